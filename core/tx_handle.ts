/**
 * The handle of `Outbox.transaction(fn)`: the caller's statements, enqueues
 * and fenced acknowledgements in one transaction of the outbox's write
 * path, every call refused once the transaction ended.
 *
 * @module
 */
import { LeaseLostError } from "../errors.ts";
import { checkFunction } from "../validate.ts";
import { checkLease, prepareBatch, prepareEnqueue } from "./arguments.ts";
import type { OutboxCore } from "./context.ts";
import { allOrNone, insertAll, insertOne } from "./enqueue.ts";
import type { GroupCommit } from "./group_commit.ts";
import type { CheckedLease } from "./ledger.ts";
import type { Transaction } from "./shapes.ts";
import { runTransactionBody, transactionStatements } from "./transaction.ts";

/**
 * Runs `fn` with a {@linkcode Transaction} handle in one transaction of the
 * outbox's write path (never run again after a deadlock: `fn` is the
 * application's code). `acknowledgeOne` is the lease rules' fenced
 * acknowledgement of one lease.
 */
export async function runTransaction<T>(
  core: OutboxCore,
  groups: GroupCommit,
  acknowledgeOne: (lease: CheckedLease, now: number) => Promise<boolean>,
  fn: (tx: Transaction) => Promise<T>,
): Promise<T> {
  checkFunction("run transaction", "fn", fn);
  let enqueued = false;
  let ended = false;
  let lost: LeaseLostError | undefined;
  // A batch's error where the engine fails the whole transaction for one
  // (errorFailsTransaction) but no statement failed: rethrown after fn.
  let failed: unknown;
  const driver = core.driver;
  // Every call checks the handle is still inside its transaction: kept past
  // it, the handle would run outside the mutex and outside any transaction.
  const inside = (op: string) => {
    if (ended) {
      throw new Error(
        `Cannot ${op} as the transaction this handle belongs to has ended`,
      );
    }
    core.runner.checkLive(op);
  };
  groups.close();
  const result = await core.write(
    "run transaction",
    async (now) => {
      const tx: Transaction = {
        ...transactionStatements(driver, inside),
        enqueue: async (payload, options = {}) => {
          inside("enqueue");
          const event = prepareEnqueue("enqueue", payload, options, core);
          enqueued = true;
          return await insertOne(core.driver, core.sql, event, now);
        },
        enqueueBatch: async (events) => {
          const op = "enqueue batch";
          inside(op);
          const prepared = prepareBatch(op, events, core);
          enqueued = true;
          if (prepared.length === 0) return [];
          // All or none even when fn catches its error: a batch can fail
          // after a statement stored some of it (a trigger's RAISE(IGNORE)
          // on SQLite, a purge racing every round on PostgreSQL).
          const insert = () => insertAll(core.driver, core.sql, prepared, now);
          if (!core.sql.errorFailsTransaction) {
            return await allOrNone(core.driver, core.sql, insert);
          }
          try {
            return await insert();
          } catch (error) {
            // A statement's error failed the transaction already; any
            // other fails it here, as PostgreSQL fails it for a statement.
            if (core.runner.status() === "open") failed ??= error;
            throw error;
          }
        },
        acknowledge: async (lease) => {
          inside("acknowledge");
          const checked = checkLease("acknowledge", "lease", lease);
          if (await acknowledgeOne(checked, now)) return true;
          lost = new LeaseLostError(checked.eventId, checked.fence);
          throw lost;
        },
      };
      try {
        const value = await runTransactionBody(
          core.mutex,
          "transaction",
          () => fn(tx),
        );
        // Catching the LeaseLostError inside fn must not let the stale
        // worker's writes commit, nor catching a batch's error part of it.
        if (lost !== undefined) throw lost;
        if (failed !== undefined) throw failed;
        return value;
      } finally {
        ended = true;
      }
    },
    // Never run again after a deadlock: fn is the application's code.
    { rerun: false },
  );
  if (enqueued) core.enqueued();
  return result;
}
