/**
 * The cross-process wake-up of the Deno file driver: another process's
 * enqueue reaches an idle worker here through a file-system watch on the
 * database's files rather than at its next poll (PostgreSQL's drivers use
 * `LISTEN`/`NOTIFY` for the same).
 *
 * A writer changes the database's `-wal` file (WAL mode) or its `-journal`
 * and the database file (rollback journal) before its commit is visible:
 * the WAL index names the new frames only after the sync. So each burst of
 * changes starts cheap reads of the events table's AUTOINCREMENT counter
 * (`sqlite_sequence`, which only an insert raises): at once, then every
 * millisecond or so (timers fire on a later tick, about 2 ms here) for 24
 * reads, then backing off to 64 ms, until one finds it raised and calls
 * the listener. A read never waits for a lock, and is skipped (counting as
 * one) while a transaction is open on the connection; it takes the
 * connection's turn (core/transaction.ts's mutex), as every outbox call does.
 *
 * The watch sees this process's own writes as well, a few file-system
 * events per commit (about 100 µs of CPU each commit, measured): the outbox
 * keeps it only while a processing loop waits idle (core/idle_watch.ts).
 *
 * The watch is a hint, never the only way: when it cannot be set up
 * (`Deno.watchFs` refused, inotify's watch limit reached, a network file
 * system that reports nothing), workers wake at their polls as before.
 *
 * @module
 */
import type { Driver } from "../driver.ts";
import { driverMutex } from "../core/transaction.ts";

/** The events table's counter: raised by every insert, and only by one. */
const SEQUENCE_SQL =
  "SELECT seq FROM sqlite_sequence WHERE name = 'outbox_events'";
/**
 * Delays of the reads after a burst of changes, milliseconds: a commit
 * becomes visible once its writer's sync returns, which on a slow disk
 * takes tens of milliseconds.
 */
const RECHECK_MS = [0, ...Array<number>(24).fill(1), 2, 4, 8, 16, 32, 64];

/** The counter as the last read found it, kept from one watch to the next. */
export interface EnqueueCounter {
  seen: number | undefined;
}

/**
 * Calls `listener` after another connection (of any process) commits new
 * events to the database file at `path`, watched through `Deno.watchFs` on
 * its directory.
 *
 * @param driver The connection that reads the counter.
 * @param path The database file's absolute path (`PRAGMA database_list`).
 * @param counter The counter's last value: a raise since then (an enqueue
 *   while no watch ran) calls `listener` at once.
 * @param listener Called with no arguments.
 * @returns Stops the watch and its timers; resolves once the watch ended.
 *   A watch that could not be set up returns a stop that does nothing.
 */
export function watchFileEnqueues(
  driver: Driver & { inTransaction(): boolean },
  path: string,
  counter: EnqueueCounter,
  listener: () => void,
): () => Promise<void> {
  const slash = path.lastIndexOf("/");
  const dir = slash <= 0 ? "/" : path.slice(0, slash);
  const names = new Set([path, `${path}-wal`, `${path}-journal`]);
  let watcher: Deno.FsWatcher;
  try {
    watcher = Deno.watchFs(dir, { recursive: false });
  } catch {
    return () => Promise.resolve();
  }
  let stopped = false;
  let timer: ReturnType<typeof setTimeout> | undefined;
  /** Index into RECHECK_MS of the next read; past its end, none. */
  let attempt = RECHECK_MS.length;

  const schedule = (ms: number) => {
    if (!stopped && timer === undefined) timer = setTimeout(check, ms);
  };
  const check = async () => {
    timer = undefined;
    // The read takes the connection's turn, as every outbox, inbox and
    // reader call on it does: run beside a call whose statements await (a
    // lock wait), it would land inside that call's transaction, or that
    // call's BEGIN inside the read. Inside a transaction (the application's
    // on a shared connection) it would see that transaction's snapshot.
    const now = await driverMutex(driver).run(() =>
      driver.inTransaction() ? Promise.resolve(undefined) : sequence(driver)
    );
    if (
      now !== undefined && (counter.seen === undefined || now > counter.seen)
    ) {
      counter.seen = now;
      attempt = RECHECK_MS.length;
      if (!stopped) listener();
      return;
    }
    const delay = RECHECK_MS[++attempt];
    if (delay !== undefined) schedule(delay);
  };

  // What committed since the last watch ended (or, for the first, ever:
  // one wake to spare) is looked for at once.
  attempt = 0;
  schedule(RECHECK_MS[0]!);
  const events = (async () => {
    try {
      for await (const event of watcher) {
        if (!event.paths.some((changed) => names.has(changed))) continue;
        attempt = 0;
        schedule(RECHECK_MS[0]!);
      }
    } catch {
      // The watch failed (e.g. its directory went away): polls remain.
    }
  })();

  return async () => {
    stopped = true;
    clearTimeout(timer);
    timer = undefined;
    try {
      watcher.close();
    } catch {
      // Already closed.
    }
    await events;
  };
}

/** The counter, or `undefined` when it cannot be read now. */
async function sequence(driver: Driver): Promise<number | undefined> {
  try {
    const [row] = await driver.query(SEQUENCE_SQL);
    return row === undefined ? 0 : Number(row["seq"]);
  } catch {
    return undefined;
  }
}
