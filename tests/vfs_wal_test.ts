/**
 * WAL through the Deno file VFS: the `-shm` index mapped into WASM memory
 * and shared with other connections, other processes and native SQLite.
 * (The crash trials are in vfs_crash_test.ts, the multi-process claim races
 * and the interop soak in vfs_process_test.ts and vfs_interop_test.ts.)
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { DatabaseSync } from "node:sqlite";
import { BusyError, SqliteError } from "../errors.ts";
import {
  type DenoSqliteWasmOptions,
  loadSqlite3,
  openSqliteWasm,
  type SqliteWasmDriver,
} from "../deno/sqlite_wasm.ts";

async function withDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "vfs_wal_" });
  try {
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

function open(
  path: string,
  options?: DenoSqliteWasmOptions,
): Promise<SqliteWasmDriver> {
  return openSqliteWasm(path, options);
}

function sqlite3Cli(path: string, sql: string) {
  const output = new Deno.Command("sqlite3", {
    args: [path, sql],
    stdout: "piped",
    stderr: "piped",
  }).outputSync();
  const decoder = new TextDecoder();
  return {
    code: output.code,
    stdout: decoder.decode(output.stdout).trim(),
    stderr: decoder.decode(output.stderr).trim(),
  };
}

Deno.test("WAL is shared by connections: a reader keeps its snapshot while a writer commits, one writer at a time, and the last close checkpoints and removes -wal and -shm", async () => {
  await withDir(async (dir) => {
    const path = join(dir, "wal.db");
    {
      await using a = await open(path, { journalMode: "wal" });
      await using b = await open(path, { journalMode: "wal" });
      assert.deepEqual(await b.query("PRAGMA journal_mode"), [{
        journal_mode: "wal",
      }]);
      await a.exec("CREATE TABLE t(x INTEGER) STRICT");
      for (let i = 0; i < 50; i++) {
        await (i % 2 ? a : b).run("INSERT INTO t VALUES (?)", [i]);
      }
      await b.exec("BEGIN");
      assert.deepEqual(await b.query("SELECT sum(x) AS s FROM t"), [{
        s: 1225,
      }]);
      // A rollback journal would refuse this commit until b's read ends.
      await a.run("INSERT INTO t VALUES (?)", [100]);
      assert.deepEqual(await b.query("SELECT sum(x) AS s FROM t"), [{
        s: 1225,
      }]);
      await b.exec("COMMIT");
      assert.deepEqual(await b.query("SELECT sum(x) AS s FROM t"), [{
        s: 1325,
      }]);
      await a.exec("BEGIN IMMEDIATE");
      await assert.rejects(b.exec("BEGIN IMMEDIATE"), BusyError);
      await a.exec("COMMIT");
      await b.exec("BEGIN IMMEDIATE; COMMIT");
      assert.equal(Deno.statSync(`${path}-shm`).size, 32768);
      assert.ok(Deno.statSync(`${path}-wal`).size > 0);
    }
    assert.deepEqual([...Deno.readDirSync(dir)].map((e) => e.name), [
      "wal.db",
    ]);
    assert.equal(sqlite3Cli(path, "SELECT sum(x) FROM t").stdout, "1325");
  });
});

Deno.test("WAL with native SQLite: node:sqlite here and sqlite3 in another process read and write one WAL file with WASM connections, and a WASM close keeps node:sqlite's WAL lock", async () => {
  await withDir(async (dir) => {
    const path = join(dir, "mixed_wal.db");
    await using wasm = await open(path, { journalMode: "wal" });
    await wasm.exec("CREATE TABLE t(x INTEGER) STRICT");
    const native = new DatabaseSync(path);
    try {
      for (let i = 0; i < 20; i++) {
        await wasm.run("INSERT INTO t VALUES (?)", [i]);
        native.prepare("INSERT INTO t VALUES (?)").run(100 + i);
        const cli = sqlite3Cli(path, `INSERT INTO t VALUES (${200 + i})`);
        assert.equal(cli.code, 0, cli.stderr);
      }
      const expected = 190 + 20 * 100 + 190 + 20 * 200 + 190;
      assert.deepEqual(await wasm.query("SELECT sum(x) AS s FROM t"), [{
        s: expected,
      }]);
      assert.deepEqual(
        { ...native.prepare("SELECT sum(x) AS s FROM t").get() },
        { s: expected },
      );
      // node:sqlite holds WAL's write lock, a POSIX lock on -shm; closing a
      // WASM connection must not close a -shm descriptor (that would drop it).
      native.exec("BEGIN IMMEDIATE; INSERT INTO t VALUES (1000)");
      const passerby = await open(path, { journalMode: "wal" });
      assert.deepEqual(await passerby.query("SELECT count(*) AS n FROM t"), [{
        n: 60,
      }]);
      await passerby.close();
      const locked = sqlite3Cli(path, "BEGIN IMMEDIATE; COMMIT;");
      assert.notEqual(locked.code, 0);
      assert.match(locked.stderr, /database is locked/);
      native.exec("COMMIT");
    } finally {
      native.close();
    }
    assert.deepEqual(await wasm.query("SELECT count(*) AS n FROM t"), [{
      n: 61,
    }]);
    assert.deepEqual(await wasm.query("PRAGMA integrity_check"), [{
      integrity_check: "ok",
    }]);
  });
});

Deno.test("the WAL index stays shared after WASM memory grows", async () => {
  await withDir(async (dir) => {
    const path = join(dir, "grow.db");
    await using db = await open(path, { journalMode: "wal" });
    await db.exec("CREATE TABLE t(x INTEGER) STRICT; INSERT INTO t VALUES (1)");
    const sqlite3 = await loadSqlite3();
    const before = sqlite3.wasm.heap8u().length;
    const block = sqlite3.wasm.alloc(before);
    try {
      assert.ok(sqlite3.wasm.heap8u().length > before, "memory grew");
      assert.equal(sqlite3Cli(path, "INSERT INTO t VALUES (2)").code, 0);
      assert.deepEqual(await db.query("SELECT sum(x) AS s FROM t"), [{
        s: 3,
      }]);
      await db.run("INSERT INTO t VALUES (?)", [4]);
      assert.equal(sqlite3Cli(path, "SELECT sum(x) FROM t").stdout, "7");
    } finally {
      sqlite3.wasm.dealloc(block);
    }
  });
});

Deno.test("a WAL file in use refuses to leave WAL (BusyError), and alone it leaves WAL and keeps its rows", async () => {
  await withDir(async (dir) => {
    const path = join(dir, "leave.db");
    {
      await using wal = await open(path, { journalMode: "wal" });
      await wal.exec("CREATE TABLE t(x); INSERT INTO t VALUES (1), (2)");
      await assert.rejects(open(path, { busyTimeoutMs: 50 }), BusyError);
    }
    await using db = await open(path);
    assert.deepEqual(await db.query("PRAGMA journal_mode"), [{
      journal_mode: "truncate",
    }]);
    assert.deepEqual(await db.query("SELECT count(*) AS n FROM t"), [{
      n: 2,
    }]);
    assert.throws(() => Deno.statSync(`${path}-wal`), Deno.errors.NotFound);
  });
});

const fixture = fileURLToPath(
  new URL("./fixtures/vfs_worker.ts", import.meta.url),
);
const config = fileURLToPath(new URL("../deno.json", import.meta.url));

Deno.test("a partial checkpoint writes its pages to the database file before it tells other processes to read them there (its pwrite held 1 s by strace)", async () => {
  assert.ok(
    Deno.statSync("/usr/bin/strace").isFile,
    "this test needs strace (Debian's strace package; `deno task test` installs it as root)",
  );
  await withDir(async (dir) => {
    const path = join(dir, "ckpt.db");
    const setup = sqlite3Cli(
      path,
      "PRAGMA journal_mode=wal; CREATE TABLE a(x); CREATE TABLE b(x); INSERT INTO a VALUES ('A1'); INSERT INTO b VALUES ('B1'); PRAGMA wal_checkpoint(TRUNCATE);",
    );
    assert.equal(setup.code, 0, setup.stderr);
    // A reader whose snapshot (after A2, before B2) lets a checkpoint copy
    // a's page but not b's: the checkpoint is partial, the WAL stays, and
    // readers decide by the index whether a's page is in the file yet.
    const pin = new DatabaseSync(path);
    try {
      // Read first, so its -shm keeps the WAL from the CLI's checkpoint on
      // close.
      pin.prepare("SELECT x FROM a").get();
      assert.equal(
        sqlite3Cli(path, "UPDATE a SET x = 'A2'").code,
        0,
      );
      pin.exec("BEGIN");
      pin.prepare("SELECT x FROM b").get();
      assert.equal(sqlite3Cli(path, "UPDATE b SET x = 'B2'").code, 0);
      const child = new Deno.Command("strace", {
        args: [
          "-f",
          "-qq",
          "-o",
          "/dev/null",
          "-e",
          "trace=pwrite64",
          "-e",
          "inject=pwrite64:delay_enter=1000000",
          // Only writes to the database file: not Deno's own at start.
          "-P",
          path,
          Deno.execPath(),
          "run",
          "-A",
          "--config",
          config,
          fixture,
          "checkpoint",
          path,
          "wal",
        ],
        stdout: "piped",
        stderr: "piped",
      }).spawn();
      const lines = child.stdout.pipeThrough(new TextDecoderStream())
        .getReader();
      let output = "";
      while (!output.includes("ready\n")) {
        const { value, done } = await lines.read();
        if (done) break;
        output += value;
      }
      const finished = (async () => {
        for (;;) {
          const { value, done } = await lines.read();
          if (done) return;
          output += value;
        }
      })();
      let ended = false;
      const status = child.status.finally(() => ended = true);
      const seen: string[] = [];
      while (!ended) {
        const reader = new DatabaseSync(path);
        try {
          seen.push(String(reader.prepare("SELECT x FROM a").get()?.x));
        } finally {
          reader.close();
        }
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      await finished;
      const errors = await new Response(child.stderr).text();
      assert.equal((await status).code, 0, errors);
      const [result] = JSON.parse(output.slice(output.indexOf("ready\n") + 6));
      assert.ok(
        result.checkpointed > 0 && result.checkpointed < result.log,
        `a partial checkpoint: ${JSON.stringify(result)}`,
      );
      assert.ok(seen.length >= 20, `read while it ran: ${seen.length}`);
      assert.deepEqual([...new Set(seen)], ["A2"]);
      pin.exec("COMMIT");
    } finally {
      pin.close();
    }
    assert.equal(sqlite3Cli(path, "SELECT x FROM a").stdout, "A2");
  });
});

function deletedShmDescriptors(): number {
  let count = 0;
  for (const entry of Deno.readDirSync("/proc/self/fd")) {
    try {
      const target = Deno.readLinkSync(`/proc/self/fd/${entry.name}`);
      if (target.endsWith("-shm (deleted)")) count++;
    } catch {
      // Closed since the listing.
    }
  }
  return count;
}

Deno.test("an -shm deleted by its last user in another process is closed here at the next WAL open, not kept while the process has the file open", async () => {
  await withDir(async (dir) => {
    const path = join(dir, "churn.db");
    // A connection in a rollback mode keeps the file open here, so closed
    // WAL connections park their -shm descriptors.
    const keeper = await open(path);
    await keeper.exec("CREATE TABLE t(x)");
    try {
      for (let cycle = 0; cycle < 4; cycle++) {
        const wal = await open(path, { journalMode: "wal" });
        await wal.exec("INSERT INTO t VALUES (1)");
        // sqlite3 opens the WAL file too, and is its last user: closing,
        // it checkpoints and deletes -wal and -shm.
        const cli = new Deno.Command("sqlite3", {
          args: [path],
          stdin: "piped",
          stdout: "piped",
        }).spawn();
        const writer = cli.stdin.getWriter();
        await writer.write(
          new TextEncoder().encode("SELECT count(*) FROM t;\n"),
        );
        const reader = cli.stdout.pipeThrough(new TextDecoderStream())
          .getReader();
        assert.equal((await reader.read()).value?.trim(), String(cycle + 1));
        await wal.close();
        await writer.close();
        await reader.cancel();
        assert.equal((await cli.status).code, 0);
        assert.throws(() => Deno.statSync(`${path}-shm`), Deno.errors.NotFound);
        assert.equal(deletedShmDescriptors(), 1, `cycle ${cycle}`);
      }
    } finally {
      await keeper.close();
    }
    assert.equal(deletedShmDescriptors(), 0);
  });
});

Deno.test("a WAL file whose -shm cannot be opened fails to open with the reason, not only 'disk I/O error'", async () => {
  await withDir(async (dir) => {
    const path = join(dir, "blocked.db");
    const setup = sqlite3Cli(
      path,
      "PRAGMA journal_mode=wal; CREATE TABLE t(x); INSERT INTO t VALUES (1)",
    );
    assert.equal(setup.code, 0, setup.stderr);
    await Deno.mkdir(`${path}-shm`);
    await assert.rejects(
      open(path, { journalMode: "wal" }),
      (error: unknown) => {
        assert.ok(error instanceof SqliteError);
        assert.equal(error.code, 4618); // SQLITE_IOERR_SHMOPEN
        assert.equal(
          error.message,
          `disk I/O error: Cannot open the WAL index ${path}-shm: Is a directory (os error 21): open '${path}-shm'`,
        );
        return true;
      },
    );
  });
});
