/**
 * Busy waits on the Deno file VFS: a refused writer waits in line and is
 * woken when the lock is let go, a writer that keeps beginning transactions
 * lets it in after a few, a writer that stops asking leaves the line, and a
 * wait never keeps a process alive. Real time is the subject here.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { BusyError } from "../errors.ts";
import { openSqliteWasm, type SqliteWasmDriver } from "../sqlite_wasm_deno.ts";

// A new connection's first wait starts its worker thread; this is far longer
// than that takes.
const WORKER_START_MS = 1_000;

async function withConnections(
  count: number,
  fn: (drivers: SqliteWasmDriver[], path: string) => Promise<void>,
): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "vfs_wait_" });
  const path = join(dir, "wait.db");
  const drivers: SqliteWasmDriver[] = [];
  try {
    for (let i = 0; i < count; i++) {
      drivers.push(await openSqliteWasm(path, { synchronous: "off" }));
    }
    await drivers[0]!.exec("CREATE TABLE t(x INTEGER) STRICT");
    await fn(drivers, path);
  } finally {
    for (const driver of drivers) await driver.close();
    await Deno.remove(dir, { recursive: true });
  }
}

/**
 * A refused BEGIN, one wait in line (which starts the connection's worker),
 * time for the worker to start, and a BEGIN refused again.
 */
async function refusedInLine(driver: SqliteWasmDriver): Promise<void> {
  await assert.rejects(driver.exec("BEGIN IMMEDIATE"), BusyError);
  await driver.busyWait!(10_000);
  await sleep(WORKER_START_MS);
  await assert.rejects(driver.exec("BEGIN IMMEDIATE"), BusyError);
}

/** Begins a write transaction, waiting in line as the lease core does. */
async function beginWaiting(driver: SqliteWasmDriver): Promise<void> {
  for (;;) {
    try {
      return await driver.exec("BEGIN IMMEDIATE");
    } catch (error) {
      if (!(error instanceof BusyError)) throw error;
      await driver.busyWait!(10_000);
    }
  }
}

/** A `deno eval` script that opens the database at `path` as `db`, then runs `body`. */
function childScript(path: string, body: string): string {
  const module = new URL("../sqlite_wasm_deno.ts", import.meta.url).href;
  return `
    const { openSqliteWasm } = await import(${JSON.stringify(module)});
    const db = await openSqliteWasm(${JSON.stringify(path)});
    ${body}
  `;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

Deno.test("a refused writer's busyWait lasts while the lock is held and ends when it is let go", async () => {
  await withConnections(2, async ([holder, waiter]) => {
    await holder!.exec("BEGIN IMMEDIATE");
    await refusedInLine(waiter!);
    // While the lock is held, a wait runs to its 50 ms step.
    let started = performance.now();
    await waiter!.busyWait!(10_000);
    let ms = performance.now() - started;
    assert.ok(ms >= 45, `not woken while the lock is held: ${ms} ms`);
    // Let go, the lock wakes the waiter well before that step.
    await assert.rejects(waiter!.exec("BEGIN IMMEDIATE"), BusyError);
    started = performance.now();
    const waited = waiter!.busyWait!(10_000);
    await holder!.exec("COMMIT");
    await waited;
    ms = performance.now() - started;
    assert.ok(ms < 40, `woken when the lock was let go: ${ms} ms`);
    await waiter!.exec("BEGIN IMMEDIATE");
    await waiter!.exec("COMMIT");
  });
});

Deno.test("a writer that keeps beginning transactions lets a writer waiting in line in after at most 16", async () => {
  await withConnections(2, async ([greedy, waiter]) => {
    await greedy!.exec("BEGIN IMMEDIATE");
    // The waiter retries as the lease core does, so it stays in line.
    const waiting = beginWaiting(waiter!);
    // A failure surfaces where it is awaited, as this test's.
    waiting.catch(() => {});
    await sleep(WORKER_START_MS);
    // No await between COMMIT and BEGIN reaches the event loop: the waiter
    // cannot run, so only the greedy writer's yield lets it in.
    let transactions = 1;
    for (;;) {
      await greedy!.exec("COMMIT");
      try {
        await greedy!.exec("BEGIN IMMEDIATE");
      } catch (error) {
        assert.ok(error instanceof BusyError);
        break;
      }
      transactions++;
      assert.ok(transactions <= 17, "the greedy writer yields its turn");
    }
    await waiting;
    await waiter!.exec("COMMIT");
  });
});

Deno.test("a writer that stops asking leaves the line and holds nobody back", async () => {
  await withConnections(2, async ([holder, quitter]) => {
    await holder!.exec("BEGIN IMMEDIATE");
    await refusedInLine(quitter!);
    await quitter!.busyWait!(100);
    // The quitter gives up; once it has been quiet a while it leaves.
    await holder!.exec("COMMIT");
    await sleep(500);
    for (let i = 0; i < 20; i++) {
      await holder!.exec("BEGIN IMMEDIATE");
      await holder!.exec("COMMIT");
    }
  });
});

Deno.test("a process waiting for a lock that is never let go still exits when its work ends", async () => {
  await withConnections(1, async ([holder], path) => {
    await holder!.exec("BEGIN IMMEDIATE");
    const script = childScript(
      path,
      `for (let i = 0; i < 3; i++) {
        try { await db.exec("BEGIN IMMEDIATE"); } catch { await db.busyWait(300); }
      }
      console.log("gave up");`,
    );
    const started = performance.now();
    const output = await new Deno.Command(Deno.execPath(), {
      args: ["eval", script],
      stdout: "piped",
      stderr: "piped",
    }).output();
    const ms = performance.now() - started;
    assert.equal(
      new TextDecoder().decode(output.stdout).trim(),
      "gave up",
      new TextDecoder().decode(output.stderr),
    );
    assert.equal(output.code, 0);
    assert.ok(ms < 10_000, `exited after ${ms} ms`);
    await holder!.exec("COMMIT");
  });
});

/** Whether some connection's worker holds the line of the database at `path`. */
function lineHeld(path: string): boolean {
  using probe = Deno.openSync(`${path}-waiting.lock`, { read: true });
  if (!probe.tryLockSync(false)) return true;
  probe.unlockSync();
  return false;
}

/** Whether every thread of process `pid` is stopped (state T). */
function stopped(pid: number): boolean {
  for (const task of Deno.readDirSync(`/proc/${pid}/task`)) {
    const stat = Deno.readTextFileSync(`/proc/${pid}/task/${task.name}/stat`);
    if (stat.slice(stat.lastIndexOf(")") + 2)[0] !== "T") return false;
  }
  return true;
}

/** Whether process `pid` holds a flock on a lock sidecar other than the line. */
function holdsLocks(pid: number, path: string): boolean {
  const inodes = ["pending", "reserved", "shared"].map((kind) =>
    String(Deno.statSync(`${path}-${kind}.lock`).ino)
  );
  return Deno.readTextFileSync("/proc/locks").split("\n").some((line) => {
    const fields = line.trim().split(/\s+/);
    const at = fields.indexOf("FLOCK");
    return at >= 0 && fields[at + 3] === String(pid) &&
      inodes.includes(fields[at + 4]!.split(":")[2]!);
  });
}

function threads(): number {
  const status = Deno.readTextFileSync("/proc/self/status");
  return Number(/^Threads:\s+(\d+)/m.exec(status)![1]);
}

async function until(condition: () => boolean, ms: number): Promise<boolean> {
  const deadline = performance.now() + ms;
  while (!condition()) {
    if (performance.now() > deadline) return false;
    await sleep(10);
  }
  return true;
}

Deno.test("closing a connection that waits in line lets go of the line and ends its worker thread", async () => {
  await withConnections(1, async ([holder], path) => {
    const before = threads();
    await holder!.exec("BEGIN IMMEDIATE");
    for (const whileBlocked of [true, false]) {
      const waiter = await openSqliteWasm(path);
      await assert.rejects(waiter.exec("BEGIN IMMEDIATE"), BusyError);
      const waited = waiter.busyWait!(10_000);
      assert.ok(await until(() => lineHeld(path), WORKER_START_MS));
      if (whileBlocked) {
        // Its worker is blocked watching the holder's lock when it closes.
        await waiter.close();
        await holder!.exec("COMMIT");
      } else {
        await holder!.exec("COMMIT");
        await waited;
        await waiter.close();
      }
      assert.ok(await until(() => !lineHeld(path), 1_000), "line let go");
      await holder!.exec("BEGIN IMMEDIATE");
    }
    await holder!.exec("COMMIT");
    assert.ok(
      await until(() => threads() <= before, 2_000),
      `threads back to ${before}: ${threads()}`,
    );
  });
});

Deno.test("a reader that waited leaves the line once it has read", async () => {
  await withConnections(2, async ([writer, reader], path) => {
    // The reader learns the schema first: a busy schema load is not BUSY.
    await reader!.query("SELECT count(*) FROM t");
    await writer!.exec("BEGIN EXCLUSIVE");
    await assert.rejects(reader!.query("SELECT count(*) FROM t"), BusyError);
    const waited = reader!.busyWait!(10_000);
    assert.ok(await until(() => lineHeld(path), WORKER_START_MS));
    await writer!.exec("COMMIT");
    await waited;
    assert.deepEqual(await reader!.query("SELECT count(*) AS n FROM t"), [{
      n: 0,
    }]);
    assert.ok(await until(() => !lineHeld(path), 100), "left at once");
  });
});

Deno.test("a process stopped while first in line slows a lone writer by one wait per second at most", async () => {
  await withConnections(1, async ([writer], path) => {
    await writer!.exec("BEGIN IMMEDIATE");
    const script = childScript(
      path,
      `for (;;) {
        try { await db.exec("BEGIN IMMEDIATE"); await db.exec("COMMIT"); }
        catch { await db.busyWait(10_000); }
      }`,
    );
    const waiter = new Deno.Command(Deno.execPath(), {
      args: ["eval", script],
      stdout: "null",
      stderr: "null",
    }).spawn();
    try {
      assert.ok(await until(() => lineHeld(path), 10_000), "waiter in line");
      // Stopped while waiting in line, not inside one of its retries (then it
      // would hold SHARED and block writers, as any stopped holder of a lock
      // does). kill() returns before every thread has stopped.
      for (let attempt = 0;; attempt++) {
        waiter.kill("SIGSTOP");
        assert.ok(await until(() => stopped(waiter.pid), 5_000), "stopped");
        if (!holdsLocks(waiter.pid, path)) break;
        assert.ok(attempt < 10, "the waiter stops outside its retries");
        waiter.kill("SIGCONT");
        await sleep(10);
      }
      await writer!.exec("COMMIT");
      // Without the cut-off every 17th transaction would wait 50 ms: 2.4 s.
      const started = performance.now();
      for (let i = 0; i < 800; i++) {
        for (;;) {
          try {
            await writer!.exec("BEGIN IMMEDIATE");
            break;
          } catch (error) {
            assert.ok(error instanceof BusyError);
            assert.ok(performance.now() - started < 10_000, "writer stuck");
            await writer!.busyWait!(10_000);
          }
        }
        await writer!.exec("COMMIT");
      }
      const ms = performance.now() - started;
      assert.ok(ms < 1_500, `800 transactions took ${ms} ms`);
    } finally {
      waiter.kill("SIGKILL");
      await waiter.status;
    }
  });
});
