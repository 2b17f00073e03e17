/**
 * The processing loop's three state machines, every state and every
 * transition in one place (graphile-worker's `localQueue.ts` is the model:
 * its modes are listed at the top and each change of mode is asserted).
 *
 * **The loop** decides when to claim:
 *
 * ```text
 * starting, full, waiting, backingOff ──► full | reading | claiming | stopped
 * reading                             ──► claiming
 * claiming                            ──► full | reading | claiming | waiting
 *                                         | backingOff | stopped
 * ```
 *
 * After each step it decides afresh: `full` when every slot is taken,
 * `reading` when idle and not woken, else `claiming`. A claim that found
 * leases claims again for the rest; one that came back empty with no read
 * before it reads, then claims once more; empty after a read, it goes
 * `waiting`; a claim that threw goes `backingOff`.
 *
 * - `starting`: the processor was just made.
 * - `full`: every handler slot is taken, or every lease the loop may hold
 *   (one per slot, and as many claimed ahead with `prefetch`) is held; it
 *   waits until one frees (a wake). Leases claimed ahead are topped up by the
 *   acknowledgements' writes, not by polling.
 * - `reading`: idle, it reads when the next event comes due
 *   ({@linkcode ProcessableOutbox.nextDueInMs}), a read outside any
 *   transaction, before it claims: an event coming due between an empty claim
 *   and the read would be seen by neither.
 * - `claiming`: its claim waits for its turn to write, or is under way.
 * - `waiting`: the queue was empty; it waits for a wake (an enqueue in this
 *   process, a NOTIFY, a freed slot), the next due time or its poll.
 * - `backingOff`: a claim threw; it waits a poll interval, doubling.
 * - `stopped`: the loop has ended (stop asked, or the outbox closed).
 *
 * **The writer** holds the loop's writes to one at a time (group commit): a
 * write covers every acknowledgement ready when it starts, and the next one
 * starts when it ends. No write waits for a timer.
 *
 * - `idle`: no write is under way.
 * - `gathering`: a handler finished while idle; the write starts at the end
 *   of the event loop's turn (`setImmediate`) while other handlers still
 *   run, else once the promise jobs running now are done, so handlers
 *   finishing in the same turn (timers due at the same tick, I/O completions
 *   delivered together, handlers awaiting one promise) share its commit. Not
 *   a wait: nothing of it depends on time.
 * - `claiming`: the loop's claim is writing.
 * - `acknowledging`: a batch of acknowledgements is writing alone (the outbox
 *   has no `acknowledgeAndClaim`, the processor is stopping, or a folded
 *   write failed and its acknowledgements go again alone).
 * - `folding`: acknowledgements and a claim for the slots they free (and every
 *   other free one) in one call, {@linkcode ProcessableOutbox.acknowledgeAndClaim}.
 *
 * **A slot** holds one claimed lease while its handler runs:
 *
 * - `running`: the handler runs; its lease renews and its watchdog is armed.
 * - `finishing`: the handler settled (or its lease is being given back); its
 *   acknowledgement or release is under way, and no timer of it is armed.
 * - `released`: given back by stop() (or dropped because the outbox closed)
 *   while its handler still ran.
 * - `abandoned`: past `handlerTimeoutMs`: released while its handler still
 *   runs; it keeps its slot until the handler settles, and stop() does not
 *   wait for it.
 *
 * @module
 */

/** The loop's states (see the module's documentation). */
export type LoopState =
  | "starting"
  | "full"
  | "reading"
  | "claiming"
  | "waiting"
  | "backingOff"
  | "stopped";

/** The writer's states (see the module's documentation). */
export type WriterState =
  | "idle"
  | "gathering"
  | "claiming"
  | "acknowledging"
  | "folding";

/** A slot's states (see the module's documentation). */
export type SlotState = "running" | "finishing" | "released" | "abandoned";

/** For each state, the states it may go to. */
export type Transitions<S extends string> = {
  readonly [From in S]: readonly S[];
};

/** After any step, the loop decides afresh: full, reading or claiming. */
const DECIDE = ["full", "reading", "claiming", "stopped"] as const;

/** The loop's transitions. */
export const LOOP: Transitions<LoopState> = {
  starting: DECIDE,
  full: DECIDE,
  reading: ["claiming"],
  claiming: [...DECIDE, "waiting", "backingOff"],
  waiting: DECIDE,
  backingOff: DECIDE,
  stopped: [],
};

/** A write ends by starting the next one, or by going idle. */
const NEXT_WRITE = ["claiming", "acknowledging", "folding", "idle"] as const;

/** The writer's transitions. */
export const WRITER: Transitions<WriterState> = {
  idle: ["gathering", "claiming"],
  gathering: NEXT_WRITE,
  claiming: NEXT_WRITE,
  acknowledging: NEXT_WRITE,
  folding: NEXT_WRITE,
};

/** A slot's transitions. */
export const SLOT: Transitions<SlotState> = {
  running: ["finishing"],
  finishing: ["released", "abandoned"],
  released: [],
  abandoned: [],
};

/**
 * Asserts that `from` may go to `to` in `machine`.
 *
 * @param machine The transitions, {@linkcode LOOP}, {@linkcode WRITER} or
 * {@linkcode SLOT}.
 * @param from The current state.
 * @param to The next state.
 * @returns `to`, to assign.
 * @throws {Error} When the transition is not in the table: a bug of the
 * loop, never of its caller.
 */
export function step<S extends string>(
  machine: Transitions<S>,
  from: S,
  to: S,
): S {
  if (!machine[from].includes(to)) {
    throw new Error(
      `processEvents: no transition from '${from}' to '${to}' (a bug in the loop)`,
    );
  }
  return to;
}
