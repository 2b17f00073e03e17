/**
 * Group commit of the producer path: `Outbox.enqueue` calls made while the
 * outbox waits for the connection or its write lock share the next
 * transaction (up to 1,000 calls or 8 MiB of payloads), each undone alone
 * under its savepoint when it fails (`insertGroup` in `enqueue.ts`), and
 * run again one per transaction when a constraint refused the shared
 * transaction as a whole (a deferred one at COMMIT, or a trigger's
 * `RAISE(ROLLBACK)`, which no savepoint undoes alone); and the listeners
 * told of each commit that enqueued.
 *
 * @module
 */
import {
  ConnectionLostError,
  ConstraintError,
  PostgresError,
} from "../errors.ts";
import type { EnqueueResult } from "../types.ts";
import { checkFunction } from "../validate.ts";
import type { OutboxCore } from "./context.ts";
import {
  insertAll,
  insertGroup,
  insertOne,
  payloadSize,
  type PreparedEnqueue,
  type Settled,
} from "./enqueue.ts";

// A group of enqueues closes at this many calls or bytes of payload: its
// statement's JSON stays small enough to build and parse at once.
const MAX_GROUP = 1_000;
const MAX_GROUP_BYTES = 8 * 1024 * 1024;

interface EnqueueCall {
  readonly event: PreparedEnqueue;
  resolve(result: EnqueueResult): void;
  reject(error: unknown): void;
}

interface EnqueueGroup {
  readonly calls: EnqueueCall[];
  bytes: number;
  /** Whether its calls were made inside the application's transaction. */
  readonly join: boolean;
}

/** The open group of enqueues of one outbox, and its commits. */
export class GroupCommit {
  readonly #core: OutboxCore;
  // The enqueues waiting for the next transaction; closed (undefined) once
  // that transaction holds the write lock.
  #group: EnqueueGroup | undefined;

  readonly #listeners = new Set<() => void>();

  constructor(core: OutboxCore) {
    this.#core = core;
  }

  /**
   * Adds an enqueue listener (`Outbox.onEnqueue`).
   *
   * @returns A function that removes it.
   */
  listen(listener: () => void): () => void {
    checkFunction("listen for enqueues", "listener", listener);
    // A wrapper per call, so registering one function twice needs two removals.
    const entry = () => listener();
    this.#listeners.add(entry);
    return () => this.#listeners.delete(entry);
  }

  /**
   * Calls the enqueue listeners after a commit that enqueued events; what
   * one throws is reported with `reportError`.
   */
  notify(): void {
    for (const listener of this.#listeners) {
      try {
        listener();
      } catch (error) {
        reportError(error);
      }
    }
  }

  /**
   * Adds a checked event to the open group (a new one when it is full or
   * was made on the other side of `join`), resolving once the commit that
   * holds it returned.
   */
  add(event: PreparedEnqueue, join: boolean): Promise<EnqueueResult> {
    const bytes = payloadSize(event);
    return new Promise((resolve, reject) => {
      let group = this.#group;
      if (
        group === undefined || group.calls.length >= MAX_GROUP ||
        group.bytes + bytes > MAX_GROUP_BYTES || group.join !== join
      ) {
        group = this.#group = { calls: [], bytes: 0, join };
        this.#commit(group);
      }
      group.calls.push({ event, resolve, reject });
      group.bytes += bytes;
    });
  }

  /**
   * Ends the open group of enqueues, so that a later `enqueue()` cannot join
   * a transaction queued before a call that may enqueue too
   * (`enqueueBatch`, `transaction`): ids, dedup winners and per-key order
   * follow the order of the calls.
   */
  close(): void {
    this.#group = undefined;
  }

  /**
   * Commits a group of enqueues in one transaction, then settles each
   * call's promise: with its own result or error, or with the transaction's
   * error when it failed.
   */
  async #commit(group: EnqueueGroup): Promise<void> {
    // Calls arriving from now on form the next group.
    const close = () => {
      if (this.#group === group) this.#group = undefined;
    };
    const { driver, sql } = this.#core;
    // The group's calls, once it is closed.
    const events = () => group.calls.map((call) => call.event);
    let settled: Settled<EnqueueResult>[];
    try {
      settled = await this.#core.write(
        "enqueue",
        (now) => {
          close();
          return insertGroup(driver, sql, events(), now);
        },
        {
          join: group.join,
          // As for enqueueBatch.
          expire: false,
          // Outside a transaction, the group as one statement (its own
          // commit). When the server refuses it, which changed nothing, the
          // transaction above runs instead and fails only the call at fault.
          inOne: sql.insertAllInOne
            ? async (now) => {
              close();
              try {
                return (await insertAll(driver, sql, events(), now)).map((
                  value,
                ) => ({ value }));
              } catch (error) {
                // A lost connection leaves unknown whether it committed. A
                // trigger's skipped insert failed the statement too
                // (insertOrFind's ConstraintError).
                if (
                  error instanceof ConstraintError ||
                  error instanceof PostgresError &&
                    !(error instanceof ConnectionLostError)
                ) return undefined;
                throw error;
              }
            }
            : undefined,
          // A constraint one call broke refused the transaction of all (a
          // deferred one at COMMIT, a RAISE(ROLLBACK)), which the engine
          // ended with nothing committed: each runs again in a transaction
          // of its own, in order and in this turn, so only that call fails.
          refused: group.calls.length === 1
            ? undefined
            : () => this.#eachAlone(group.calls),
        },
      );
    } catch (error) {
      close();
      for (const call of group.calls) call.reject(error);
      return;
    }
    group.calls.forEach((call, i) => {
      const outcome = settled[i]!;
      if ("value" in outcome) call.resolve(outcome.value);
      else call.reject(outcome.error);
    });
    if (settled.some((outcome) => "value" in outcome)) this.#core.enqueued();
  }

  /** Commits each call of a group in a transaction of its own, in order. */
  async #eachAlone(
    calls: readonly EnqueueCall[],
  ): Promise<Settled<EnqueueResult>[]> {
    const settled: Settled<EnqueueResult>[] = [];
    for (const { event } of calls) {
      try {
        settled.push({
          value: await this.#core.runner.inTurn(
            "enqueue",
            async () =>
              insertOne(
                this.#core.driver,
                this.#core.sql,
                event,
                await this.#core.start("enqueue", false),
              ),
            {},
          ),
        });
      } catch (error) {
        settled.push({ error });
      }
    }
    return settled;
  }
}
