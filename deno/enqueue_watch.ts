/**
 * The cross-process wake-up of the Deno file driver: another process's
 * enqueue reaches an idle worker here through a file-system watch on the
 * database's WAL file or rollback journal rather than at its next poll
 * (PostgreSQL's drivers use `LISTEN`/`NOTIFY` for the same).
 *
 * A writer changes the database's `-wal` file (WAL mode) or its `-journal`
 * (rollback journal) before its commit is visible: the WAL index names the
 * new frames only after the sync, and a rollback journal is truncated,
 * zeroed or deleted at the commit, a change too. So each burst of changes
 * starts cheap reads of the events' id counter (the higher of the highest
 * id and `outbox_id_floor`, the highest id ever deleted, which only an
 * insert raises and nothing lowers): at once, then every
 * millisecond or so (timers fire on a later tick, about 2 ms here) for 24
 * reads, then backing off to 64 ms, until one finds it raised and calls
 * the listener. A read never waits for a lock, and is skipped (counting as
 * one) while a transaction is open on the connection; it takes the
 * connection's turn (core/transaction.ts's mutex), as every outbox call does.
 *
 * Only those two files are watched, each by its own path, never the
 * database's directory, the database file or its `-shm`: Deno's watcher
 * opens, then closes, the path of every event it sees (to match it against
 * each watch, `same_file::is_same_file`, on its own thread), and closing any
 * descriptor of a file drops every classic POSIX lock the process holds on
 * it: the VFS's own on macOS and the BSDs (and with
 * `LEASED_OUTBOX_VFS_LOCKS=posix`), node:sqlite's everywhere. A watch of
 * the directory so let another process's writer in beside a transaction of
 * this one (`tests/vfs_wake_test.ts`: a change to the database file, then
 * a native `BEGIN EXCLUSIVE` that the reader's SHARED lock no longer
 * refused; in the interop soak, claims committed that no worker held and
 * "database disk image is malformed"). Neither the WAL file nor a journal
 * carries a lock, so opening and closing them changes nothing.
 *
 * The watch sees this process's own writes as well, a few file-system
 * events per commit (about 100 µs of CPU each commit, measured): the outbox
 * keeps it only while a processing loop waits idle (core/idle_watch.ts).
 *
 * The watch is a hint, never the only way: when it cannot be set up
 * (neither file there yet, as before the first write in rollback mode;
 * `Deno.watchFs` refused, inotify's watch limit reached, a network file
 * system that reports nothing), or its file goes (a journal deleted at
 * commit in DELETE mode ends its watch after one wake), workers wake at
 * their polls as before; each idle wait starts the watch afresh.
 *
 * @module
 */
import type { Driver } from "../driver.ts";
import { driverMutex } from "../core/transaction.ts";
import { statIfPresent } from "./file_access.ts";

/**
 * The events' id counter: raised by every insert, and only by one (a
 * delete of the highest ids raises outbox_id_floor to them).
 */
const SEQUENCE_SQL =
  `SELECT max(coalesce((SELECT max(id) FROM outbox_events), 0),
    coalesce((SELECT seq FROM outbox_id_floor), 0)) AS seq`;
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
 * its `-wal` file and `-journal`, those of them that exist (never on a
 * file that carries locks: see the module's documentation).
 *
 * @param driver The connection that reads the counter.
 * @param path The database file's absolute path (`PRAGMA database_list`).
 * @param counter The counter's last value: a raise since then (an enqueue
 *   while no watch ran) calls `listener` at once.
 * @param listener Called with no arguments.
 * @returns Stops the watch and its timers; resolves once the watch ended.
 *   A watch that could not be set up (neither file exists) returns a stop
 *   that does nothing.
 */
export function watchFileEnqueues(
  driver: Driver & { inTransaction(): boolean },
  path: string,
  counter: EnqueueCounter,
  listener: () => void,
): () => Promise<void> {
  // Each by its own path: a watch of the directory would have Deno open
  // and close the database file and its -shm at each of their changes.
  // stat(2) opens nothing.
  const watched = [`${path}-wal`, `${path}-journal`].filter((file) =>
    statIfPresent(file) !== undefined
  );
  let watcher: Deno.FsWatcher;
  try {
    if (watched.length === 0) throw new Error("nothing to watch");
    watcher = Deno.watchFs(watched, { recursive: false });
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
      // Every event is one of the watched files' (a change, or its removal).
      for await (const _ of watcher) {
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
