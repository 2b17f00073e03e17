/**
 * WAL through the Deno file VFS: the `-shm` index mapped into WASM memory
 * and shared with other connections, other processes and native SQLite
 * (node:sqlite in this process: vfs_same_process_test.ts).
 * (The crash trials are in vfs_crash_test.ts, the multi-process claim races
 * and the interop soak in vfs_process_test.ts and vfs_interop_test.ts.)
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { DatabaseSync } from "node:sqlite";
import { BusyError, SqliteError } from "../errors.ts";
import { loadSqlite3, openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { lines } from "./fixtures/vfs_child.ts";
import { nativeSql as sqlite3Cli } from "./fixtures/vfs_locks.ts";
import { tempDir } from "./helpers.ts";

/** As `sqlite3Cli`, which must succeed; returns its output. */
function sqlite3Ok(path: string, sql: string): string {
  const { code, stdout, stderr } = sqlite3Cli(path, sql);
  assert.equal(code, 0, stderr);
  return stdout;
}

Deno.test("WAL is shared by connections: a reader keeps its snapshot while a writer commits, one writer at a time, and the last close checkpoints and removes -wal and -shm", async () => {
  await using tmp = await tempDir("vfs_wal_");
  const dir = tmp.path;
  const path = join(dir, "wal.db");
  {
    await using a = await openSqliteWasm(path, { journalMode: "wal" });
    await using b = await openSqliteWasm(path, { journalMode: "wal" });
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
  assert.equal(sqlite3Ok(path, "SELECT sum(x) FROM t"), "1325");
});

Deno.test("the WAL index stays shared after WASM memory grows", async () => {
  await using tmp = await tempDir("vfs_wal_");
  const dir = tmp.path;
  const path = join(dir, "grow.db");
  await using db = await openSqliteWasm(path, { journalMode: "wal" });
  await db.exec("CREATE TABLE t(x INTEGER) STRICT; INSERT INTO t VALUES (1)");
  const sqlite3 = await loadSqlite3();
  const before = sqlite3.wasm.heap8u().length;
  const block = sqlite3.wasm.alloc(before);
  try {
    assert.ok(sqlite3.wasm.heap8u().length > before, "memory grew");
    sqlite3Ok(path, "INSERT INTO t VALUES (2)");
    assert.deepEqual(await db.query("SELECT sum(x) AS s FROM t"), [{
      s: 3,
    }]);
    await db.run("INSERT INTO t VALUES (?)", [4]);
    assert.equal(sqlite3Ok(path, "SELECT sum(x) FROM t"), "7");
  } finally {
    sqlite3.wasm.dealloc(block);
  }
});

Deno.test("a file in WAL mode stays in it when journalMode is unset; asked to leave WAL while in use, opening throws BusyError saying why; alone, it leaves WAL and keeps its rows", async () => {
  await using tmp = await tempDir("vfs_wal_");
  const dir = tmp.path;
  const path = join(dir, "leave.db");
  {
    await using wal = await openSqliteWasm(path, { journalMode: "wal" });
    await wal.exec("CREATE TABLE t(x); INSERT INTO t VALUES (1), (2)");
    await using joined = await openSqliteWasm(path, { busyTimeoutMs: 50 });
    assert.deepEqual(await joined.query("PRAGMA journal_mode"), [{
      journal_mode: "wal",
    }]);
    await joined.run("INSERT INTO t VALUES (3)");
    await assert.rejects(
      openSqliteWasm(path, { journalMode: "truncate", busyTimeoutMs: 50 }),
      (error: unknown) =>
        error instanceof BusyError &&
        /journalMode "truncate": the file is in WAL mode, and leaving WAL needs it alone/
          .test(error.message),
    );
  }
  {
    await using again = await openSqliteWasm(path);
    assert.deepEqual(await again.query("PRAGMA journal_mode"), [{
      journal_mode: "wal",
    }]);
  }
  await using db = await openSqliteWasm(path, { journalMode: "truncate" });
  assert.deepEqual(await db.query("PRAGMA journal_mode"), [{
    journal_mode: "truncate",
  }]);
  assert.deepEqual(await db.query("SELECT count(*) AS n FROM t"), [{
    n: 3,
  }]);
  assert.throws(() => Deno.statSync(`${path}-wal`), Deno.errors.NotFound);
});

for (const asRoot of [false, true]) {
  Deno.test({
    name: asRoot
      ? "as root, a journal, a WAL file and a WAL index take the database file's owner and group, as os_unix does"
      : "a journal, a WAL file and a WAL index take the database file's permission bits, not the umask's",
    ignore: asRoot && Deno.uid() !== 0,
    async fn() {
      await using tmp = await tempDir("vfs_wal_");
      const path = join(tmp.path, "shared.db");
      (await openSqliteWasm(path, { journalMode: "truncate" })).close();
      Deno.chmodSync(path, 0o660);
      if (asRoot) Deno.chownSync(path, 4321, 4322);
      const taken = (file: string) => {
        const info = Deno.statSync(file);
        return asRoot
          ? { uid: info.uid, gid: info.gid }
          : { mode: info.mode! & 0o777 };
      };
      const expected = asRoot ? { uid: 4321, gid: 4322 } : { mode: 0o660 };
      {
        await using db = await openSqliteWasm(path);
        await db.exec("CREATE TABLE t(x); INSERT INTO t VALUES (1)");
        // Truncate mode keeps the journal, empty, between transactions.
        assert.deepEqual(taken(`${path}-journal`), expected);
      }
      await using wal = await openSqliteWasm(path, { journalMode: "wal" });
      await wal.run("INSERT INTO t VALUES (2)");
      assert.deepEqual(taken(`${path}-wal`), expected);
      assert.deepEqual(taken(`${path}-shm`), expected);
    },
  });
}

Deno.test("a WAL index path that is a symbolic link is not followed (as os_unix): the open fails and the link's target is never created", async () => {
  await using tmp = await tempDir("vfs_wal_");
  const dir = tmp.path;
  const path = join(dir, "linked.db");
  sqlite3Ok(path, "PRAGMA journal_mode=wal; CREATE TABLE t(x)");
  Deno.mkdirSync(join(dir, "elsewhere"));
  const target = join(dir, "elsewhere", "authorized_keys");
  Deno.symlinkSync(target, `${path}-shm`);
  await assert.rejects(
    openSqliteWasm(path, { journalMode: "wal" }),
    SqliteError,
  );
  assert.throws(() => Deno.lstatSync(target), Deno.errors.NotFound);
  // Native SQLite refuses it too.
  assert.notEqual(sqlite3Cli(path, "SELECT count(*) FROM t").code, 0);
});

const walChild = fileURLToPath(
  new URL("./fixtures/wal_child.ts", import.meta.url),
);
const config = fileURLToPath(new URL("../deno.json", import.meta.url));
/** The command line that runs tests/fixtures/wal_child.ts, before its arguments. */
const walChildCommand = [
  Deno.execPath(),
  "run",
  "-A",
  "--config",
  config,
  walChild,
];

/**
 * tests/fixtures/wal_child.ts under strace, which injects `fault` (strace's
 * `inject=` syntax, or none when empty) into every `syscall` (one, or a
 * comma-separated list) the child makes
 * on `file` alone, and lists those calls in `traceTo` (with the opening of
 * `mark`, when given). Resolves once the child printed `ready`.
 */
async function straced(
  syscall: string,
  fault: string,
  file: string,
  args: [path: string, synchronous: string, ...statements: string[]],
  traceTo = "/dev/null",
  mark?: string,
) {
  assert.ok(
    Deno.statSync("/usr/bin/strace").isFile,
    "this test needs strace (Debian's strace package; `deno task test` installs it as root)",
  );
  const child = new Deno.Command("strace", {
    args: [
      "-f",
      "-qq",
      "-o",
      traceTo,
      "-e",
      mark === undefined ? `trace=${syscall}` : `trace=${syscall},openat`,
      ...(fault === "" ? [] : ["-e", `inject=${syscall}:${fault}`]),
      "-P",
      file,
      ...(mark === undefined ? [] : ["-P", mark]),
      ...walChildCommand,
      ...args,
    ],
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const output = lines(child.stdout)[Symbol.asyncIterator]();
  let ended = false;
  const status = child.status.finally(() => ended = true);
  assert.equal((await output.next()).value, "ready");
  return {
    get ended() {
      return ended;
    },
    /** Waits for the exit; returns the JSON lines after `ready`. */
    async results(): Promise<Record<string, unknown>[]> {
      const results = [];
      for (let line; !(line = await output.next()).done;) {
        results.push(JSON.parse(line.value));
      }
      const errors = await new Response(child.stderr).text();
      assert.equal((await status).code, 0, errors);
      return results;
    },
  };
}

/**
 * Runs the child once without a fault and lists its writes to `-wal`: all
 * of them, or with `untilMark`, those before a mark after the statements.
 * Returns their count, their sizes and the child's results.
 */
async function walWrites(
  dir: string,
  args: [path: string, synchronous: string, ...statements: string[]],
  untilMark = false,
) {
  const trace = join(dir, "trace");
  const mark = join(dir, "mark");
  const child = await straced(
    "pwrite64",
    "",
    `${args[0]}-wal`,
    untilMark ? [...args, `m:${mark}`] : args,
    trace,
    untilMark ? mark : undefined,
  );
  const results = await child.results();
  const traced = Deno.readTextFileSync(trace).split("\n");
  const end = untilMark
    ? traced.findIndex((line) => line.includes(mark))
    : traced.length;
  const sizes = traced.slice(0, end)
    .filter((line) => line.includes("pwrite64("))
    .map((line) => Number(/= (\d+)$/.exec(line)![1]));
  return { writes: sizes.length, sizes, results };
}

/**
 * A WAL file where a reader's snapshot (after A2, before B2) lets a
 * checkpoint copy a's page but not b's: the checkpoint is partial, the WAL
 * stays, and readers decide by the index whether a's page is in the file
 * yet. Returns the reader that pins it.
 */
function partialCheckpointSetup(path: string): DatabaseSync {
  sqlite3Ok(
    path,
    "PRAGMA journal_mode=wal; CREATE TABLE a(x); CREATE TABLE b(x); INSERT INTO a VALUES ('A1'); INSERT INTO b VALUES ('B1'); PRAGMA wal_checkpoint(TRUNCATE);",
  );
  const pin = new DatabaseSync(path);
  // Read first, so its -shm keeps the WAL from the CLI's checkpoint on close.
  pin.prepare("SELECT x FROM a").get();
  sqlite3Ok(path, "UPDATE a SET x = 'A2'");
  pin.exec("BEGIN");
  pin.prepare("SELECT x FROM b").get();
  sqlite3Ok(path, "UPDATE b SET x = 'B2'");
  return pin;
}

Deno.test("a partial checkpoint writes its pages to the database file before it tells other processes to read them there (its pwrite held 1 s by strace)", async () => {
  await using tmp = await tempDir("vfs_wal_");
  const dir = tmp.path;
  const path = join(dir, "ckpt.db");
  const pin = partialCheckpointSetup(path);
  try {
    const child = await straced("pwrite64", "delay_enter=1000000", path, [
      path,
      "full",
      "q:PRAGMA wal_checkpoint(PASSIVE)",
    ]);
    const seen: string[] = [];
    while (!child.ended) {
      const reader = new DatabaseSync(path);
      try {
        seen.push(String(reader.prepare("SELECT x FROM a").get()?.x));
      } finally {
        reader.close();
      }
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    const [checkpoint] = await child.results();
    const [result] = checkpoint!.rows as Record<string, number>[];
    assert.ok(
      result!.checkpointed! > 0 && result!.checkpointed! < result!.log!,
      `a partial checkpoint: ${JSON.stringify(result)}`,
    );
    assert.ok(seen.length >= 20, `read while it ran: ${seen.length}`);
    assert.deepEqual([...new Set(seen)], ["A2"]);
    pin.exec("COMMIT");
  } finally {
    pin.close();
  }
  assert.equal(sqlite3Ok(path, "SELECT x FROM a"), "A2");
});

Deno.test("a partial checkpoint whose database write fails stops there: no commit is lost (EIO injected by strace)", async () => {
  await using tmp = await tempDir("vfs_wal_");
  const dir = tmp.path;
  const path = join(dir, "ckpt_eio.db");
  const pin = partialCheckpointSetup(path);
  try {
    const child = await straced("pwrite64", "error=EIO", path, [
      path,
      "full",
      "q:PRAGMA wal_checkpoint(PASSIVE)",
      "q:SELECT x FROM a",
    ]);
    const [checkpoint, after] = await child.results();
    assert.match(String(checkpoint!.error), /disk I\/O error/);
    assert.deepEqual(after!.rows, [{ x: "A2" }]);
    assert.deepEqual({ ...pin.prepare("SELECT x FROM a").get() }, {
      x: "A2",
    });
    pin.exec("COMMIT");
  } finally {
    pin.close();
  }
  assert.deepEqual(
    sqlite3Ok(
      path,
      "PRAGMA wal_checkpoint(TRUNCATE); SELECT x FROM a; SELECT x FROM b; PRAGMA integrity_check;",
    ).split("\n").slice(1),
    ["A2", "B2", "ok"],
  );
});

for (const synchronous of ["off", "normal"]) {
  Deno.test(`synchronous ${synchronous}: a commit whose WAL write fails fails, and every process goes on reading the last commit (ENOSPC injected by strace)`, async () => {
    await using tmp = await tempDir("vfs_wal_");
    const dir = tmp.path;
    const path = join(dir, `commit_${synchronous}.db`);
    sqlite3Ok(
      path,
      "PRAGMA journal_mode=wal; CREATE TABLE a(x); INSERT INTO a VALUES ('A0'); PRAGMA wal_checkpoint(TRUNCATE);",
    );
    const pin = new DatabaseSync(path);
    try {
      pin.prepare("SELECT x FROM a").get();
      sqlite3Ok(path, "UPDATE a SET x = 'OLD-1'");
      sqlite3Ok(path, "UPDATE a SET x = 'A2'");
      if (synchronous === "off") {
        // All backfilled: the next commit starts the WAL over from its
        // first frame, over OLD-1's.
        sqlite3Ok(path, "PRAGMA wal_checkpoint");
      }
      const child = await straced("pwrite64", "error=ENOSPC", `${path}-wal`, [
        path,
        synchronous,
        "e:UPDATE a SET x = 'A3'",
        "q:SELECT x FROM a",
      ]);
      const [commit, after] = await child.results();
      assert.match(String(commit!.error), /database or disk is full/);
      assert.deepEqual(after!.rows, [{ x: "A2" }]);
      assert.deepEqual({ ...pin.prepare("SELECT x FROM a").get() }, {
        x: "A2",
      });
    } finally {
      pin.close();
    }
    assert.deepEqual(
      sqlite3Ok(path, "SELECT x FROM a; PRAGMA integrity_check").split("\n"),
      ["A2", "ok"],
    );
  });
}

/**
 * 40 rows of 3,000 bytes in a checkpointed WAL file, and a transaction that
 * spills a page (a cache of 2 pages) and then changes it again, so that at
 * its commit SQLite rewrites the checksums in the headers of the frames
 * after it, the commit frame's last.
 */
function rewrittenChecksumsSetup(
  path: string,
): [string, string, ...string[]] {
  sqlite3Ok(
    path,
    "PRAGMA journal_mode=wal; CREATE TABLE t(id INTEGER PRIMARY KEY, b BLOB); WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 40) INSERT INTO t SELECT i, randomblob(3000) FROM c; PRAGMA wal_checkpoint(TRUNCATE);",
  );
  return [
    path,
    "normal",
    "e:PRAGMA cache_size=2",
    "e:BEGIN; UPDATE t SET b = randomblob(3000) WHERE id <= 20; UPDATE t SET b = randomblob(3000) WHERE id = 1; UPDATE t SET b = zeroblob(3001) WHERE id = 40; COMMIT",
    "q:SELECT length(b) AS n FROM t WHERE id = 40",
  ];
}

Deno.test("synchronous normal: a commit whose checksums SQLite rewrites fails if the last rewrite's write fails, and nothing of it is seen or lost (EIO injected by strace on that write)", async () => {
  await using tmp = await tempDir("vfs_wal_");
  const dir = tmp.path;
  // The same run twice on fresh files: the first counts the writes to
  // -wal, the second fails the last of them.
  const counted = join(dir, "counted.db");
  const { writes, results: [, committed] } = await walWrites(
    dir,
    rewrittenChecksumsSetup(counted),
  );
  assert.deepEqual(committed, { rows: [] });
  assert.ok(writes > 2, `writes to -wal: ${writes}`);

  const path = join(dir, "failed.db");
  const child = await straced(
    "pwrite64",
    `error=EIO:when=${writes}`,
    `${path}-wal`,
    rewrittenChecksumsSetup(path),
  );
  const [, commit, after] = await child.results();
  // Failed, and the connection reads on (a WAL's failed write does not
  // leave the connection failing until reopened).
  assert.match(String(commit!.error), /disk I\/O error/);
  assert.deepEqual(after, { rows: [{ n: 3000 }] });
  assert.deepEqual(
    sqlite3Ok(
      path,
      "SELECT length(b) FROM t WHERE id = 40; PRAGMA integrity_check",
    ).split("\n"),
    ["3000", "ok"],
  );
});

Deno.test("each WAL frame reaches the file in one write, its header with its page, the first frame of a commit too; a checksum rewrite writes the header alone", async () => {
  await using tmp = await tempDir("vfs_wal_");
  const dir = tmp.path;
  const sizes = async (args: [string, string, ...string[]]) => {
    const { sizes, results } = await walWrites(dir, args);
    for (const result of results) assert.equal(result.error, undefined);
    return sizes;
  };
  const path = join(dir, "frames.db");
  sqlite3Ok(
    path,
    "PRAGMA journal_mode=wal; CREATE TABLE t(id INTEGER PRIMARY KEY, b BLOB); PRAGMA wal_checkpoint(TRUNCATE);",
  );
  const [header, ...frames] = await sizes([
    path,
    "full",
    "e:WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 50) INSERT INTO t SELECT i, randomblob(3000) FROM c",
  ]);
  assert.equal(header, 32);
  // The first frame too, though it follows the header's sync, not a write
  // (and a commit's first frame follows the write lock): one pwrite per
  // frame, not two.
  assert.ok(frames.length >= 50, `frames: ${frames.length}`);
  assert.deepEqual(new Set(frames), new Set([24 + 4096]));

  // The headers SQLite rewrites after a commit frame (the last 20 writes
  // here) follow a read of their frame, not a write: each is written at
  // once, alone.
  const rewritten = await sizes(rewrittenChecksumsSetup(join(dir, "re.db")));
  assert.deepEqual(new Set(rewritten.slice(-20)), new Set([24]));
  assert.equal(sqlite3Ok(join(dir, "re.db"), "PRAGMA integrity_check"), "ok");
});

Deno.test("after a WAL write fails with ENOSPC in a spilling transaction, that transaction fails whole and the connection reads and writes on", async () => {
  await using tmp = await tempDir("vfs_wal_");
  const dir = tmp.path;
  const path = join(dir, "spill.db");
  sqlite3Ok(
    path,
    "PRAGMA page_size=65536; PRAGMA journal_mode=wal; CREATE TABLE t(id INTEGER PRIMARY KEY, b BLOB); WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 40) INSERT INTO t SELECT i, randomblob(3000) FROM c; PRAGMA wal_checkpoint(TRUNCATE);",
  );
  // The first write to -wal is its header (synced on its own after the
  // WAL starts over); the second, the insert's first spilled frames.
  const child = await straced(
    "pwrite64",
    "error=ENOSPC:when=2",
    `${path}-wal`,
    [
      path,
      "normal",
      "e:PRAGMA cache_size=3",
      "e:WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 300) INSERT INTO t SELECT 100 + i, randomblob(3000) FROM c",
      "q:SELECT count(*) AS n FROM t",
      "e:UPDATE t SET b = zeroblob(11) WHERE id = 2",
      "q:SELECT length(b) AS n FROM t WHERE id = 2",
    ],
  );
  const [, insert, count, update, length] = await child.results();
  assert.match(String(insert!.error), /database or disk is full/);
  assert.deepEqual(count, { rows: [{ n: 40 }] });
  assert.deepEqual(update, { rows: [] });
  assert.deepEqual(length, { rows: [{ n: 11 }] });
  assert.deepEqual(
    sqlite3Ok(
      path,
      "SELECT count(*) FROM t; PRAGMA integrity_check",
    ).split("\n"),
    ["40", "ok"],
  );
});

Deno.test("a spilled frame whose write fails fails its own transaction, not another connection's call, and no commit has a hole (ENOSPC injected by strace on the write after the spill)", async () => {
  await using tmp = await tempDir("vfs_wal_");
  const dir = tmp.path;
  const setup = (path: string) => {
    sqlite3Ok(
      path,
      "PRAGMA journal_mode=wal; CREATE TABLE t(id INTEGER PRIMARY KEY, b BLOB); CREATE TABLE u(id INTEGER PRIMARY KEY, b BLOB); INSERT INTO u VALUES (1, 'x'), (2, 'y'); PRAGMA wal_checkpoint(TRUNCATE);",
    );
  };
  // A transaction that spills (a cache of 2 pages), then another
  // connection of the process reads, then the commit.
  const statements = [
    "e:PRAGMA cache_size=2",
    "Q:SELECT count(*) AS n FROM u",
    "e:BEGIN",
    "e:WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 200) INSERT INTO t SELECT i, randomblob(1000) FROM c",
  ];
  // A first run counts the writes to -wal until the insert returned (a
  // mark); the second fails the next one.
  const counted = join(dir, "counted.db");
  setup(counted);
  const { writes } = await walWrites(
    dir,
    [counted, "full", ...statements],
    true,
  );
  assert.ok(writes > 0, `writes to -wal: ${writes}`);

  const path = join(dir, "spilled.db");
  setup(path);
  const child = await straced(
    "pwrite64",
    `error=ENOSPC:when=${writes + 1}`,
    `${path}-wal`,
    [
      path,
      "full",
      ...statements,
      "Q:SELECT count(*) AS n FROM u",
      "e:COMMIT",
      "q:SELECT count(*) AS n FROM t",
    ],
  );
  const results = await child.results();
  const [other, commit, rows] = results.slice(4);
  // The other connection's read has nothing to do with the failed write.
  assert.deepEqual(other, { rows: [{ n: 2 }] }, JSON.stringify(results));
  // All or nothing: committed with its 200 rows, or failed with none.
  const n = commit!.error === undefined ? 200 : 0;
  assert.deepEqual(rows, { rows: [{ n }] }, JSON.stringify(results));
  assert.deepEqual(
    sqlite3Ok(
      path,
      "SELECT count(*) FROM t; PRAGMA integrity_check",
    ).split("\n"),
    [String(n), "ok"],
  );
});

Deno.test("readers never wait for a writer whose WAL write is slow (synchronous normal, the write held 3 s by strace)", async () => {
  await using tmp = await tempDir("vfs_wal_");
  const dir = tmp.path;
  const path = join(dir, "slow.db");
  sqlite3Ok(
    path,
    "PRAGMA journal_mode=wal; CREATE TABLE a(x); INSERT INTO a VALUES ('A1'); PRAGMA wal_checkpoint(TRUNCATE);",
  );
  await using reader = await openSqliteWasm(path, { journalMode: "wal" });
  await reader.query("SELECT x FROM a");
  sqlite3Ok(path, "UPDATE a SET x = 'A2'");
  const child = await straced(
    "pwrite64",
    "delay_enter=3000000",
    `${path}-wal`,
    [
      path,
      "normal",
      "e:UPDATE a SET x = 'A3'",
      "q:SELECT x FROM a",
    ],
  );
  let slowest = 0;
  const seen = new Set<string>();
  let reads = 0;
  while (!child.ended) {
    const started = performance.now();
    const [row] = await reader.query("SELECT x FROM a");
    slowest = Math.max(slowest, performance.now() - started);
    seen.add(String(row?.x));
    reads++;
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  const [commit, after] = await child.results();
  assert.deepEqual(commit, { rows: [] });
  assert.deepEqual(after!.rows, [{ x: "A3" }]);
  assert.ok(reads >= 10, `reads while it ran: ${reads}`);
  assert.ok(slowest < 1_500, `the slowest read took ${slowest} ms`);
  assert.ok(seen.has("A2"), [...seen].join());
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
  await using tmp = await tempDir("vfs_wal_");
  const dir = tmp.path;
  const path = join(dir, "churn.db");
  // A connection in a rollback mode keeps the file open here, so closed
  // WAL connections park their -shm descriptors.
  const keeper = await openSqliteWasm(path, { journalMode: "truncate" });
  await keeper.exec("CREATE TABLE t(x)");
  try {
    for (let cycle = 0; cycle < 4; cycle++) {
      const wal = await openSqliteWasm(path, { journalMode: "wal" });
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

Deno.test("a WAL file whose -shm cannot be opened fails to open with the reason, not only 'disk I/O error'", async () => {
  await using tmp = await tempDir("vfs_wal_");
  const dir = tmp.path;
  const path = join(dir, "blocked.db");
  sqlite3Ok(
    path,
    "PRAGMA journal_mode=wal; CREATE TABLE t(x); INSERT INTO t VALUES (1)",
  );
  await Deno.mkdir(`${path}-shm`);
  await assert.rejects(
    openSqliteWasm(path, { journalMode: "wal" }),
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

Deno.test("a journal swapped for a link to another file just after the VFS created it leaves that file's mode alone: the database's mode is given through the descriptor (strace holds the create 1 s)", async () => {
  await using tmp = await tempDir("vfs_wal_");
  const dir = tmp.path;
  const path = join(dir, "swap.db");
  sqlite3Ok(path, "CREATE TABLE t(x)");
  Deno.chmodSync(path, 0o600);
  const victim = join(dir, "victim");
  Deno.writeTextFileSync(victim, "keep");
  Deno.chmodSync(victim, 0o644);
  const journal = `${path}-journal`;
  const child = await straced("openat", "delay_exit=1000000", journal, [
    path,
    "full",
    "e:PRAGMA journal_mode=delete",
    "e:INSERT INTO t VALUES (1)",
    "q:SELECT count(*) AS n FROM t",
  ]);
  // The journal exists from the moment the kernel created it, while the
  // child still waits in that openat.
  const exists = () => {
    try {
      Deno.lstatSync(journal);
      return true;
    } catch {
      return false;
    }
  };
  while (!exists()) await new Promise((resolve) => setTimeout(resolve, 5));
  Deno.renameSync(journal, join(dir, "moved-journal"));
  Deno.symlinkSync(victim, journal);
  const [mode, insert, count] = await child.results();
  assert.deepEqual([mode, insert, count], [
    { rows: [] },
    { rows: [] },
    { rows: [{ n: 1 }] },
  ]);
  assert.equal(Deno.statSync(victim).mode! & 0o777, 0o644);
  assert.equal(Deno.readTextFileSync(victim), "keep");
});

for (const file of ["-journal", "-shm"]) {
  Deno.test(`a ${file} whose chmod and chown fail opens all the same, as with os_unix (EPERM injected by strace)`, async () => {
    await using tmp = await tempDir("vfs_wal_");
    const path = join(tmp.path, "denied.db");
    sqlite3Ok(path, "CREATE TABLE t(x)");
    Deno.chmodSync(path, 0o600);
    const child = await straced(
      "chmod,fchmod,fchmodat,chown,fchown,fchownat,lchown",
      "error=EPERM",
      `${path}${file}`,
      [
        path,
        "full",
        ...file === "-journal" ? ["e:PRAGMA journal_mode=delete"] : [],
        "e:INSERT INTO t VALUES (1)",
        "q:SELECT count(*) AS n FROM t",
      ],
    );
    const results = await child.results();
    assert.deepEqual(results.at(-1), { rows: [{ n: 1 }] });
    assert.ok(results.every((result) => result.error === undefined));
  });
}

Deno.test("a journal write that fails fails the statement that made it, at once, and never a call on another database (ENOSPC injected by strace on the journal)", async () => {
  await using tmp = await tempDir("vfs_wal_");
  const a = join(tmp.path, "a.db");
  const b = join(tmp.path, "b.db");
  for (const path of [a, b]) {
    sqlite3Ok(path, "CREATE TABLE t(v INTEGER); INSERT INTO t VALUES (1)");
  }
  // The child's first connection is b's (WAL); a's, opened second, keeps
  // a rollback journal.
  const child = await straced("pwrite64", "error=ENOSPC", `${a}-journal`, [
    b,
    "full",
    `O:${a}`,
    "o:BEGIN",
    "o:UPDATE t SET v = v + 1 RETURNING v",
    "q:SELECT count(*) AS n FROM t",
    "e:INSERT INTO t VALUES (2)",
    "o:COMMIT",
    "o:SELECT v FROM t",
  ]);
  const [open, begin, update, count, insert, commit, after] = await child
    .results();
  assert.deepEqual([open, begin], [{ rows: [] }, { rows: [] }]);
  // SQLite rolled the transaction back on the full disk.
  assert.deepEqual([update, commit], [
    { error: "database or disk is full" },
    { error: "cannot commit - no transaction is active" },
  ]);
  assert.deepEqual([count, insert], [{ rows: [{ n: 1 }] }, { rows: [] }]);
  assert.deepEqual(after, { rows: [{ v: 1 }] });
  assert.equal(
    sqlite3Ok(a, "SELECT v FROM t; PRAGMA integrity_check"),
    "1\nok",
  );
  assert.equal(
    sqlite3Ok(b, "SELECT count(*) FROM t; PRAGMA integrity_check"),
    "2\nok",
  );
});

Deno.test("each rollback-journal record reaches the journal in one write (page number, page, checksum), page 1's at the commit too", async () => {
  await using tmp = await tempDir("vfs_wal_");
  const a = join(tmp.path, "a.db");
  sqlite3Ok(
    a,
    "CREATE TABLE t(v INTEGER); INSERT INTO t SELECT value FROM generate_series(1, 2000)",
  );
  const trace = join(tmp.path, "trace");
  const child = await straced("pwrite64", "", `${a}-journal`, [
    join(tmp.path, "b.db"),
    "full",
    `O:${a}`,
    "o:UPDATE t SET v = v + 1",
  ], trace);
  assert.deepEqual((await child.results()).slice(1), [{ rows: [] }]);
  const sizes = Deno.readTextFileSync(trace).split("\n")
    .filter((line) => line.includes("pwrite64("))
    .map((line) => Number(/= (\d+)$/.exec(line)![1]));
  // The header, a record for each page the UPDATE changed and for page 1
  // (the change counter, journalled after the EXCLUSIVE lock), then the
  // header's record count.
  const records = sizes.filter((size) => size === 4096 + 8).length;
  assert.ok(records > 2, sizes.join(" "));
  assert.deepEqual(sizes, [512, ...Array(records).fill(4096 + 8), 12]);
  assert.equal(
    sqlite3Ok(a, "SELECT sum(v) FROM t; PRAGMA integrity_check"),
    `${2000 * 2001 / 2 + 2000}\nok`,
  );
});

Deno.test("a rollback-journal record written at the commit (page 1's) whose write fails fails the COMMIT, and nothing is lost (ENOSPC injected by strace on that write)", async () => {
  await using tmp = await tempDir("vfs_wal_");
  const a = join(tmp.path, "a.db");
  sqlite3Ok(a, "CREATE TABLE t(v INTEGER); INSERT INTO t VALUES (1)");
  // The journal's writes: its header, t's page, then page 1's record at
  // the commit.
  const child = await straced(
    "pwrite64",
    "error=ENOSPC:when=3",
    `${a}-journal`,
    [
      join(tmp.path, "b.db"),
      "full",
      `O:${a}`,
      "o:BEGIN",
      "o:UPDATE t SET v = 2",
      "o:COMMIT",
      "o:SELECT v FROM t",
      "o:UPDATE t SET v = 3",
    ],
  );
  const [, begin, update, commit, read, again] = await child.results();
  assert.deepEqual([begin, update], [{ rows: [] }, { rows: [] }]);
  assert.deepEqual(commit, { error: "database or disk is full" });
  // SQLite rolled the transaction back on the full disk; the connection
  // goes on, and its next write commits.
  assert.deepEqual([read, again], [{ rows: [{ v: 1 }] }, { rows: [] }]);
  assert.equal(
    sqlite3Ok(a, "SELECT v FROM t; PRAGMA integrity_check"),
    "3\nok",
  );
});

Deno.test("synchronous off, journal_mode delete: a commit whose database writes fail fails, and nothing committed is lost (ENOSPC injected by strace on the database)", async () => {
  await using tmp = await tempDir("vfs_wal_");
  const a = join(tmp.path, "a.db");
  sqlite3Ok(a, "CREATE TABLE t(v INTEGER); INSERT INTO t VALUES (1)");
  const child = await straced("pwrite64", "error=ENOSPC", a, [
    join(tmp.path, "b.db"),
    "off",
    `O:${a}`,
    "o:PRAGMA journal_mode=delete",
    "o:INSERT INTO t VALUES (2), (3), (4)",
    "o:SELECT count(*) AS n FROM t",
  ]);
  const [, mode, insert, count] = await child.results();
  assert.deepEqual(mode, { rows: [{ journal_mode: "delete" }] });
  assert.deepEqual(insert, { error: "database or disk is full" });
  // The journal stayed, hot: rolling it back writes the database too.
  assert.deepEqual(count, { error: "database or disk is full" });
  assert.equal(
    sqlite3Ok(a, "SELECT count(*) FROM t; PRAGMA integrity_check"),
    "1\nok",
  );
});

for (const file of ["-journal", "-wal"]) {
  Deno.test(`a ${file} path that is a symbolic link is not followed (as os_unix): writing fails and the link's target stays empty`, async () => {
    await using tmp = await tempDir("vfs_wal_");
    const path = join(tmp.path, "linked.db");
    sqlite3Ok(path, "CREATE TABLE t(x TEXT)");
    const loot = join(tmp.path, "loot");
    Deno.writeTextFileSync(loot, "");
    Deno.symlinkSync(loot, `${path}${file}`);
    await assert.rejects(
      (async () => {
        await using db = await openSqliteWasm(path, {
          journalMode: file === "-wal" ? "wal" : "truncate",
        });
        await db.run("INSERT INTO t VALUES (?)", ["secret"]);
      })(),
      SqliteError,
    );
    assert.equal(Deno.readTextFileSync(loot), "");
    // Native SQLite refuses it too.
    assert.notEqual(sqlite3Cli(path, "INSERT INTO t VALUES ('x')").code, 0);
  });
}

Deno.test("a journal is created with the database file's permission bits, never first with the umask's (strace lists the create)", async () => {
  await using tmp = await tempDir("vfs_wal_");
  const path = join(tmp.path, "private.db");
  sqlite3Ok(path, "CREATE TABLE t(v INTEGER)");
  Deno.chmodSync(path, 0o600);
  const trace = join(tmp.path, "trace");
  const child = await straced("openat", "", `${path}-journal`, [
    join(tmp.path, "other.db"),
    "full",
    `O:${path}`,
    "o:INSERT INTO t VALUES (1)",
  ], trace);
  assert.deepEqual((await child.results()).at(-1), { rows: [] });
  const creates = Deno.readTextFileSync(trace).split("\n")
    .filter((line) => line.includes("O_CREAT"));
  assert.equal(creates.length, 1, creates.join("\n"));
  assert.match(creates[0]!, /O_EXCL\|O_NOFOLLOW.*, 0600\) = \d+$/);
});

Deno.test("a -wal and a -shm are created with the database file's permission bits too (strace lists the creates)", async () => {
  await using tmp = await tempDir("vfs_wal_");
  const path = join(tmp.path, "private.db");
  sqlite3Ok(path, "PRAGMA journal_mode=wal; CREATE TABLE t(v INTEGER)");
  Deno.chmodSync(path, 0o600);
  for (const file of ["-wal", "-shm"]) {
    const trace = join(tmp.path, `trace${file}`);
    const child = await straced("openat", "", `${path}${file}`, [
      path,
      "full",
      "e:INSERT INTO t VALUES (1)",
    ], trace);
    assert.deepEqual((await child.results()).at(-1), { rows: [] });
    const creates = Deno.readTextFileSync(trace).split("\n")
      .filter((line) => line.includes("O_CREAT"));
    assert.ok(creates.length > 0, file);
    for (const line of creates) assert.match(line, /, 0600\) = \d+$/);
  }
});

Deno.test("a super-journal's directory entry is synced before the commit relies on it, as os_unix does (strace lists the syncs)", async () => {
  await using tmp = await tempDir("vfs_wal_");
  const a = join(tmp.path, "a.db");
  const c = join(tmp.path, "c.db");
  sqlite3Ok(a, "CREATE TABLE t(v INTEGER)");
  sqlite3Ok(c, "CREATE TABLE u(v INTEGER)");
  const trace = join(tmp.path, "trace");
  const commit = [
    "o:BEGIN",
    "o:INSERT INTO t VALUES (1)",
    "o:INSERT INTO c.u VALUES (1)",
    "o:COMMIT",
  ];
  const { code } = await new Deno.Command("strace", {
    args: [
      "-f",
      "-qq",
      "-o",
      trace,
      "-e",
      "trace=openat,fsync,unlink",
      ...walChildCommand,
      join(tmp.path, "other.db"),
      "full",
      `O:${a}`,
      `o:ATTACH '${c}' AS c`,
      "o:PRAGMA c.journal_mode=truncate",
      // The first commit creates both journals; the second finds them.
      ...commit,
      ...commit,
    ],
    stdout: "null",
  }).output();
  assert.equal(code, 0);
  const lines = Deno.readTextFileSync(trace).split("\n");
  const created = lines.findLastIndex((line) =>
    line.includes("-mj") && line.includes("O_CREAT")
  );
  const removed = lines.findLastIndex((line) =>
    line.includes("unlink(") && line.includes("-mj")
  );
  assert.ok(0 <= created && created < removed);
  assert.ok(
    lines.slice(created, removed).some((line) => line.includes("fsync(")),
    lines.slice(created, removed + 1).join("\n"),
  );
  assert.equal(sqlite3Ok(c, "SELECT count(*) FROM u"), "2");
});

/**
 * Runs `body` in a child process, after an import of `openSqliteWasm`, as
 * `<dir>/child.ts` with Deno's `flags` (its permissions) and `args`, and
 * returns the JSON it prints.
 */
async function permissionChild(
  dir: string,
  body: string,
  flags: readonly string[],
  args: readonly string[],
) {
  const script = join(dir, "child.ts");
  Deno.writeTextFileSync(
    script,
    `import { openSqliteWasm } from ${
      JSON.stringify(new URL("../deno/sqlite_wasm.ts", import.meta.url).href)
    };
${body}
`,
  );
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--no-prompt", ...flags, "--config", config, script, ...args],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const decoder = new TextDecoder();
  assert.equal(output.code, 0, decoder.decode(output.stderr));
  return JSON.parse(decoder.decode(output.stdout));
}

for (const journalMode of ["truncate", "delete", "wal"]) {
  Deno.test(`journalMode ${journalMode}: a connection's journal keeps the permission it had when the connection opened, as the database file does; a connection opened after write permission is revoked cannot write`, async () => {
    await using tmp = await tempDir("vfs_wal_");
    const path = join(tmp.path, "a.db");
    sqlite3Ok(path, "CREATE TABLE t(x INTEGER)");
    const { kept, later, rows } = await permissionChild(
      tmp.path,
      `const [path, journalMode] = Deno.args;
await using a = await openSqliteWasm(path, { journalMode });
await a.run("INSERT INTO t VALUES (1)");
Deno.permissions.revokeSync({ name: "write" });
let kept = "ok";
try { await a.run("INSERT INTO t VALUES (2)"); } catch (error) { kept = error.message; }
let later = "ok";
try {
  await using b = await openSqliteWasm(path, { journalMode });
  await b.run("INSERT INTO t VALUES (3)");
} catch (error) { later = error.message; }
console.log(JSON.stringify({ kept, later, rows: await a.query("SELECT x FROM t ORDER BY x") }));`,
      ["-A"],
      [path, journalMode],
    );
    assert.deepEqual([kept, rows], ["ok", [{ x: 1 }, { x: 2 }]]);
    assert.match(
      later,
      /^unable to open database file: Requires write access to ".*a\.db"/,
    );
  });
}

Deno.test("a connection opened after the journal's write permission was revoked cannot write, though a connection opened before it is still open (the journal's permission is the connection's, not the path's)", async () => {
  await using tmp = await tempDir("vfs_wal_");
  const path = join(tmp.path, "a.db");
  sqlite3Ok(path, "CREATE TABLE t(x INTEGER)");
  const outcomes = await permissionChild(
    tmp.path,
    `const [path] = Deno.args;
const write = async (db, x) => {
  try { await db.run("INSERT INTO t VALUES (?)", [x]); return "ok"; } catch (error) { return error.message; }
};
const a = await openSqliteWasm(path, { journalMode: "delete" });
Deno.permissions.revokeSync({ name: "write", path: path + "-journal" });
const b = await openSqliteWasm(path, { journalMode: "delete" });
const whileBoth = await write(b, 1);
await a.close();
const alone = await write(b, 2);
await b.close();
console.log(JSON.stringify({ whileBoth, alone }));`,
    ["--allow-read", "--allow-ffi", `--allow-write=${path},${path}-journal`],
    [path],
  );
  // The journal's open is refused (Deno's permission for it), whether or
  // not the connection opened before the revocation is still open.
  const refused =
    `unable to open database file: Requires write access to "${path}-journal", run again with the --allow-write flag`;
  assert.deepEqual(outcomes, { whileBoth: refused, alone: refused });
  assert.equal(sqlite3Ok(path, "SELECT count(*) FROM t"), "0");
});

for (const length of [245, 250]) {
  Deno.test(`a database whose file name is ${length} bytes long opens and reads, its sidecar names being longer than the file system allows (ENAMETOOLONG is absent, as in os_unix)${length === 245 ? ", and writes" : ""}`, async () => {
    await using tmp = await tempDir("vfs_wal_");
    const path = join(tmp.path, `${"a".repeat(length - 3)}.db`);
    // Made under a short name: at 250 the journal's name is too long for
    // the CLI too.
    const short = join(tmp.path, "short.db");
    sqlite3Ok(short, "CREATE TABLE t(x INTEGER); INSERT INTO t VALUES (1)");
    Deno.renameSync(short, path);
    await using db = await openSqliteWasm(path, { journalMode: "truncate" });
    assert.deepEqual(await db.query("SELECT x FROM t"), [{ x: 1 }]);
    if (length === 245) {
      await db.run("INSERT INTO t VALUES (2)");
      assert.equal(sqlite3Ok(path, "SELECT count(*) FROM t"), "2");
    } else {
      // Its journal's name is too long to create: writing fails, and
      // nothing is written.
      await assert.rejects(
        () => db.run("INSERT INTO t VALUES (2)"),
        /unable to open database file/,
      );
      assert.equal(sqlite3Ok(path, "SELECT count(*) FROM t"), "1");
    }
  });
}

for (const journalMode of ["truncate", "delete"]) {
  Deno.test(`journalMode ${journalMode}: with write permission for the database file alone, a write fails before anything is written, and no journal is left (Deno's permissions hold for journals too)`, async () => {
    await using tmp = await tempDir("vfs_wal_");
    const path = join(tmp.path, "a.db");
    sqlite3Ok(path, "CREATE TABLE t(x INTEGER)");
    const { insert, rows } = await permissionChild(
      tmp.path,
      `await using db = await openSqliteWasm(Deno.args[0], { journalMode: Deno.args[1] });
let insert = "ok";
try { await db.run("INSERT INTO t VALUES (1)"); } catch (error) { insert = error.message; }
console.log(JSON.stringify({ insert, rows: await db.query("SELECT count(*) AS n FROM t") }));`,
      ["--allow-ffi", "--allow-read", `--allow-write=${path}`],
      [path, journalMode],
    );
    // SQLite says only the first part; the VFS says why.
    assert.equal(
      insert,
      `unable to open database file: Requires write access to "${path}-journal", run again with the --allow-write flag`,
    );
    assert.deepEqual(rows, [{ n: 0 }]);
    assert.deepEqual(
      [...Deno.readDirSync(tmp.path)].map((entry) => entry.name).sort(),
      ["a.db", "child.ts"],
    );
  });
}
