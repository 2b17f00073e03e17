/**
 * The CLI's `main()` in the same process as the application's outboxes on
 * the same file (docs/cli.md, "From code"). With classic POSIX locks,
 * closing any descriptor of a database file drops every lock the process
 * holds on it, so the CLI must open the file only through the driver the
 * process already uses for it. The VFS case runs in a child process with
 * classic locks and the lock audit on (the variables are read at a
 * process's first open); the node:sqlite case runs here, as native SQLite
 * takes classic locks on every system.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { main } from "../cli.ts";
import { openNodeSqlite } from "../drivers/node_sqlite.ts";
import { Outbox } from "../mod.ts";
import { nativeSql } from "./fixtures/vfs_locks.ts";
import { tempDir } from "./helpers.ts";

const CHILD = new URL("./fixtures/cli_same_process.ts", import.meta.url);
const RESERVED = "WRITE 1073741825 1073741825";
const SHARED = "READ 1073741826 1073742335";
const DEAD_MAN_SWITCH = "READ 128 128";

Deno.test("main() beside the process's own VFS outboxes under classic locks keeps their locks: a rollback transaction open across stats, list, explain and cancel commits, and both outboxes write after, with the lock audit on", async () => {
  await using tmp = await tempDir("vfs_cli_same_process_");
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--lock=deno.lock", CHILD.href, tmp.path],
    env: { LEASED_OUTBOX_VFS_LOCKS: "posix", LEASED_OUTBOX_VFS_AUDIT: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stderr = new TextDecoder().decode(output.stderr);
  assert.equal(output.code, 0, stderr);
  const report: {
    before: unknown;
    after: unknown;
    commands: Record<string, [number, string]>;
    transaction: string;
    writes: unknown;
    counts: unknown;
  } = JSON.parse(new TextDecoder().decode(output.stdout));
  const held = {
    rollback: [SHARED, RESERVED],
    wal: [SHARED],
    walShm: [DEAD_MAN_SWITCH],
  };
  assert.equal(report.transaction, "ok");
  assert.deepEqual(report.before, held);
  assert.deepEqual(report.after, held);
  for (const [command, [code, out]] of Object.entries(report.commands)) {
    assert.equal(code, 0, `${command}: ${out}`);
  }
  const stats = (name: string) => JSON.parse(report.commands[name]![1]);
  assert.equal(stats("stats rollback").pending, 1);
  assert.equal(stats("stats rollback").wal, null);
  assert.equal(stats("stats wal").pending, 2);
  assert.equal(typeof stats("stats wal").wal.sizeBytes, "number");
  assert.deepEqual(report.writes, { rollback: "ok", wal: "ok" });
  assert.deepEqual(report.counts, { rollback: 3, wal: 2 });
});

for (const journalMode of ["truncate", "wal"] as const) {
  Deno.test(`main() beside the process's own node:sqlite outbox (${journalMode}) keeps its write lock: another process is still refused`, async () => {
    await using tmp = await tempDir("vfs_cli_same_process_");
    const path = join(tmp.path, "native.db");
    await using outbox = await Outbox.open(
      await openNodeSqlite(path, { journalMode }),
    );
    await outbox.enqueue({ n: 1 });
    let refused = "";
    await outbox.transaction(async (tx) => {
      await tx.enqueue({ n: 2 });
      const lines: string[] = [];
      const code = await main(["stats", path, "--json"], {
        stdout: (line) => lines.push(line),
        stderr: (line) => lines.push(line),
      });
      assert.equal(code, 0, lines.join("\n"));
      assert.equal(JSON.parse(lines[0]!).pending, 1);
      refused = nativeSql(path, "BEGIN IMMEDIATE; COMMIT;").stderr;
    });
    assert.match(refused, /database is locked/);
    assert.equal((await outbox.stats()).pending, 2);
  });
}
