/**
 * Interop soak: WASM processes (a producer, two running `processEvents`),
 * a `node:sqlite` process claiming and acknowledging, a loop of plain native
 * `sqlite3` reads and a loop of native `sqlite3` writes, all on one file at
 * once. Before the VFS took SQLite's own locks, a native read took the live
 * journal for a hot one and rolled it back: committed events vanished and an
 * index was corrupted.
 *
 * It runs twice: with the rollback journal ("truncate") and with the file in
 * WAL mode, where every WASM and `node:sqlite` connection opens with
 * journalMode "wal" and the native CLI just follows the file (WAL is
 * persistent), sharing the `-shm` index and its locks with the WASM VFS.
 *
 * `VFS_SOAK_MS` sets how long the load runs in each mode (`deno task
 * test:stress` runs 60 s).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Outbox } from "../mod.ts";
import { type JournalMode, openSqliteWasm } from "../deno/sqlite_wasm.ts";

const SOAK_MS = Number(Deno.env.get("VFS_SOAK_MS") ?? 6_000);
const fixture = fileURLToPath(
  new URL("./fixtures/vfs_soak.ts", import.meta.url),
);
const config = fileURLToPath(new URL("../deno.json", import.meta.url));

/** A soak child process and everything it printed. */
class SoakChild {
  readonly process: Deno.ChildProcess;
  readonly output: Promise<string>;
  readonly errors: Promise<string>;
  /** Resolves once the child's outbox is open. */
  readonly ready: Promise<void>;

  constructor(mode: string, path: string, journalMode: JournalMode) {
    const process = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", "--config", config, fixture, mode, path, journalMode],
      stdin: "piped",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    this.process = process;
    const ready = Promise.withResolvers<void>();
    this.ready = ready.promise;
    this.output = (async () => {
      let text = "";
      for await (
        const chunk of process.stdout.pipeThrough(new TextDecoderStream())
      ) {
        text += chunk;
        if (text.startsWith("ready\n")) ready.resolve();
      }
      ready.reject(new Error(`ended before it was ready: ${text}`));
      return text;
    })();
    this.errors = new Response(process.stderr).text();
  }

  /** Kills the child if it still runs (after a failed assertion). */
  async [Symbol.asyncDispose](): Promise<void> {
    try {
      this.process.kill("SIGKILL");
    } catch {
      // It has exited already.
    }
    await Promise.allSettled([this.process.status, this.output, this.errors]);
  }

  async stop(): Promise<string[]> {
    const writer = this.process.stdin.getWriter();
    await writer.write(new TextEncoder().encode("stop\n"));
    await writer.close();
    const [status, output, errors] = await Promise.all([
      this.process.status,
      this.output,
      this.errors,
    ]);
    assert.equal(status.code, 0, errors);
    assert.equal(errors, "", "no error the child survived");
    const lines = output.trim().split("\n");
    assert.equal(lines[0], "ready");
    assert.equal(lines.at(-1), "done");
    return lines.slice(1, -1);
  }
}

async function sqlite3(
  path: string,
  sql: string,
  timeoutMs = 0,
): Promise<{ ok: boolean; stdout: string; stderr: string }> {
  const output = await new Deno.Command("sqlite3", {
    args: [...(timeoutMs ? ["-cmd", `.timeout ${timeoutMs}`] : []), path, sql],
    stdout: "piped",
    stderr: "piped",
  }).output();
  return {
    ok: output.code === 0,
    stdout: new TextDecoder().decode(output.stdout).trim(),
    stderr: new TextDecoder().decode(output.stderr).trim(),
  };
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

const MODES: readonly JournalMode[] = ["truncate", "wal"];

for (const journalMode of MODES) {
  Deno.test(`interop soak (${journalMode}, ${SOAK_MS} ms): WASM producers and processEvents workers, node:sqlite claims, native sqlite3 reads and writes on one file lose nothing, hand no fence out twice, and keep integrity`, async () => {
    const dir = await Deno.makeTempDir({ prefix: "vfs_interop_" });
    const path = join(dir, "outbox.db");
    try {
      {
        await using outbox = await Outbox.open(
          await openSqliteWasm(path, { journalMode }),
        );
        await outbox.enqueue({ seed: true });
      }
      // A rollback mode is the connection's own (the CLI's is "delete");
      // WAL is the file's, so the native CLI follows it.
      assert.equal(
        (await sqlite3(path, "PRAGMA journal_mode")).stdout,
        journalMode === "wal" ? "wal" : "delete",
      );
      assert.equal(
        (await sqlite3(path, "CREATE TABLE native_side(k INTEGER PRIMARY KEY)"))
          .ok,
        true,
      );
      await using producer = new SoakChild("produce", path, journalMode);
      await using processA = new SoakChild("process", path, journalMode);
      await using processB = new SoakChild("process", path, journalMode);
      await using node = new SoakChild("node", path, journalMode);
      const children = [producer, processA, processB, node];
      const consumers = [processA, processB, node];
      await Promise.all(children.map((child) => child.ready));
      const deadline = performance.now() + SOAK_MS;
      let reads = 0;
      let lockedReads = 0;
      const readLoop = (async () => {
        while (performance.now() < deadline) {
          const read = await sqlite3(
            path,
            "SELECT count(*) FROM outbox_events",
            2_000,
          );
          if (read.ok) reads++;
          else if (read.stderr.includes("database is locked")) lockedReads++;
          else throw new Error(`native read failed: ${read.stderr}`);
          await sleep(20);
        }
      })();
      const written: number[] = [];
      // A write refused with SQLITE_BUSY after the CLI's timeout reported its
      // failure, as native SQLite promises; its row must then be absent. Native
      // writers poll with sleeps while WASM writers wait in the kernel, so under
      // load a native write can time out (a fairness gap, not a safety one).
      let lockedWrites = 0;
      const writeLoop = (async () => {
        for (let k = 1; performance.now() < deadline; k++) {
          const write = await sqlite3(
            path,
            `BEGIN IMMEDIATE; INSERT INTO native_side(k) VALUES (${k}); COMMIT;`,
            30_000,
          );
          if (write.ok) written.push(k);
          else if (write.stderr.includes("database is locked")) lockedWrites++;
          else throw new Error(`native write failed: ${write.stderr}`);
          await sleep(20);
        }
      })();
      await Promise.all([readLoop, writeLoop]);
      const committed = (await producer.stop()).flatMap((line) =>
        line.slice(2).split(" ").map(Number)
      );
      // Drain: every committed event done before the consumers stop.
      const drained = performance.now() + 120_000;
      for (;;) {
        const left = await sqlite3(
          path,
          "SELECT count(*) FROM outbox_events WHERE state IN ('pending', 'leased')",
          30_000,
        );
        if (left.ok && left.stdout === "0") break;
        assert.ok(performance.now() < drained, `not drained: ${left.stdout}`);
        await sleep(100);
      }
      const handed = (await Promise.all(consumers.map((child) => child.stop())))
        .flat().map((line) => line.slice(2));

      assert.ok(committed.length > 0 && reads > 0 && written.length > 0);
      const integrity = await sqlite3(path, "PRAGMA integrity_check", 30_000);
      assert.equal(integrity.stdout, "ok");
      if (journalMode === "wal") {
        // No connection switched the file out of WAL under the others; no
        // rollback journal was ever written (so none could look hot).
        assert.equal(
          (await sqlite3(path, "PRAGMA journal_mode", 30_000)).stdout,
          "wal",
        );
        const names = [...Deno.readDirSync(dir)].map((entry) => entry.name);
        assert.ok(!names.includes("outbox.db-journal"), names.join(", "));
      }
      await using db = await openSqliteWasm(path, { journalMode });
      const states = new Map(
        (await db.query("SELECT id, state FROM outbox_events")).map((
          row,
        ) => [Number(row.id), String(row.state)]),
      );
      const missing = committed.filter((id) => !states.has(id));
      assert.deepEqual(missing, [], "every committed event is present");
      const unfinished = committed.filter((id) =>
        states.get(id) !== "done" && states.get(id) !== "dead"
      );
      assert.deepEqual(unfinished, [], "every committed event done or dead");
      const twice = await db.query(
        `SELECT event_id, count(*) AS n FROM outbox_ledger
       WHERE kind = 'acknowledged' GROUP BY event_id HAVING n <> 1`,
      );
      assert.deepEqual(twice, [], "each done event acknowledged exactly once");
      const reused = await db.query(
        `SELECT event_id, fence FROM outbox_ledger WHERE kind = 'claimed'
       GROUP BY event_id, fence HAVING count(*) > 1`,
      );
      assert.deepEqual(reused, [], "no fence claimed twice in the ledger");
      assert.equal(
        new Set(handed).size,
        handed.length,
        "no fence handed out twice",
      );
      const sides = (await db.query("SELECT k FROM native_side ORDER BY k"))
        .map((row) => Number(row.k));
      assert.deepEqual(sides, written, "every native write's row is present");
      console.log(
        `${journalMode}: ${committed.length} events, ${handed.length} claims, ${reads} native reads (${lockedReads} locked), ${written.length} native writes (${lockedWrites} refused as locked)`,
      );
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
}
