/**
 * A reference model of the lease contract and the model-based test that
 * checks real outboxes against it.
 *
 * The model is written from DESIGN.md §2, the acceptance cases and the
 * semantics the lead fixed, not from lease.ts: plain objects in a map, the
 * clock passed into every call, no SQL. Where the contract leaves a choice,
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
import fc from "fast-check";
import { type Lease, LeaseLostError, Outbox } from "../mod.ts";
import type { Connections } from "./drivers.ts";
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

  /** Adds an event, or finds the one its dedup key names. */
  enqueue(
    now: number,
    payload: unknown,
    options: ModelEnqueue,
  ): { eventId: number; deduplicated: boolean } {
    return this.#atomic(now, () => this.#enqueue(now, payload, options));
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
  ): ModelLease[] {
    return this.#atomic(now, () => {
      const leases: ModelLease[] = [];
      while (leases.length < options.max) {
        const event = this.#next(now, options.queue);
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

  /**
   * Runs one call as a transaction. First, leases that lapsed with no
   * attempts left become dead (the lead's decision: they count as dead from
   * their deadline on), as seen by whichever call comes first at or after
   * the deadline; they died at their deadline.
   */
  #atomic<T>(now: number, fn: () => T): T {
    const saved = {
      events: structuredClone(this.#events),
      lastId: this.#lastId,
      minted: this.#minted,
    };
    try {
      for (const event of this.#events.values()) {
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

  /** The first claimable event by (due time, id), a lease's due time being its deadline. */
  #next(now: number, queue: string): ModelEvent | undefined {
    const due = (e: ModelEvent) =>
      e.state === "leased" ? e.leaseUntil : e.dueAt;
    const unfinished = (e: ModelEvent) =>
      e.state === "pending" || e.state === "leased";
    const events = [...this.#events.values()];
    return events
      .filter((e) =>
        e.queue === queue && unfinished(e) && due(e) <= now &&
        e.attempt < e.maxAttempts &&
        !(e.orderingKey !== null && events.some((p) =>
          p.queue === queue && p.orderingKey === e.orderingKey &&
          p.id < e.id && unfinished(p)
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

/** One generated step; `worker`, `lease` and `leases` are indices taken modulo what exists. */
export type Command =
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
  | { readonly op: "advance"; readonly ms: number }
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

/** Prints a command as `w1.claim({"leaseMs":5})`, one per line in a counterexample. */
function printable<C extends object & { op: string }>(
  generated: C,
): Command {
  const command = present(generated) as unknown as Command;
  const { op, ...rest } = command;
  const worker = "worker" in rest ? `w${rest.worker}.` : "";
  const args = Object.fromEntries(
    Object.entries(rest).filter(([k]) => k !== "worker"),
  );
  const text = `\n  ${worker}${op}(${fc.stringify(args)})`;
  return Object.defineProperty(command, fc.toStringMethod, {
    value: () => text,
  });
}

const optional = <T>(arb: fc.Arbitrary<T>, freq = 2) =>
  fc.option(arb, { nil: undefined, freq });

const worker = fc.nat({ max: 2 });
const queue = optional(fc.constant(QUEUES[1]), 5);
const leaseIndex = fc.nat({ max: 4 });
const leaseMs = optional(fc.integer({ min: 1, max: 40 }));
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

/** The command generator: weights favour the lease operations and small clock steps. */
export const commandArbitrary: fc.Arbitrary<Command> = fc.oneof(
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
    weight: 7,
    arbitrary: fc.record({
      op: fc.constant("advance" as const),
      ms: fc.oneof(
        { weight: 8, arbitrary: fc.integer({ min: 0, max: 20 }) },
        { weight: 2, arbitrary: fc.integer({ min: -25, max: -1 }) },
        { weight: 1, arbitrary: fc.constant(30_000) },
      ),
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
).map(printable);

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
}

/** What {@linkcode runModelTest} ran. */
export interface ModelTestReport {
  /** Sequences run (shrinking included). */
  readonly runs: number;
  /** Outbox calls compared with the model. */
  readonly steps: number;
  /** Clock moves (forwards, backwards or by zero). */
  readonly clockMoves: number;
}

/** The clock starts at a realistic epoch time, so exact integers are exercised. */
const START_MS = 1_700_000_000_000;

/**
 * Runs random command sequences on outboxes over `open()`'s connections
 * (one simulated worker per connection) and on the reference model,
 * comparing every result. Throws fast-check's report with the shrunk
 * sequence on the first divergence.
 *
 * @param open Opens two or more connections to one fresh database.
 * @param options See {@linkcode ModelTestOptions}.
 * @returns How much was run.
 */
export async function runModelTest(
  open: () => Promise<Connections>,
  options: ModelTestOptions = {},
): Promise<ModelTestReport> {
  let runs = 0;
  let steps = 0;
  let clockMoves = 0;
  const property = fc.asyncProperty(
    fc.array(workerSetup, { minLength: 3, maxLength: 3 }),
    fc.array(commandArbitrary, {
      maxLength: options.maxCommands ?? 100,
      size: "max",
    }),
    async (setups, commands) => {
      runs += 1;
      const connections = await open();
      const clock = new ManualClock(START_MS);
      const workers: Worker[] = [];
      try {
        for (const [i, driver] of connections.drivers.entries()) {
          const setup = setups[i % setups.length]!;
          workers.push({
            outbox: await Outbox.open(driver, { now: clock.now, ...setup }),
            leaseMs: setup.leaseMs ?? 30_000,
            maxAttempts: setup.maxAttempts ?? 5,
            leases: [],
          });
        }
        const run = new Run(new ReferenceOutbox(), clock, workers);
        for (const [i, command] of commands.entries()) {
          try {
            if (command.op === "advance") {
              clock.advance(command.ms);
              clockMoves += 1;
            } else if (await run.step(command)) steps += 1;
          } catch (error) {
            throw new Error(
              `divergence at step ${i}, ${fc.stringify(command).trim()}, t=${
                clock.ms - START_MS
              }: ${error instanceof Error ? error.message : String(error)}`,
              { cause: error },
            );
          }
        }
        await run.checkEveryEvent();
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
  return { runs, steps, clockMoves };
}

/** A lease a worker holds: the real one and the model's, claimed together. */
interface Held {
  readonly real: Lease<unknown>;
  readonly model: ModelLease;
}

interface Worker {
  readonly outbox: Outbox;
  readonly leaseMs: number;
  readonly maxAttempts: number;
  /** Every lease it ever got, kept after losing it, so stale calls happen. */
  readonly leases: Held[];
}

/**
 * Runs commands on the real outboxes and the model and compares each result.
 *
 * Event ids: the contract asks that they are never reused and grow with
 * enqueue order (FIFO and per-key order go by id), not that they are dense,
 * so the model numbers events 1, 2, 3… and the run maps each to the id the
 * database gave it. Commands name events by model id.
 */
class Run {
  readonly #minted = new Set<string>();
  readonly #realIds = new Map<number, number>();
  readonly #modelIds = new Map<number, number>();
  #lastRealId = 0;

  constructor(
    readonly model: ReferenceOutbox,
    readonly clock: ManualClock,
    readonly workers: readonly Worker[],
  ) {}

  /** One command; `false` when it had nothing to act on (no lease held). */
  async step(command: Exclude<Command, { op: "advance" }>): Promise<boolean> {
    const worker = this.workers[command.worker % this.workers.length]!;
    const { outbox } = worker;
    const now = this.clock.ms;
    const model = this.model;
    const compare = (real: unknown, expected: unknown) =>
      assert.deepStrictEqual(this.#toModelIds(real), expected);
    switch (command.op) {
      case "enqueue": {
        const { op: _, worker: __, payload, ...options } = command;
        await same(
          () => model.enqueue(now, payload, enqueueOptions(worker, options)),
          () => outbox.enqueue(payload, present(options)),
          (real, expected) => this.#enqueued(real, expected),
        );
        return true;
      }
      case "claim":
        await same(
          () =>
            model.claim(now, {
              queue: command.queue ?? QUEUES[0],
              leaseMs: command.leaseMs ?? worker.leaseMs,
              max: 1,
              token: command.token ?? null,
            }),
          () =>
            outbox.claim(present({
              queue: command.queue,
              leaseMs: command.leaseMs,
              token: command.token,
            })),
          (real, expected) =>
            this.#leases(worker, real === null ? [] : [real], expected),
        );
        return true;
      case "claimBatch":
        await same(
          () =>
            model.claim(now, {
              queue: command.queue ?? QUEUES[0],
              leaseMs: command.leaseMs ?? worker.leaseMs,
              max: command.max,
              token: null,
            }),
          () =>
            outbox.claim(present({
              max: command.max,
              queue: command.queue,
              leaseMs: command.leaseMs,
            })),
          (real, expected) => this.#leases(worker, real, expected),
        );
        return true;
      case "acknowledge": {
        const held = pick(worker, command.lease);
        if (held === undefined) return false;
        await same(
          () => model.acknowledge(now, [held.model])[0],
          () => outbox.acknowledge(held.real),
        );
        return true;
      }
      case "acknowledgeBatch": {
        const held = command.leases.map((i) => pick(worker, i));
        if (held[0] === undefined) return false;
        const leases = held as Held[];
        await same(
          () => model.acknowledge(now, leases.map((h) => h.model)),
          () => outbox.acknowledge(leases.map((h) => h.real)),
        );
        return true;
      }
      case "renew": {
        const held = pick(worker, command.lease);
        if (held === undefined) return false;
        await same(
          () => model.renew(now, held.model, command.leaseMs ?? worker.leaseMs),
          () => outbox.renew(held.real, command.leaseMs),
        );
        return true;
      }
      case "release": {
        const held = pick(worker, command.lease);
        if (held === undefined) return false;
        await same(
          () =>
            model.release(now, held.model, {
              delayMs: command.delayMs ?? 0,
              error: command.error ?? null,
            }),
          () =>
            outbox.release(
              held.real,
              present({ delayMs: command.delayMs, error: command.error }),
            ),
        );
        return true;
      }
      case "transaction": {
        const held = pick(worker, command.lease);
        if (held === undefined) return false;
        const options = present({ dedupKey: command.dedupKey });
        await same(
          () =>
            model.enqueueAndAcknowledge(
              now,
              command.payload,
              enqueueOptions(worker, options),
              held.model,
            ),
          () =>
            outbox.transaction(async (tx) => {
              const result = await tx.enqueue(command.payload, options);
              await tx.acknowledge(held.real);
              return result;
            }),
          (real, expected) => this.#enqueued(real, expected),
        );
        return true;
      }
      case "deadLetters":
        await same(
          () =>
            model.deadLetters(
              now,
              command.queue ?? QUEUES[0],
              command.limit ?? 100,
            ),
          () =>
            outbox.deadLetters(
              present({ queue: command.queue, limit: command.limit }),
            ),
          compare,
        );
        return true;
      case "retry":
        await same(
          () => model.retry(now, command.eventId),
          () => outbox.retry(this.#realId(command.eventId)),
        );
        return true;
      case "stats":
        await same(
          () => model.stats(now, command.queue ?? QUEUES[0]),
          () => outbox.stats(present({ queue: command.queue })),
        );
        return true;
      case "explain":
        await this.#explain(outbox, command.eventId);
        return true;
      case "purge": {
        const doneBeforeMs = Math.max(0, now - command.ageMs);
        await same(
          () => model.purge(now, doneBeforeMs),
          () => outbox.purge({ doneBeforeMs }),
        );
        return true;
      }
    }
  }

  /** After a sequence: every event the model or the database has agrees. */
  async checkEveryEvent(): Promise<void> {
    const outbox = this.workers[0]!.outbox;
    const last = Math.max(0, ...this.model.ids());
    for (let id = 1; id <= last + 1; id++) await this.#explain(outbox, id);
  }

  async #explain(outbox: Outbox, eventId: number): Promise<void> {
    await same(
      () => this.model.explain(this.clock.ms, eventId),
      async () => {
        const e = await outbox.explain(this.#realId(eventId));
        return e === null ? null : {
          eventId: e.eventId,
          queue: e.queue,
          state: e.state,
          attempt: e.attempt,
          maxAttempts: e.maxAttempts,
          fence: e.fence,
          lastError: e.lastError,
        };
      },
      (real, expected) =>
        assert.deepStrictEqual(this.#toModelIds(real), expected),
      `explain(${eventId})`,
    );
  }

  /** Checks an enqueue result and learns the id of a new event. */
  #enqueued(
    real: { eventId: number; deduplicated: boolean },
    expected: { eventId: number; deduplicated: boolean },
  ): void {
    if (expected.deduplicated) {
      assert.deepStrictEqual(this.#toModelIds(real), expected);
      return;
    }
    assert.equal(real.deduplicated, false, "deduplicated");
    assert.ok(
      real.eventId > this.#lastRealId,
      `a new event got id ${real.eventId}, not above the last one, ${this.#lastRealId}: ids must never be reused`,
    );
    this.#lastRealId = real.eventId;
    this.#realIds.set(expected.eventId, real.eventId);
    this.#modelIds.set(real.eventId, expected.eventId);
  }

  /** The database's id of a model event; an id never handed out for unknown ones. */
  #realId(modelId: number): number {
    return this.#realIds.get(modelId) ?? this.#lastRealId + modelId;
  }

  /** Rewrites `eventId` fields of a result (or of its elements) to model ids. */
  #toModelIds(value: unknown): unknown {
    if (Array.isArray(value)) return value.map((v) => this.#toModelIds(v));
    if (value === null || typeof value !== "object" || !("eventId" in value)) {
      return value;
    }
    const id = Number(value.eventId);
    return { ...value, eventId: this.#modelIds.get(id) ?? -id };
  }

  /**
   * Compares claimed leases field by field. Tokens: a supplied one comes
   * back as is; a minted one is never seen before and has at least 128 bits
   * in the token alphabet (22 base-64 characters).
   */
  #leases(worker: Worker, real: Lease<unknown>[], expected: ModelLease[]) {
    assert.equal(real.length, expected.length, "number of leases");
    for (const [i, model] of expected.entries()) {
      const lease = real[i]!;
      const { token, ...fields } = model;
      assert.deepStrictEqual(this.#toModelIds({ ...lease, token }), {
        ...fields,
        token,
      });
      if (token.startsWith("minted:")) {
        assert.match(lease.token, /^[A-Za-z0-9._~-]{22,128}$/);
        assert.ok(!this.#minted.has(lease.token), "a minted token repeated");
        this.#minted.add(lease.token);
      } else assert.equal(lease.token, token);
      worker.leases.push({ real: lease, model });
    }
  }
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

/** The `index`-th most recent lease the worker holds (recent ones are likelier live). */
function pick(worker: Worker, index: number): Held | undefined {
  const { leases } = worker;
  return leases.length === 0
    ? undefined
    : leases[leases.length - 1 - (index % leases.length)];
}

/**
 * Runs the model call, then the real one, and compares: both return (and
 * `compare` agrees, by default deep strict equality) or both throw the same
 * error class. Returns the real result, or `undefined` when both threw.
 */
async function same<M, R>(
  modelCall: () => M,
  realCall: () => Promise<R>,
  compare: (real: R, expected: M) => void = (real, expected) =>
    assert.deepStrictEqual(real, expected),
  what?: string,
): Promise<R | undefined> {
  let expected: M;
  try {
    expected = modelCall();
  } catch (error) {
    if (!(error instanceof ModelRejection)) throw error;
    await assert.rejects(realCall(), (e: unknown) => {
      assert.ok(
        e instanceof error.expected,
        `${
          what ?? "the call"
        } should throw ${error.expected.name} (${error.message}), threw ${e}`,
      );
      return true;
    });
    return undefined;
  }
  let real: R;
  try {
    real = await realCall();
  } catch (e) {
    throw new Error(
      `${what ?? "the call"} threw ${e}, the model returned ${
        fc.stringify(expected)
      }`,
      { cause: e },
    );
  }
  compare(real, expected);
  return real;
}
