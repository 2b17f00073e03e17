/**
 * A line for connections that SQLite refused a lock with `SQLITE_BUSY`:
 * one waiter at a time watches the lock, the others sleep in the kernel, and
 * the waiting itself never blocks the event loop (starting a connection's
 * worker does, once).
 *
 * SQLite's lock has no queue: a refused connection must try again later.
 * Sleeping on a timer (Deno's fire no sooner than about 2 ms, longer than a
 * durable transaction) leaves the lock idle through most handoffs; waking
 * every waiter when the lock is let go wakes a herd that fights for the
 * CPU the lock's new holder needs. So each waiting connection has a worker
 * thread that first takes the line, an exclusive `flock(2)` on a sidecar
 * file, blocking (the kernel wakes one blocked taker when it is let go),
 * and then, first in line, blocks on a shared `flock` of the lock file that
 * refused its connection until that lock's holder lets go, and wakes its
 * connection. The connection leaves the line when it gets the lock, or when
 * it stops asking.
 *
 * Workers are unref'd (they never keep the process alive), and a wait keeps
 * a timer on the main thread, so it ends on time whatever the worker does:
 * a blocking call cannot be abandoned, and a stopped process's worker may
 * hold the line for as long as it is stopped.
 *
 * @module
 */
import { Worker } from "node:worker_threads";

// The longest single wait: past it the connection tries again anyway, so a
// line held by a stopped process delays others by this much, not forever.
const MAX_WAIT_MS = 50;
// How long a connection stays in line after its last wait ended without it
// asking again: SQLite gives up a lock between retries, so only a timer can
// tell that the caller gave up.
const LEAVE_AFTER_MS = 250;

/** Slots of the control array the main thread and the worker share. */
const SLOTS = {
  /** Bumped by the main thread on every request. */
  bell: 0,
  /** Number of the latest wait asked for. */
  asked: 1,
  /** Which of the watchable files the latest wait watches. */
  watch: 2,
  /** Bumped to leave the line. */
  left: 3,
  /** The number of the latest wait asked for when the connection left. */
  leftAsked: 4,
  /** 1 while the worker holds the line (written by the worker). */
  inLine: 5,
  /** Set to 1 when the connection closes: the worker lets go and ends. */
  stop: 6,
} as const;
const { bell: BELL, asked: ASKED, watch: WATCH, left: LEFT } = SLOTS;
const { leftAsked: LEFT_ASKED, inLine: IN_LINE, stop: STOP } = SLOTS;

interface LineData {
  readonly linePath: string;
  readonly paths: readonly string[];
  readonly control: Int32Array;
  readonly slots: typeof SLOTS;
}

/**
 * The worker's whole program. It runs from its source text (an eval worker
 * needs no module URL, so it works wherever the package is loaded from),
 * which is why it gets its module as an argument. It re-reads the control
 * array after every call that blocks, so it never acts on a request that
 * went stale meanwhile: the line is held only while a wait is asked for.
 */
function runLine(api: typeof import("node:worker_threads")): void {
  const { linePath, paths, control, slots } = api.workerData as LineData;
  const { bell: BELL, asked: ASKED, watch: WATCH, left: LEFT } = slots;
  const { leftAsked: LEFT_ASKED, inLine: IN_LINE, stop: STOP } = slots;
  const line = Deno.openSync(linePath, { read: true });
  const files = paths.map((path) => Deno.openSync(path, { read: true }));
  let served = 0;
  let left = 0;
  let inLine = false;
  const release = () => {
    if (!inLine) return;
    line.unlockSync();
    inLine = false;
    Atomics.store(control, IN_LINE, 0);
  };
  for (;;) {
    const bell = Atomics.load(control, BELL);
    if (Atomics.load(control, STOP) === 1) {
      // Closing the files lets go of every lock they hold.
      line.close();
      for (const file of files) file.close();
      return;
    }
    if (Atomics.load(control, LEFT) !== left) {
      // Waits asked for before leaving are over; later ones are not.
      left = Atomics.load(control, LEFT);
      served = Math.max(served, Atomics.load(control, LEFT_ASKED));
      release();
      continue;
    }
    const asked = Atomics.load(control, ASKED);
    if (asked === served) {
      Atomics.wait(control, BELL, bell);
    } else if (!inLine) {
      line.lockSync(true);
      inLine = true;
      Atomics.store(control, IN_LINE, 1);
    } else {
      const file = files[Atomics.load(control, WATCH)]!;
      file.lockSync(false);
      file.unlockSync();
      served = asked;
      api.parentPort!.postMessage(asked);
    }
  }
}

/**
 * One connection's place in the line of the connections waiting for one
 * database's locks.
 */
export class WaitLine {
  readonly #control = new Int32Array(
    new SharedArrayBuffer(Object.keys(SLOTS).length * 4),
  );
  #wake: ((reported: boolean) => void) | undefined;
  #leaveTimer: ReturnType<typeof setTimeout> | undefined;

  /**
   * Starts the connection's worker thread, which blocks the event loop for
   * 40–60 ms here (Deno builds the thread's runtime) and takes about 12 MB
   * until {@linkcode WaitLine.close}.
   *
   * @param linePath The sidecar file whose exclusive lock is the line.
   * @param paths The lock files a wait can watch, by index.
   */
  constructor(linePath: string, paths: readonly string[]) {
    const workerData: LineData = {
      linePath,
      paths,
      control: this.#control,
      slots: SLOTS,
    };
    const worker = new Worker(
      `(${runLine})(require("node:worker_threads"))`,
      { eval: true, workerData },
    );
    worker.unref();
    worker.on("message", (asked: number) => {
      if (asked === Atomics.load(this.#control, ASKED)) this.#wake?.(true);
    });
  }

  /** Whether this connection is first in line (its worker holds the line). */
  get isFirst(): boolean {
    return Atomics.load(this.#control, IN_LINE) === 1;
  }

  /**
   * Resolves once this connection is first in line and a shared lock on
   * `paths[watch]` could be taken (its exclusive holder let go), or after
   * `timeoutMs` (at most 50 ms), whichever comes first. It never takes the
   * lock: the caller retries and may lose the race.
   *
   * @param watch Index of the lock file to watch.
   * @param timeoutMs The longest wait, in milliseconds.
   * @returns `true` when the lock was let go, `false` when the time ran out.
   */
  wait(watch: number, timeoutMs: number): Promise<boolean> {
    clearTimeout(this.#leaveTimer);
    this.#wake?.(false);
    return new Promise((resolve) => {
      const wake = (reported: boolean) => {
        clearTimeout(timer);
        this.#wake = undefined;
        this.#leaveTimer = setTimeout(() => this.leave(), LEAVE_AFTER_MS);
        Deno.unrefTimer(this.#leaveTimer);
        resolve(reported);
      };
      const timer = setTimeout(
        () => wake(false),
        Math.min(timeoutMs, MAX_WAIT_MS),
      );
      this.#wake = wake;
      Atomics.store(this.#control, WATCH, watch);
      Atomics.add(this.#control, ASKED, 1);
      this.#ring();
    });
  }

  /** Leaves the line: the connection got its lock, or stopped asking. */
  leave(): void {
    clearTimeout(this.#leaveTimer);
    Atomics.store(
      this.#control,
      LEFT_ASKED,
      Atomics.load(this.#control, ASKED),
    );
    Atomics.add(this.#control, LEFT, 1);
    this.#ring();
  }

  /** Ends any wait and stops the worker (the kernel drops its locks). */
  close(): void {
    this.#wake?.(false);
    clearTimeout(this.#leaveTimer);
    // Worker.terminate() does not stop a thread that is inside Atomics.wait
    // or flock (Deno 2.9): the worker ends itself, at once when idle, or as
    // soon as the lock it blocks on is let go.
    Atomics.store(this.#control, STOP, 1);
    this.#ring();
  }

  #ring(): void {
    Atomics.add(this.#control, BELL, 1);
    Atomics.notify(this.#control, BELL);
  }
}
