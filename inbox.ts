/**
 * The receiving half of the outbox: an inbox that applies each event's
 * effect once, however often the event is delivered.
 *
 * The sender delivers an event with its identity (the idempotency key) and
 * the fence of the claim delivering it, {@linkcode deliveryHeaders} puts
 * both in HTTP headers. {@linkcode Inbox.accept} runs the effect's writes
 * and records the identity in one transaction: a second delivery of the
 * identity runs nothing and reports `duplicate`, and one whose fence is
 * lower than the accepted one reports `stale`. The identity is recorded
 * before the effect runs, under SQLite's write lock (`BEGIN IMMEDIATE`) or
 * on PostgreSQL's unique index (a second insert waits for the first
 * transaction to end), so two processes delivering one identity at once
 * apply its effect once.
 *
 * Runtime-neutral, on the same drivers as the outbox, SQLite and
 * PostgreSQL alike (each engine's statements are in `dialects/`): it may
 * share the application's database (and a connection) with an outbox.
 *
 * @module
 */
import {
  type Driver,
  integerOf,
  type Row,
  type RunResult,
  type SqlValue,
} from "./driver.ts";
import { type Clock, type Lease, MAX_DURATION_MS } from "./lease.ts";
import {
  insideTransactionBody,
  type Mutex,
  runTransactionBody,
  TransactionRunner,
  transactionStatements,
  withinApplication,
} from "./core/transaction.ts";
import { insertOrFind, type InsertTarget } from "./core/insert_or_find.ts";
import { SQLITE } from "./dialects/sqlite.ts";
import { SQLITE_INBOX } from "./dialects/sqlite_inbox.ts";
import type { InboxStatements } from "./types.ts";
import {
  checkDriver,
  checkFunction,
  checkIdentity,
  checkInstance,
  checkInteger,
  checkOptions,
  describe,
  missing,
} from "./validate.ts";

/**
 * The request header that carries an event's identity: `Idempotency-Key`,
 * from the IETF HTTPAPI draft "The Idempotency-Key HTTP Header Field".
 */
export const IDENTITY_HEADER = "Idempotency-Key";

/**
 * The request header that carries the fence of the claim delivering the
 * event, a positive decimal integer. No registered header carries a
 * fencing token, so it is named after the key whose attempts it orders,
 * without an `X-` prefix (RFC 6648); not "token", since the claim token
 * stays with the sender.
 */
export const FENCE_HEADER = "Idempotency-Fence";

/**
 * The inbox's table on SQLite, created by {@linkcode Inbox.open} when
 * missing: one row per accepted identity, with the fence that was accepted
 * and when. It lives beside the application's tables and never touches
 * `PRAGMA user_version`. On PostgreSQL the inbox creates the same table
 * (`identity text`, `fence bigint`, `accepted_at bigint`) in the
 * connection's schema, under an advisory lock so that two openers never
 * collide.
 */
export const INBOX_SCHEMA_SQL: string = SQLITE_INBOX.schema;

const MAX_DATE_MS = 8_640_000_000_000_000;

/** Options fixed when an {@linkcode Inbox} is opened. */
export interface InboxOptions {
  /**
   * The clock acceptances are stamped with, in epoch milliseconds; purge
   * judges ages by it.
   *
   * @default {Date.now}
   */
  readonly now?: Clock;
  /**
   * How long a call waits for the database write lock before it throws
   * {@linkcode BusyError}, in milliseconds. `0` tries once.
   *
   * @default {5000}
   */
  readonly busyTimeoutMs?: number;
}

/** The handle an effect writes through, inside the acceptance's transaction. */
export interface InboxTransaction {
  /**
   * Runs one of the caller's statements inside the transaction; refuses a
   * transaction-control statement with a RangeError before it runs.
   */
  run(sql: string, params?: readonly SqlValue[]): Promise<RunResult>;
  /**
   * Runs one of the caller's queries inside the transaction; refuses a
   * transaction-control statement with a RangeError before it runs.
   */
  query(sql: string, params?: readonly SqlValue[]): Promise<Row[]>;
}

/** What {@linkcode Inbox.accept} reports. */
export type AcceptResult<T> =
  | {
    /** The effect ran and its writes committed with the identity. */
    readonly status: "accepted";
    /** What the effect returned. */
    readonly value: T;
  }
  | {
    /**
     * `duplicate`: the identity was accepted before, at this fence or a
     * lower one. `stale`: it was accepted at a higher fence. Either way the
     * effect did not run.
     */
    readonly status: "duplicate" | "stale";
    /** The fence the identity was accepted at. */
    readonly acceptedFence: number;
  };

/** An event's identity and fence as a delivery carries them. */
export interface Delivery {
  /** The event's identity, canonical lowercase UUID text. */
  readonly identity: string;
  /** The fence of the claim delivering it, a positive integer. */
  readonly fence: number;
}

/**
 * Applies each event's effect once: records accepted identities in the
 * recipient's database, in the transaction of the effect's own writes.
 *
 * @example Accept a delivery once
 * ```ts
 * import { Inbox } from "@leased/outbox";
 * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
 * import assert from "node:assert/strict";
 *
 * await using inbox = await Inbox.open(await openSqliteWasm(":memory:"));
 * const identity = "0190b2c4-7d3e-7a11-8f00-5c0ffee0cafe";
 * const effect = (tx: { run(sql: string): Promise<unknown> }) =>
 *   tx.run("CREATE TABLE IF NOT EXISTS shipped (n INTEGER)");
 * assert.equal((await inbox.accept(identity, 1, effect)).status, "accepted");
 * assert.equal((await inbox.accept(identity, 2, effect)).status, "duplicate");
 * ```
 */
export class Inbox implements AsyncDisposable {
  readonly #driver: Driver;
  readonly #mutex: Mutex;
  readonly #runner: TransactionRunner;
  readonly #sql: InboxStatements;
  // Where an acceptance records its identity, for insertOrFind.
  readonly #target: InsertTarget;
  readonly #now: Clock;
  readonly #busyTimeoutMs: number;
  #closed = false;

  private constructor(driver: Driver, options: InboxOptions) {
    const op = "open inbox";
    this.#now = options.now === undefined
      ? Date.now
      : checkFunction(op, "now", options.now);
    this.#busyTimeoutMs = checkInteger(
      op,
      "busyTimeoutMs",
      options.busyTimeoutMs,
      0,
      MAX_DURATION_MS,
    ) ?? 5_000;
    const dialect = driver.dialect ?? SQLITE;
    if (dialect.inbox === undefined) {
      throw new TypeError(
        `Cannot ${op} as 'driver' must speak a dialect with the inbox's statements (SQLite's or PostgreSQL's)`,
      );
    }
    this.#sql = dialect.inbox;
    this.#target = {
      table: "inbox_accepted",
      keys: "its identity",
      oneWriter: dialect.oneWriter === true,
    };
    this.#runner = new TransactionRunner(
      driver,
      dialect,
      this.#busyTimeoutMs,
      "only calls made inside inbox.within() or outbox.within() join it; the inbox's others wait for it to end",
    );
    this.#mutex = this.#runner.mutex;
    this.#driver = this.#runner.driver;
  }

  /**
   * Opens an inbox on a connection, creating its table
   * ({@linkcode INBOX_SCHEMA_SQL} on SQLite, its twin on PostgreSQL) when
   * missing.
   *
   * @param driver The connection; the inbox owns it and closes it.
   * @param options See {@linkcode InboxOptions}.
   * @returns The opened inbox.
   * @throws {TypeError | RangeError} When an option is invalid, naming it.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  static async open(
    driver: Driver,
    options: InboxOptions = {},
  ): Promise<Inbox> {
    checkDriver("open inbox", driver);
    checkOptions("open inbox", options, ["now", "busyTimeoutMs"]);
    const inbox = new Inbox(driver, options);
    await inbox.#write(
      "open inbox",
      () => inbox.#driver.exec(inbox.#sql.schema),
    );
    return inbox;
  }

  /**
   * Applies a delivery's effect unless its identity was accepted before.
   * In one transaction: records the identity with `fence` unless it is
   * recorded already, and runs `fn` when it was new. The record is what
   * makes two processes that accept one identity at once run its effect
   * once: the second waits for the first's transaction (SQLite's write
   * lock, taken by `BEGIN IMMEDIATE`; the identity's unique index on
   * PostgreSQL, where transactions are `READ COMMITTED`), then finds it.
   * Throwing from `fn` rolls its writes back, records nothing, and rethrows,
   * so the sender's retry runs the effect again.
   *
   * Inside `fn`, use only `tx`: this inbox's (or an outbox's on the same
   * connection) own methods would wait for the transaction waiting for
   * them, so they throw at once instead (where the runtime has no
   * `AsyncLocalStorage`, as in browsers, this is not detected and they
   * wait). `tx.run` and `tx.query` refuse `BEGIN`, `COMMIT`, `END`,
   * `ROLLBACK`, `SAVEPOINT` and `RELEASE` before they run: a `COMMIT` there
   * would let another connection accept the identity and apply the effect
   * again.
   *
   * @param identity The event's identity (`lease.identity` at the sender).
   * @param fence The delivering claim's fence (`lease.fence`).
   * @param fn The effect's writes.
   * @returns `accepted` with what `fn` returned; or `duplicate` (accepted
   * before at this fence or a lower one) or `stale` (accepted at a higher
   * fence), with the accepted fence, and `fn` did not run.
   * @throws {TypeError | RangeError} When an argument is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`
   * (on PostgreSQL, the wait for another acceptance of the identity ends at
   * the connection's `lock_timeout`: `connectPostgres`'s `lockTimeoutMs`).
   * @throws {TransactionEndedError} When a statement of `fn` ended or
   * failed the transaction (even one `fn` caught): nothing was recorded.
   * @throws {ConnectionLostError} When the PostgreSQL connection was lost
   * inside the transaction, also while `fn` awaited something else: nothing
   * was recorded.
   * @throws {DedupRaceError} When the identity's record was purged between
   * the insert that met it and its lookup, and recorded again by another
   * acceptance before the lookup's own insert (on PostgreSQL): nothing was
   * recorded; calling again finds that record.
   * @throws {ConstraintError} When a trigger skipped the record's insert
   * (SQLite's `RAISE(IGNORE)`, PostgreSQL's `BEFORE INSERT` trigger returning
   * NULL; code 1811, naming `inbox_accepted`): `fn` did not run, and nothing
   * was recorded.
   * @throws {RangeError} When `tx.run` or `tx.query` is given a
   * transaction-control statement (before it runs).
   * @throws {Error} When called from inside `fn` of an acceptance or a
   * transaction on the same connection.
   */
  async accept<T>(
    identity: string,
    fence: number,
    fn: (tx: InboxTransaction) => Promise<T>,
  ): Promise<AcceptResult<T>> {
    const op = "accept";
    const key = checkIdentity(op, "identity", identity);
    const checkedFence =
      checkInteger(op, "fence", fence, 1, Number.MAX_SAFE_INTEGER) ??
        missing(op, "fence");
    checkFunction(op, "fn", fn);
    const driver = this.#driver;
    const sql = this.#sql;
    return await this.#write(op, async (now) => {
      const params = [key, checkedFence, now];
      const seen = await insertOrFind(op, this.#target, async () => {
        if ((await driver.query(sql.record, params)).length) {
          return { acceptedFence: null };
        }
        // Without one writer the lookup records the identity itself when
        // its row is gone, and fails when a trigger skipped that insert.
        const [row] = await driver.query(
          sql.accepted,
          this.#target.oneWriter ? [key] : params,
        );
        if (row === undefined) return undefined;
        return {
          acceptedFence: row["recorded"] === 1 ? null : integerOf(row, "fence"),
        };
      });
      const { acceptedFence } = seen;
      if (acceptedFence !== null) {
        return {
          status: checkedFence < acceptedFence ? "stale" : "duplicate",
          acceptedFence,
        };
      }
      let ended = false;
      const inside = (method: string) => {
        if (ended) {
          throw new Error(
            `Cannot ${method} as the acceptance this handle belongs to has ended`,
          );
        }
        this.#runner.checkLive(method);
      };
      let value: T;
      try {
        value = await runTransactionBody(
          this.#mutex,
          "accept",
          () => fn(transactionStatements(driver, inside)),
        );
      } finally {
        ended = true;
      }
      return { status: "accepted", value };
    }, this.#runner.joins());
  }

  /**
   * Runs `fn` as part of the transaction the application has open on the
   * connection this inbox shares: an {@linkcode Inbox.accept} made inside
   * `fn` (and an outbox's calls on the same connection, as
   * `Outbox.within` says) runs inside it under a savepoint, and
   * the application's `COMMIT` or `ROLLBACK` decides whether the effect and
   * the identity stay. Made anywhere else, it waits for that transaction to
   * end, then runs in its own.
   *
   * @param fn The application's code that belongs to its transaction.
   * @returns What `fn` returned.
   * @throws {TypeError} When `fn` is not a function.
   */
  within<T>(fn: () => Promise<T>): Promise<T> {
    return withinApplication("run within", this.#mutex, fn);
  }

  /**
   * Accepts an HTTP delivery, for `Deno.serve` handlers: reads the identity
   * from {@linkcode IDENTITY_HEADER} and the fence from
   * {@linkcode FENCE_HEADER}, then {@linkcode Inbox.accept}s it.
   *
   * The answer `fn` returns decides, as the sender reads it: a final one
   * (none, or any status but those below) commits the effect's writes with
   * the identity. A status that asks for a retry
   * ({@linkcode isRetryStatus}: any 5xx, 408 Request Timeout, 425 Too Early,
   * 429 Too Many Requests) rolls the effect's writes back and records
   * nothing, so the sender's retry runs the effect again; the response is
   * still sent.
   *
   * @param request The delivery.
   * @param fn The effect's writes; a `Response` it returns is sent, and
   * its status decides whether the delivery is accepted.
   * @returns `fn`'s response, or 200 when it returned none; 200 `duplicate`
   * for a duplicate, so the sender acknowledges; 409 `stale` for a stale
   * fence (the sender's lease was lost, a newer claim delivered); 400 when a
   * header is missing or invalid, naming it.
   * @throws {TypeError} When `request` is not a `Request` or `fn` not a
   * function (the caller's mistake, not the sender's: no 400).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   *
   * @example A Deno.serve handler
   * ```ts
   * import { deliveryHeaders, Inbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using inbox = await Inbox.open(await openSqliteWasm(":memory:"));
   * const handler = (request: Request) =>
   *   inbox.acceptRequest(request, async (tx, request) => {
   *     await tx.run("CREATE TABLE IF NOT EXISTS mail (body TEXT)");
   *     await tx.run("INSERT INTO mail VALUES (?)", [await request.text()]);
   *   });
   * const lease = { identity: "0190b2c4-7d3e-7a11-8f00-5c0ffee0cafe", fence: 1 };
   * const deliver = () =>
   *   handler(new Request("http://x/", { method: "POST", headers: deliveryHeaders(lease), body: "hi" }));
   * assert.equal(await (await deliver()).text(), "accepted");
   * assert.equal(await (await deliver()).text(), "duplicate");
   * ```
   */
  async acceptRequest(
    request: Request,
    fn: (tx: InboxTransaction, request: Request) => Promise<Response | void>,
  ): Promise<Response> {
    const op = "accept request";
    checkInstance(op, "request", request, Request);
    checkFunction(op, "fn", fn);
    let delivery: Delivery;
    try {
      delivery = readDeliveryHeaders(request.headers);
    } catch (error) {
      if (!(error instanceof TypeError)) throw error;
      return new Response(error.message, { status: 400 });
    }
    let result: AcceptResult<Response | void>;
    try {
      result = await this.accept(
        delivery.identity,
        delivery.fence,
        async (tx) => {
          const response = await fn(tx, request);
          if (response instanceof Response && isRetryStatus(response.status)) {
            throw new RetryAnswer(response);
          }
          return response;
        },
      );
    } catch (error) {
      if (error instanceof RetryAnswer) return error.response;
      throw error;
    }
    if (result.status === "accepted") {
      return result.value ?? new Response("accepted", { status: 200 });
    }
    return new Response(result.status, {
      status: result.status === "stale" ? 409 : 200,
    });
  }

  /**
   * Deletes the records of identities accepted more than `olderThanMs`
   * ago. A purged identity is accepted again when it comes back, so keep
   * records longer than an event can be redelivered: the sender's leases
   * times its attempts, plus its backoff, plus any retry of dead letters.
   *
   * @param options `olderThanMs`: the age, in milliseconds, by the inbox's
   * clock, past which records go.
   * @returns How many records were deleted.
   * @throws {TypeError | RangeError} When an argument is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async purge(options: { readonly olderThanMs: number }): Promise<number> {
    const op = "purge inbox";
    checkOptions(op, options, ["olderThanMs"]);
    const olderThanMs = checkInteger(
      op,
      "olderThanMs",
      options.olderThanMs,
      0,
      Number.MAX_SAFE_INTEGER,
    ) ?? missing(op, "olderThanMs");
    return await this.#write(op, async (now) => {
      const { changes } = await this.#driver.run(this.#sql.purge, [
        now - olderThanMs,
      ]);
      return changes;
    });
  }

  /** Whether {@linkcode Inbox.close} was called: every later call rejects. */
  get closed(): boolean {
    return this.#closed;
  }

  /** Closes the connection once the calls made before it finish. */
  close(): Promise<void> {
    this.#closed = true;
    return this.#runner.line.run(() =>
      this.#mutex.run(() => this.#driver.close())
    );
  }

  /** Same as {@linkcode Inbox.close}, for `await using`. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  /**
   * Runs `fn` in a transaction of the connection's transaction runner
   * ({@linkcode TransactionRunner}: `BEGIN IMMEDIATE` on SQLite, `READ
   * COMMITTED` on PostgreSQL); `fn` sees the clock read once it began.
   */
  #write<T>(
    op: string,
    fn: (now: number) => Promise<T>,
    join = false,
  ): Promise<T> {
    if (this.#closed) {
      return Promise.reject(new Error(`Cannot ${op} as the inbox is closed`));
    }
    const body = insideTransactionBody(this.#mutex);
    if (body !== undefined) {
      const open = body === "accept"
        ? "an acceptance's fn"
        : "an outbox's transaction(fn)";
      return Promise.reject(
        new Error(
          `Cannot ${op} inside ${open} on the same connection: use its handle (tx.run, tx.query), or the call would wait for the transaction that waits for it`,
        ),
      );
    }
    return this.#runner.run(op, () => fn(this.#clock(op)), {
      join,
      rerun: false,
    });
  }

  #clock(op: string): number {
    const now = this.#now();
    if (!Number.isSafeInteger(now) || now < 0 || now > MAX_DATE_MS) {
      throw new RangeError(
        `Cannot ${op} as the clock must return a non-negative integer of milliseconds within Date's range: current value is ${
          describe(now)
        }`,
      );
    }
    return now;
  }
}

/**
 * Whether an HTTP status asks the sender to deliver again later, so an
 * inbox that answers it must not record the delivery as done: any 5xx
 * (RFC 9110 §15.6, the server failed), 408 Request Timeout, 425 Too Early
 * and 429 Too Many Requests (RFC 9110 §15.5.9, RFC 8470, RFC 6585: the
 * same request may succeed later). Every other status is final: 2xx done,
 * other 4xx refused for good.
 *
 * @param status The HTTP status.
 * @returns Whether a retry is asked for: `false` for anything but a
 * number (`"503"` included).
 *
 * @example Usage
 * ```ts
 * import { isRetryStatus } from "@leased/outbox";
 * import assert from "node:assert/strict";
 *
 * assert.equal(isRetryStatus(503), true);
 * assert.equal(isRetryStatus(429), true);
 * assert.equal(isRetryStatus(422), false);
 * ```
 */
export function isRetryStatus(status: number): boolean {
  return typeof status === "number" && status >= 500 || status === 408 ||
    status === 425 || status === 429;
}

/** Carries a retry answer out of the acceptance, rolling it back. */
class RetryAnswer extends Error {
  constructor(readonly response: Response) {
    super(`the effect answered ${response.status}`);
  }
}

/**
 * The headers that deliver a claimed event to a recipient: its identity as
 * {@linkcode IDENTITY_HEADER} (what the recipient dedupes on) and the
 * claim's fence as {@linkcode FENCE_HEADER} (what orders the attempts).
 *
 * @param lease The lease being delivered (its `identity` and `fence`).
 * @returns The two headers, to spread into `fetch`'s `headers`.
 * @throws {TypeError | RangeError} When the lease's identity or fence is invalid.
 *
 * @example Usage
 * ```ts
 * import { deliveryHeaders } from "@leased/outbox";
 * import assert from "node:assert/strict";
 *
 * const lease = { identity: "0190b2c4-7d3e-7a11-8f00-5c0ffee0cafe", fence: 2 };
 * assert.deepEqual(deliveryHeaders(lease), {
 *   "Idempotency-Key": "0190b2c4-7d3e-7a11-8f00-5c0ffee0cafe",
 *   "Idempotency-Fence": "2",
 * });
 * ```
 */
export function deliveryHeaders(
  lease: Pick<Lease<unknown>, "identity" | "fence">,
): Record<string, string> {
  const op = "build delivery headers";
  if (lease === null || typeof lease !== "object") {
    throw new TypeError(
      `Cannot ${op} as 'lease' must be a Lease: current value is ${
        describe(lease)
      }`,
    );
  }
  const identity = checkIdentity(op, "lease.identity", lease.identity);
  const fence =
    checkInteger(op, "lease.fence", lease.fence, 1, Number.MAX_SAFE_INTEGER) ??
      missing(op, "lease.fence");
  return { [IDENTITY_HEADER]: identity, [FENCE_HEADER]: String(fence) };
}

/**
 * Reads a delivery's identity and fence from request headers
 * ({@linkcode IDENTITY_HEADER}, {@linkcode FENCE_HEADER}).
 *
 * @param headers The request's headers.
 * @returns The identity and the fence.
 * @throws {TypeError} When `headers` is not a `Headers`, or a header is
 * missing or invalid, naming it.
 *
 * @example Usage
 * ```ts
 * import { readDeliveryHeaders } from "@leased/outbox";
 * import assert from "node:assert/strict";
 *
 * const headers = new Headers({
 *   "idempotency-key": "0190b2c4-7d3e-7a11-8f00-5c0ffee0cafe",
 *   "idempotency-fence": "3",
 * });
 * assert.deepEqual(readDeliveryHeaders(headers), {
 *   identity: "0190b2c4-7d3e-7a11-8f00-5c0ffee0cafe",
 *   fence: 3,
 * });
 * ```
 */
export function readDeliveryHeaders(headers: Headers): Delivery {
  const op = "read delivery";
  checkInstance(op, "headers", headers, Headers);
  const identity = checkIdentity(
    op,
    IDENTITY_HEADER,
    headers.get(IDENTITY_HEADER) ?? undefined,
  );
  const text = headers.get(FENCE_HEADER);
  // Digits only: Number() would also take "0x10", "1e3" and " 7 ".
  const fence = text !== null && /^[1-9][0-9]{0,15}$/.test(text)
    ? Number(text)
    : NaN;
  if (!Number.isSafeInteger(fence)) {
    throw new TypeError(
      `Cannot ${op} as '${FENCE_HEADER}' must be a positive decimal integer: current value is ${
        describe(text ?? undefined)
      }`,
    );
  }
  return { identity, fence };
}
