/**
 * The runtime-neutral lease core: every claim, acknowledge, renew and release
 * statement lives here, sent through a {@linkcode Driver}. Uses only web
 * standard APIs (`crypto.getRandomValues`, `performance.now`, `setTimeout`),
 * so it runs unchanged in Deno, browsers and edge runtimes.
 *
 * Semantics follow the contract in README.md (Guarantees), which generalises
 * the seed scenario (claim under `BEGIN IMMEDIATE`, acknowledge by id *and*
 * token) with SQS's visibility timeout, receive count and dead-letter queue.
 *
 * @module
 */
import { type Driver, integerOf } from "./driver.ts";
import { LeaseLostError } from "./errors.ts";
import type { Dialect, EnqueueResult } from "./types.ts";
export type {
  Dialect,
  EnqueueResult,
  EventState,
  StatementName,
} from "./types.ts";
import { checkInteger } from "./validate.ts";
import type {
  ActivityCount,
  CountQueuesOptions,
  EventInfo,
  ListOptions,
  PurgeOptions,
  QueueCounts,
  QueuesOptions,
  RedriveOptions,
} from "./admin.ts";
export { decodePayload, explanation } from "./admin.ts";
import { insertAll } from "./core/enqueue.ts";
import { acknowledgeInOne, claimInOne } from "./core/one_statement.ts";
import { TransactionRunner, withinApplication } from "./core/transaction.ts";
export {
  driverMutex,
  insideTransactionBody,
  Mutex,
  runTransactionBody,
  transactionStatements,
} from "./core/transaction.ts";
import { SQLITE } from "./dialects/sqlite.ts";
import {
  batchClaimArguments,
  checkLease,
  checkLeases,
  checkOpenArguments,
  claimArguments,
  type OutboxSettings,
  outboxSettings,
  prepareBatch,
  prepareEnqueue,
  releaseArguments,
} from "./core/arguments.ts";
export {
  listParameters,
  listStatement,
  OUTBOX_OPTIONS,
} from "./core/arguments.ts";
import * as admin from "./core/admin.ts";
import {
  acknowledgeAll,
  acknowledgeOne,
  expireLeases,
} from "./core/lease_ends.ts";
import * as flow from "./core/flow_calls.ts";
import type { QueueFlow, QueueLimits } from "./core/flow.ts";
import type { Schedule, ScheduleOptions } from "./core/schedules.ts";
import type { OutboxCore } from "./core/context.ts";
import { GroupCommit } from "./core/group_commit.ts";
import { claimCandidates } from "./core/claim.ts";
import { IdleWatch } from "./core/idle_watch.ts";
import { Ledger } from "./core/ledger.ts";
import { maintain, withWal } from "./core/maintenance.ts";
import type { WalStats } from "./wal.ts";
import { openSchema } from "./core/schema.ts";
import { runTransaction } from "./core/tx_handle.ts";
import { WritePath } from "./core/write_path.ts";
import {
  type AcknowledgedAndClaimed,
  type BatchClaimOptions,
  type BatchEvent,
  type ClaimOptions,
  type DeadLetter,
  type EnqueueOptions,
  type Explanation,
  type Lease,
  MAX_DURATION_MS,
  type OutboxOptions,
  type ReleaseOptions,
  type Stats,
  type Transaction,
} from "./core/shapes.ts";
export * from "./core/shapes.ts";

/**
 * A transactional outbox with leases on one SQLite connection.
 *
 * Open it with {@linkcode Outbox.open}, which applies the schema once. Calls
 * on one outbox are serialized by an async mutex, so they never interleave
 * inside each other's transactions; use one outbox per connection.
 *
 * @typeParam P The payload type callers enqueue and claims return.
 *
 * @example Enqueue, claim, acknowledge
 * ```ts
 * import { Outbox } from "@leased/outbox";
 * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
 * import assert from "node:assert/strict";
 *
 * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
 * const { eventId } = await outbox.enqueue({ to: "ada@example.com" });
 * const lease = await outbox.claim({ leaseMs: 30_000 });
 * assert.equal(lease?.eventId, eventId);
 * assert.equal(lease?.fence, 1);
 * assert.equal(await outbox.acknowledge(lease!), true);
 * assert.equal(await outbox.claim(), null);
 * ```
 */
export class Outbox<P = unknown> implements AsyncDisposable {
  readonly #driver: Driver;
  readonly #sql: Dialect;
  readonly #settings: OutboxSettings;
  readonly #runner: TransactionRunner;
  readonly #ledger: Ledger;
  readonly #path: WritePath;
  readonly #core: OutboxCore;
  readonly #groups: GroupCommit;
  #stopWatching: (() => Promise<void>) | undefined;
  readonly #idleWatch: IdleWatch;
  #closed = false;

  private constructor(driver: Driver, options: OutboxOptions) {
    const sql = this.#sql = driver.dialect ?? SQLITE;
    const settings = this.#settings = outboxSettings(sql, options);
    this.#runner = new TransactionRunner(
      driver,
      sql,
      settings.busyTimeoutMs,
      "only enqueue(), enqueueBatch() and acknowledge() of one lease made inside outbox.within() join it; claims, renewals, releases and the outbox's own transactions wait for it to end",
    );
    this.#driver = this.#runner.driver;
    this.#ledger = new Ledger(this.#driver, sql);
    this.#path = new WritePath(
      this.#runner,
      sql,
      settings.now,
      () => this.#closed,
      (op, expire) => this.#start(op, expire),
    );
    this.#core = {
      ...settings,
      driver: this.#driver,
      sql,
      mutex: this.#runner.mutex,
      runner: this.#runner,
      ledger: this.#ledger,
      isClosed: () => this.#closed,
      write: (op, fn, options) => this.#path.write(op, fn, options),
      start: (op, expire) => this.#start(op, expire),
      checkNow: (op, now) => this.#path.checkNow(op, now),
      localNow: (op) => this.#path.localNow(op),
      enqueued: () => this.#groups.notify(),
    };
    this.#groups = new GroupCommit(this.#core);
    // PostgreSQL listens from opening (core/schema.ts).
    this.#idleWatch = new IdleWatch(async () =>
      sql.setup === undefined
        ? await this.#driver.watchEnqueues?.(() => this.#groups.notify())
        : undefined
    );
  }

  /**
   * Opens an outbox on a connection, creating the schema (`schema.sql`) when
   * the database has none, upgrading an older one in the same transaction
   * (one frozen step per version, `dialects/sqlite/migrations/`), and
   * checking its version otherwise. The version lives in the outbox's own
   * table `outbox_schema`, never in the application's `PRAGMA user_version`
   * (a file of a release that kept it there moves it: see
   * docs/limits-and-faq.md). Stop processes running an older release before
   * an upgrade, or their claims and acknowledgements go unrecorded or out of
   * order, and the events they enqueue have no identity.
   *
   * A new database gets `auto_vacuum = INCREMENTAL` before its first table,
   * so {@linkcode Outbox.maintain} can give freed pages back to the file
   * system.
   *
   * @param driver The connection; the outbox closes it when it closes, also
   * when opening fails (a driver over the application's own handle, such as
   * `nodeSqliteDriver`, leaves the handle open).
   * @param options See {@linkcode OutboxOptions}.
   * @returns The opened outbox.
   * @throws {TypeError | RangeError} When an option is invalid or unknown,
   * naming it.
   * @throws {SchemaVersionError} When the database has a newer outbox schema.
   * @throws {Error} When the connection is read-only (claims, acknowledgements
   * and the admin calls write: lapsed last-attempt leases become dead
   * letters first).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  static async open<P = unknown>(
    driver: Driver,
    options: OutboxOptions = {},
  ): Promise<Outbox<P>> {
    checkOpenArguments(driver, options);
    const outbox = new Outbox<P>(driver, options);
    try {
      outbox.#stopWatching = await openSchema(outbox.#core);
    } catch (error) {
      await outbox.close().catch(() => {});
      throw error;
    }
    return outbox;
  }

  /**
   * Adds a pending event. To commit it with business rows, use
   * {@linkcode Transaction.enqueue} inside {@linkcode Outbox.transaction},
   * or call this inside {@linkcode Outbox.within} while the application has
   * a transaction open on the connection the outbox shares: it then runs
   * inside that transaction, with no `BEGIN` or `COMMIT` of its own, and the
   * application's `COMMIT` or `ROLLBACK` decides. Called anywhere else while
   * that transaction is open, it waits for it to end, then commits on its
   * own (joining follows the caller, not the handle).
   *
   * Concurrent calls share transactions (group commit, up to 1,000 calls
   * or 8 MiB of payloads; a lone call commits at once): each resolves once
   * the commit holding its event returned, with its own result or error,
   * and ids follow the order of the calls (docs/getting-started.md, Group
   * commit, says what a failed commit does).
   *
   * @param payload JSON data that `JSON.stringify` keeps as it is (plain
   * objects, arrays, strings, finite numbers, booleans, `null`), or a
   * `Uint8Array` stored as is; `NaN`, `undefined` members, a `Map`, a `Date`
   * or any object with `toJSON`, and the like are refused (docs/limits-and-faq.md).
   * @param options See {@linkcode EnqueueOptions}.
   * @returns The event id, its identity, and whether `dedupKey` or a
   * supplied `identity` matched an earlier event.
   * @throws {TypeError | RangeError} When an argument is invalid or an
   * option unknown, a payload JSON would change naming the place inside it
   * (`'payload.a'`), before any SQL.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`
   * (inside the application's transaction: at once, as waiting could
   * deadlock).
   * @throws {DedupRaceError} When the event `dedupKey` or `identity` met was
   * purged before it could be read, round after round (PostgreSQL only).
   * @throws {ConstraintError} When the application's own constraint or
   * trigger on `outbox_events` refused the insert (the engine's error,
   * naming it; on PostgreSQL a `PostgresError`), or a trigger skipped it
   * (SQLite's `RAISE(IGNORE)`, a PostgreSQL `BEFORE INSERT` trigger
   * returning NULL: code 1811, naming the table).
   */
  async enqueue(
    payload: P,
    options: EnqueueOptions = {},
  ): Promise<EnqueueResult> {
    const op = "enqueue";
    const event = prepareEnqueue(op, payload, options, this.#core);
    this.#path.checkOpen(op);
    this.#path.notNested(op);
    // Only a call made inside the application's transaction (within()) joins
    // it: any other waits for it to end, or a rollback would take back an
    // event whose call had resolved.
    return await this.#groups.add(event, this.#runner.joins());
  }

  /**
   * Adds pending events in one transaction and one statement, each exactly
   * as {@linkcode Outbox.enqueue} would add it if called once per element in
   * order: its options apply to it alone, a `dedupKey` or `identity` may
   * match an earlier element of the batch, ids follow the array's order.
   * Inside {@linkcode Outbox.within}, joins a transaction the application
   * began on the connection the outbox shares, as `enqueue` does. All or none: when any element fails in SQL,
   * none is written.
   *
   * @param events The events, at most 10,000: each a `payload` (as for
   * `enqueue`) with that event's {@linkcode EnqueueOptions}.
   * @returns One result per element, in order.
   * @throws {TypeError | RangeError} When `events` is not an array, is too
   * long, or an element is invalid (before any SQL): the message names it
   * (`events[3].dedupKey`).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   * @throws {DedupRaceError} When events the batch's keys met were purged
   * before they could be read, round after round (PostgreSQL only).
   * @throws {ConstraintError} As for `enqueue`, for any of its events.
   *
   * @example Enqueue a batch
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
   * const results = await outbox.enqueueBatch([
   *   { payload: { n: 1 }, dedupKey: "order-1" },
   *   { payload: { n: 2 }, delayMs: 60_000 },
   *   { payload: { n: 1 }, dedupKey: "order-1" },
   * ]);
   * assert.deepEqual(results.map((r) => r.deduplicated), [false, false, true]);
   * assert.equal(results[2]!.eventId, results[0]!.eventId);
   * assert.deepEqual((await outbox.claim())?.payload, { n: 1 });
   * ```
   */
  async enqueueBatch(
    events: readonly BatchEvent<P>[],
  ): Promise<EnqueueResult[]> {
    const op = "enqueue batch";
    const prepared = prepareBatch(op, events, this.#core);
    this.#groups.close();
    // Joins the application's transaction only when called inside it (see
    // enqueue).
    const join = this.#runner.joins();
    const results = await this.#path.write(
      op,
      (now) => insertAll(this.#driver, this.#sql, prepared, now),
      // An enqueue reads nothing that lapsed last-attempt leases decide, so
      // it leaves making them dead letters to the next call that does: on
      // PostgreSQL that step waits for their row locks, and a long
      // transaction holding one would stall every producer.
      {
        join,
        expire: false,
        inOne: this.#sql.insertAllInOne
          ? (now) => insertAll(this.#driver, this.#sql, prepared, now)
          : undefined,
      },
    );
    if (results.length > 0) this.#groups.notify();
    return results;
  }

  /**
   * Calls `listener` after each commit that enqueued events through this
   * outbox ({@linkcode Outbox.enqueue} or a transaction's `enqueue`), so a
   * processing loop in the same process can claim at once instead of waiting
   * for its next poll. Other connections' enqueues call it too where the
   * driver can tell: PostgreSQL's `NOTIFY` from opening, and the Deno file
   * driver's watch of the database's files while a loop waits idle (see
   * {@linkcode Outbox.watchWhileIdle}); elsewhere they are found by polls. An
   * enqueue inside the application's transaction calls it when it returns,
   * before the application commits (a claim on the same connection then
   * waits for that commit).
   *
   * @param listener Called synchronously after the commit; what it throws is
   * reported with `reportError` and does not fail the enqueue.
   * @returns A function that removes the listener.
   *
   * @example Usage
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
   * let calls = 0;
   * const off = outbox.onEnqueue(() => calls++);
   * await outbox.enqueue({ n: 1 });
   * off();
   * await outbox.enqueue({ n: 2 });
   * assert.equal(calls, 1);
   * ```
   */
  onEnqueue(listener: () => void): () => void {
    return this.#groups.listen(listener);
  }

  /**
   * Says that a consumer waits idle for events, until the returned function
   * is called: while any does, a driver whose watch for other connections'
   * enqueues costs something on every commit (the Deno file driver of
   * `openSqliteWasm` watches the database's files, and so sees this
   * process's own commits too) keeps it, and calls the
   * {@linkcode Outbox.onEnqueue} listeners when another connection, of this
   * process or another, enqueues. `processEvents` calls it around its idle
   * waits. Where the watch cannot start (no file, the system's watch limit
   * reached), nothing changes: consumers find events at their polls.
   *
   * @returns Ends this consumer's wait; a second call does nothing.
   *
   * @example Usage
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   *
   * const dir = await Deno.makeTempDir();
   * const outbox = await Outbox.open(await openSqliteWasm(`${dir}/app.db`));
   * const done = outbox.watchWhileIdle();
   * // ... until the consumer has work again:
   * done();
   * await outbox.close();
   * await Deno.remove(dir, { recursive: true });
   * ```
   */
  watchWhileIdle(): () => void {
    return this.#idleWatch.begin();
  }

  /**
   * Claims the oldest eligible event of a queue under a new lease: pending
   * and due, or its previous lease lapsed (`now >= leaseUntil`), with
   * attempts left, no earlier unfinished event of its ordering key and no
   * live lease on another event of that key. Runs in one `BEGIN IMMEDIATE`
   * transaction; lapsed leases with no attempts left become dead letters on
   * the way.
   *
   * @param options See {@linkcode ClaimOptions}; with `max`, claims a batch.
   * @returns The lease, or `null` when nothing is eligible (with `max`: the
   * leases, possibly none).
   * @throws {TypeError | RangeError} When an argument is invalid (before any
   * SQL), or when a supplied `token` was used on the event before.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   * @throws {UnsafeIntegerError} When the event's id, fence or attempt (or
   * the next fence or attempt) is past `Number.MAX_SAFE_INTEGER`; nothing
   * is claimed.
   * @throws {Error} When the claim's UPDATE did not change exactly the rows
   * it leased; nothing is claimed.
   */
  claim(options?: ClaimOptions): Promise<Lease<P> | null>;
  /**
   * Claims up to `max` eligible events in one transaction, each under its own
   * lease and freshly minted token, in claim order.
   *
   * @param options See {@linkcode BatchClaimOptions}.
   * @returns The leases, possibly none.
   * @throws {TypeError | RangeError} When an argument is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   * @throws {UnsafeIntegerError} As for a lone claim; nothing is claimed.
   */
  claim(options: BatchClaimOptions): Promise<Lease<P>[]>;
  async claim(
    options: ClaimOptions | BatchClaimOptions = {},
  ): Promise<Lease<P> | null | Lease<P>[]> {
    const op = "claim";
    const { queue, leaseMs, max, token } = claimArguments(
      op,
      options,
      this.#settings,
    );
    if (max !== undefined) {
      return await this.#path.write(
        op,
        (now) =>
          claimCandidates<P>(
            this.#core,
            op,
            queue,
            leaseMs,
            max,
            undefined,
            now,
          ),
        { inOne: claimInOne<P>(this.#core, op, queue, leaseMs, max) },
      );
    }
    // A supplied token is first looked up in the ledger: the general path.
    const inOne = token === undefined
      ? claimInOne<P>(this.#core, op, queue, leaseMs, 1)
      : undefined;
    return await this.#path.write(
      op,
      async (now) => {
        const [lease] = await claimCandidates<P>(
          this.#core,
          op,
          queue,
          leaseMs,
          1,
          token,
          now,
        );
        return lease ?? null;
      },
      {
        inOne: inOne &&
          (async (now) => {
            const leases = await inOne(now);
            return leases && (leases[0] ?? null);
          }),
      },
    );
  }

  /**
   * Marks the event done **iff** the lease's token is still the event's
   * current one and the event is not done or dead. A stale lease changes
   * nothing but the ledger's `stale_acknowledge` entry.
   *
   * Made inside {@linkcode Outbox.within} while the application has a
   * transaction open on the connection the outbox shares, it runs inside that
   * transaction and commits with the application's writes; a stale lease
   * then throws {@linkcode LeaseLostError} having written nothing, so the
   * application rolls its effect back (as `tx.acknowledge` does).
   *
   * @param lease A lease from {@linkcode Outbox.claim}, or an array of them
   * acknowledged in one transaction.
   * @returns `true` when acknowledged, `false` when stale (per lease for an array).
   * @throws {TypeError | RangeError} When a lease is malformed (before any SQL).
   * @throws {LeaseLostError} When the lease is stale inside the
   * application's transaction.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  acknowledge(lease: Lease<unknown>): Promise<boolean>;
  /**
   * Acknowledges several leases in one transaction, each as
   * {@linkcode Outbox.acknowledge} does one. A batch is the processing
   * loop's: it never joins the application's transaction but waits for it
   * to end, as claims do.
   *
   * @param leases Leases from {@linkcode Outbox.claim}.
   * @returns Per lease, in order: `true` when acknowledged, `false` when
   * stale (as a lease listed a second time is).
   * @throws {TypeError | RangeError} When a lease is malformed (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  acknowledge(leases: readonly Lease<unknown>[]): Promise<boolean[]>;
  async acknowledge(
    leases: Lease<unknown> | readonly Lease<unknown>[],
  ): Promise<boolean | boolean[]> {
    const op = "acknowledge";
    if (Array.isArray(leases)) {
      const checked = checkLeases(op, leases);
      return await this.#path.write(
        op,
        (now) => acknowledgeAll(this.#core, checked, now),
        { inOne: acknowledgeInOne(this.#core, op, checked) },
      );
    }
    const lease = checkLease(op, "lease", leases);
    const inOne = acknowledgeInOne(this.#core, op, [lease]);
    // Joins the application's transaction only when called inside it (see
    // enqueue).
    const join = this.#runner.joins();
    return await this.#path.write(
      op,
      async (now, joined) => {
        if (await acknowledgeOne(this.#core, lease, now)) return true;
        // In the application's transaction, a stale lease must roll its
        // writes back, as in transaction(fn).
        if (joined) throw new LeaseLostError(lease.eventId, lease.fence);
        return false;
      },
      { join, inOne: inOne && (async (now) => (await inOne(now))?.[0]) },
    );
  }

  /**
   * Acknowledges `leases` and claims up to `max` more in one transaction:
   * a worker that goes through batches commits once per batch instead of
   * twice, and on a rollback journal each commit is four `fdatasync`s.
   * Each lease is acknowledged as {@linkcode Outbox.acknowledge} does it,
   * then the claim runs as a batch {@linkcode Outbox.claim} does and sees
   * them done (so the next event of an ordering key whose event was just
   * acknowledged can be claimed at once). Both halves commit, or neither
   * does: when the claim throws, no lease is acknowledged. Like a batch
   * acknowledge, it never joins the application's transaction but waits for
   * it to end.
   *
   * @param leases Leases from {@linkcode Outbox.claim}, possibly none.
   * @param options See {@linkcode BatchClaimOptions}.
   * @returns Per lease given, whether it was acknowledged, and the new leases.
   * @throws {TypeError | RangeError} When a lease or an option is invalid
   * (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   * @throws {UnsafeIntegerError} As for a batch claim; nothing is
   * acknowledged or claimed.
   *
   * @example Usage
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
   * await outbox.enqueueBatch([{ payload: 1 }, { payload: 2 }, { payload: 3 }]);
   * const leases = await outbox.claim({ max: 2 });
   * const next = await outbox.acknowledgeAndClaim(leases, { max: 2 });
   * assert.deepEqual(next.acknowledged, [true, true]);
   * assert.deepEqual(next.leases.map((l) => l.payload), [3]);
   * assert.equal((await outbox.stats()).done, 2);
   * ```
   */
  async acknowledgeAndClaim(
    leases: readonly Lease<unknown>[],
    options: BatchClaimOptions,
  ): Promise<AcknowledgedAndClaimed<P>> {
    const op = "acknowledgeAndClaim";
    const checked = checkLeases(op, leases);
    const { queue, leaseMs, max } = batchClaimArguments(
      op,
      options,
      this.#settings,
    );
    const inOne = claimInOne<P>(this.#core, op, queue, leaseMs, max, checked);
    return await this.#path.write(
      op,
      async (now) => ({
        acknowledged: await acknowledgeAll(this.#core, checked, now),
        leases: await claimCandidates<P>(
          this.#core,
          op,
          queue,
          leaseMs,
          max,
          undefined,
          now,
        ),
      }),
      {
        inOne: inOne && (async (now) => {
          const leases = await inOne(now);
          return leases && { acknowledged: checked.map(() => true), leases };
        }),
      },
    );
  }

  /**
   * Extends a live lease to `now + leaseMs` **iff** its token is current and
   * `now < leaseUntil`. Never shortens: when the clock stepped back, the old
   * deadline stays.
   *
   * @param lease The lease to extend.
   * @param leaseMs New lease length from now, in milliseconds.
   * @default {OutboxOptions.leaseMs}
   * @returns The new deadline in epoch milliseconds, or `false` when the
   * lease was lost or had lapsed (nothing changes then).
   * @throws {TypeError | RangeError} When an argument is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async renew(
    lease: Lease<unknown>,
    leaseMs?: number,
  ): Promise<number | false> {
    const op = "renew";
    const checked = checkLease(op, "lease", lease);
    const ms = checkInteger(op, "leaseMs", leaseMs, 1, MAX_DURATION_MS) ??
      this.#settings.leaseMs;
    return await this.#path.write(op, async (now) => {
      await this.#ledger.writeUnwritten([checked.eventId], false);
      const [row] = await this.#driver.query(this.#sql.renew, [
        now + ms,
        now,
        checked.eventId,
        checked.token,
        checked.fence,
      ]);
      if (row === undefined) {
        await this.#ledger.stale(checked, "stale_renew", now);
        return false;
      }
      const leaseUntil = integerOf(row, "lease_until");
      await this.#ledger.entry(
        checked.eventId,
        checked.fence,
        "renewed",
        now,
        checked.token,
        leaseUntil,
      );
      return leaseUntil;
    });
  }

  /**
   * Gives an event back before its lease ends, **iff** the token is current:
   * it becomes claimable after `delayMs`, or a dead letter when it has no
   * attempts left. A stale lease changes nothing.
   *
   * @param lease The lease to give back.
   * @param options See {@linkcode ReleaseOptions}.
   * @returns `true` when released, `false` when stale.
   * @throws {TypeError | RangeError} When an argument is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async release(
    lease: Lease<unknown>,
    options: ReleaseOptions = {},
  ): Promise<boolean> {
    const op = "release";
    const checked = checkLease(op, "lease", lease);
    const { delayMs, error, deadLetter, attempted } = releaseArguments(
      op,
      options,
    );
    return await this.#path.write(op, async (now) => {
      await this.#ledger.writeUnwritten([checked.eventId], false);
      const [row] = await this.#driver.query(this.#sql.release, [
        now,
        now + delayMs,
        error,
        checked.eventId,
        checked.token,
        checked.fence,
        deadLetter ? 1 : 0,
        attempted ? 0 : 1,
      ]);
      if (row === undefined) {
        await this.#ledger.stale(checked, "stale_release", now);
        return false;
      }
      await this.#ledger.entry(
        checked.eventId,
        checked.fence,
        "released",
        now,
        checked.token,
        null,
        error,
      );
      if (row["state"] === "dead") {
        await this.#ledger.entry(
          checked.eventId,
          checked.fence,
          "dead",
          now,
          null,
          null,
          error,
        );
      }
      return true;
    });
  }

  /**
   * Lists dead letters of a queue, oldest first.
   *
   * @param options `queue` (default: the outbox's) and `limit` (default 100).
   * @returns The dead letters.
   * @throws {TypeError | RangeError} When an argument is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async deadLetters(
    options: { readonly queue?: string; readonly limit?: number } = {},
  ): Promise<DeadLetter<P>[]> {
    return await admin.deadLetters<P>(this.#core, options);
  }

  /**
   * Lists events in one state, oldest id first, a page at a time: pass the
   * last id of a page as `afterId` for the next one.
   *
   * @param options See {@linkcode ListOptions}.
   * @returns The events, at most `limit` of them.
   * @throws {TypeError | RangeError} When an argument is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   *
   * @example Page through pending events
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
   * for (const n of [1, 2, 3]) await outbox.enqueue({ n });
   * const first = await outbox.list({ state: "pending", limit: 2 });
   * assert.deepEqual(first.map((e) => e.payload), [{ n: 1 }, { n: 2 }]);
   * const next = await outbox.list({ state: "pending", afterId: first[1]!.id });
   * assert.deepEqual(next.map((e) => e.payload), [{ n: 3 }]);
   * ```
   */
  async list(options: ListOptions): Promise<EventInfo<P>[]> {
    return await admin.list<P>(this.#core, options);
  }

  /**
   * Cancels a pending event: it becomes a dead letter whose last error is
   * `"cancelled"`, so it stays listed (and explained) and
   * {@linkcode Outbox.redrive} can bring it back; purge deletes it for good.
   * A leased event is not cancelled: its holder would find its
   * acknowledgement refused without knowing why.
   *
   * @param eventId The event's id.
   * @returns `true` when the event was pending and is cancelled now, else `false`.
   * @throws {TypeError | RangeError} When `eventId` is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   *
   * @example Cancel, then change one's mind
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
   * const { eventId } = await outbox.enqueue({ to: "ada@example.com" });
   * assert.equal(await outbox.cancel(eventId), true);
   * assert.equal(await outbox.claim(), null);
   * assert.equal(await outbox.redrive({ ids: [eventId] }), 1);
   * assert.equal((await outbox.claim())?.eventId, eventId);
   * ```
   */
  cancel(eventId: number): Promise<boolean>;
  /**
   * Cancels the pending events among `eventIds` in one transaction, as
   * pg-boss's `cancel()` takes an array: all of them or, when it throws,
   * none. The others named (leased, finished, unknown) are left alone.
   *
   * @param eventIds At most 10,000 event ids.
   * @returns The ids cancelled, ascending.
   * @throws {TypeError | RangeError} When an id or the array is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   *
   * @example Cancel several events at once
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
   * const a = await outbox.enqueue({ n: 1 });
   * const b = await outbox.enqueue({ n: 2 });
   * assert.deepEqual(await outbox.cancel([b.eventId, a.eventId, 99]), [
   *   a.eventId,
   *   b.eventId,
   * ]);
   * ```
   */
  cancel(eventIds: readonly number[]): Promise<number[]>;
  async cancel(
    eventIds: number | readonly number[],
  ): Promise<boolean | number[]> {
    return await admin.cancel(this.#core, eventIds);
  }

  /**
   * Makes dead letters claimable again at once with a fresh attempt count
   * (SQS's dead-letter redrive, pg-boss's `redrive()`), in one transaction.
   * With neither option, every dead letter of every queue.
   *
   * @param options See {@linkcode RedriveOptions}.
   * @returns How many dead letters are pending now.
   * @throws {TypeError | RangeError} When an argument is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   *
   * @example Redrive a queue's dead letters after fixing the receiver
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"), {
   *   maxAttempts: 1,
   * });
   * await outbox.enqueue({ to: "ada@example.com" }, { queue: "mail" });
   * const lease = await outbox.claim({ queue: "mail" });
   * await outbox.release(lease!, { error: "receiver down" });
   * assert.equal(await outbox.redrive({ queue: "mail" }), 1);
   * assert.equal((await outbox.claim({ queue: "mail" }))?.attempt, 1);
   * ```
   */
  async redrive(options: RedriveOptions = {}): Promise<number> {
    return await admin.redrive(this.#core, options);
  }

  /**
   * Deletes done events and dead letters older than a duration, counted from
   * when they were acknowledged or became dead letters, with their ledger
   * entries (retention). It deletes at most 1,000 events per transaction, so
   * claims on other connections wait for short write locks only. Their dedup
   * keys stop deduplicating.
   *
   * @param options See {@linkcode PurgeOptions}.
   * @returns How many events were deleted.
   * @throws {TypeError | RangeError} When an argument is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   *
   * @example Keep a week of history
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * let now = 0;
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"), {
   *   now: () => now,
   * });
   * await outbox.enqueue({ n: 1 });
   * await outbox.acknowledge((await outbox.claim())!);
   * now = 3 * 86_400_000;
   * assert.equal(await outbox.purge({ olderThanMs: 7 * 86_400_000 }), 0);
   * now = 8 * 86_400_000;
   * assert.equal(await outbox.purge({ olderThanMs: 7 * 86_400_000 }), 1);
   * ```
   */
  async purge(options: PurgeOptions): Promise<number> {
    return await admin.purge(this.#core, options);
  }

  /**
   * Counts the events of every queue per state.
   *
   * @returns One entry per queue that has events, in name order.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   *
   * @example Usage
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"), { now: () => 5 });
   * await outbox.enqueue({ n: 1 }, { queue: "mail" });
   * assert.deepEqual(await outbox.queues(), [
   *   { queue: "mail", pending: 1, leased: 0, done: 0, dead: 0, oldestPendingAt: 5 },
   * ]);
   * ```
   */
  async queues(options: QueuesOptions = {}): Promise<QueueCounts[]> {
    return await admin.queues(this.#core, options);
  }

  /**
   * Counts the queues that have events, by a name prefix: with
   * `queues({ prefix, limit, after })`, what a page of queues shows "of".
   *
   * @param options See {@linkcode CountQueuesOptions}.
   * @returns How many queues, at most `upTo`.
   * @throws {TypeError | RangeError} When an option is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   *
   * @example Usage
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
   * for (const queue of ["mail-a", "mail-b", "sms"]) await outbox.enqueue(1, { queue });
   * assert.equal(await outbox.countQueues({ prefix: "mail-" }), 2);
   * assert.deepEqual(
   *   (await outbox.queues({ prefix: "mail-", after: "mail-a", limit: 1 })).map((q) => q.queue),
   *   ["mail-b"],
   * );
   * ```
   */
  async countQueues(options: CountQueuesOptions = {}): Promise<number> {
    return await admin.countQueues(this.#core, options);
  }

  /**
   * Counts events acknowledged and attempts failed per time bucket, as
   * {@linkcode OutboxReader.activity} does (the dashboard's chart), under
   * the write lock like the other admin reads.
   *
   * @param sinceMs Epoch milliseconds; what happened at or after it counts.
   * @param bucketMs The buckets' width, 1 ms to 1 day.
   * @returns The buckets that saw anything, oldest first.
   * @throws {TypeError | RangeError} When an argument is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async activity(sinceMs: number, bucketMs: number): Promise<ActivityCount[]> {
    return await admin.activity(this.#core, sinceMs, bucketMs);
  }

  /**
   * Finds the event a queue holds under a dedup key, done ones included.
   *
   * @param queue The queue's name, or `undefined` for any queue (the first
   * by name that holds the key: a seek of the dedup index per queue on
   * SQLite).
   * @param dedupKey The dedup key the event was enqueued with.
   * @returns The event's id, or `null` when none has that key.
   * @throws {TypeError | RangeError} When an argument is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async eventIdByDedupKey(
    queue: string | undefined,
    dedupKey: string,
  ): Promise<number | null> {
    return await admin.eventIdByDedupKey(this.#core, queue, dedupKey);
  }

  /**
   * How long until the next pending or leased event of a queue that is not
   * due yet comes due (a delayed event, a backoff, a lease deadline), by the
   * outbox's clock, so an idle loop sleeps until then instead of polling.
   * One statement outside a transaction: it takes no write lock (on
   * PostgreSQL, one round trip), and falls back to a transaction that waits
   * for the lock only when the database is busy.
   *
   * @param options `queue`: default the outbox's.
   * @returns Milliseconds from now, or `null` when nothing is scheduled.
   * @throws {TypeError} When `queue` is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   *
   * @example Usage
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"), { now: () => 0 });
   * assert.equal(await outbox.nextDueInMs(), null);
   * await outbox.enqueue({ n: 1 }, { delayMs: 2_000 });
   * assert.equal(await outbox.nextDueInMs(), 2_000);
   * ```
   */
  async nextDueInMs(
    options: { readonly queue?: string } = {},
  ): Promise<number | null> {
    return await admin.nextDueInMs(this.#core, options);
  }

  /** Pauses a queue's claims everywhere until `resume` (docs/flow-control.md). */
  pause(queue: string): Promise<void> {
    return flow.pause(this.#core, queue, true);
  }

  /** Resumes a paused queue: claims take its events again. */
  resume(queue: string): Promise<void> {
    return flow.pause(this.#core, queue, false);
  }

  /** Sets a queue's `perKey` and `perSecond` limits, stored in the database. */
  setLimits(queue: string, limits: QueueLimits): Promise<void> {
    return flow.setLimits(this.#core, queue, limits);
  }

  /** A queue's flow control: whether it is paused, and its limits. */
  limits(queue: string): Promise<QueueFlow> {
    return flow.limits(this.#core, queue);
  }

  /** Stores a cron schedule that enqueues `payload` at each tick. */
  schedule(
    name: string,
    cron: string,
    payload: P,
    options: ScheduleOptions = {},
  ): Promise<void> {
    return flow.schedule(this.#core, name, cron, payload, options);
  }

  /** Removes a schedule (its events stay); answers whether there was one. */
  unschedule(name: string): Promise<boolean> {
    return flow.unschedule(this.#core, name);
  }

  /** The schedules by name, each with its next and latest tick. */
  schedules(): Promise<Schedule[]> {
    return flow.schedules(this.#core);
  }

  /** Enqueues each schedule's due ticks once; answers how many it enqueued. */
  runSchedules(): Promise<number> {
    return flow.runSchedules(this.#core);
  }

  /**
   * Gives the pages that deleted rows freed back to the file system, so the
   * file shrinks after {@linkcode Outbox.purge} (SQLite keeps freed pages on
   * a free list otherwise). Databases this library creates have
   * `auto_vacuum = INCREMENTAL`, and this runs `PRAGMA incremental_vacuum`.
   * One made before (or by another program) has `auto_vacuum = NONE`, which
   * the result says: `vacuum: true` then runs a full `VACUUM` once, which
   * rewrites the file, switches it to incremental, and fails with
   * {@linkcode BusyError} while another connection uses the database.
   * In WAL mode it then runs `PRAGMA wal_checkpoint(TRUNCATE)`: the WAL file
   * goes back to zero bytes unless a reader or writer uses it at that moment
   * (it is then checkpointed as far as the readers allow).
   *
   * @param options `vacuum`: run a full `VACUUM`. @default {false}
   * @returns The bytes given back, the free pages left, the database's
   * `auto_vacuum` mode afterwards (`"none"`: nothing can be given back
   * without `vacuum: true`), and in WAL mode the WAL after the checkpoint
   * (`sizeBytes` `0` when it was truncated).
   * @throws {TypeError} When an option is invalid (before any SQL).
   * @throws {BusyError} When the database is locked.
   *
   * @example Shrink after a purge
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
   * const { autoVacuum } = await outbox.maintain();
   * assert.equal(autoVacuum, "incremental");
   * ```
   */
  async maintain(
    options: { readonly vacuum?: boolean } = {},
  ): Promise<
    {
      reclaimedBytes: number;
      freePages: number;
      autoVacuum: "none" | "full" | "incremental";
      wal?: WalStats;
    }
  > {
    return await maintain(this.#core, options);
  }

  /**
   * Counts the events of a queue per state. On SQLite in WAL mode, then
   * runs a passive checkpoint (`PRAGMA wal_checkpoint(PASSIVE)`, which waits
   * for nothing and copies nothing once the WAL is copied) to report the
   * WAL's size and whether a reader holds its checkpoints back.
   *
   * @param options `queue`: default the outbox's.
   * @returns See {@linkcode Stats}.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async stats(options: { readonly queue?: string } = {}): Promise<Stats> {
    return await withWal(this.#core, await admin.stats(this.#core, options));
  }

  /**
   * Tells one event's state and every claim, renewal, release,
   * acknowledgement, stale call, expiry, dead letter and retry it had.
   *
   * @param event The event's id, or its identity (UUID text).
   * @returns The explanation, or `null` when no such event exists.
   * @throws {TypeError | RangeError} When `event` is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async explain(event: number | string): Promise<Explanation | null> {
    return await admin.explain(this.#core, event);
  }

  /**
   * Runs `fn` as part of the transaction the application has open on the
   * connection this outbox shares (a `DatabaseSync` behind
   * `nodeSqliteDriver`, an `oo1.DB` behind `sqliteWasmDriver`, or the
   * driver itself): {@linkcode Outbox.enqueue}, {@linkcode Outbox.enqueueBatch}
   * and the {@linkcode Outbox.acknowledge} of one lease made inside `fn`, on
   * this outbox or any outbox or inbox on the same connection, run inside
   * that transaction under a savepoint, and its `COMMIT` or `ROLLBACK`
   * decides. With none open they run on their own. The same calls made
   * anywhere else wait for the application's transaction to end (at most
   * `busyTimeoutMs`), so a rollback never takes back an event whose call
   * was not part of it. Where the runtime has no `AsyncLocalStorage`
   * (browsers), every such call made while `fn` runs joins.
   *
   * @param fn The application's code that belongs to its transaction.
   * @returns What `fn` returned.
   * @throws {TypeError} When `fn` is not a function.
   *
   * @example The application's transaction on a shared node:sqlite handle
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { nodeSqliteDriver } from "@leased/outbox/node-sqlite";
   * import { DatabaseSync } from "node:sqlite";
   * import assert from "node:assert/strict";
   *
   * const db = new DatabaseSync(":memory:");
   * await using outbox = await Outbox.open(nodeSqliteDriver(db));
   * db.exec("BEGIN IMMEDIATE");
   * await outbox.within(() => outbox.enqueue({ order: 1 })); // joins it
   * db.exec("ROLLBACK");
   * assert.equal((await outbox.stats()).pending, 0);
   * ```
   */
  within<T>(fn: () => Promise<T>): Promise<T> {
    return withinApplication("run within", this.#runner.mutex, fn);
  }

  /**
   * Runs `fn` in one `BEGIN IMMEDIATE` transaction: the caller's statements,
   * enqueues and fenced acknowledgements commit together, or none of them
   * does. Throwing from `fn` rolls back and rethrows.
   *
   * Inside `fn`, use only the handle: a call on this outbox (or another
   * outbox on the same connection) made from `fn` throws at once, as it
   * would wait for the transaction that is waiting for it (where the
   * runtime has no `AsyncLocalStorage`, as in browsers, it is not detected
   * and waits). `tx.run` and `tx.query` refuse `BEGIN`, `COMMIT`, `END`,
   * `ROLLBACK`, `SAVEPOINT` and `RELEASE` (and PostgreSQL's `ABORT`,
   * `START TRANSACTION` and `PREPARE TRANSACTION`): the transaction ends
   * when `fn` does. While the application has its own transaction open on the
   * connection, this waits for it to end (see {@linkcode Outbox.enqueue}).
   *
   * @param fn The work; its result is returned after the commit.
   * @returns What `fn` returned.
   * @throws {LeaseLostError} When `tx.acknowledge` found its lease stale.
   * @throws {TransactionEndedError} When the engine ended or failed the
   * transaction (a statement of `fn` failed in a way that ends it, caught or
   * not, and `fn` went on), or PostgreSQL answered its `COMMIT` with
   * `ROLLBACK`: nothing of `fn` was committed, and every `tx` call made
   * after the end threw it too.
   * @throws {ConnectionLostError} When the PostgreSQL connection was lost
   * inside the transaction, also while `fn` awaited something else (a
   * terminated backend, `idle_in_transaction_session_timeout`): nothing of
   * `fn` was committed, and every `tx` call made after the loss threw it too.
   * @throws {RangeError} When `tx.run` or `tx.query` is given a
   * transaction-control statement (before it runs).
   * @throws {TypeError} When `tx.run` or `tx.query` is given SQL that is not
   * a string, or parameters that are not an array (before it runs).
   * @throws {Error} When called from inside `fn` of a transaction on the
   * same connection.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   *
   * @example Business row and event commit together
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
   * await outbox.transaction((tx) => tx.run("CREATE TABLE orders (id INTEGER PRIMARY KEY)"));
   * const id = await outbox.transaction(async (tx) => {
   *   const { lastInsertRowid } = await tx.run("INSERT INTO orders DEFAULT VALUES");
   *   await tx.enqueue({ order: Number(lastInsertRowid) });
   *   return Number(lastInsertRowid);
   * });
   * assert.deepEqual((await outbox.claim())?.payload, { order: id });
   * ```
   */
  async transaction<T>(fn: (tx: Transaction) => Promise<T>): Promise<T> {
    return await runTransaction(
      this.#core,
      this.#groups,
      (lease, now) => acknowledgeOne(this.#core, lease, now),
      fn,
    );
  }

  /** The queue of calls that name none. */
  get queue(): string {
    return this.#settings.queue;
  }

  /** The default lease length of claims and renewals, in milliseconds. */
  get leaseMs(): number {
    return this.#settings.leaseMs;
  }

  /** Whether {@linkcode Outbox.close} was called: every later call rejects. */
  get closed(): boolean {
    return this.#closed;
  }

  /**
   * Closes the connection once the calls made before it finish. Calls made
   * after it reject with an `Error` saying the outbox is closed.
   */
  async close(): Promise<void> {
    this.#path.notNested("close");
    this.#closed = true;
    return await this.#runner.line.run(() =>
      this.#runner.mutex.run(async () => {
        await this.#stopWatching?.().catch(() => {});
        await this.#idleWatch.close();
        await this.#driver.close();
      })
    );
  }

  /** Same as {@linkcode Outbox.close}, for `await using`. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  /**
   * Reads the lease clock at the start of a transaction and, unless
   * `expire` is off, makes lapsed last-attempt leases dead letters; on the
   * server's clock one statement does both when the dialect has it.
   */
  async #start(op: string, expire: boolean): Promise<number> {
    if (expire && this.#settings.now === "database" && this.#sql.nowExhausted) {
      const rows = await this.#driver.query(this.#sql.nowExhausted);
      const now = this.#path.checkNow(op, rows[0]?.["now"]);
      await expireLeases(
        this.#core,
        rows.filter((row) => row["id"] !== null),
        now,
      );
      return now;
    }
    const now = await this.#path.clock(op);
    if (expire) {
      await expireLeases(
        this.#core,
        await this.#driver.query(this.#sql.exhausted, [now]),
        now,
      );
    }
    return now;
  }
}
