/**
 * The Deno file driver's cross-process wake-up: an idle `processEvents`
 * learns of another process's enqueue from a watch on the database's files
 * (deno/enqueue_watch.ts), not at its next poll; the watch runs only while
 * the loop waits idle (core/idle_watch.ts).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { type Driver, Outbox, processEvents } from "../mod.ts";
import { type JournalMode, openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { IdleWatch } from "../core/idle_watch.ts";
import { driverMutex } from "../core/transaction.ts";
import { Child } from "./fixtures/vfs_child.ts";
import { loadLibc } from "../deno/libc.ts";

/** Far longer than any wake the test allows: only the watch explains one. */
const POLL_MS = 600_000;
/** How long a handler may take to start after the other process's commit. */
const BOUND_MS = 5_000;

function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  return Promise.race([
    promise,
    new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new Error(`${what}: not within ${ms} ms`)),
        ms,
      );
    }),
  ]).finally(() => clearTimeout(timer));
}

for (
  const journalMode of ["wal", "truncate"] as const satisfies JournalMode[]
) {
  Deno.test(`an idle processEvents starts the handler of another process's enqueue long before its next poll (${journalMode})`, async () => {
    const dir = await Deno.makeTempDir({ prefix: "vfs_wake_" });
    try {
      const path = join(dir, "outbox.db");
      await using outbox = await Outbox.open(
        await openSqliteWasm(path, { journalMode }),
      );
      await using child = new Child("serve", path, journalMode);
      const started = new Map<number, PromiseWithResolvers<void>>();
      const startOf = (n: number) => {
        let entry = started.get(n);
        if (entry === undefined) {
          entry = Promise.withResolvers<void>();
          started.set(n, entry);
        }
        return entry;
      };
      await using _processor = processEvents(outbox, (lease) => {
        startOf((lease.payload as { n: number }).n).resolve();
      }, { pollMinMs: POLL_MS, pollMaxMs: POLL_MS });
      // Three in turn: after the first, the loop waits with nothing left
      // to find but through the watch.
      for (let n = 0; n < 3; n++) {
        await child.send(`enqueue ${JSON.stringify({ n })}`);
        const eventId = await child.json<number>();
        await within(
          startOf(n).promise,
          BOUND_MS,
          `event ${eventId}'s handler`,
        );
      }
      await child.send("exit");
      assert.equal((await child.status()).code, 0);
      const stats = await outbox.stats();
      assert.deepEqual({ done: stats.done, pending: stats.pending }, {
        done: 3,
        pending: 0,
      });
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
}

Deno.test("the idle watch starts once for overlapping waits, stops when the last ends, and for good at close", async () => {
  const calls: string[] = [];
  const watch = new IdleWatch(() => {
    calls.push("start");
    return Promise.resolve(() => {
      calls.push("stop");
      return Promise.resolve();
    });
  });
  const first = watch.begin();
  const second = watch.begin();
  await watch.settled();
  assert.deepEqual(calls, ["start"]);
  first();
  first();
  await watch.settled();
  assert.deepEqual(calls, ["start"]);
  second();
  await watch.settled();
  assert.deepEqual(calls, ["start", "stop"]);
  watch.begin();
  await watch.settled();
  await watch.close();
  assert.deepEqual(calls, ["start", "stop", "start", "stop"]);
  watch.begin();
  await watch.settled();
  assert.deepEqual(calls, ["start", "stop", "start", "stop"]);
});

Deno.test("a watch that fails to start leaves waits and close working, with nothing to stop", async () => {
  let starts = 0;
  const watch = new IdleWatch(() => {
    starts++;
    return Promise.reject(new Error("inotify watch limit reached"));
  });
  const end = watch.begin();
  await watch.settled();
  end();
  await watch.settled();
  await watch.close();
  assert.equal(starts, 1);
});

Deno.test("the watch's read of the counter waits for the connection's turn: none runs inside another call's section on the connection", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vfs_wake_" });
  try {
    const path = join(dir, "outbox.db");
    const driver = await openSqliteWasm(path);
    // The outbox on the watched connection: its calls take the same turn.
    await using _outbox = await Outbox.open(driver);
    await using other = await Outbox.open(await openSqliteWasm(path));
    let inSection = false;
    const readsInSection: string[] = [];
    const query = driver.query.bind(driver);
    driver.query = (sql, params) => {
      if (inSection && sql.includes("outbox_id_floor")) {
        readsInSection.push(sql);
      }
      return query(sql, params);
    };
    let wake = Promise.withResolvers<void>();
    const watch = (driver as Driver).watchEnqueues!;
    const stop = await watch.call(driver, () => wake.resolve());
    try {
      // The first read of a watch looks for what came before it: let it
      // wake once, then wait for another connection's enqueue.
      await within(wake.promise, BOUND_MS, "the first read");
      wake = Promise.withResolvers<void>();
      // A call's section on the connection (as an outbox transaction whose
      // statements await) while another connection enqueues.
      await driverMutex(driver).run(async () => {
        inSection = true;
        await other.enqueue({ n: 1 });
        await new Promise((resolve) => setTimeout(resolve, 500));
        inSection = false;
      });
      await within(wake.promise, BOUND_MS, "the wake after the section");
      assert.deepEqual(readsInSection, []);
    } finally {
      await stop();
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

/**
 * Whether a native process is refused `BEGIN EXCLUSIVE` on `path` now (a
 * lock of this process's is in its way), with no busy timeout.
 */
async function nativeExclusiveRefused(path: string): Promise<boolean> {
  const output = await new Deno.Command("sqlite3", {
    args: [path, "BEGIN EXCLUSIVE; COMMIT;"],
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (output.code === 0) return false;
  const stderr = new TextDecoder().decode(output.stderr);
  assert.match(stderr, /database is locked/);
  return true;
}

Deno.test("a change to the database file while the enqueue watch runs leaves this process's classic POSIX locks on it in force (node:sqlite's, and the VFS's under LEASED_OUTBOX_VFS_LOCKS=posix)", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vfs_wake_" });
  try {
    const path = join(dir, "outbox.db");
    const sentinel = join(dir, "sentinel");
    await Deno.writeTextFile(sentinel, "");
    // A rollback journal that stays (TRUNCATE): the watch has it to watch.
    await using driver = await openSqliteWasm(path, {
      journalMode: "truncate",
    });
    await driver.exec("CREATE TABLE t(x); INSERT INTO t VALUES (1)");
    assert.ok(Deno.statSync(`${path}-journal`).isFile);
    const stop = await (driver as Driver).watchEnqueues!(() => {});
    // Deno's watcher handles events one after another on one thread: once
    // the sentinel's arrives, the database file's change before it was
    // handled too.
    using marks = Deno.watchFs(sentinel, { recursive: false });
    const events = marks[Symbol.asyncIterator]();
    /** Changes the database file, then waits until the watcher saw it. */
    const changeDatabase = async () => {
      const now = new Date();
      await Deno.utime(path, now, now);
      await Deno.writeTextFile(sentinel, "x", { append: true });
      for (;;) {
        const { value, done } = await events.next();
        assert.ok(!done);
        if (value.paths.includes(sentinel)) return;
      }
    };
    try {
      // node:sqlite takes classic POSIX locks whatever the VFS's style
      // (beside the VFS's own classic locks it is not supported: the
      // process's last reader lets go of the process's locks).
      const { DatabaseSync } = await import("node:sqlite");
      const native = loadLibc(path).lockStyle === "ofd"
        ? new DatabaseSync(path)
        : undefined;
      if (native !== undefined) {
        native.exec("BEGIN");
        native.prepare("SELECT count(*) FROM t").get();
        assert.equal(await nativeExclusiveRefused(path), true);
        await changeDatabase();
        assert.equal(
          await nativeExclusiveRefused(path),
          true,
          "node:sqlite's SHARED lock is still held",
        );
        native.exec("COMMIT");
        native.close();
      }
      // The VFS's own lock: classic under LEASED_OUTBOX_VFS_LOCKS=posix.
      await using reader = await openSqliteWasm(path, {
        journalMode: "truncate",
      });
      await reader.exec("BEGIN");
      await reader.query("SELECT count(*) FROM t");
      assert.equal(await nativeExclusiveRefused(path), true);
      await changeDatabase();
      assert.equal(
        await nativeExclusiveRefused(path),
        true,
        "the reader's SHARED lock is still held",
      );
      await reader.exec("COMMIT");
    } finally {
      await stop();
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
