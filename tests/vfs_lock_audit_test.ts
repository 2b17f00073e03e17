/**
 * The lock audit (deno/lock_audit.ts, `LEASED_OUTBOX_VFS_AUDIT=1`): a lock
 * the kernel let go behind the VFS's back fails the next write, naming it,
 * and a process whose locks are all in force writes as ever. Each case runs
 * in a child process, which reads the variables at its first open.
 */
import assert from "node:assert/strict";
import { join } from "node:path";

const SQLITE_WASM = new URL("../deno/sqlite_wasm.ts", import.meta.url).href;

/**
 * Runs a writer in a child process with the audit on and `locks` as
 * `LEASED_OUTBOX_VFS_LOCKS`: it begins a write transaction, inserts, then
 * (with `dropLocks`) opens and closes another descriptor of the database
 * file, as any `Deno.open` of it would, and commits. Returns what the
 * commit said and the rows a fresh connection reads.
 */
async function writer(
  journalMode: "truncate" | "wal",
  locks: "posix" | "",
  dropLocks: boolean,
): Promise<{ commit: string; rows: number[] }> {
  const dir = await Deno.makeTempDir({ prefix: "vfs_lock_audit_" });
  try {
    const script = join(dir, "child.ts");
    await Deno.writeTextFile(
      script,
      `import { loadSqlite3, openSqliteWasm, takeDenoFileVfsError } from ${
        JSON.stringify(SQLITE_WASM)
      };
const [path, journalMode, dropLocks] = Deno.args;
const a = await openSqliteWasm(path, { journalMode });
await a.exec("CREATE TABLE t(x INTEGER)");
await a.run("INSERT INTO t VALUES (1)");
await a.exec("BEGIN IMMEDIATE");
await a.run("INSERT INTO t VALUES (2)");
if (dropLocks === "true") Deno.openSync(path).close();
let commit = "ok";
try { await a.exec("COMMIT"); } catch (error) { commit = error.message; }
try { await a.exec("ROLLBACK"); } catch { /* none left */ }
await a.close();
const b = await openSqliteWasm(path, { journalMode });
const rows = (await b.query("SELECT x FROM t ORDER BY x")).map((r) => r.x);
await b.close();
console.log(JSON.stringify({ commit, rows }));`,
    );
    const output = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        "--config",
        new URL("../deno.json", import.meta.url).pathname,
        "--lock=" + new URL("../deno.lock", import.meta.url).pathname,
        script,
        join(dir, "audit.db"),
        journalMode,
        String(dropLocks),
      ],
      env: { LEASED_OUTBOX_VFS_AUDIT: "1", LEASED_OUTBOX_VFS_LOCKS: locks },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const decoder = new TextDecoder();
    assert.equal(output.code, 0, decoder.decode(output.stderr));
    return JSON.parse(decoder.decode(output.stdout));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

const linux = Deno.build.os === "linux";

Deno.test({
  name:
    "lock audit, classic POSIX locks, rollback journal: a close of another descriptor of the database mid-transaction drops the process's RESERVED, and the commit fails naming it before a byte is written; the row is not committed",
  ignore: !linux,
  fn: async () => {
    const { commit, rows } = await writer("truncate", "posix", true);
    assert.match(
      commit,
      /^disk I\/O error: Lock audit, before (writing|syncing|truncating) .*audit\.db(-journal)?: .*audit\.db believes it holds RESERVED \(a write lock on bytes 1073741825-1073741825\), which the kernel does not hold for this process/,
    );
    assert.deepEqual(rows, [1]);
  },
});

Deno.test({
  name:
    "lock audit, classic POSIX locks, WAL: the same close drops the database's SHARED lock, and the commit fails naming it before the WAL is written",
  ignore: !linux,
  fn: async () => {
    const { commit, rows } = await writer("wal", "posix", true);
    assert.match(
      commit,
      /^disk I\/O error: Lock audit, before (writing|syncing) .*audit\.db-wal: .*audit\.db believes it holds SHARED \(a read lock on bytes 1073741826-1073742335\)/,
    );
    assert.deepEqual(rows, [1]);
  },
});

for (const journalMode of ["truncate", "wal"] as const) {
  Deno.test({
    name:
      `lock audit, ${journalMode}: with every lock in force the audit passes every write (classic locks, and open file description locks, which a close of another descriptor leaves alone)`,
    ignore: !linux,
    fn: async () => {
      assert.deepEqual(await writer(journalMode, "posix", false), {
        commit: "ok",
        rows: [1, 2],
      });
      assert.deepEqual(await writer(journalMode, "", true), {
        commit: "ok",
        rows: [1, 2],
      });
    },
  });
}

Deno.test({
  name:
    "lock audit: while other processes take and drop hundreds of locks a second, which shifts /proc/locks between the pages of one read of it (the audit reads this process's fdinfo), no lock held all along is reported missing (1,000 WAL commits, none failed)",
  ignore: !linux,
  fn: async () => {
    const output = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        "--config",
        new URL("../deno.json", import.meta.url).pathname,
        "--lock=" + new URL("../deno.lock", import.meta.url).pathname,
        new URL("./fixtures/audit_churn.ts", import.meta.url).pathname,
        "1000",
      ],
      env: { LEASED_OUTBOX_VFS_AUDIT: "1" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const decoder = new TextDecoder();
    assert.equal(output.code, 0, decoder.decode(output.stderr));
    assert.deepEqual(JSON.parse(decoder.decode(output.stdout)), {
      failures: 0,
      first: "",
      ends: ["SIGKILL", "SIGKILL"],
    });
  },
});
