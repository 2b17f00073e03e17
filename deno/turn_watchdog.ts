/**
 * The watchdog that ends a kept turn of the Deno file VFS (see `LockSet` in
 * `deno/file_vfs.ts`) on time even while the event loop is blocked: a
 * worker thread that, past a turn's deadline, lets go of the turn on the
 * connection's second open file description. Open file
 * description locks belong to the description, not to a thread, so any
 * thread may let them go.
 *
 * A kept turn is a slot in shared memory: the descriptor, the deadline, and
 * a state that the connection and the watchdog change by compare-and-swap
 * only, so exactly one of them ends the turn: the connection by taking it up
 * (KEPT to FREE, and it holds the locks again), the watchdog by letting the
 * locks go (KEPT to RELEASING, then FREE).
 *
 * @module
 */
import { Worker } from "node:worker_threads";
import { encodeFlock, type Platform } from "./platform.ts";

/** No turn kept: the connection holds its locks, or none. */
const FREE = 0;
/** Kept: the watchdog lets the locks go at the deadline. */
const KEPT = 1;
/** The watchdog is letting the locks go. */
const RELEASING = 2;

const SLOTS = 256;

/**
 * Milliseconds on a clock both threads read alike and that never steps
 * back (Date.now() can): each thread's time origin plus its monotonic time
 * (alike unless the wall clock stepped between the two threads' starts).
 */
export function monotonicMs(): number {
  return performance.timeOrigin + performance.now();
}

// The worker, as a data: URL, so it loads wherever this module was loaded
// from. It sleeps on the generation counter until the nearest deadline or a
// change, and ends every turn past its deadline with one fcntl
// (F_OFD_SETLK with the struct flock it is given: F_UNLCK over the turn).
const WORKER_SOURCE = `
import { parentPort, workerData } from "node:worker_threads";
const { buffer, slots, library, command, flock } = workerData;
const generation = new Int32Array(buffer, 0, 1);
const states = new Int32Array(buffer, 4, slots);
const fds = new Int32Array(buffer, 4 + 4 * slots, slots);
const deadlines = new Float64Array(buffer, 8 * (1 + slots), slots);
const libc = Deno.dlopen(library, {
  fcntl: { parameters: ["i32", "i32", "buffer"], result: "i32" },
});
parentPort.postMessage("ready");
for (;;) {
  const seen = Atomics.load(generation, 0);
  const now = performance.timeOrigin + performance.now();
  let next = Infinity;
  for (let i = 0; i < slots; i++) {
    if (Atomics.load(states, i) !== ${KEPT}) continue;
    if (deadlines[i] > now) {
      next = Math.min(next, deadlines[i]);
    } else if (Atomics.compareExchange(states, i, ${KEPT}, ${RELEASING}) === ${KEPT}) {
      libc.symbols.fcntl(fds[i], command, flock);
      Atomics.store(states, i, ${FREE});
      Atomics.notify(states, i);
    }
  }
  Atomics.wait(generation, 0, seen, next === Infinity ? undefined : Math.max(0, next - now));
}
`;

/**
 * The process's watchdog: started once, by the first connection that keeps
 * a turn; it never keeps the process alive.
 */
export class TurnWatchdog {
  readonly #generation: Int32Array;
  readonly #states: Int32Array;
  readonly #fds: Int32Array;
  readonly #deadlines: Float64Array;
  readonly #free: number[] = [];
  #ready = false;

  /**
   * @param platform The system's facts: its C library, F_OFD_SETLK, F_UNLCK
   *   and struct flock's layout (Linux: open file description locks only).
   * @param start The first byte of the range a turn holds.
   * @param length Its length in bytes.
   */
  constructor(platform: Platform, start: number, length: number) {
    const command = platform.fcntl.F_OFD_SETLK;
    if (command === undefined) {
      throw new Error(`${platform.os} has no open file description locks`);
    }
    const flock = new Uint8Array(platform.flock.size);
    encodeFlock(platform.flock, new DataView(flock.buffer), {
      type: platform.lockTypes.F_UNLCK,
      whence: 0,
      start,
      len: length,
      pid: 0,
    });
    const buffer = new SharedArrayBuffer(8 * (1 + SLOTS) + 8 * SLOTS);
    this.#generation = new Int32Array(buffer, 0, 1);
    this.#states = new Int32Array(buffer, 4, SLOTS);
    this.#fds = new Int32Array(buffer, 4 + 4 * SLOTS, SLOTS);
    this.#deadlines = new Float64Array(buffer, 8 * (1 + SLOTS), SLOTS);
    for (let i = SLOTS - 1; i >= 0; i--) this.#free.push(i);
    const worker = new Worker(
      new URL(`data:text/javascript,${encodeURIComponent(WORKER_SOURCE)}`),
      {
        workerData: {
          buffer,
          slots: SLOTS,
          library: platform.library,
          command,
          flock,
        },
      },
    );
    worker.unref();
    worker.once("message", () => this.#ready = true);
    // Without it, turns are not kept (see keep).
    worker.once("error", () => this.#ready = false);
  }

  /** A slot for a connection, or undefined when all are taken. */
  slot(): number | undefined {
    return this.#free.pop();
  }

  /** Gives back a slot whose turn has ended (see end). */
  freeSlot(slot: number): void {
    this.#free.push(slot);
  }

  /**
   * Hands a turn to the watchdog, to end by `deadline` (see monotonicMs)
   * unless the connection ends it first; false when the watchdog is not
   * running, and then nothing changed.
   */
  keep(slot: number, fd: number, deadline: number): boolean {
    if (!this.#ready) return false;
    this.#fds[slot] = fd;
    this.#deadlines[slot] = deadline;
    Atomics.store(this.#states, slot, KEPT);
    Atomics.add(this.#generation, 0, 1);
    Atomics.notify(this.#generation, 0);
    return true;
  }

  /**
   * Ends a kept turn from the connection's side: true when it still held
   * the locks (they are the connection's again), false when the watchdog let
   * them go. Waits out a release in progress, which is one fcntl.
   */
  end(slot: number): boolean {
    for (;;) {
      const was = Atomics.compareExchange(this.#states, slot, KEPT, FREE);
      if (was === KEPT) return true;
      if (was === FREE) return false;
      Atomics.wait(this.#states, slot, RELEASING, 1);
    }
  }
}
