/**
 * A reference model of the lease contract and the model-based test that
 * checks real outboxes against it.
 *
 * The model is written from the contract (README.md, Guarantees), the
 * acceptance cases and the semantics the lead fixed, not from lease.ts: plain
 * objects in a map, the clock passed into every call, no SQL. Where the contract leaves a choice,
 * the choice is stated next to the code that makes it.
 *
 * {@linkcode runModelTest} generates command sequences with fast-check, runs
 * each on fresh outboxes (one per connection, all sharing one database and
 * one manual clock) and on the model, and compares every result step by
 * step. A divergence fails with the shrunk command sequence printed one
 * command per line.
 *
 * @module
 */
import assert from "node:assert/strict";
import fc from "npm:fast-check@4.11.0";
import {
  type AcknowledgedAndClaimed,
  type EnqueueResult,
  type Lease,
  LeaseLostError,
  Outbox,
} from "../mod.ts";
import type { Driver } from "../driver.ts";
import type { Connections } from "./drivers.ts";
import { PostgresDriver } from "../drivers/postgres.ts";
import { ManualClock } from "./helpers.ts";

/** The state of an event in the model. */
export type ModelState = "pending" | "leased" | "done" | "dead";

/** What the model knows about one event. */
interface ModelEvent {
  readonly id: number;
  readonly queue: string;
  readonly payload: unknown;
  readonly dedupKey: string | null;
  readonly orderingKey: string | null;
  readonly maxAttempts: number;
  readonly createdAt: number;
  state: ModelState;
  /** While pending: the first time it may be claimed. */
  dueAt: number;
  /** While leased: the deadline; the lease is live while `now < leaseUntil`. */
  leaseUntil: number;
  token: string | null;
  /** Every token the event was ever claimed with: none may claim it again. */
  readonly tokens: Set<string>;
  fence: number;
  attempt: number;
  lastError: string | null;
  deadAt: number | null;
  doneAt: number | null;
}

/** A lease as the model hands it out; minted tokens are `minted:<n>`. */
export interface ModelLease {
  readonly eventId: number;
  readonly queue: string;
  readonly token: string;
  readonly fence: number;
  readonly attempt: number;
  readonly maxAttempts: number;
  readonly leaseUntil: number;
  readonly payload: unknown;
  readonly orderingKey: string | null;
  readonly lastError: string | null;
}

/** Enqueue options as the model takes them, defaults already applied. */
export interface ModelEnqueue {
  readonly queue: string;
  readonly delayMs: number;
  readonly maxAttempts: number;
  readonly dedupKey: string | null;
  readonly orderingKey: string | null;
}

/** A dead letter as the model lists it. */
export interface ModelDeadLetter {
  readonly eventId: number;
  readonly queue: string;
  readonly payload: unknown;
  readonly attempts: number;
  readonly lastError: string | null;
  readonly createdAt: number;
  readonly deadAt: number;
}

/** Counts per state as the model reports them. */
export interface ModelStats {
  readonly pending: number;
  readonly leased: number;
  readonly done: number;
  readonly dead: number;
  readonly oldestPendingAgeMs: number;
}

/** The part of an explanation the model predicts (not the ledger). */
export interface ModelExplanation {
  readonly eventId: number;
  readonly queue: string;
  readonly state: ModelState;
  readonly attempt: number;
  readonly maxAttempts: number;
  readonly fence: number;
  readonly lastError: string | null;
}

/** Why the model expects a call to throw; the real call must throw alike. */
export class ModelRejection extends Error {
  /**
   * @param expected The error class the real call must throw.
   * @param message What was rejected.
   */
  constructor(
    readonly expected: typeof RangeError | typeof LeaseLostError,
    message: string,
  ) {
    super(message);
    this.name = "ModelRejection";
  }
}

const LEASE_EXPIRED = "lease expired";

/**
 * The reference outbox: every method is one atomic call at a given `now`.
 * A call that throws leaves the model exactly as it was (a rolled-back
 * transaction).
 */
export class ReferenceOutbox {
  #events = new Map<number, ModelEvent>();
  /** Ids are never reused, even after purge: `${eventId}:${fence}` must stay unique. */
  #lastId = 0;
  #minted = 0;

  /**
   * Adds an event, or finds the one its dedup key names. It reads nothing
   * lapsed leases decide, so it leaves them to the next call that does.
   */
  enqueue(
    now: number,
    payload: unknown,
    options: ModelEnqueue,
  ): { eventId: number; deduplicated: boolean } {
    return this.#atomic(
      now,
      () => this.#enqueue(now, payload, options),
      false,
    );
  }

  /** Claims up to `max` events, as `max` single claims at the same `now`. */
  claim(
    now: number,
    options: {
      queue: string;
      leaseMs: number;
      max: number;
      token: string | null;
    },
    skip: ReadonlySet<number> = new Set(),
  ): ModelLease[] {
    return this.#atomic(now, () => {
      const leases: ModelLease[] = [];
      while (leases.length < options.max) {
        const event = this.#next(now, options.queue, skip);
        if (event === undefined) break;
        let token = options.token;
        if (token === null) token = `minted:${++this.#minted}`;
        else if (event.tokens.has(token)) {
          throw new ModelRejection(
            RangeError,
            `token ${token} was used on event ${event.id} before`,
          );
        }
        // Taking over a lapsed lease records why the previous attempt ended.
        if (event.state === "leased") event.lastError = LEASE_EXPIRED;
        event.state = "leased";
        event.token = token;
        event.tokens.add(token);
        event.fence += 1;
        event.attempt += 1;
        event.leaseUntil = now + options.leaseMs;
        leases.push(this.#lease(event));
      }
      return leases;
    });
  }

  /** Acknowledges leases one after another in one call. */
  acknowledge(now: number, leases: readonly ModelLease[]): boolean[] {
    return this.#atomic(
      now,
      () => leases.map((l) => this.#acknowledge(now, l)),
    );
  }

  /** Acknowledges leases, then claims up to `max`, in one call. */
  acknowledgeAndClaim(
    now: number,
    leases: readonly ModelLease[],
    options: { queue: string; leaseMs: number; max: number },
    skip: ReadonlySet<number> = new Set(),
  ): { acknowledged: boolean[]; leases: ModelLease[] } {
    return this.#atomic(now, () => ({
      acknowledged: leases.map((l) => this.#acknowledge(now, l)),
      leases: this.claim(now, { ...options, token: null }, skip),
    }));
  }

  /** Extends a live lease to `max(deadline, now + leaseMs)`. */
  renew(now: number, lease: ModelLease, leaseMs: number): number | false {
    return this.#atomic(now, () => {
      const event = this.#owned(lease);
      if (event === undefined || now >= event.leaseUntil) return false;
      event.leaseUntil = Math.max(event.leaseUntil, now + leaseMs);
      return event.leaseUntil;
    });
  }

  /** Gives an event back; with no attempts left it becomes dead. */
  release(
    now: number,
    lease: ModelLease,
    options: { delayMs: number; error: string | null },
  ): boolean {
    return this.#atomic(now, () => {
      const event = this.#owned(lease);
      if (event === undefined) return false;
      // Choice: a release without an error keeps the previous error text.
      event.lastError = options.error ?? event.lastError;
      event.token = null;
      if (event.attempt >= event.maxAttempts) {
        event.state = "dead";
        event.deadAt = now;
      } else {
        event.state = "pending";
        event.dueAt = now + options.delayMs;
      }
      return true;
    });
  }

  /** Lists a queue's dead letters by id. */
  deadLetters(now: number, queue: string, limit: number): ModelDeadLetter[] {
    return this.#atomic(now, () =>
      [...this.#events.values()]
        .filter((e) => e.queue === queue && e.state === "dead")
        .sort((a, b) => a.id - b.id)
        .slice(0, limit)
        .map((e) => ({
          eventId: e.id,
          queue: e.queue,
          payload: e.payload,
          attempts: e.attempt,
          lastError: e.lastError,
          createdAt: e.createdAt,
          deadAt: e.deadAt!,
        })));
  }

  /** Makes a dead event pending at `now` with its attempts reset. */
  retry(now: number, eventId: number): boolean {
    return this.#atomic(now, () => {
      const event = this.#events.get(eventId);
      if (event?.state !== "dead") return false;
      event.state = "pending";
      event.attempt = 0;
      event.dueAt = now;
      event.deadAt = null;
      return true;
    });
  }

  /** Deletes done events acknowledged strictly before `doneBeforeMs`. */
  purge(now: number, doneBeforeMs: number): number {
    return this.#atomic(now, () => {
      let deleted = 0;
      for (const event of [...this.#events.values()]) {
        if (event.state === "done" && event.doneAt! < doneBeforeMs) {
          this.#events.delete(event.id);
          deleted += 1;
        }
      }
      return deleted;
    });
  }

  /** Counts a queue's events per state. */
  stats(now: number, queue: string): ModelStats {
    return this.#atomic(now, () => {
      const events = [...this.#events.values()].filter((e) =>
        e.queue === queue
      );
      const count = (state: ModelState) =>
        events.filter((e) => e.state === state).length;
      const pendingSince = events
        .filter((e) => e.state === "pending")
        .map((e) => e.createdAt);
      return {
        pending: count("pending"),
        leased: count("leased"),
        done: count("done"),
        dead: count("dead"),
        oldestPendingAgeMs: pendingSince.length === 0
          ? 0
          : Math.max(0, now - Math.min(...pendingSince)),
      };
    });
  }

  /** One event's state, or `null` when there is none. */
  explain(now: number, eventId: number): ModelExplanation | null {
    return this.#atomic(now, () => {
      const e = this.#events.get(eventId);
      if (e === undefined) return null;
      return {
        eventId: e.id,
        queue: e.queue,
        state: e.state,
        attempt: e.attempt,
        maxAttempts: e.maxAttempts,
        fence: e.fence,
        lastError: e.lastError,
      };
    });
  }

  /** Enqueues and acknowledges in one transaction: both or neither. */
  enqueueAndAcknowledge(
    now: number,
    payload: unknown,
    options: ModelEnqueue,
    lease: ModelLease,
  ): { eventId: number; deduplicated: boolean } {
    return this.#atomic(now, () => {
      const result = this.#enqueue(now, payload, options);
      if (!this.#acknowledge(now, lease)) {
        throw new ModelRejection(LeaseLostError, "the lease is stale");
      }
      return result;
    });
  }

  /** Ids of every event the model holds. */
  ids(): number[] {
    return [...this.#events.keys()];
  }

  /** An event's lease deadline while it is leased, else `null` (no call: nothing changes). */
  leaseUntil(eventId: number): number | null {
    const event = this.#events.get(eventId);
    return event?.state === "leased" ? event.leaseUntil : null;
  }

  /** An independent copy, to try one serial order of concurrent calls. */
  clone(): ReferenceOutbox {
    const copy = new ReferenceOutbox();
    copy.#events = structuredClone(this.#events);
    copy.#lastId = this.#lastId;
    copy.#minted = this.#minted;
    return copy;
  }

  /**
   * Runs one call as a transaction. First, unless `expire` is false (an
   * enqueue), leases that lapsed with no attempts left become dead (the
   * lead's decision: they count as dead from their deadline on), as seen by
   * whichever such call comes first at or after the deadline; they died at
   * their deadline.
   */
  #atomic<T>(now: number, fn: () => T, expire = true): T {
    const saved = {
      events: structuredClone(this.#events),
      lastId: this.#lastId,
      minted: this.#minted,
    };
    try {
      for (const event of expire ? this.#events.values() : []) {
        if (
          event.state === "leased" && event.attempt >= event.maxAttempts &&
          now >= event.leaseUntil
        ) {
          event.state = "dead";
          event.token = null;
          event.lastError = LEASE_EXPIRED;
          event.deadAt = event.leaseUntil;
        }
      }
      return fn();
    } catch (error) {
      this.#events = saved.events;
      this.#lastId = saved.lastId;
      this.#minted = saved.minted;
      throw error;
    }
  }

  #enqueue(
    now: number,
    payload: unknown,
    options: ModelEnqueue,
  ): { eventId: number; deduplicated: boolean } {
    if (options.dedupKey !== null) {
      for (const event of this.#events.values()) {
        if (
          event.queue === options.queue && event.dedupKey === options.dedupKey
        ) {
          return { eventId: event.id, deduplicated: true };
        }
      }
    }
    const id = ++this.#lastId;
    this.#events.set(id, {
      id,
      queue: options.queue,
      payload,
      dedupKey: options.dedupKey,
      orderingKey: options.orderingKey,
      maxAttempts: options.maxAttempts,
      createdAt: now,
      state: "pending",
      dueAt: now + options.delayMs,
      leaseUntil: 0,
      token: null,
      tokens: new Set(),
      fence: 0,
      attempt: 0,
      lastError: null,
      deadAt: null,
      doneAt: null,
    });
    return { eventId: id, deduplicated: false };
  }

  #acknowledge(now: number, lease: ModelLease): boolean {
    const event = this.#owned(lease);
    if (event === undefined) return false;
    event.state = "done";
    event.doneAt = now;
    return true;
  }

  /** The event iff the lease's token still holds it (a lapsed lease may). */
  #owned(lease: ModelLease): ModelEvent | undefined {
    const event = this.#events.get(lease.eventId);
    return event?.state === "leased" && event.token === lease.token
      ? event
      : undefined;
  }

  /**
   * The first claimable event by (due time, id), a lease's due time being
   * its deadline, leaving out the events in `skip` (which still hold back
   * later events of their ordering key). An event of an ordering key waits
   * for every earlier unfinished event of its key and for every live lease
   * of its key, on both engines: one event of a key in flight at a time.
   */
  #next(
    now: number,
    queue: string,
    skip: ReadonlySet<number>,
  ): ModelEvent | undefined {
    const due = (e: ModelEvent) =>
      e.state === "leased" ? e.leaseUntil : e.dueAt;
    const unfinished = (e: ModelEvent) =>
      e.state === "pending" || e.state === "leased";
    const events = [...this.#events.values()];
    return events
      .filter((e) =>
        e.queue === queue && unfinished(e) && due(e) <= now &&
        e.attempt < e.maxAttempts && !skip.has(e.id) &&
        !(e.orderingKey !== null && events.some((p) =>
          p.queue === queue && p.orderingKey === e.orderingKey && (
            p.id < e.id && unfinished(p) ||
            p.id !== e.id && p.state === "leased" && p.leaseUntil > now
          )
        ))
      )
      .sort((a, b) => due(a) - due(b) || a.id - b.id)[0];
  }

  #lease(e: ModelEvent): ModelLease {
    return {
      eventId: e.id,
      queue: e.queue,
      token: e.token!,
      fence: e.fence,
      attempt: e.attempt,
      maxAttempts: e.maxAttempts,
      leaseUntil: e.leaseUntil,
      payload: e.payload,
      orderingKey: e.orderingKey,
      lastError: e.lastError,
    };
  }
}

// ---------------------------------------------------------------- commands

const QUEUES = ["default", "other"] as const;
const TOKENS = ["tokenA", "tokenB"] as const;

/**
 * One call of one worker. `worker`, `lease` and `leases` are indices taken
 * modulo what exists (`lease: 0` is the worker's latest lease); `eventId`
 * is a model id (the n-th event enqueued).
 */
export type WorkerCommand =
  | {
    readonly op: "enqueue";
    readonly worker: number;
    readonly payload: unknown;
    readonly queue?: string;
    readonly delayMs?: number;
    readonly maxAttempts?: number;
    readonly dedupKey?: string;
    readonly orderingKey?: string;
  }
  | {
    readonly op: "claim";
    readonly worker: number;
    readonly queue?: string;
    readonly leaseMs?: number;
    readonly token?: string;
  }
  | {
    readonly op: "claimBatch";
    readonly worker: number;
    readonly max: number;
    readonly queue?: string;
    readonly leaseMs?: number;
  }
  | {
    readonly op: "acknowledge";
    readonly worker: number;
    readonly lease: number;
  }
  | {
    readonly op: "acknowledgeBatch";
    readonly worker: number;
    readonly leases: readonly number[];
  }
  | {
    readonly op: "acknowledgeAndClaim";
    readonly worker: number;
    readonly leases: readonly number[];
    readonly max: number;
    readonly queue?: string;
    readonly leaseMs?: number;
  }
  | {
    readonly op: "renew";
    readonly worker: number;
    readonly lease: number;
    readonly leaseMs?: number;
  }
  | {
    readonly op: "release";
    readonly worker: number;
    readonly lease: number;
    readonly delayMs?: number;
    readonly error?: string;
  }
  | {
    readonly op: "transaction";
    readonly worker: number;
    readonly lease: number;
    readonly payload: unknown;
    readonly dedupKey?: string;
  }
  | {
    readonly op: "deadLetters";
    readonly worker: number;
    readonly queue?: string;
    readonly limit?: number;
  }
  | { readonly op: "retry"; readonly worker: number; readonly eventId: number }
  | { readonly op: "stats"; readonly worker: number; readonly queue?: string }
  | {
    readonly op: "explain";
    readonly worker: number;
    readonly eventId: number;
  }
  | { readonly op: "purge"; readonly worker: number; readonly ageMs: number };

/**
 * One generated step: a worker's call, a clock move (possibly backwards;
 * `toDeadline` sets the clock next to a held lease's deadline, where
 * off-by-one faults live), two calls started at once whose results must match one of the two
 * serial orders, or an application transaction on a worker's connection:
 * `BEGIN`, a business row, `outbox.enqueue` (and `outbox.acknowledge` of a
 * held lease when `lease` is set) joining it inside `outbox.within`, then
 * `COMMIT` or `ROLLBACK`.
 */
export type Command =
  | WorkerCommand
  | {
    readonly op: "application";
    readonly worker: number;
    readonly payload: unknown;
    readonly dedupKey?: string;
    readonly lease?: number;
    readonly commit: boolean;
  }
  | { readonly op: "advance"; readonly ms: number }
  | {
    readonly op: "toDeadline";
    readonly worker: number;
    readonly lease: number;
    readonly offsetMs: number;
  }
  | {
    readonly op: "together";
    readonly first: WorkerCommand;
    readonly second: WorkerCommand;
  };

/** Per-worker outbox options; absent fields take the library defaults. */
export interface WorkerSetup {
  readonly leaseMs?: number;
  readonly maxAttempts?: number;
}

/** `T` with the fields that may be `undefined` made optional instead. */
type Present<T> =
  & { [K in keyof T as undefined extends T[K] ? never : K]: T[K] }
  & {
    [K in keyof T as undefined extends T[K] ? K : never]?: Exclude<
      T[K],
      undefined
    >;
  };

/** Drops `undefined` fields, so `exactOptionalPropertyTypes` holds. */
function present<T extends object>(value: T): Present<T> {
  return Object.fromEntries(
    Object.entries(value).filter(([, v]) => v !== undefined),
  ) as Present<T>;
}

/** A command on one line, e.g. `w1.claim({"leaseMs":5})`. */
function line(command: Command): string {
  if (command.op === "together") {
    return `together(${line(command.first)}, ${line(command.second)})`;
  }
  const { op, ...rest } = command;
  const worker = "worker" in rest ? `w${rest.worker}.` : "";
  const args = Object.fromEntries(
    Object.entries(rest).filter(([k]) => k !== "worker"),
  );
  return `${worker}${op}(${fc.stringify(args)})`;
}

/** Makes fast-check print a counterexample one command per line. */
function printable<C extends Command>(generated: Present<C>): C {
  const command = present(generated) as unknown as C;
  const text = `\n  ${line(command)}`;
  return Object.defineProperty(command, fc.toStringMethod, {
    value: () => text,
  });
}

const optional = <T>(arb: fc.Arbitrary<T>, freq = 2) =>
  fc.option(arb, { nil: undefined, freq });

const worker = fc.nat({ max: 2 });
const queue = optional(fc.constant(QUEUES[1]), 5);
/** Mostly the latest lease, which is the likeliest to be live. */
const leaseIndex = fc.oneof(
  { weight: 3, arbitrary: fc.constant(0) },
  { weight: 2, arbitrary: fc.nat({ max: 4 }) },
);
/** Just past 2^31 ms: such leases must stay exact through the WASM boundary. */
const LONG_MS = 2 ** 31 + 7;
const leaseMs = optional(fc.oneof(
  { weight: 20, arbitrary: fc.integer({ min: 1, max: 40 }) },
  { weight: 1, arbitrary: fc.constant(LONG_MS) },
));
/** Payloads: JSON objects with odd strings, arrays, `null`, and bytes. */
type Payload = { n: number; s: string } | Uint8Array | null | boolean[];
const payload: fc.Arbitrary<Payload> = fc.oneof(
  fc.record({
    n: fc.integer(),
    s: fc.string({ unit: "binary", maxLength: 6 }),
  }, { noNullPrototype: true }),
  fc.uint8Array({ maxLength: 4 }),
  fc.constant(null),
  fc.array(fc.boolean(), { maxLength: 3 }),
);
const dedupKey = optional(fc.constantFrom("d1", "d2", "d3"), 3);

/** One worker call; the weights favour the lease operations. */
/**
 * A worker's call. `acknowledgeAndClaim` calls are appended to the choices
 * only when asked for, so that a recorded seed and path (the counterexample
 * tests) still replay the sequence they were found with.
 */
const workerCommand = (
  acknowledgeAndClaim: boolean,
): fc.Arbitrary<WorkerCommand> =>
  fc.oneof(
    {
      weight: 6,
      arbitrary: fc.record({
        op: fc.constant("enqueue" as const),
        worker,
        payload,
        queue,
        delayMs: optional(fc.integer({ min: 0, max: 30 })),
        maxAttempts: optional(fc.integer({ min: 1, max: 3 })),
        dedupKey,
        orderingKey: optional(fc.constantFrom("k1", "k2"), 3),
      }),
    },
    {
      weight: 5,
      arbitrary: fc.record({
        op: fc.constant("claim" as const),
        worker,
        queue,
        leaseMs,
        token: optional(fc.constantFrom(...TOKENS), 5),
      }),
    },
    {
      weight: 2,
      arbitrary: fc.record({
        op: fc.constant("claimBatch" as const),
        worker,
        max: fc.integer({ min: 1, max: 4 }),
        queue,
        leaseMs,
      }),
    },
    {
      weight: 4,
      arbitrary: fc.record({
        op: fc.constant("acknowledge" as const),
        worker,
        lease: leaseIndex,
      }),
    },
    {
      weight: 1,
      arbitrary: fc.record({
        op: fc.constant("acknowledgeBatch" as const),
        worker,
        leases: fc.array(leaseIndex, { minLength: 1, maxLength: 3 }),
      }),
    },
    {
      weight: 3,
      arbitrary: fc.record({
        op: fc.constant("renew" as const),
        worker,
        lease: leaseIndex,
        leaseMs,
      }),
    },
    {
      weight: 3,
      arbitrary: fc.record({
        op: fc.constant("release" as const),
        worker,
        lease: leaseIndex,
        delayMs: optional(fc.integer({ min: 0, max: 20 })),
        error: optional(fc.constantFrom("e1", "e2")),
      }),
    },
    {
      weight: 1,
      arbitrary: fc.record({
        op: fc.constant("transaction" as const),
        worker,
        lease: leaseIndex,
        payload,
        dedupKey,
      }),
    },
    {
      weight: 1,
      arbitrary: fc.record({
        op: fc.constant("deadLetters" as const),
        worker,
        queue,
        limit: optional(fc.integer({ min: 1, max: 3 }), 3),
      }),
    },
    {
      weight: 2,
      arbitrary: fc.record({
        op: fc.constant("retry" as const),
        worker,
        eventId: fc.integer({ min: 1, max: 12 }),
      }),
    },
    {
      weight: 1,
      arbitrary: fc.record({
        op: fc.constant("stats" as const),
        worker,
        queue,
      }),
    },
    {
      weight: 2,
      arbitrary: fc.record({
        op: fc.constant("explain" as const),
        worker,
        eventId: fc.integer({ min: 1, max: 12 }),
      }),
    },
    {
      weight: 1,
      arbitrary: fc.record({
        op: fc.constant("purge" as const),
        worker,
        ageMs: fc.integer({ min: 0, max: 40 }),
      }),
    },
    ...acknowledgeAndClaim
      ? [{
        weight: 2,
        arbitrary: fc.record({
          op: fc.constant("acknowledgeAndClaim" as const),
          worker,
          leases: fc.array(leaseIndex, { maxLength: 3 }),
          max: fc.integer({ min: 1, max: 4 }),
          queue,
          leaseMs,
        }),
      }]
      : [],
  ).map((c) => printable<WorkerCommand>(c as Present<WorkerCommand>));

/** The command generator: mostly single calls, small clock steps, some pairs. */
const commandArbitrary = (
  acknowledgeAndClaim: boolean,
): fc.Arbitrary<Command> => {
  const call = workerCommand(acknowledgeAndClaim);
  return fc.oneof(
    { weight: 32, arbitrary: call },
    {
      weight: 7,
      arbitrary: fc.record({
        op: fc.constant("advance" as const),
        ms: fc.oneof(
          { weight: 8, arbitrary: fc.integer({ min: 0, max: 20 }) },
          { weight: 2, arbitrary: fc.integer({ min: -25, max: -1 }) },
          { weight: 1, arbitrary: fc.constantFrom(30_000, LONG_MS) },
        ),
      }).map((c) => printable<Command>(c)),
    },
    {
      weight: 2,
      arbitrary: fc.record({
        op: fc.constant("toDeadline" as const),
        worker,
        lease: leaseIndex,
        offsetMs: fc.integer({ min: -1, max: 1 }),
      }).map((c) => printable<Command>(c)),
    },
    {
      weight: 3,
      arbitrary: fc.record({
        op: fc.constant("application" as const),
        worker,
        payload,
        dedupKey,
        lease: optional(leaseIndex),
        commit: fc.boolean(),
      }).map((c) => printable<Command>(c)),
    },
    {
      weight: 3,
      arbitrary: fc.record({
        op: fc.constant("together" as const),
        first: call,
        second: call,
      }).map((c) => printable<Command>(c)),
    },
  );
};

const workerSetup: fc.Arbitrary<WorkerSetup> = fc.record({
  leaseMs: optional(fc.integer({ min: 1, max: 40 }), 8),
  maxAttempts: optional(fc.integer({ min: 1, max: 4 }), 8),
}).map(present);

// ------------------------------------------------------------------ runner

/** Options of {@linkcode runModelTest}. */
export interface ModelTestOptions {
  /** Command sequences to run. @default {400} */
  readonly numRuns?: number;
  /** Longest sequence. @default {100} */
  readonly maxCommands?: number;
  /** fast-check seed, to replay a reported failure. */
  readonly seed?: number;
  /** fast-check replay path, printed with a reported failure. */
  readonly path?: string;
  /**
   * Whether workers also call `acknowledgeAndClaim`; off to replay a seed
   * and path recorded before it was generated. @default {true}
   */
  readonly acknowledgeAndClaim?: boolean;
}

/** What {@linkcode runModelTest} ran. */
export interface ModelTestReport {
  /** Sequences run (shrinking included). */
  readonly runs: number;
  /** Outbox calls compared with the model. */
  readonly steps: number;
  /** Of those, calls started two at a time. */
  readonly concurrentSteps: number;
  /** Clock moves (forwards, backwards or by zero). */
  readonly clockMoves: number;
  /** Application transactions that enqueued on the outbox's connection. */
  readonly applicationTransactions: number;
  /** Of those, the ones the application committed. */
  readonly committed: number;
}

/** The clock starts at a realistic epoch time, so exact integers are exercised. */
const START_MS = 1_700_000_000_000;

/**
 * Runs random command sequences on outboxes over `open()`'s connections
 * (one simulated worker per connection, all on one manual clock) and on the
 * reference model, comparing every result. Throws fast-check's report with
 * the shrunk sequence on the first divergence.
 *
 * @param open Opens two or more connections to one fresh database.
 * @param options See {@linkcode ModelTestOptions}.
 * @returns How much was run.
 */
export async function runModelTest(
  open: () => Promise<Connections>,
  options: ModelTestOptions = {},
): Promise<ModelTestReport> {
  const report = {
    runs: 0,
    steps: 0,
    concurrentSteps: 0,
    clockMoves: 0,
    applicationTransactions: 0,
    committed: 0,
  };
  const property = fc.asyncProperty(
    fc.array(workerSetup, { minLength: 3, maxLength: 3 }),
    fc.array(commandArbitrary(options.acknowledgeAndClaim ?? true), {
      maxLength: options.maxCommands ?? 100,
      size: "max",
    }),
    async (setups, commands) => {
      report.runs += 1;
      const connections = await open();
      const clock = new ManualClock(START_MS);
      const workers: Worker[] = [];
      try {
        // The application's own migrations, in the same database, first
        // (on SQLite with its user_version, which the outbox must leave be).
        const postgres = connections.drivers[0] instanceof PostgresDriver;
        await connections.drivers[0]!.exec(
          postgres
            ? "CREATE TABLE app_orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, note text)"
            : "CREATE TABLE app_orders (id INTEGER PRIMARY KEY, note TEXT); PRAGMA user_version = 7",
        );
        for (const [i, driver] of connections.drivers.entries()) {
          const setup = setups[i % setups.length]!;
          workers.push({
            index: i,
            driver,
            outbox: await Outbox.open(driver, { now: clock.now, ...setup }),
            leaseMs: setup.leaseMs ?? 30_000,
            maxAttempts: setup.maxAttempts ?? 5,
          });
        }
        const run = new Run(clock, workers, postgres);
        for (const [i, command] of commands.entries()) {
          try {
            if (command.op === "advance") {
              clock.advance(command.ms);
              report.clockMoves += 1;
            } else if (command.op === "toDeadline") {
              const deadline = run.deadline(command.worker, command.lease);
              if (deadline !== undefined) {
                clock.set(deadline + command.offsetMs);
                report.clockMoves += 1;
              }
            } else if (command.op === "application") {
              if (await run.application(command)) {
                report.steps += 1;
                report.applicationTransactions += 1;
              }
            } else if (command.op === "together") {
              const ran = await run.together(command.first, command.second);
              report.steps += ran.calls;
              if (ran.concurrent) report.concurrentSteps += ran.calls;
            } else if (await run.alone(command)) report.steps += 1;
          } catch (error) {
            throw new Error(
              `divergence at step ${i}, ${line(command)}, t=${
                clock.ms - START_MS
              }: ${error instanceof Error ? error.message : String(error)}`,
              { cause: error },
            );
          }
        }
        await run.checkEveryEvent();
        report.committed += run.committed;
        if (!postgres) {
          const [version] = await connections.drivers[0]!.query(
            "PRAGMA user_version",
          );
          assert.equal(version?.["user_version"], 7);
        }
      } finally {
        for (const w of workers) await w.outbox.close();
        await connections.close();
      }
    },
  );
  await fc.assert(property, {
    numRuns: options.numRuns ?? 400,
    ...(options.seed === undefined ? {} : { seed: options.seed }),
    ...(options.path === undefined ? {} : { path: options.path }),
  });
  return report;
}

interface Worker {
  readonly index: number;
  /** The connection the worker's outbox and its application share. */
  readonly driver: Driver;
  readonly outbox: Outbox;
  readonly leaseMs: number;
  readonly maxAttempts: number;
}

/** A lease a worker holds: the real one and the model's, claimed together. */
interface Held {
  readonly real: Lease<unknown>;
  readonly model: ModelLease;
}

/**
 * What a run learned from the database besides the model's state: which
 * database id each model event got, the minted tokens seen, and every
 * lease each worker ever got (kept after losing it, so stale calls happen).
 */
interface Books {
  readonly realIds: Map<number, number>;
  readonly modelIds: Map<number, number>;
  /** Each real event's identity, as its enqueue returned it. */
  readonly identities: Map<number, string>;
  lastRealId: number;
  readonly minted: Set<string>;
  readonly held: Held[][];
}

function copyBooks(books: Books): Books {
  return {
    realIds: new Map(books.realIds),
    modelIds: new Map(books.modelIds),
    identities: new Map(books.identities),
    lastRealId: books.lastRealId,
    minted: new Set(books.minted),
    held: books.held.map((leases) => [...leases]),
  };
}

/**
 * One call planned against both sides: the model call, the real call, and
 * the check of a real result against the model's (which also records what
 * the result taught, in the books).
 */
interface Plan {
  model(model: ReferenceOutbox): unknown;
  real(): Promise<unknown>;
  check(real: unknown, expected: unknown, books: Books): void;
  /** A claim's model leaving out the events in `skip`. */
  skipping?(model: ReferenceOutbox, skip: ReadonlySet<number>): unknown;
  /** The (model) events whose rows the call locks while it runs. */
  locks?: readonly number[];
}

type Outcome = { ok: true; value: unknown } | { ok: false; error: unknown };

/**
 * Runs commands on the real outboxes and the model and compares each result.
 *
 * Event ids: the contract asks that they are never reused and grow with
 * enqueue order (FIFO and per-key order go by id), not that they are dense,
 * so the model numbers events 1, 2, 3… and the books map each to the id the
 * database gave it.
 */
class Run {
  #model = new ReferenceOutbox();
  #books: Books;
  /** Business rows the application committed. */
  committed = 0;

  constructor(
    readonly clock: ManualClock,
    readonly workers: readonly Worker[],
    /** Claims skip rows other transactions hold (PostgreSQL's SKIP LOCKED). */
    readonly skipLocked: boolean,
  ) {
    this.#books = {
      realIds: new Map(),
      modelIds: new Map(),
      identities: new Map(),
      lastRealId: 0,
      minted: new Set(),
      held: workers.map(() => []),
    };
  }

  /**
   * The current deadline of the event a held lease is for (renewals
   * included), else the lease's own; `undefined` when the worker holds none.
   */
  deadline(worker: number, lease: number): number | undefined {
    const held = this.#books.held[worker % this.workers.length]!;
    const chosen = held[held.length - 1 - (lease % Math.max(1, held.length))];
    if (chosen === undefined) return undefined;
    return this.#model.leaseUntil(chosen.model.eventId) ??
      chosen.model.leaseUntil;
  }

  /** One call; `false` when it had nothing to act on (no lease held). */
  async alone(command: WorkerCommand): Promise<boolean> {
    const plan = this.#plan(command);
    if (plan === undefined) return false;
    const expected = settle(() => plan.model(this.#model));
    const real = await settleAsync(plan.real);
    judge(plan, real, expected, this.#books);
    return true;
  }

  /**
   * Two calls started at once (they contend for the write lock): their
   * results must be those of one of the two serial orders. On PostgreSQL a
   * claim may also leave out an event the other call holds locked, as
   * `FOR UPDATE SKIP LOCKED` does: fewer events, never a different one.
   *
   * @returns How many calls ran (a call with no lease to act on is
   * dropped) and whether they ran at once.
   */
  async together(
    a: WorkerCommand,
    b: WorkerCommand,
  ): Promise<{ calls: number; concurrent: boolean }> {
    const planA = this.#plan(a);
    const planB = this.#plan(b);
    if (planA === undefined || planB === undefined) {
      // Nothing to pair with: run what can run, one after the other.
      const calls = Number(await this.alone(a)) + Number(await this.alone(b));
      return { calls, concurrent: false };
    }
    const [realA, realB] = await Promise.all([
      settleAsync(planA.real),
      settleAsync(planB.real),
    ]);
    const orders: [Plan, Outcome, Plan, Outcome][] = [
      [planA, realA, planB, realB],
      [planB, realB, planA, realA],
    ];
    // A claim that skips the rows the other call locks, run first: the
    // other call's row lock was held when the claim looked, so SKIP LOCKED
    // left the event to the next claim; it is never skipped afterwards.
    if (this.skipLocked) {
      for (const [claim, claimReal, other, otherReal] of [...orders]) {
        const skipping = claim.skipping;
        if (skipping === undefined || other.locks === undefined) continue;
        const skip = new Set(other.locks);
        orders.push([
          { ...claim, model: (m) => skipping(m, skip) },
          claimReal,
          other,
          otherReal,
        ]);
      }
    }
    const mismatches: string[] = [];
    for (const [first, firstReal, second, secondReal] of orders) {
      const model = this.#model.clone();
      const books = copyBooks(this.#books);
      try {
        judge(first, firstReal, settle(() => first.model(model)), books);
        judge(second, secondReal, settle(() => second.model(model)), books);
      } catch (error) {
        mismatches.push(error instanceof Error ? error.message : String(error));
        continue;
      }
      this.#model = model;
      this.#books = books;
      return { calls: 2, concurrent: true };
    }
    throw new Error(
      `no serial order explains the results:\n${mismatches.join("\n---\n")}`,
    );
  }

  /**
   * An application transaction on a worker's connection, with the outbox's
   * calls joining it: on COMMIT the model takes the enqueue (and the
   * acknowledgement) as one atomic call; on ROLLBACK, or when the
   * acknowledgement threw, nothing changes. The business rows must follow.
   *
   * @returns `false` when `lease` is set and the worker holds none.
   */
  async application(
    command: Extract<Command, { op: "application" }>,
  ): Promise<boolean> {
    const worker = this.workers[command.worker % this.workers.length]!;
    const held = this.#books.held[worker.index]!;
    const lease = command.lease === undefined || held.length === 0
      ? undefined
      : held[held.length - 1 - (command.lease % held.length)];
    if (command.lease !== undefined && lease === undefined) return false;
    const now = this.clock.ms;
    const options = present({ dedupKey: command.dedupKey });
    const modelOptions = enqueueOptions(worker, options);
    const { driver, outbox } = worker;
    const postgres = driver instanceof PostgresDriver;
    await driver.run(postgres ? "BEGIN" : "BEGIN IMMEDIATE");
    const real = await settleAsync(async () => {
      await driver.run(
        postgres
          ? "INSERT INTO app_orders (note) VALUES ($1)"
          : "INSERT INTO app_orders (note) VALUES (?)",
        [
          `${command.worker}`,
        ],
      );
      // Made inside the application's transaction: joining follows the
      // caller.
      return await outbox.within(async () => {
        const result = await outbox.enqueue(command.payload, options);
        if (lease !== undefined) await outbox.acknowledge(lease.real);
        return result;
      });
    });
    assert.equal(driver.inTransaction?.(), true, "the outbox ended it");
    const commit = command.commit && real.ok;
    await driver.run(commit ? "COMMIT" : "ROLLBACK");
    const model = commit ? this.#model : this.#model.clone();
    const books = commit ? this.#books : copyBooks(this.#books);
    const expected = settle(() =>
      lease === undefined
        ? model.enqueue(now, command.payload, modelOptions)
        : model.enqueueAndAcknowledge(
          now,
          command.payload,
          modelOptions,
          lease.model,
        )
    );
    judge(
      {
        model: () => undefined,
        real: () => Promise.resolve(),
        check: enqueued,
      },
      real,
      expected,
      books,
    );
    if (commit) this.committed += 1;
    const [rows] = await driver.query(
      "SELECT count(*) AS n FROM app_orders",
    );
    assert.equal(rows?.["n"], this.committed, "business rows");
    return true;
  }

  /** After a sequence: every event the model or the database has agrees. */
  async checkEveryEvent(): Promise<void> {
    const outbox = this.workers[0]!.outbox;
    const last = Math.max(0, ...this.#model.ids());
    for (let id = 1; id <= last + 1; id++) {
      const plan = this.#explain(outbox, id);
      const expected = settle(() => plan.model(this.#model));
      judge(plan, await settleAsync(plan.real), expected, this.#books);
    }
  }

  #plan(command: WorkerCommand): Plan | undefined {
    const worker = this.workers[command.worker % this.workers.length]!;
    const { outbox } = worker;
    const now = this.clock.ms;
    const held = this.#books.held[worker.index]!;
    // A claim's model, also with the events a concurrent call holds left out.
    const claiming = (
      command: { queue?: string; leaseMs?: number },
      max: number,
      token: string | null,
    ) =>
    (m: ReferenceOutbox, skip?: ReadonlySet<number>) =>
      m.claim(now, {
        queue: command.queue ?? QUEUES[0],
        leaseMs: command.leaseMs ?? worker.leaseMs,
        max,
        token,
      }, skip);
    // The rows a claim locks while it runs: its candidates, also when it
    // then refuses them (a supplied token used before), since FOR UPDATE
    // SKIP LOCKED holds them until its transaction ends (seed -2140077608).
    const candidates = (
      queue: string | undefined,
      max: number,
      model = this.#model,
    ): number[] => {
      try {
        return model.clone().claim(now, {
          queue: queue ?? QUEUES[0],
          leaseMs: worker.leaseMs,
          max,
          token: null,
        }).map((lease) => lease.eventId);
      } catch {
        return [];
      }
    };
    const pick = (index: number): Held | undefined =>
      held.length === 0
        ? undefined
        : held[held.length - 1 - (index % held.length)];
    switch (command.op) {
      case "enqueue": {
        const { op: _, worker: __, payload, ...options } = command;
        return {
          model: (m) =>
            m.enqueue(now, payload, enqueueOptions(worker, options)),
          real: () => outbox.enqueue(payload, present(options)),
          check: enqueued,
        };
      }
      case "claim": {
        const skipping = claiming(command, 1, command.token ?? null);
        return {
          model: (m) => skipping(m),
          skipping,
          locks: candidates(command.queue, 1),
          real: () =>
            outbox.claim(present({
              queue: command.queue,
              leaseMs: command.leaseMs,
              token: command.token,
            })),
          check: (real, expected, books) =>
            leases(
              worker,
              real === null ? [] : [real as Lease<unknown>],
              expected as ModelLease[],
              books,
            ),
        };
      }
      case "claimBatch": {
        const skipping = claiming(command, command.max, null);
        return {
          model: (m) => skipping(m),
          skipping,
          locks: candidates(command.queue, command.max),
          real: () =>
            outbox.claim(present({
              max: command.max,
              queue: command.queue,
              leaseMs: command.leaseMs,
            })),
          check: (real, expected, books) =>
            leases(
              worker,
              real as Lease<unknown>[],
              expected as ModelLease[],
              books,
            ),
        };
      }
      case "acknowledge": {
        const lease = pick(command.lease);
        return lease && {
          locks: [lease.model.eventId],
          model: (m) => m.acknowledge(now, [lease.model])[0],
          real: () => outbox.acknowledge(lease.real),
          check: equal,
        };
      }
      case "acknowledgeBatch": {
        if (held.length === 0) return undefined;
        const chosen = command.leases.map((i) => pick(i)!);
        return {
          locks: chosen.map((h) => h.model.eventId),
          model: (m) => m.acknowledge(now, chosen.map((h) => h.model)),
          real: () => outbox.acknowledge(chosen.map((h) => h.real)),
          check: equal,
        };
      }
      case "acknowledgeAndClaim": {
        const chosen = held.length === 0
          ? []
          : command.leases.map((i) => pick(i)!);
        const options = {
          queue: command.queue ?? QUEUES[0],
          leaseMs: command.leaseMs ?? worker.leaseMs,
          max: command.max,
        };
        const fused = (m: ReferenceOutbox, skip?: ReadonlySet<number>) =>
          m.acknowledgeAndClaim(now, chosen.map((h) => h.model), options, skip);
        // Its claim's candidates: before the acknowledgements (PostgreSQL's
        // one statement looks in a snapshot taken before them) and after.
        const after = this.#model.clone();
        try {
          after.acknowledge(now, chosen.map((h) => h.model));
        } catch {
          // A refused acknowledgement leaves the candidates as they were.
        }
        return {
          model: (m) => fused(m),
          skipping: fused,
          locks: [
            ...chosen.map((h) => h.model.eventId),
            ...candidates(command.queue, command.max),
            ...candidates(command.queue, command.max, after),
          ],
          real: () =>
            outbox.acknowledgeAndClaim(
              chosen.map((h) => h.real),
              present({
                max: command.max,
                queue: command.queue,
                leaseMs: command.leaseMs,
              }),
            ),
          check: (real, expected, books) => {
            const r = real as AcknowledgedAndClaimed;
            const e = expected as ReturnType<typeof fused>;
            assert.deepStrictEqual(r.acknowledged, e.acknowledged);
            leases(worker, r.leases, e.leases, books);
          },
        };
      }
      case "renew": {
        const lease = pick(command.lease);
        return lease && {
          locks: [lease.model.eventId],
          model: (m) =>
            m.renew(now, lease.model, command.leaseMs ?? worker.leaseMs),
          real: () => outbox.renew(lease.real, command.leaseMs),
          check: equal,
        };
      }
      case "release": {
        const lease = pick(command.lease);
        return lease && {
          locks: [lease.model.eventId],
          model: (m) =>
            m.release(now, lease.model, {
              delayMs: command.delayMs ?? 0,
              error: command.error ?? null,
            }),
          real: () =>
            outbox.release(
              lease.real,
              present({ delayMs: command.delayMs, error: command.error }),
            ),
          check: equal,
        };
      }
      case "transaction": {
        const lease = pick(command.lease);
        const options = present({ dedupKey: command.dedupKey });
        return lease && {
          locks: [lease.model.eventId],
          model: (m) =>
            m.enqueueAndAcknowledge(
              now,
              command.payload,
              enqueueOptions(worker, options),
              lease.model,
            ),
          real: () =>
            outbox.transaction(async (tx) => {
              const result = await tx.enqueue(command.payload, options);
              await tx.acknowledge(lease.real);
              return result;
            }),
          check: enqueued,
        };
      }
      case "deadLetters":
        return {
          model: (m) =>
            m.deadLetters(
              now,
              command.queue ?? QUEUES[0],
              command.limit ?? 100,
            ),
          real: () =>
            outbox.deadLetters(
              present({ queue: command.queue, limit: command.limit }),
            ),
          check: equal,
        };
      case "retry": {
        const id = realId(this.#books, command.eventId);
        return {
          model: (m) => m.retry(now, command.eventId),
          real: async () => (await outbox.redrive({ ids: [id] })) === 1,
          check: equal,
        };
      }
      case "stats":
        return {
          model: (m) => m.stats(now, command.queue ?? QUEUES[0]),
          // The WAL's size (WAL mode only) is no part of the model.
          real: async () => {
            const { wal: _, ...counts } = await outbox.stats(
              present({ queue: command.queue }),
            );
            return counts;
          },
          check: equal,
        };
      case "explain":
        return this.#explain(outbox, command.eventId);
      case "purge": {
        const doneBeforeMs = Math.max(0, now - command.ageMs);
        return {
          model: (m) => m.purge(now, doneBeforeMs),
          real: () =>
            outbox.purge({ olderThanMs: command.ageMs, states: ["done"] }),
          check: equal,
        };
      }
    }
  }

  #explain(outbox: Outbox, eventId: number): Plan {
    const now = this.clock.ms;
    const id = realId(this.#books, eventId);
    return {
      model: (m) => m.explain(now, eventId),
      real: async () => {
        const e = await outbox.explain(id);
        if (e === null) return null;
        // The identity finds the same event the id does, unless a purge run
        // together with this call deleted it in between.
        const again = await outbox.explain(e.identity);
        if (again !== null) assert.equal(again.eventId, e.eventId);
        return {
          eventId: e.eventId,
          identity: e.identity,
          queue: e.queue,
          state: e.state,
          attempt: e.attempt,
          maxAttempts: e.maxAttempts,
          fence: e.fence,
          lastError: e.lastError,
        };
      },
      check: equal,
    };
  }
}

function settle(call: () => unknown): Outcome {
  try {
    return { ok: true, value: call() };
  } catch (error) {
    return { ok: false, error };
  }
}

async function settleAsync(call: () => Promise<unknown>): Promise<Outcome> {
  try {
    return { ok: true, value: await call() };
  } catch (error) {
    return { ok: false, error };
  }
}

/**
 * Both sides returned and the plan's check agrees, or the model rejected
 * the call and the real one threw the same error class.
 */
function judge(plan: Plan, real: Outcome, expected: Outcome, books: Books) {
  if (!expected.ok) {
    const rejection = expected.error;
    if (!(rejection instanceof ModelRejection)) throw rejection;
    assert.ok(
      !real.ok && real.error instanceof rejection.expected,
      `the call should throw ${rejection.expected.name} (${rejection.message}), ${
        real.ok ? `returned ${fc.stringify(real.value)}` : `threw ${real.error}`
      }`,
    );
    return;
  }
  if (!real.ok) {
    throw new Error(
      `the call threw ${real.error}, the model returned ${
        fc.stringify(expected.value)
      }`,
      { cause: real.error },
    );
  }
  plan.check(real.value, expected.value, books);
}

function equal(real: unknown, expected: unknown, books: Books): void {
  assert.deepStrictEqual(toModelIds(books, real), expected);
}

/** Checks an enqueue result and records the id of a new event. */
function enqueued(real: unknown, expected: unknown, books: Books): void {
  const result = real as EnqueueResult;
  const model = expected as EnqueueResult;
  if (model.deduplicated) {
    assert.deepStrictEqual(toModelIds(books, result), model);
    return;
  }
  assert.equal(result.deduplicated, false, "deduplicated");
  assert.ok(
    result.eventId > books.lastRealId,
    `a new event got id ${result.eventId}, not above the last one, ${books.lastRealId}: ids must never be reused`,
  );
  assert.match(
    result.identity,
    /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/,
  );
  assert.ok(
    ![...books.identities.values()].includes(result.identity),
    `a new event got identity ${result.identity}, another event's`,
  );
  books.lastRealId = result.eventId;
  books.realIds.set(model.eventId, result.eventId);
  books.modelIds.set(result.eventId, model.eventId);
  books.identities.set(result.eventId, result.identity);
}

/**
 * Compares claimed leases field by field and records them as held. Tokens:
 * a supplied one comes back as is; a minted one is never seen before and has
 * at least 128 bits in the token alphabet (22 base-64 characters).
 */
function leases(
  worker: Worker,
  real: readonly Lease<unknown>[],
  expected: readonly ModelLease[],
  books: Books,
): void {
  assert.equal(real.length, expected.length, "number of leases");
  for (const [i, model] of expected.entries()) {
    const lease = real[i]!;
    const { token, ...fields } = model;
    assert.deepStrictEqual(toModelIds(books, { ...lease, token }), {
      ...fields,
      token,
    });
    if (token.startsWith("minted:")) {
      assert.match(lease.token, /^[A-Za-z0-9._~-]{22,128}$/);
      assert.ok(!books.minted.has(lease.token), "a minted token repeated");
      books.minted.add(lease.token);
    } else assert.equal(lease.token, token);
    books.held[worker.index]!.push({ real: lease, model });
  }
}

/**
 * The database's id of a model event; for an unknown one, an id no run
 * reaches. Ids are not dense (an enqueue skipped for its dedup key may
 * still use one up), so one just past the last id seen could be the id a
 * concurrent enqueue gets.
 */
function realId(books: Books, modelId: number): number {
  return books.realIds.get(modelId) ?? Number.MAX_SAFE_INTEGER - modelId;
}

/**
 * Rewrites `eventId` fields of a result (or of its elements) to model ids,
 * after checking that its `identity` is the one the event's enqueue
 * returned: an event keeps its identity through every operation.
 */
function toModelIds(books: Books, value: unknown): unknown {
  if (Array.isArray(value)) return value.map((v) => toModelIds(books, v));
  if (value === null || typeof value !== "object" || !("eventId" in value)) {
    return value;
  }
  const id = Number(value.eventId);
  const { identity, ...rest } = value as { identity?: unknown };
  assert.equal(
    identity,
    books.identities.get(id),
    `event ${id} changed identity`,
  );
  return { ...rest, eventId: books.modelIds.get(id) ?? -id };
}

function enqueueOptions(
  worker: Worker,
  options: {
    queue?: string;
    delayMs?: number;
    maxAttempts?: number;
    dedupKey?: string;
    orderingKey?: string;
  },
): ModelEnqueue {
  return {
    queue: options.queue ?? QUEUES[0],
    delayMs: options.delayMs ?? 0,
    maxAttempts: options.maxAttempts ?? worker.maxAttempts,
    dedupKey: options.dedupKey ?? null,
    orderingKey: options.orderingKey ?? null,
  };
}
