/**
 * {@linkcode openSharedOutbox}: one outbox shared by every tab of an origin.
 * The tab holding the `navigator.locks` lock leads: it hosts the database in
 * its worker, and the other tabs forward their calls to it over a
 * `BroadcastChannel`.
 *
 * @module
 */
import type { EnqueueOptions, EnqueueResult } from "../lease.ts";
import { uuidv7 } from "../identity.ts";
import {
  type BrowserOutboxOptions,
  leaseMsOf,
  setup,
  watchVisibility,
  WorkerConnection,
  type WorkerSetup,
} from "./connection.ts";
import {
  type ChannelMessage,
  claimedLeases,
  fromWireError,
  OpfsUnavailableError,
  type ReplyMessage,
  TAB_CLOSED,
  toWireError,
} from "./protocol.ts";
import { RemoteOutbox } from "./remote.ts";

// The slice of the Web Locks API used here (absent from Deno's own lib).
interface LockManager {
  request(
    name: string,
    options: { signal: AbortSignal },
    callback: () => Promise<void>,
  ): Promise<void>;
}

interface ForwardedCall {
  readonly method: string;
  readonly args: readonly unknown[];
  resolve(value: unknown): void;
  reject(error: Error): void;
}

// A leader remembers the ids of the calls it ran, so that a call a follower
// re-sends (it learned of this leader after sending) does not run twice.
const SEEN_LIMIT = 100_000;

const WORKER_ONLY = new Set(["open", "close", "hide", "show", "hasVfs"]);

/**
 * An outbox shared by every tab of the origin. Made by
 * {@linkcode openSharedOutbox}. Dispatches `"leaderchange"` when the tab
 * hosting the database changes, and in the leader tab `"enqueue"` whenever
 * an event from any tab was stored.
 */
export class SharedOutbox<P = unknown> extends RemoteOutbox<P> {
  /** This tab's id on the channel. */
  readonly tab: string = crypto.randomUUID();
  readonly #setup: WorkerSetup;
  readonly #channel: BroadcastChannel;
  readonly #pending = new Map<string, ForwardedCall>();
  readonly #seen = new Set<string>();
  readonly #abort = new AbortController();
  readonly #locks: LockManager;
  readonly #hiddenTabs = new Set<string>();
  #unwatch: () => void = () => {};
  #stopLeading: (() => void) | undefined;
  #local: WorkerConnection | undefined;
  #leader: string | undefined;
  #failure: Error | undefined;
  #next = 0;

  private constructor(name: string, setup: WorkerSetup) {
    super(name, leaseMsOf(setup));
    this.#setup = setup;
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
    this.#unwatch = watchVisibility(() => this.#hide(), () => this.#show());
    this.#channel.postMessage({ type: "hello" } satisfies ChannelMessage);
    this.#requestLeadership();
  }

  #requestLeadership(): void {
    this.#locks.request(
      `leased-outbox:${this.name}`,
      { signal: this.#abort.signal },
      () => this.#lead(),
    ).catch(() => {/* aborted by close() before this tab led */});
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
   * it before it went away.
   *
   * @param payload A JSON-serializable value, or a `Uint8Array`.
   * @param options Delay, attempts, dedup and ordering keys, identity, queue.
   * @returns The event id, its identity, and whether the caller's `dedupKey`
   * or `identity` matched an earlier event.
   * @throws {TypeError | RangeError} When an argument is invalid.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  override async enqueue(
    payload: P,
    options: EnqueueOptions = {},
  ): Promise<EnqueueResult> {
    if (
      options === null || typeof options !== "object" ||
      options.identity !== undefined
    ) {
      return super.enqueue(payload, options);
    }
    const identity = uuidv7();
    const result = await super.enqueue(payload, { ...options, identity });
    // Our own identity found means a re-sent call the old leader stored.
    return result.identity === identity
      ? { ...result, deduplicated: false }
      : result;
  }

  /** Runs a call here when leading, else forwards it to the leader. */
  protected invoke(method: string, args: readonly unknown[]): Promise<unknown> {
    if (this.#failure) return Promise.reject(this.#failure);
    if (this.#local) return this.#run(this.#local, method, args, true);
    const id = `${this.tab}:${this.#next++}`;
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { method, args, resolve, reject });
      this.#forward(id, method, args);
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
    this.#abort.abort();
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

  #forward(id: string, method: string, args: readonly unknown[]): void {
    this.#channel.postMessage(
      {
        type: "call",
        id,
        from: this.tab,
        method,
        args,
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
    const stopped = new Promise<void>((resolve) => {
      this.#stopLeading = resolve;
    });
    this.#local = local;
    this.#leader = this.tab;
    this.#channel.postMessage(
      { type: "leader", tab: this.tab } satisfies ChannelMessage,
    );
    for (const [id, call] of this.#pending) {
      this.#pending.delete(id);
      this.#run(local, call.method, call.args, true).then(
        call.resolve,
        call.reject,
      );
    }
    this.dispatchEvent(new Event("leaderchange"));
    await stopped;
  }

  // The database worker died: give the lock back so that the next tab in
  // line (or this one, queued again) opens the database in a new worker.
  #stepDown(local: WorkerConnection | undefined): void {
    if (local === undefined || this.#local !== local) return;
    this.#local = undefined;
    this.#stopLeading?.();
    this.dispatchEvent(new Event("leaderchange"));
    if (!this.#failure) this.#requestLeadership();
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
        for (const [id, call] of this.#pending) {
          this.#forward(id, call.method, call.args);
        }
        if (changed) this.dispatchEvent(new Event("leaderchange"));
        return;
      }
      case "call":
        if (this.#local) this.#answer(this.#local, message);
        return;
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
        if (message.ok) call.resolve(message.value);
        else call.reject(fromWireError(message.error));
      }
    }
  }

  #answer(
    local: WorkerConnection,
    message: Extract<ChannelMessage, { type: "call" }>,
  ): void {
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
  // claim them now rather than after they lapse. Fire and forget, since
  // nothing can be awaited during pagehide; a lost release only delays.
  #hide(): void {
    if (this.#local) {
      // The worker releases this tab's leases, and claims still in flight.
      this.#local.call("hide", []).catch(() => {});
      return;
    }
    this.#channel.postMessage(
      { type: "hidden", tab: this.tab } satisfies ChannelMessage,
    );
    for (const lease of this.heldLeases()) {
      this.#forward(`${this.tab}:${this.#next++}`, "release", [
        lease,
        { error: TAB_CLOSED },
      ]);
    }
  }

  #show(): void {
    if (this.#local) this.#local.call("show", []).catch(() => {});
    else {
      this.#channel.postMessage(
        { type: "shown", tab: this.tab } satisfies ChannelMessage,
      );
    }
  }

  #rejectPending(error: Error): void {
    for (const call of this.#pending.values()) call.reject(error);
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
