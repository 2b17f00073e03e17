/**
 * A line for connections that SQLite refused a lock with `SQLITE_BUSY`:
 * one waiter at a time watches the lock, the others sleep in the kernel, and
 * nobody blocks the event loop.
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
  /** 1 while the worker holds the line (written by the worker). */
  inLine: 4,
} as const;
const { bell: BELL, asked: ASKED, watch: WATCH, left: LEFT, inLine: IN_LINE } =
  SLOTS;

interface LineData {
  readonly linePath: string;
  readonly paths: readonly string[];
  readonly control: Int32Array;
  readonly slots: typeof SLOTS;
}

/**
 * The worker's whole program. It runs from its source text (an eval worker
 * needs no module URL, so it works wherever the package is loaded from),
 * which is why it gets its module as an argument.
 */
function runLine(api: typeof import("node:worker_threads")): void {
  const { linePath, paths, control, slots } = api.workerData as LineData;
  const { bell: BELL, asked: ASKED, watch: WATCH, left: LEFT } = slots;
  const IN_LINE = slots.inLine;
  const line = Deno.openSync(linePath, { read: true });
  const files = paths.map((path) => Deno.openSync(path, { read: true }));
  let served = 0;
  let left = 0;
  const leave = () => {
    line.unlockSync();
    Atomics.store(control, IN_LINE, 0);
  };
  for (;;) {
    const bell = Atomics.load(control, BELL);
    const asked = Atomics.load(control, ASKED);
    if (Atomics.load(control, LEFT) !== left) {
      left = Atomics.load(control, LEFT);
      if (Atomics.load(control, IN_LINE) === 1) leave();
    } else if (asked !== served) {
      if (Atomics.load(control, IN_LINE) === 0) {
        line.lockSync(true);
        Atomics.store(control, IN_LINE, 1);
        // The connection may have got the lock meanwhile.
        if (Atomics.load(control, LEFT) !== left) continue;
      }
      const file = files[Atomics.load(control, WATCH)]!;
      file.lockSync(false);
      file.unlockSync();
      served = asked;
      api.parentPort!.postMessage(asked);
    } else {
      Atomics.wait(control, BELL, bell);
    }
  }
}

/**
 * One connection's place in the line of the connections waiting for one
 * database's locks.
 */
export class WaitLine {
  readonly #control = new Int32Array(new SharedArrayBuffer(5 * 4));
  readonly #worker: Worker;
  #wake: (() => void) | undefined;
  #leaveTimer: ReturnType<typeof setTimeout> | undefined;

  /**
   * Starts the connection's worker (about 75 ms before its first report).
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
    this.#worker = new Worker(
      `(${runLine})(require("node:worker_threads"))`,
      { eval: true, workerData },
    );
    this.#worker.unref();
    this.#worker.on("message", (asked: number) => {
      if (asked === Atomics.load(this.#control, ASKED)) this.#wake?.();
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
   */
  wait(watch: number, timeoutMs: number): Promise<void> {
    clearTimeout(this.#leaveTimer);
    this.#wake?.();
    return new Promise((resolve) => {
      const wake = () => {
        clearTimeout(timer);
        this.#wake = undefined;
        this.#leaveTimer = setTimeout(() => this.leave(), LEAVE_AFTER_MS);
        Deno.unrefTimer(this.#leaveTimer);
        resolve();
      };
      const timer = setTimeout(wake, Math.min(timeoutMs, MAX_WAIT_MS));
      this.#wake = wake;
      Atomics.store(this.#control, WATCH, watch);
      Atomics.add(this.#control, ASKED, 1);
      this.#ring();
    });
  }

  /** Leaves the line: the connection got its lock, or stopped asking. */
  leave(): void {
    clearTimeout(this.#leaveTimer);
    Atomics.add(this.#control, LEFT, 1);
    this.#ring();
  }

  /** Ends any wait and stops the worker (the kernel drops its locks). */
  close(): void {
    this.#wake?.();
    clearTimeout(this.#leaveTimer);
    // A worker blocked in flock stops when the call returns; its files close
    // with it, which lets go of the line.
    void this.#worker.terminate();
  }

  #ring(): void {
    Atomics.add(this.#control, BELL, 1);
    Atomics.notify(this.#control, BELL);
  }
}
