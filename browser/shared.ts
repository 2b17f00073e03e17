/**
 * {@linkcode openSharedOutbox}: one outbox shared by every tab of an origin.
 * The tab holding the `navigator.locks` lock leads: it hosts the database in
 * its worker, and the other tabs forward their calls to it over a
 * `BroadcastChannel`.
 *
 * @module
 */
import type {
  AcknowledgedAndClaimed,
  EnqueueOptions,
  EnqueueResult,
  Lease,
} from "../lease.ts";
import { BusyError } from "../errors.ts";
import { uuidv7 } from "../identity.ts";
import {
  type BrowserOutboxOptions,
  leaseMsOf,
  type PageTransitionEvent,
  type PendingCall,
  setup,
  watchLifecycle,
  WorkerConnection,
  type WorkerSetup,
} from "./connection.ts";
import { type LeftLease, LeftLeases } from "./handback.ts";
import {
  type ChannelMessage,
  claimedLeases,
  fromWireError,
  leaseKey,
  OpfsUnavailableError,
  type ReplyMessage,
  TAB_CLOSED,
  toWireError,
} from "./protocol.ts";
import { RemoteOutbox } from "./remote.ts";
import { checkPayload } from "../core/payload.ts";

// The slice of the Web Locks API used here (absent from Deno's own lib).
interface LockManager {
  request(
    name: string,
    options: { signal: AbortSignal },
    callback: () => Promise<void>,
  ): Promise<void>;
}

interface ForwardedCall extends PendingCall {
  /** How many times it was sent (to a leader, or run in this tab's worker). */
  sends: number;
  /** Gives the call up with a BusyError unless the leader takes it on. */
  timer?: ReturnType<typeof setTimeout>;
  /**
   * A leader took it on once (its receipt came), or this tab's own worker
   * had it when it ended: it may have run, so giving up a later send must
   * not say it did not.
   */
  takenOn?: boolean;
}

// A call's reply settles it with this, which says whether it was sent more
// than once (so an earlier send may have run).
interface Answer {
  readonly value: unknown;
  readonly resent: boolean;
}

// The answer of a call this tab's own worker took and ended before
// answering, which another leader ran again.
class Resent {
  constructor(readonly value: unknown) {}
}

function answer(value: unknown, resent: boolean): Answer {
  return value instanceof Resent
    ? { value: value.value, resent: true }
    : { value, resent };
}

// The leader refuses a call it receives with less than this left before the
// sender gives it up, so that its receipt reaches the sender in time.
const RECEIPT_MARGIN_MS = 100;
// The least time a follower waits for the leader to take a call on, in ms,
// whatever busyTimeoutMs says (0 would give up every forwarded call).
const MIN_RECEIPT_WAIT_MS = 250;

// A leader remembers the ids of the calls it ran, so that a call a follower
// re-sends (it learned of this leader after sending) does not run twice.
const SEEN_LIMIT = 100_000;

const WORKER_ONLY = new Set(["open", "close", "hide", "show", "hasVfs"]);

/**
 * An outbox shared by every tab of the origin. Made by
 * {@linkcode openSharedOutbox}. Dispatches `"leaderchange"` when the tab
 * hosting the database changes, and in the leader tab `"enqueue"` whenever
 * an event from any tab was stored.
 *
 * Through the page lifecycle: a leader tab that is frozen, or goes into the
 * back-forward cache (`pagehide` with `persisted` true), gives up the
 * database and the lock at once, so another tab takes over, and rejoins as
 * a follower on `resume`/`pageshow`. A leaving leader's leases are released
 * by the next leader (kept in `localStorage` meanwhile). A call forwarded to
 * a leader that does not take it on within `busyTimeoutMs` (at least
 * 250 ms) fails with `BusyError`, and does not run; one a leader took on
 * before and that is sent again (to a leader announced since) fails the
 * same way, saying it may have run. See `docs/browser.md`.
 */
export class SharedOutbox<P = unknown> extends RemoteOutbox<P> {
  /** This tab's id on the channel. */
  readonly tab: string = crypto.randomUUID();
  readonly #setup: WorkerSetup;
  readonly #channel: BroadcastChannel;
  readonly #pending = new Map<string, ForwardedCall>();
  readonly #seen = new Set<string>();
  // Withdraws this tab's place in the queue for the leader lock.
  #lockRequest = new AbortController();
  readonly #locks: LockManager;
  readonly #hiddenTabs = new Set<string>();
  readonly #left: LeftLeases;
  readonly #receiptWaitMs: number;
  #unwatch: () => void = () => {};
  #unwatchLeft: () => void = () => {};
  #stopLeading: (() => void) | undefined;
  // Stepped aside (frozen, or in the back-forward cache): not queued for
  // leadership until the page resumes.
  #resting = false;
  #local: WorkerConnection | undefined;
  #leader: string | undefined;
  #failure: Error | undefined;
  #next = 0;

  private constructor(name: string, setup: WorkerSetup) {
    super(name, leaseMsOf(setup));
    this.#setup = setup;
    this.#left = new LeftLeases(name);
    const busyTimeoutMs = setup.config.outbox["busyTimeoutMs"];
    this.#receiptWaitMs = Math.max(
      MIN_RECEIPT_WAIT_MS,
      typeof busyTimeoutMs === "number" ? busyTimeoutMs : 5_000,
    );
    this.#channel = new BroadcastChannel(`leased-outbox:${name}`);
    this.#channel.addEventListener(
      "message",
      (event) => this.#receive(event.data as ChannelMessage),
    );
    const locks = (navigator as unknown as { locks?: LockManager }).locks;
    if (locks === undefined) {
      this.#channel.close();
      throw new OpfsUnavailableError(
        "navigator.locks is not available: a shared outbox needs a secure context",
      );
    }
    this.#locks = locks;
    this.#unwatch = watchLifecycle({
      pagehide: (event) => this.#hide(event as PageTransitionEvent),
      pageshow: (event) => this.#show(event as PageTransitionEvent),
      freeze: () => this.#stepAside(),
      resume: () => this.#wake(),
    });
    this.#channel.postMessage({ type: "hello" } satisfies ChannelMessage);
    this.#requestLeadership();
  }

  #requestLeadership(): void {
    this.#locks.request(
      `leased-outbox:${this.name}`,
      { signal: (this.#lockRequest = new AbortController()).signal },
      () => this.#lead(),
    ).catch(() => {/* withdrawn by close() or a freeze before this tab led */});
  }

  /** @internal Use {@linkcode openSharedOutbox}. */
  static create<P>(name: string, setup: WorkerSetup): SharedOutbox<P> {
    return new SharedOutbox<P>(name, setup);
  }

  /** Whether this outbox was closed (or failed to open): every later call rejects. */
  get closed(): boolean {
    return this.#failure !== undefined;
  }

  /** Whether this tab hosts the database now. */
  get isLeader(): boolean {
    return this.#local !== undefined;
  }

  /** The id of the tab hosting the database, once known. */
  get leader(): string | undefined {
    return this.#leader;
  }

  /** The SQLite VFS the database was opened through, while leading. */
  get vfs(): string | undefined {
    return this.#local?.vfs;
  }

  /**
   * Adds a pending event; see `Outbox.enqueue`. The event's identity is
   * minted in this tab (unless one is given), so a call that has to be
   * re-sent to a new leader is stored once even when the old leader stored
   * it before it went away; `deduplicated` then still says `false`, also
   * for an identity the caller gave, since the event is this call's own.
   *
   * @param payload JSON data JSON keeps as it is, or a `Uint8Array` (see
   * `Outbox.enqueue`).
   * @param options Delay, attempts, dedup and ordering keys, identity, queue.
   * @returns The event id, its identity, and whether the caller's `dedupKey`
   * or `identity` matched an earlier event.
   * @throws {TypeError | RangeError} When an argument is invalid.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`,
   * or the leader tab does not take the call on within it.
   */
  override async enqueue(
    payload: P,
    options: EnqueueOptions = {},
  ): Promise<EnqueueResult> {
    if (options === null || typeof options !== "object") {
      return super.enqueue(payload, options);
    }
    checkPayload("enqueue", "payload", payload);
    const given = options.identity;
    const identity = given ?? uuidv7();
    const madeAt = Date.now();
    const { value, resent } = await this.#call("enqueue", [payload, {
      ...options,
      identity,
    }]);
    const result = value as EnqueueResult;
    if (!result.deduplicated || result.identity !== identity) return result;
    // Our identity found: a minted one is this call's own (a re-send the old
    // leader stored); a given one is when an earlier send of this call
    // stored it, i.e. the event was made after this call was.
    if (given === undefined) return { ...result, deduplicated: false };
    if (resent && await this.#madeSince(result.eventId, madeAt)) {
      return { ...result, deduplicated: false };
    }
    return result;
  }

  // Whether event eventId was stored at or after madeAt (epoch ms; the
  // leaders' workers stamp events with the same machine's clock).
  async #madeSince(eventId: number, madeAt: number): Promise<boolean> {
    for (const state of ["pending", "leased", "done", "dead"] as const) {
      const [event] = await this.list({
        state,
        afterId: eventId - 1,
        limit: 1,
      });
      if (event?.id === eventId) return event.createdAt >= madeAt;
    }
    return false;
  }

  /**
   * Runs a call here when leading, else forwards it to the leader. A call
   * sent more than once (its leader went away before answering) may have
   * ended its leases at an earlier send: the re-send then finds them ended
   * and answers `false`, which says another worker owns the event. Such an
   * answer is made `true` when the ledger holds that earlier end of the
   * lease itself (its kind, fence and token; tokens are unique).
   */
  protected async invoke(
    method: string,
    args: readonly unknown[],
  ): Promise<unknown> {
    const { value, resent } = await this.#call(method, args);
    if (!resent) return value;
    switch (method) {
      case "acknowledge": {
        const leases = args[0] as Lease<unknown> | readonly Lease<unknown>[];
        if (!Array.isArray(leases)) {
          return value === false
            ? await this.#endedBy(leases as Lease<unknown>, "acknowledged")
            : value;
        }
        return await this.#endedByAll(leases, value as boolean[]);
      }
      case "acknowledgeAndClaim": {
        const result = value as AcknowledgedAndClaimed<P>;
        return {
          ...result,
          acknowledged: await this.#endedByAll(
            args[0] as readonly Lease<unknown>[],
            result.acknowledged,
          ),
        };
      }
      case "release":
        return value === false
          ? await this.#endedBy(args[0] as Lease<unknown>, "released")
          : value;
    }
    return value;
  }

  // Per lease, its answer, or (false) whether an earlier send acknowledged it.
  async #endedByAll(
    leases: readonly Lease<unknown>[],
    answers: readonly boolean[],
  ): Promise<boolean[]> {
    const settled = [];
    for (const [i, lease] of leases.entries()) {
      settled.push(
        answers[i] === false
          ? await this.#endedBy(lease, "acknowledged")
          : answers[i] === true,
      );
    }
    return settled;
  }

  // Whether the ledger holds the lease's own `kind` entry.
  async #endedBy(
    lease: Lease<unknown>,
    kind: "acknowledged" | "released",
  ): Promise<boolean> {
    const explanation = await this.explain(lease.eventId);
    return explanation?.history.some((entry) =>
      entry.kind === kind && entry.fence === lease.fence &&
      entry.token === lease.token
    ) ?? false;
  }

  #call(method: string, args: readonly unknown[]): Promise<Answer> {
    if (this.#failure) return Promise.reject(this.#failure);
    if (this.#local) {
      return this.#run(this.#local, method, args, true).then((value) =>
        answer(value, false)
      );
    }
    return new Promise((resolve, reject) => {
      const call: ForwardedCall = {
        method,
        args,
        sends: 0,
        resolve: (value) => resolve(answer(value, call.sends > 1)),
        reject,
      };
      const id = `${this.tab}:${this.#next++}`;
      this.#pending.set(id, call);
      this.#forward(id, call);
    });
  }

  /**
   * Leaves the group: a leading tab closes its database and lets another tab
   * take over; pending calls reject.
   */
  async close(): Promise<void> {
    if (this.#failure) return;
    this.#failure = new Error("The outbox is closed");
    this.#unwatch();
    this.#unwatchLeft();
    this.#lockRequest.abort();
    const local = this.#local;
    this.#local = undefined;
    try {
      await local?.close();
    } finally {
      this.#stopLeading?.();
      this.#rejectPending(this.#failure);
      this.#channel.close();
    }
  }

  // Runs a call in this leader's worker; a stored event is announced with an
  // "enqueue" event, so a delivery loop can wait for work on events rather
  // than on timers (which browsers throttle in background tabs).
  async #run(
    local: WorkerConnection,
    method: string,
    args: readonly unknown[],
    own: boolean,
  ): Promise<unknown> {
    const result = await local.call(method, args, own);
    if (method === "enqueue") this.dispatchEvent(new Event("enqueue"));
    return result;
  }

  // Sends a call to the leader. While a leader other than this tab is
  // known, it must take the call on (a "received" message) within
  // busyTimeoutMs, or the call fails with BusyError: a frozen or hung
  // leader does not hold the call for ever. With no leader known, the call
  // waits for the next one's announcement, which sends it again.
  #forward(id: string, call: ForwardedCall): void {
    call.sends++;
    clearTimeout(call.timer);
    const leader = this.#leader;
    const waiting = leader !== undefined && leader !== this.tab;
    const expiresAt = Date.now() + this.#receiptWaitMs;
    if (waiting) {
      call.timer = setTimeout(() => {
        if (this.#pending.get(id) !== call) return;
        this.#pending.delete(id);
        call.reject(
          new BusyError(
            call.takenOn
              ? `Cannot ${call.method} as the leader tab did not take the call on again within ${this.#receiptWaitMs} ms (busyTimeoutMs) after it was sent again: it may be frozen, hung or going away; a leader took it on before, so it may have run (check, e.g. with explain(), before calling again)`
              : `Cannot ${call.method} as the leader tab did not take the call on within ${this.#receiptWaitMs} ms (busyTimeoutMs): it may be frozen, hung or going away; the call did not run, and calling again is safe`,
          ),
        );
      }, this.#receiptWaitMs);
    }
    this.#channel.postMessage(
      {
        type: "call",
        id,
        from: this.tab,
        method: call.method,
        args: call.args,
        ...(waiting ? { expiresAt } : {}),
      } satisfies ChannelMessage,
    );
  }

  async #lead(): Promise<void> {
    if (this.#failure) return;
    let local: WorkerConnection | undefined;
    try {
      local = await WorkerConnection.open(
        this.#setup,
        () => this.#stepDown(local),
      );
    } catch (error) {
      this.#failure = error instanceof Error ? error : new Error(String(error));
      this.#rejectPending(this.#failure);
      return;
    }
    if (this.#failure) {
      await local.close();
      return;
    }
    if (this.#resting) {
      // Frozen while it opened: closing would wait for the thaw, lock held.
      local.terminate();
      return;
    }
    const stopped = new Promise<void>((resolve) => {
      this.#stopLeading = resolve;
    });
    this.#local = local;
    this.#leader = this.tab;
    // Leases a tab left behind as it went (the leader before this one, or
    // this page before a reload), now and whenever one is left later.
    this.#releaseLeft(local);
    this.#unwatchLeft = this.#left.watch(() => {
      if (this.#local === local) this.#releaseLeft(local);
    });
    this.#channel.postMessage(
      { type: "leader", tab: this.tab } satisfies ChannelMessage,
    );
    for (const [id, call] of this.#pending) {
      this.#pending.delete(id);
      clearTimeout(call.timer);
      call.sends++;
      this.#run(local, call.method, call.args, true).then(
        call.resolve,
        call.reject,
      );
    }
    this.dispatchEvent(new Event("leaderchange"));
    await stopped;
  }

  #releaseLeft(local: WorkerConnection): void {
    for (const lease of this.#left.take()) {
      this.#run(local, "release", [lease, { error: TAB_CLOSED }], false)
        .catch(() => {});
    }
  }

  // The database worker died: give the lock back so that the next tab in
  // line (or this one, queued again) opens the database in a new worker.
  #stepDown(local: WorkerConnection | undefined): void {
    if (local === undefined || this.#local !== local) return;
    this.#local = undefined;
    this.#unwatchLeft();
    this.#stopLeading?.();
    this.dispatchEvent(new Event("leaderchange"));
    if (!this.#failure) this.#requestLeadership();
  }

  // The page is frozen or went into the back-forward cache: a leader gives
  // the database and the lock up at once, so another tab takes over, and
  // leaves its leases to it. Its worker is ended rather than closed (a
  // frozen page's worker would never finish closing, and would keep the
  // OPFS handles); SQLite's journal makes that safe. Calls still waiting
  // for the worker go to the next leader, like a follower's.
  #stepAside(): void {
    this.#resting = true;
    // A frozen tab granted the lock could not use it, and would hold it.
    this.#lockRequest.abort();
    const local = this.#local;
    if (local === undefined) return;
    this.#local = undefined;
    this.#leader = undefined;
    this.#unwatchLeft();
    this.#leaveLeases();
    for (const call of local.handOver()) {
      // Other tabs' calls are theirs to send again to the next leader, and
      // the worker's own business ends with it.
      if (!call.own || WORKER_ONLY.has(call.method)) continue;
      this.#pending.set(`${this.tab}:${this.#next++}`, {
        ...call,
        // It may have run in the ended worker: its answer says so.
        resolve: (value) => call.resolve(new Resent(value)),
        sends: 1,
        takenOn: true,
      });
    }
    this.#stopLeading?.();
    this.dispatchEvent(new Event("leaderchange"));
  }

  // The page is back from being frozen or from the back-forward cache:
  // queue for leadership again and learn who leads now.
  #wake(): void {
    if (!this.#resting || this.#failure) return;
    this.#resting = false;
    this.#channel.postMessage({ type: "hello" } satisfies ChannelMessage);
    this.#requestLeadership();
  }

  // Writes this tab's leases where the next leader finds them, and forgets
  // them here. Returns their keys.
  #leaveLeases(): string[] {
    const leases = this.forgetLeases() as Lease<unknown>[];
    const left: LeftLease[] = leases.map(({ eventId, token, fence }) => ({
      eventId,
      token,
      fence,
    }));
    return this.#left.leave(this.tab, left) ? left.map(leaseKey) : [];
  }

  #receive(message: ChannelMessage): void {
    switch (message.type) {
      case "hello":
        if (this.#local) {
          this.#channel.postMessage(
            { type: "leader", tab: this.tab } satisfies ChannelMessage,
          );
        }
        return;
      case "leader": {
        // Re-send on every announcement, even from the tab that led before
        // (it may lead again after its worker died): a leader runs a call
        // it has already seen only once.
        const changed = message.tab !== this.#leader;
        this.#leader = message.tab;
        for (const [id, call] of this.#pending) this.#forward(id, call);
        if (changed) this.dispatchEvent(new Event("leaderchange"));
        return;
      }
      case "call":
        if (this.#local) this.#answer(this.#local, message);
        return;
      case "received": {
        const call = this.#pending.get(message.id);
        if (message.to === this.tab && call !== undefined) {
          clearTimeout(call.timer);
          call.takenOn = true;
        }
        return;
      }
      case "hidden":
        this.#hiddenTabs.add(message.tab);
        return;
      case "shown":
        this.#hiddenTabs.delete(message.tab);
        return;
      case "reply": {
        const call = this.#pending.get(message.id);
        if (message.to !== this.tab || call === undefined) return;
        this.#pending.delete(message.id);
        clearTimeout(call.timer);
        if (message.ok) call.resolve(message.value);
        else call.reject(fromWireError(message.error));
      }
    }
  }

  #answer(
    local: WorkerConnection,
    message: Extract<ChannelMessage, { type: "call" }>,
  ): void {
    // Its sender has given it up (or is about to) with a BusyError: a call
    // that did not run must not run now.
    if (
      message.expiresAt !== undefined &&
      Date.now() > message.expiresAt - RECEIPT_MARGIN_MS &&
      !this.#seen.has(message.id)
    ) {
      return;
    }
    this.#channel.postMessage(
      {
        type: "received",
        id: message.id,
        to: message.from!,
      } satisfies ChannelMessage,
    );
    // A call re-sent to this same leader is answered by the first run.
    if (this.#seen.has(message.id)) return;
    this.#seen.add(message.id);
    if (this.#seen.size > SEEN_LIMIT) {
      this.#seen.delete(this.#seen.values().next().value!);
    }
    // Only outbox methods cross tabs: opening and closing the leader's
    // database is the leader's own business.
    const call = WORKER_ONLY.has(message.method)
      ? Promise.reject(
        new TypeError(
          `Cannot call '${message.method}' as it is not an outbox method`,
        ),
      )
      : this.#run(local, message.method, message.args, false);
    call.then((value) => {
      // Its tab went away while this claim ran: nobody will finish it.
      if (this.#hiddenTabs.has(message.from!)) {
        for (const lease of claimedLeases(message.method, value)) {
          this.#run(local, "release", [lease, { error: TAB_CLOSED }], false)
            .catch(() => {});
        }
      }
      return value;
    }).then(
      (value): ReplyMessage => ({
        type: "reply",
        id: message.id,
        ok: true,
        value,
      }),
      (error): ReplyMessage => ({
        type: "reply",
        id: message.id,
        ok: false,
        error: toWireError(error),
      }),
    ).then((reply) => {
      try {
        this.#channel.postMessage({ ...reply, to: message.from });
      } catch {
        // The channel closed with this tab's outbox: the follower re-sends
        // the call to the next leader.
      }
    });
  }

  // The page is going away: hand its leases back so that another tab can
  // claim them now rather than after they lapse. Nothing can be awaited
  // during pagehide. Into the back-forward cache (persisted), a leader
  // steps aside as when frozen: a cached page runs nothing.
  #hide(event: PageTransitionEvent): void {
    if (this.#local) {
      if (event.persisted) {
        this.#stepAside();
        return;
      }
      // The next leader (another tab, or this page reloaded) releases the
      // leases this tab knows of, from localStorage: the worker may be
      // ended before it reads another message. The worker releases the
      // rest, the leases of claims still in flight, if it gets to.
      const left = this.#leaveLeases();
      this.#local.call("hide", [left]).catch(() => {});
      return;
    }
    this.#channel.postMessage(
      { type: "hidden", tab: this.tab } satisfies ChannelMessage,
    );
    for (const lease of this.forgetLeases()) {
      this.#channel.postMessage(
        {
          type: "call",
          id: `${this.tab}:${this.#next++}`,
          from: this.tab,
          method: "release",
          args: [lease, { error: TAB_CLOSED }],
        } satisfies ChannelMessage,
      );
    }
  }

  #show(event: PageTransitionEvent): void {
    if (!event.persisted) return;
    if (this.#resting) {
      this.#wake();
      return;
    }
    if (this.#local) this.#local.call("show", []).catch(() => {});
    else {
      this.#channel.postMessage(
        { type: "shown", tab: this.tab } satisfies ChannelMessage,
      );
    }
  }

  #rejectPending(error: Error): void {
    for (const call of this.#pending.values()) {
      clearTimeout(call.timer);
      call.reject(error);
    }
    this.#pending.clear();
  }
}

/**
 * Joins the outbox every tab of this origin shares under `name`. The first
 * tab to get the `navigator.locks` lock hosts the database in its worker;
 * calls from other tabs are forwarded to it. Calls made while no tab leads
 * (at start, or while leadership passes on) wait for the next leader.
 *
 * @param name The outbox name: 1-64 letters, digits, `_` or `-`.
 * @param options See {@linkcode BrowserOutboxOptions}.
 * @returns The shared outbox; it resolves at once, calls wait for a leader.
 * @throws {TypeError | RangeError} When an argument is invalid.
 *
 * @example Usage
 * ```ts ignore
 * import { openSharedOutbox } from "@leased/outbox/browser";
 *
 * const outbox = await openSharedOutbox("mail");
 * outbox.addEventListener("leaderchange", () => {
 *   if (outbox.isLeader) console.log("this tab delivers now");
 * });
 * ```
 */
export function openSharedOutbox<P = unknown>(
  name: string,
  options: BrowserOutboxOptions = {},
): Promise<SharedOutbox<P>> {
  try {
    return Promise.resolve(
      SharedOutbox.create<P>(name, setup("open outbox", name, options)),
    );
  } catch (error) {
    return Promise.reject(error);
  }
}
