/**
 * Read-only admin reads of an outbox: counts per queue and state, lists of
 * events, one event's ledger, the acknowledgement rate. Unlike
 * {@linkcode Outbox}, whose calls take the write lock (its claims,
 * acknowledgements and admin calls turn lapsed last-attempt leases into
 * dead letters first), an {@linkcode OutboxReader} only reads, so it never
 * creates or upgrades the schema. On SQLite it reads in deferred
 * transactions, so it works on a read-only connection
 * (`file:outbox.db?mode=ro`) beside live workers; on PostgreSQL (a driver
 * from `connectPostgres`) in `READ ONLY` repeatable-read transactions,
 * which take no row lock.
 *
 * @module
 */
import {
  type ActivityCount,
  activityCounts,
  activityParameters,
  type CountQueuesOptions,
  countQueuesStatement,
  dedupKeyParameters,
  dedupKeyStatement,
  type EventInfo,
  eventInfo,
  type ListOptions,
  type QueueCounts,
  queueCounts,
  type QueuesOptions,
  queuesStatement,
} from "./admin.ts";
import type { Driver } from "./driver.ts";
import { integerOf } from "./driver.ts";
import { SchemaVersionError } from "./errors.ts";
import {
  decodePayload,
  type Dialect,
  type Explanation,
  explanation,
  listStatement,
  MAX_DURATION_MS,
} from "./lease.ts";
import {
  checkDriver,
  checkIdentity,
  checkInteger,
  checkOptions,
} from "./validate.ts";
import { SQLITE } from "./dialects/sqlite.ts";
import { TransactionRunner } from "./core/transaction.ts";
import { allFlows, withFlows } from "./core/flow.ts";
import { SCHEMA_VERSION } from "./schema.ts";
import { checkpointWal, type WalStats } from "./wal.ts";

/** Options of {@linkcode OutboxReader.open}. */
export interface OutboxReaderOptions {
  /**
   * How long a read waits for a writer's lock (a commit in progress) before
   * it throws {@linkcode BusyError}, in milliseconds.
   *
   * @default {5000}
   */
  readonly busyTimeoutMs?: number;
}

/**
 * Read-only access to an outbox database, for tools that watch a live queue.
 *
 * @example Count and list events without taking the write lock
 * ```ts
 * import { Outbox } from "@leased/outbox";
 * import { OutboxReader } from "@leased/outbox/reader";
 * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
 * import assert from "node:assert/strict";
 *
 * const dir = await Deno.makeTempDir();
 * {
 *   await using outbox = await Outbox.open(await openSqliteWasm(`${dir}/o.db`));
 *   await outbox.enqueue({ to: "ada@example.com" }, { queue: "mail" });
 * }
 * {
 *   await using reader = await OutboxReader.open(
 *     await openSqliteWasm(new URL(`file://${dir}/o.db?mode=ro`)),
 *   );
 *   const [mail] = await reader.queues();
 *   assert.equal(mail?.pending, 1);
 *   const [event] = await reader.list({ state: "pending" });
 *   assert.deepEqual(event?.payload, { to: "ada@example.com" });
 * }
 * await Deno.remove(dir, { recursive: true });
 * ```
 */
export class OutboxReader implements AsyncDisposable {
  readonly #driver: Driver;
  readonly #sql: Dialect;
  // One transaction at a time on the connection (the runner's line and
  // mutex); reads inside snapshot() join its transaction.
  readonly #runner: TransactionRunner;
  #inside = false;

  private constructor(driver: Driver, busyTimeoutMs: number) {
    this.#sql = driver.dialect ?? SQLITE;
    this.#runner = new TransactionRunner(
      driver,
      this.#sql,
      busyTimeoutMs,
      "reads wait for it to end",
    );
    this.#driver = this.#runner.driver;
  }

  /**
   * Checks that the database holds an outbox of this release's schema,
   * without writing anything.
   *
   * @param driver The connection, read-only or not; the reader owns it and
   * closes it (also when opening fails).
   * @param options See {@linkcode OutboxReaderOptions}.
   * @returns The reader.
   * @throws {TypeError | RangeError} When `driver` is not a `Driver` (it is
   * not closed then), or an option is invalid, naming it.
   * @throws {SchemaVersionError} When the database's schema is newer than this release's.
   * @throws {Error} When the database has no outbox, or an older schema version.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  static async open(
    driver: Driver,
    options: OutboxReaderOptions = {},
  ): Promise<OutboxReader> {
    const op = "open outbox reader";
    // Before the try: its cleanup closes the driver, which needs one.
    checkDriver(op, driver);
    let reader: OutboxReader;
    try {
      checkOptions(op, options, ["busyTimeoutMs"]);
      const busyTimeoutMs = checkInteger(
        op,
        "busyTimeoutMs",
        options.busyTimeoutMs,
        0,
        MAX_DURATION_MS,
      ) ?? 5_000;
      reader = new OutboxReader(driver, busyTimeoutMs);
      const sql = reader.#sql;
      const supported = sql.version ?? SCHEMA_VERSION;
      await reader.#read(async () => {
        const [table] = await driver.query(sql.outboxPresent);
        if (table === undefined) {
          throw new Error(
            `Cannot ${op} as the database has no outbox (no table outbox_events)`,
          );
        }
        // The version lives in outbox_schema; a file without it is from a
        // release that kept it in user_version, which Outbox.open upgrades.
        const [row] = await driver.query(sql.schemaVersion).catch(() => [
          undefined,
        ]);
        const version = row?.["version"] == null
          ? 0
          : integerOf(row, "version");
        if (version > supported) {
          throw new SchemaVersionError(version, supported, op);
        }
        if (version !== supported) {
          throw new Error(
            `Cannot ${op} as the database has outbox schema version ${version}, not ${supported}: Outbox.open upgrades an older one`,
          );
        }
      });
    } catch (error) {
      await driver.close();
      throw error;
    }
    return reader;
  }

  /**
   * Counts the events of every queue per state, in one snapshot.
   *
   * @returns One entry per queue that has events, by name.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async queues(options: QueuesOptions = {}): Promise<QueueCounts[]> {
    const [sql, params] = queuesStatement(this.#sql, options);
    return await this.#read(async () => {
      const counts = queueCounts(await this.#driver.query(sql, params));
      const flow = this.#sql.flow;
      // Paused and limited queues (core/flow.ts), as Outbox.queues() tells.
      return flow === undefined
        ? counts
        : withFlows(counts, await allFlows(this.#driver, flow));
    });
  }

  /**
   * Counts the queues that have events, by a name prefix, as
   * {@linkcode Outbox.countQueues} does.
   *
   * @param options See {@linkcode CountQueuesOptions}.
   * @returns How many queues, at most `upTo`.
   * @throws {TypeError | RangeError} When an option is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async countQueues(options: CountQueuesOptions = {}): Promise<number> {
    const [sql, params] = countQueuesStatement(this.#sql, options);
    const [row] = await this.#read(() => this.#driver.query(sql, params));
    return row === undefined ? 0 : integerOf(row, "n");
  }

  /**
   * Counts acknowledgements per queue since a time (from the events' `done_at`,
   * so purged events no longer count).
   *
   * @param sinceMs Epoch milliseconds; acknowledgements at or after it count.
   * @returns Acknowledgements per queue name; queues with none are absent.
   * @throws {TypeError | RangeError} When `sinceMs` is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async acknowledgedSince(sinceMs: number): Promise<Map<string, number>> {
    const since = checkInteger(
      "count acknowledgements",
      "sinceMs",
      sinceMs,
      0,
      Number.MAX_SAFE_INTEGER,
    ) ?? 0;
    const rows = await this.#read(() =>
      this.#driver.query(this.#sql.acknowledgedSince, [since])
    );
    return new Map(
      rows.map((row) => [String(row["queue"]), integerOf(row, "n")]),
    );
  }

  /**
   * Counts what happened per time bucket since a time: events acknowledged
   * (from their `done_at`, so purged events no longer count) and attempts
   * that failed (a release with an error, a lapsed lease, from the ledger).
   * The dashboard's chart reads it.
   *
   * @param sinceMs Epoch milliseconds; what happened at or after it counts.
   * @param bucketMs The buckets' width in milliseconds, 1 to 1 day; buckets
   * start at multiples of it.
   * @returns The buckets that saw anything, oldest first: `at` (the
   * bucket's start, epoch ms), `done` and `failed`.
   * @throws {TypeError | RangeError} When an argument is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async activity(sinceMs: number, bucketMs: number): Promise<ActivityCount[]> {
    const params = activityParameters(sinceMs, bucketMs);
    return activityCounts(
      await this.#read(() => this.#driver.query(this.#sql.activity, params)),
    );
  }

  /**
   * Finds the event a queue holds under a dedup key (done ones included:
   * the key stays after the event is done).
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
    const params = dedupKeyParameters(queue, dedupKey);
    const [row] = await this.#read(() =>
      this.#driver.query(dedupKeyStatement(this.#sql, params), params)
    );
    return row === undefined ? null : integerOf(row, "id");
  }

  /**
   * The database server's clock, where the engine has one that judges
   * leases (PostgreSQL, as `openPostgres` judges them by default), so ages
   * and windows agree with the workers' whatever the reader's own clock.
   *
   * @returns Epoch milliseconds, or `null` on SQLite, whose outboxes judge
   * by the application's clock.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async databaseNow(): Promise<number | null> {
    const sql = this.#sql.now;
    if (sql === undefined) return null;
    const [row] = await this.#read(() => this.#driver.query(sql));
    return integerOf(row ?? {}, "now");
  }

  /**
   * The database's write-ahead log: its size and whether a reader holds its
   * checkpoints back, from a passive checkpoint
   * (`PRAGMA wal_checkpoint(PASSIVE)`, as {@linkcode Outbox.stats} reads
   * it). The checkpoint copies into the database file what no reader needs,
   * which changes no row, and cannot run on a read-only connection.
   *
   * @returns The WAL's state, or `null` on PostgreSQL, on a database not in
   * WAL mode, on a read-only connection, inside
   * {@linkcode OutboxReader.snapshot}, or while another connection is
   * checkpointing.
   * @throws {SqliteError} When the checkpoint fails otherwise.
   */
  async wal(): Promise<WalStats | null> {
    if (this.#sql !== SQLITE || this.#inside) return null;
    // In line with the reader's transactions, outside any.
    const runner = this.#runner;
    return await runner.line.run(() =>
      runner.mutex.run(() => checkpointWal(this.#driver, "PASSIVE"))
    ) ?? null;
  }

  /**
   * Lists the events in one state, by id (or by enqueue time), a page at a
   * time.
   *
   * @param options See {@linkcode ListOptions}.
   * @returns Up to `limit` events with ids above `afterId`.
   * @throws {TypeError | RangeError} When an option is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async list(options: ListOptions): Promise<EventInfo[]> {
    const [sql, params] = listStatement(this.#sql, "list events", options);
    const rows = await this.#read(() => this.#driver.query(sql, params));
    return rows.map((row) => eventInfo(row, decodePayload));
  }

  /**
   * Tells one event's state and its whole ledger, as
   * {@linkcode Outbox.explain} does, without writing.
   *
   * @param event The event's id, or its identity (UUID text).
   * @returns The explanation, or `null` when no such event exists.
   * @throws {TypeError | RangeError} When `event` is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async explain(event: number | string): Promise<Explanation | null> {
    const [sql, key] = typeof event === "string"
      ? [this.#sql.eventByIdentity, checkIdentity("explain", "event", event)]
      : [
        this.#sql.event,
        checkInteger("explain", "event", event, 1, Number.MAX_SAFE_INTEGER) ??
          0,
      ];
    return await this.#read(async () => {
      const [row] = await this.#driver.query(sql, [key]);
      if (row === undefined) return null;
      const history = await this.#driver.query(this.#sql.history, [row["id"]!]);
      return explanation(row, history);
    });
  }

  /**
   * Runs several reads in one transaction, so they see one state of the
   * database (counts and rates that add up).
   *
   * @param fn Calls this reader's methods.
   * @returns What `fn` returned.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  snapshot<T>(fn: () => Promise<T>): Promise<T> {
    return this.#read(fn);
  }

  /** Closes the connection. */
  close(): Promise<void> {
    return this.#driver.close();
  }

  /** Same as {@linkcode OutboxReader.close}, for `await using`. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  /**
   * Runs `fn` in one deferred (read) transaction, so its statements see one
   * snapshot; a writer's lock met on the way makes it wait and start over.
   * Inside a transaction already (snapshot()), `fn` joins it.
   */
  async #read<T>(fn: () => Promise<T>): Promise<T> {
    if (this.#inside) return await fn();
    return await this.#transaction(async () => {
      this.#inside = true;
      try {
        return await fn();
      } finally {
        this.#inside = false;
      }
    });
  }

  #transaction<T>(fn: () => Promise<T>): Promise<T> {
    return this.#runner.run("read the outbox", fn, {
      begin: this.#sql.readBegin,
      rerunBusy: true,
    });
  }
}
