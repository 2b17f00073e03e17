/**
 * SIGKILL crash trials through the Deno file VFS: a worker process enqueues
 * (with a business row in the same transaction), claims and acknowledges
 * until it is killed at a random moment; then two processes open the file at
 * once, one of them rolls back the hot journal, and both must see every
 * reported commit and nothing torn.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { BusyError, Outbox, type Row } from "../mod.ts";
import {
  type JournalMode,
  openSqliteWasm,
  type SqliteWasmDriver,
} from "../deno/sqlite_wasm.ts";
import { Child } from "./fixtures/vfs_child.ts";
import { beginWaiting, locksOn } from "./fixtures/vfs_locks.ts";

// `deno task test:stress` runs 25 per mode (100 in all).
const TRIALS = Number(Deno.env.get("VFS_CRASH_TRIALS") ?? 3);
const MODES: readonly JournalMode[] = ["truncate", "delete", "persist", "wal"];

interface Snapshot {
  integrity: string;
  events: Row[];
  business: number[];
}

const JOURNAL_MAGIC = [0xd9, 0xd5, 0x05, 0xf9, 0x20, 0xa1, 0x63, 0xd7];

/**
 * Whether a rollback journal that SQLite would treat as hot is on disk;
 * synchronous, so asking it holds the event loop.
 */
function hotJournal(path: string): boolean {
  let bytes: Uint8Array;
  try {
    bytes = Deno.readFileSync(`${path}-journal`);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return false;
    throw error;
  }
  return JOURNAL_MAGIC.every((byte, i) => bytes[i] === byte);
}

async function snapshot(db: SqliteWasmDriver): Promise<Snapshot> {
  const [integrity] = await db.query("PRAGMA integrity_check");
  const events = await db.query(
    "SELECT id, state, token, json_extract(payload, '$.business') AS business FROM outbox_events ORDER BY id",
  );
  const business = await db.query("SELECT id FROM business ORDER BY id");
  return {
    integrity: String(integrity!.integrity_check),
    events,
    business: business.map((row) => Number(row.id)),
  };
}

async function verifyHere(
  path: string,
  journalMode: JournalMode,
): Promise<Snapshot> {
  const deadline = performance.now() + 20_000;
  for (;;) {
    try {
      await using db = await openSqliteWasm(path, { journalMode });
      return await snapshot(db);
    } catch (error) {
      if (!(error instanceof BusyError) || performance.now() > deadline) {
        throw error;
      }
      await new Promise((resolve) =>
        setTimeout(resolve, 1 + Math.random() * 10)
      );
    }
  }
}

// WAL twice: recovered by the first opener after the kill (no one holds the
// index), and with this process holding the index open all along, so the
// next writer and every opener take up the index the killed writer left.
const VARIANTS = [
  ...MODES.map((journalMode) => ({ journalMode, held: false })),
  { journalMode: "wal" as const, held: true },
];

for (const { journalMode, held } of VARIANTS) {
  const name = held ? `${journalMode}, index held open` : journalMode;
  Deno.test(`crash (${name}): ${TRIALS} SIGKILLs mid-transaction lose no reported commit, keep business rows and events together, and leave integrity ok`, async () => {
    const dir = await Deno.makeTempDir({ prefix: `vfs_crash_${journalMode}_` });
    const path = join(dir, "outbox.db");
    try {
      {
        await using outbox = await Outbox.open(
          await openSqliteWasm(path, { journalMode }),
        );
        await outbox.transaction((tx) =>
          tx.run(
            "CREATE TABLE business (id INTEGER PRIMARY KEY, body TEXT NOT NULL) STRICT",
          )
        );
      }
      await using keeper = held
        ? await openSqliteWasm(path, { journalMode })
        : undefined;
      const enqueued = new Set<number>();
      const claimed = new Map<number, string>();
      const acknowledged = new Map<number, string>();
      let hot = 0;
      for (let trial = 0; trial < TRIALS; trial++) {
        const worker = new Child("crash", path, journalMode);
        if (await worker.next() !== "ready") {
          worker.kill();
          await worker.status();
          assert.fail(`worker did not start: ${await worker.stderr()}`);
        }
        // The kill comes at a random moment after the first commit, so a
        // loaded machine's slow start cannot leave a trial without one.
        const committed = Promise.withResolvers<void>();
        const output = (async () => {
          for (let line; (line = await worker.next()) !== undefined;) {
            committed.resolve();
            const [kind, id, token] = line.split(" ");
            if (kind === "E") enqueued.add(Number(id));
            else if (kind === "C") claimed.set(Number(id), token!);
            else if (kind === "A") acknowledged.set(Number(id), token!);
          }
        })().finally(() => committed.resolve());
        await committed.promise;
        await new Promise((resolve) =>
          setTimeout(resolve, Math.random() * 450)
        );
        worker.kill();
        const status = await worker.status();
        await output;
        assert.equal(status.signal, "SIGKILL", await worker.stderr());
        if (journalMode !== "wal" && hotJournal(path)) hot++;

        // Two processes open the crashed file at once.
        await using verifier = new Child("verify", path, journalMode);
        const [here, there] = await Promise.all([
          verifyHere(path, journalMode),
          verifier.json<Snapshot>(),
        ]);
        assert.deepEqual(there, here, "both processes see the same database");
        if (keeper !== undefined) {
          assert.deepEqual(await snapshot(keeper), here, "the keeper too");
        }
        assert.equal(here.integrity, "ok");
        if (journalMode !== "wal") assert.equal(hotJournal(path), false);

        const events = new Map(here.events.map((row) => [Number(row.id), row]));
        for (const id of enqueued) {
          assert.ok(events.has(id), `enqueued event ${id} was lost`);
        }
        for (const [id, token] of acknowledged) {
          assert.equal(
            events.get(id)?.state,
            "done",
            `acknowledged event ${id}`,
          );
          assert.equal(events.get(id)?.token, token);
        }
        for (const [id, token] of claimed) {
          if (acknowledged.has(id)) continue;
          assert.ok(["leased", "done"].includes(String(events.get(id)?.state)));
          assert.equal(events.get(id)?.token, token, `claimed event ${id}`);
        }
        // The business row and its event commit together or not at all.
        assert.deepEqual(
          here.events.map((row) => Number(row.business)).sort((a, b) => a - b),
          here.business,
        );
      }
      assert.ok(enqueued.size > 0, "the workers made progress");
      console.log(
        `${name}: ${TRIALS} kills, ${
          journalMode === "wal"
            ? "WAL recovered each time"
            : `${hot} hot journals rolled back`
        }, ${enqueued.size} events, ${acknowledged.size} acknowledged`,
      );
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
}

for (const journalMode of ["truncate", "delete", "persist"] as const) {
  Deno.test(`crash (${journalMode}): a writer killed after spilling pages into the file leaves a hot journal that the next of two simultaneous openers rolls back`, async () => {
    const dir = await Deno.makeTempDir({ prefix: `vfs_spill_${journalMode}_` });
    const path = join(dir, "spill.db");
    try {
      {
        await using db = await openSqliteWasm(path, { journalMode });
        await db.exec(
          "CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB NOT NULL) STRICT; WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300) INSERT INTO t SELECT i, zeroblob(1000) FROM n",
        );
      }
      const committed = await Deno.readFile(path);
      await using writer = new Child("spill", path, journalMode);
      assert.equal(await writer.next(), "spilled");
      assert.notDeepEqual(
        await Deno.readFile(path),
        committed,
        "uncommitted pages reached the file",
      );
      writer.kill();
      assert.equal((await writer.status()).signal, "SIGKILL");
      assert.equal(hotJournal(path), true);

      const check = async (db: Awaited<ReturnType<typeof openSqliteWasm>>) => {
        for (;;) {
          try {
            return [
              ...await db.query("PRAGMA integrity_check"),
              ...await db.query(
                "SELECT count(*) AS n, count(*) FILTER (WHERE v = zeroblob(1000)) AS untouched FROM t",
              ),
            ];
          } catch (error) {
            if (!(error instanceof BusyError)) throw error;
            await new Promise((resolve) =>
              setTimeout(resolve, Math.random() * 5)
            );
          }
        }
      };
      await using a = await openSqliteWasm(path, { journalMode });
      await using b = await openSqliteWasm(path, { journalMode });
      const [fromA, fromB] = await Promise.all([check(a), check(b)]);
      const expected = [{ integrity_check: "ok" }, { n: 300, untouched: 300 }];
      assert.deepEqual(fromA, expected);
      assert.deepEqual(fromB, expected);
      assert.equal(hotJournal(path), false);
      assert.deepEqual(
        await Deno.readFile(path),
        committed,
        "the file is back to its committed bytes",
      );
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
}

/**
 * Whether a lock as locksOn lists it covers RESERVED: of either type, it
 * tells native SQLite's xCheckReservedLock that RESERVED is held.
 */
function coversReserved(lock: string): boolean {
  const [, first, last] = lock.split(" ");
  return Number(first) <= 0x40000001 && Number(last) >= 0x40000001;
}

/** Whether process `pid` has not exited yet (a zombie has, and holds no lock). */
function alive(pid: number): boolean {
  try {
    const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
    return stat.slice(stat.lastIndexOf(")") + 2)[0] !== "Z";
  } catch {
    return false;
  }
}

/**
 * A native `sqlite3` inside an UPDATE of every row of the spill table whose
 * uncommitted pages it has already written into the file (cache_size=2), so
 * it holds EXCLUSIVE beside a live journal; disposing lets its pipes go.
 */
async function spillingSqlite3(
  path: string,
  journalMode: JournalMode,
): Promise<{ process: Deno.ChildProcess } & AsyncDisposable> {
  const process = new Deno.Command("sqlite3", {
    args: [path],
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const lines = process.stdout.pipeThrough(new TextDecoderStream())
    .getReader();
  const writer = process.stdin.getWriter();
  const dispose = async () => {
    await writer.close().catch(() => {});
    await lines.cancel();
    await process.stderr.cancel();
  };
  try {
    await writer.write(
      new TextEncoder().encode(
        `PRAGMA journal_mode=${journalMode}; PRAGMA cache_size=2; BEGIN; UPDATE t SET v = randomblob(1000);\n.print spilled\n`,
      ),
    );
    let printed = "";
    while (!printed.includes("spilled")) {
      const { value, done } = await lines.read();
      assert.equal(done, false, "sqlite3 ended early");
      printed += value;
    }
  } catch (error) {
    process.kill("SIGKILL");
    await dispose();
    throw error;
  }
  return { process, [Symbol.asyncDispose]: dispose };
}

/** A 300-row table of zeroblobs, and the file's committed bytes. */
async function seedSpillTable(
  path: string,
  journalMode: JournalMode,
): Promise<Uint8Array> {
  await using db = await openSqliteWasm(path, { journalMode });
  await db.exec(
    "CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB NOT NULL) STRICT; WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300) INSERT INTO t SELECT i, zeroblob(1000) FROM n",
  );
  await db.close();
  return await Deno.readFile(path);
}

/** Runs the native `sqlite3` CLI on `path` with `sql`; returns its output. */
async function nativeSqlite(path: string, sql: string): Promise<string> {
  const output = await new Deno.Command("sqlite3", {
    args: ["-bail", path, sql],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stderr = new TextDecoder().decode(output.stderr);
  assert.equal(output.code, 0, stderr);
  return new TextDecoder().decode(output.stdout).trim();
}

for (const journalMode of ["truncate", "delete", "persist"] as const) {
  Deno.test(`crash (${journalMode}): native sqlite3 killed after spilling pages leaves a hot journal that a WASM opener, shut out until then, rolls back`, async () => {
    const dir = await Deno.makeTempDir({
      prefix: `vfs_native_${journalMode}_`,
    });
    const path = join(dir, "spill.db");
    try {
      const committed = await seedSpillTable(path, journalMode);
      await using reader = await openSqliteWasm(path, { journalMode });
      {
        await using spilled = await spillingSqlite3(path, journalMode);
        const native = spilled.process;
        assert.notDeepEqual(await Deno.readFile(path), committed);
        // The native writer holds EXCLUSIVE: the WASM reader is shut out
        // rather than reading its uncommitted pages or its live journal.
        await assert.rejects(reader.query("SELECT count(*) FROM t"), BusyError);
        native.kill("SIGKILL");
        assert.equal((await native.status).signal, "SIGKILL");
      }
      assert.equal(hotJournal(path), true);
      assert.deepEqual(
        await reader.query(
          "SELECT count(*) AS n, count(*) FILTER (WHERE v = zeroblob(1000)) AS untouched FROM t",
        ),
        [{ n: 300, untouched: 300 }],
      );
      assert.deepEqual(await reader.query("PRAGMA integrity_check"), [{
        integrity_check: "ok",
      }]);
      assert.equal(hotJournal(path), false);
      assert.deepEqual(await Deno.readFile(path), committed);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });

  Deno.test(`crash (${journalMode}): native sqlite3 killed after spilling pages, with a WASM writer waiting in the kernel, is never read as live: nothing granted to the waiter says RESERVED, and a reader rolls the journal back or is shut out`, async () => {
    const dir = await Deno.makeTempDir({
      prefix: `vfs_waiter_${journalMode}_`,
    });
    const path = join(dir, "spill.db");
    try {
      const committed = await seedSpillTable(path, journalMode);
      await using waiter = await openSqliteWasm(path, { journalMode });
      let begun: Promise<void> | undefined;
      {
        await using spilled = await spillingSqlite3(path, journalMode);
        const native = spilled.process;
        begun = beginWaiting(waiter);
        // Awaited below; when an assertion fails first, the connection's
        // close rejects it, which is no further failure.
        begun.catch(() => {});
        await new Promise((resolve) => setTimeout(resolve, 50));
        // From here until the reader has run, this process's event loop is
        // held: a kernel wait of the waiter's would be granted when the
        // writer dies, and its callback could not run in between.
        native.kill("SIGKILL");
        const deadline = performance.now() + 5_000;
        while (alive(native.pid)) {
          assert.ok(performance.now() < deadline, "sqlite3 lives on");
        }
        const granted = performance.now() + 50;
        while (performance.now() < granted);
        assert.equal(hotJournal(path), true);
        // Nothing the waiter holds covers RESERVED: a reader that took
        // SHARED at any moment around the writer's death finds the journal
        // hot, as with no waiter, rather than live (xCheckReservedLock).
        assert.deepEqual(locksOn(path).filter(coversReserved), []);
        const read = new Deno.Command("sqlite3", {
          args: [
            path,
            "SELECT count(*) FILTER (WHERE v = zeroblob(1000)) FROM t",
          ],
          stdout: "piped",
          stderr: "piped",
        }).outputSync();
        // It rolls the journal back itself, or the waiter's grant refuses
        // it; it never reads the crashed commit's pages.
        const out = new TextDecoder().decode(read.stdout).trim();
        const err = new TextDecoder().decode(read.stderr);
        assert.ok(
          read.success ? out === "300" : /database is locked/.test(err),
          `a reader went past the hot journal and read ${out}${err}`,
        );
        assert.equal((await native.status).signal, "SIGKILL");
      }
      await begun;
      assert.deepEqual(
        await waiter.query(
          "SELECT count(*) AS n, count(*) FILTER (WHERE v = zeroblob(1000)) AS untouched FROM t",
        ),
        [{ n: 300, untouched: 300 }],
      );
      await waiter.exec("COMMIT");
      assert.equal(hotJournal(path), false);
      assert.deepEqual(await Deno.readFile(path), committed);
      assert.equal(
        await nativeSqlite(
          path,
          "SELECT count(*) FILTER (WHERE v = zeroblob(1000)) FROM t; PRAGMA integrity_check",
        ),
        "300\nok",
      );
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });

  Deno.test(`crash (${journalMode}): a WASM writer killed after spilling pages leaves a hot journal that native sqlite3, shut out until then, rolls back`, async () => {
    const dir = await Deno.makeTempDir({ prefix: `vfs_wasm_${journalMode}_` });
    const path = join(dir, "spill.db");
    try {
      const committed = await seedSpillTable(path, journalMode);
      await using writer = new Child("spill", path, journalMode);
      assert.equal(await writer.next(), "spilled");
      assert.notDeepEqual(await Deno.readFile(path), committed);
      const shutOut = await new Deno.Command("sqlite3", {
        args: [path, "SELECT count(*) FROM t"],
        stdout: "piped",
        stderr: "piped",
      }).output();
      assert.notEqual(shutOut.code, 0);
      assert.match(
        new TextDecoder().decode(shutOut.stderr),
        /database is locked/,
      );
      writer.kill();
      assert.equal((await writer.status()).signal, "SIGKILL");
      assert.equal(hotJournal(path), true);
      assert.equal(
        await nativeSqlite(
          path,
          "SELECT count(*), count(*) FILTER (WHERE v = zeroblob(1000)) FROM t; PRAGMA integrity_check",
        ),
        "300|300\nok",
      );
      assert.equal(hotJournal(path), false);
      assert.deepEqual(await Deno.readFile(path), committed);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
}
