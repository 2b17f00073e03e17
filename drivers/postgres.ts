/**
 * The driver contract over PostgreSQL: one connection of `npm:pg`
 * (node-postgres), which runs on Deno, Node and edge runtimes with TCP
 * sockets.
 *
 * The outbox's own statements are named prepared statements, parsed and
 * planned once per connection, unless `prepare` is off: then they go unnamed
 * through the extended protocol, so the driver works behind a transaction
 * pooler (PgBouncer, Supavisor) where named prepared statements do not
 * survive. The app's statements (`tx.query`) always go unnamed, so the
 * named ones are the dialect's few dozen. Integers come back as numbers
 * within ±2^53 and as `bigint` beyond, `bytea` as `Uint8Array`.
 *
 * A lost connection is never resumed inside a transaction: the statement in
 * flight and the rest of the transaction fail with
 * {@linkcode ConnectionLostError} until the transaction ends with
 * `ROLLBACK` (which then succeeds: the server rolled it back when the
 * session ended), and the next statement after that opens a new connection.
 * A `COMMIT` in flight when the connection is lost may have committed: its
 * `ConnectionLostError` says the outcome is unknown.
 *
 * @module
 */
import pgModule from "pg";
import {
  type Driver,
  firstKeyword,
  type Row,
  type RunResult,
  type SqlValue,
  transactionControl,
} from "../driver.ts";
import { POSTGRES } from "../dialects/postgres.ts";
import { type Dialect, Outbox, type OutboxOptions } from "../lease.ts";
import { checkBoolean, checkInteger, describe } from "../validate.ts";
import {
  BusyError,
  ConnectionLostError,
  PostgresError,
  StatementTimeoutError,
  TransactionEndedError,
} from "../errors.ts";
import type { TransactionStatus } from "../types.ts";

/** Options of {@linkcode connectPostgres}. */
export interface PostgresDriverOptions {
  /**
   * How long to wait for a connection, in milliseconds, at most
   * 2,147,483,647 (as for the two below).
   *
   * @default {10000}
   */
  readonly connectTimeoutMs?: number;
  /**
   * The server's `statement_timeout` for this connection, in milliseconds;
   * `0` for none. A statement past it fails with
   * {@linkcode StatementTimeoutError}.
   *
   * @default {0}
   */
  readonly statementTimeoutMs?: number;
  /**
   * The server's `lock_timeout` for this connection, in milliseconds; `0`
   * for none. A lock wait past it fails with {@linkcode BusyError}.
   * `openPostgres` sets it to the outbox's `busyTimeoutMs` unless given
   * (1 ms for a `busyTimeoutMs` of 0, which waits for no lock; the server's
   * longest, about 24.8 days, for a longer one).
   *
   * @default {0}
   */
  readonly lockTimeoutMs?: number;
  /**
   * The schema the outbox's tables live in, created by the outbox when
   * missing: the connection's whole `search_path`, so the application's
   * SQL on the connection (`tx.query`) names tables of other schemas in
   * full (`public.orders`).
   *
   * @default {the connection's current schema: `public`, unless the server's `search_path` puts another first (a schema named after the user, as `"$user"` does)}
   */
  readonly schema?: string;
  /**
   * Named prepared statements, parsed and planned once per connection (a
   * claim and its acknowledgement then skip planning their CTEs on every
   * call). Turn off behind a transaction pooler.
   *
   * @default {true}
   */
  readonly prepare?: boolean;
  /**
   * `application_name`, shown in `pg_stat_activity`: at most 63 printable
   * ASCII characters, which the server keeps whole.
   *
   * @default {"leased-outbox"}
   */
  readonly applicationName?: string;
  /**
   * Wake idle workers with `LISTEN`/`NOTIFY` when another connection
   * enqueues. Turn it off behind a transaction pooler, where `LISTEN` does
   * not work; workers then find new events at their next poll.
   *
   * @default {true}
   */
  readonly listen?: boolean;
}

/** Options of {@linkcode openPostgres}. */
export interface PostgresOutboxOptions
  extends OutboxOptions, PostgresDriverOptions {
  /**
   * The clock leases are judged by: `"database"` reads the server's
   * (`clock_timestamp()`) at the start of every transaction, so workers
   * whose clocks disagree still agree on leases; a function injects one
   * (tests).
   *
   * @default {"database"}
   */
  readonly now?: Exclude<OutboxOptions["now"], undefined>;
}

/** What the server sent on a channel this connection listens on. */
export type NotificationListener = (payload: string) => void;

const DRIVER_OPTIONS: readonly (keyof PostgresDriverOptions)[] = [
  "connectTimeoutMs",
  "statementTimeoutMs",
  "lockTimeoutMs",
  "schema",
  "prepare",
  "applicationName",
  "listen",
];
const INT8 = 20;
const BYTEA = 17;
// PostgreSQL reserves names that begin with pg_.
const SCHEMA = /^(?!pg_)[a-z_][a-z0-9_]{0,62}$/;
// The longest timeout, in milliseconds, the server takes (an int), and the
// longest delay setTimeout keeps.
const MAX_TIMEOUT_MS = 2_147_483_647;
// The server keeps 63 bytes of an application name and shows printable
// ASCII only; a longer one can overflow the startup packet.
const APPLICATION_NAME = /^[\x20-\x7e]{0,63}$/;
/**
 * The statements worth a name: the dialect's (the core's, flow control's
 * and the inbox's), a bounded set, less transaction control, which has
 * nothing to plan (and so a transaction still commits after the
 * application's `DEALLOCATE ALL`).
 */
const PREPARED: ReadonlySet<string> = new Set(
  [
    ...Object.values(POSTGRES),
    ...Object.values(POSTGRES.flow),
    ...Object.values(POSTGRES.inbox),
  ].filter((
    v,
  ): v is string => typeof v === "string" && transactionControl(v) === ""),
);
/** A statement that ends the transaction, whatever its outcome. */
const ENDS_TRANSACTION = /^\s*(ROLLBACK|ABORT|COMMIT|END)\s*;?\s*$/i;
/** The first keywords of statements that drop a connection's named ones. */
const DROPS_PREPARED: ReadonlySet<string> = new Set(["DEALLOCATE", "DISCARD"]);
// Errors that node-postgres raises itself when the socket is gone.
const LOST = [
  "Connection terminated",
  "not queryable",
  "ECONNREFUSED",
  "ECONNRESET",
  "EPIPE",
  "ETIMEDOUT",
  "timeout expired",
];

/**
 * The part of node-postgres this driver uses. Declared here rather than
 * taken from `@types/pg`, whose `@types/node` would replace the DOM types the
 * browser modules of this package are checked with.
 */
interface PgClient {
  connect(): Promise<void>;
  query(config: PgQueryConfig): Promise<PgResult>;
  end(): Promise<void>;
  getTransactionStatus(): "I" | "T" | "E" | null;
  /** False from a query's start to the server's ReadyForQuery. */
  readonly readyForQuery: boolean;
  readonly connection: {
    on(event: string, listener: () => void): void;
    off(event: string, listener: () => void): void;
  };
  on(event: "error", listener: (error: Error) => void): void;
  on(
    event: "notification",
    listener: (message: { channel: string; payload?: string }) => void,
  ): void;
}
interface PgQueryConfig {
  text: string;
  values: unknown[];
  queryMode?: "extended";
  name?: string;
}
interface PgResult {
  rows: Row[];
  rowCount: number | null;
  /** The command tag's verb (`ROLLBACK` for a failed transaction's COMMIT). */
  command?: string;
}
interface PgClientConfig {
  connectionString: string;
  connectionTimeoutMillis: number;
  application_name: string;
  statement_timeout?: number;
  lock_timeout?: number;
  options?: string;
  types: { getTypeParser(oid: number, format?: string): unknown };
}
const pg = pgModule as unknown as {
  Client: new (config: PgClientConfig) => PgClient;
  types: { getTypeParser(oid: number, format?: string): unknown };
};

const types = {
  getTypeParser(oid: number, format?: string): unknown {
    if (oid === INT8) return parseInt8;
    if (oid === BYTEA) return parseBytea;
    return pg.types.getTypeParser(oid, format);
  },
};

/**
 * One connection to PostgreSQL behind the {@linkcode Driver} contract.
 * Open it with {@linkcode connectPostgres}.
 */
export class PostgresDriver implements Driver, AsyncDisposable {
  /** PostgreSQL's spelling of the core's statements. */
  readonly dialect: Dialect = POSTGRES;
  readonly #url: string;
  readonly #options: PostgresDriverOptions;
  readonly #listeners = new Map<string, Set<NotificationListener>>();
  readonly #names = new Map<string, string>();
  /** Bumped when the server forgot or must re-plan the named statements. */
  #generation = 1;
  #client: PgClient | undefined;
  #connecting: Promise<PgClient> | undefined;
  /**
   * The connection was lost inside a transaction: until the caller's
   * ROLLBACK, statements fail rather than run on a new connection outside
   * the transaction they belong to.
   */
  #lostInTransaction = false;
  /**
   * Statements that begin a transaction, sent and not yet answered: the
   * server's status shows the transaction only once BEGIN is answered, and
   * an outbox sharing the connection must not send its own BEGIN meanwhile.
   */
  #beginning = 0;
  /** ROLLBACKs and COMMITs sent and not answered yet. */
  #ending = 0;
  #closed = false;
  /** Creates the schema at the first connection (openPostgres's). */
  #createSchema: boolean;
  /** Without the `schema` option, where the outbox's table was found. */
  #tableSchema: string | undefined;

  /** @ignore Use {@linkcode connectPostgres}. */
  constructor(
    url: string,
    options: PostgresDriverOptions,
    createSchema = false,
  ) {
    this.#url = url;
    this.#options = options;
    this.#createSchema = createSchema;
  }

  /** The schema of the outbox's tables. */
  get schema(): string {
    return this.#options.schema ?? this.#tableSchema ?? "public";
  }

  /** Connects now, so a bad URL or a server that is down fails at open. */
  async connect(): Promise<void> {
    await this.#session();
  }

  /**
   * Runs one statement (extended protocol, so a second statement is
   * refused by the server before anything runs) and returns its rows.
   *
   * @param sql One statement, with `$1`, `$2`, … placeholders.
   * @param params The placeholders' values.
   * @returns The rows, keyed by column name.
   * @throws {ConnectionLostError} When the connection is or was lost
   * inside the transaction.
   * @throws {PostgresError} When the server refuses the statement.
   */
  async query(sql: string, params: readonly SqlValue[] = []): Promise<Row[]> {
    return (await this.#query("query", sql, params)).rows;
  }

  /**
   * Runs one statement and reports how many rows it changed.
   * `lastInsertRowid` is always `0`: PostgreSQL has none, use `RETURNING`.
   *
   * @param sql One statement, with `$1`, `$2`, … placeholders.
   * @param params The placeholders' values.
   * @returns The changed-row count.
   * @throws {ConnectionLostError} When the connection is or was lost
   * inside the transaction.
   * @throws {PostgresError} When the server refuses the statement.
   */
  async run(sql: string, params: readonly SqlValue[] = []): Promise<RunResult> {
    const result = await this.#query("run", sql, params);
    return { changes: result.rowCount ?? 0, lastInsertRowid: 0 };
  }

  /**
   * Runs a script of several statements (simple protocol, no parameters).
   *
   * @param sql The statements.
   * @throws {ConnectionLostError} When the connection is or was lost
   * inside the transaction.
   * @throws {PostgresError} When the server refuses a statement; those
   * before it ran.
   */
  async exec(sql: string): Promise<void> {
    await this.#query("exec", sql, []);
  }

  /**
   * Calls `listener` with each `NOTIFY` payload sent on `channel`, on this
   * connection (and again on each new connection after one was lost).
   * Notifications arrive between transactions; behind a transaction pooler
   * they do not arrive at all.
   *
   * @param channel The channel name, as `LISTEN` takes it (an identifier).
   * @param listener Called with the payload.
   * @returns Stops listening.
   * @throws {ConnectionLostError} When the connection is lost.
   */
  async listen(
    channel: string,
    listener: NotificationListener,
  ): Promise<() => Promise<void>> {
    let set = this.#listeners.get(channel);
    if (set === undefined) {
      this.#listeners.set(channel, set = new Set());
      await this.exec(`LISTEN ${quoteIdentifier(channel)}`);
    }
    set.add(listener);
    return async () => {
      set.delete(listener);
      if (set.size > 0 || this.#listeners.get(channel) !== set) return;
      this.#listeners.delete(channel);
      if (this.#client !== undefined && !this.#closed) {
        await this.exec(`UNLISTEN ${quoteIdentifier(channel)}`).catch(
          () => {},
        );
      }
    };
  }

  /**
   * Calls `listener` after another connection commits new events to this
   * driver's schema (the schema's insert trigger sends a `NOTIFY`). Does
   * nothing when the driver was opened with `listen: false`.
   *
   * @param listener Called with no arguments.
   * @returns Stops the calls.
   */
  async watchEnqueues(listener: () => void): Promise<() => Promise<void>> {
    if (this.#options.listen === false) return () => Promise.resolve();
    if (this.#options.schema === undefined) {
      // The NOTIFY of an enqueue names the schema its table is in, which
      // the search_path led to (not always its first schema).
      const [row] = await this.query(
        `SELECT n.nspname AS schema FROM pg_class AS c
          JOIN pg_namespace AS n ON n.oid = c.relnamespace
          WHERE c.oid = to_regclass('outbox_events')`,
      );
      if (row !== undefined) this.#tableSchema = String(row["schema"]);
    }
    return await this.listen("leased_outbox", (payload) => {
      if (payload === this.schema) listener();
    });
  }

  /**
   * Whether the connection is inside a transaction (the server's
   * transaction status after the last statement, or a `BEGIN` or
   * `START TRANSACTION` sent and not yet answered), so an outbox sharing it
   * joins the application's transaction instead of opening its own.
   *
   * @returns `true` inside a transaction, also a failed one or one whose
   * `BEGIN` is on its way.
   */
  inTransaction(): boolean {
    if (this.#lostInTransaction || this.#beginning > 0) return true;
    return this.#client !== undefined && openTransaction(this.#client);
  }

  /**
   * The connection's transaction as the server's last ReadyForQuery
   * reported it: `idle` (`I`), `open` (`T`, or a `BEGIN` on its way) or
   * `failed` (`E`: an error inside it, after which the server only rolls it
   * back), or `lost` (the connection was lost inside it: the server rolled
   * it back, and statements fail with {@linkcode ConnectionLostError} until
   * the caller's `ROLLBACK`).
   */
  transactionStatus(): TransactionStatus {
    if (this.#lostInTransaction) return "lost";
    if (this.#beginning > 0) return "open";
    const status = this.#client?.getTransactionStatus();
    return status === "T" ? "open" : status === "E" ? "failed" : "idle";
  }

  /** Closes the connection; later calls reject. Closing twice is a no-op. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    const client = this.#client ?? await this.#connecting?.catch(() => {});
    this.#client = undefined;
    if (client) await client.end().catch(() => {});
  }

  /** Closes the connection, as {@linkcode PostgresDriver.close} does. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  async #query(
    method: "query" | "run" | "exec",
    sql: string,
    params: readonly SqlValue[],
  ): Promise<PgResult> {
    // exec's scripts go through the simple protocol, which allows several
    // statements; query and run use the extended one, which refuses them.
    const extended = method !== "exec";
    if (this.#closed) throw new Error("Cannot query as the driver is closed");
    const keyword = firstKeyword(sql).toUpperCase();
    // Counted from the moment it is sent, before any await (see #beginning).
    const begins = keyword === "BEGIN" || keyword === "START";
    const ends = ENDS_TRANSACTION.test(sql);
    const commits = keyword === "COMMIT" || keyword === "END";
    // Lost before this COMMIT was sent, the transaction was rolled back
    // (#send says so); lost while it was in flight, nobody knows.
    const sentLive = !this.#lostInTransaction;
    if (begins) this.#beginning++;
    if (ends) this.#ending++;
    try {
      const result = await this.#send(method, sql, params, extended);
      // A failed transaction's COMMIT succeeds as a ROLLBACK: nothing of
      // it was committed, which the caller must not take for a commit.
      if (commits && result.command === "ROLLBACK") {
        throw new TransactionEndedError("commit", "", "failed");
      }
      return result;
    } catch (error) {
      if (commits && sentLive && error instanceof ConnectionLostError) {
        throw new ConnectionLostError(
          `Cannot commit as the connection was lost while COMMIT was in flight: whether the transaction committed is unknown (${error.message})`,
          error.code,
          { cause: error },
        );
      }
      throw error;
    } finally {
      if (begins) this.#beginning--;
      if (ends) this.#ending--;
    }
  }

  async #send(
    method: "query" | "run" | "exec",
    sql: string,
    params: readonly SqlValue[],
    extended: boolean,
  ): Promise<PgResult> {
    if (this.#lostInTransaction) {
      if (/^\s*ROLLBACK\s*;?\s*$/i.test(sql)) {
        this.#lostInTransaction = false;
        return { rows: [], rowCount: 0 };
      }
      throw new ConnectionLostError(
        "Cannot run the statement as the connection was lost inside this transaction: the server rolled it back",
      );
    }
    const client = await this.#session();
    const named = extended && (this.#options.prepare ?? true) &&
      PREPARED.has(sql);
    const inTransaction = openTransaction(client);
    const config = (): PgQueryConfig => ({
      text: sql,
      values: params.map(toParam),
      ...(extended ? { queryMode: "extended" } : {}),
      ...(named ? { name: this.#name(sql) } : {}),
    });
    try {
      try {
        const result = await client.query(config());
        if (!named && DROPS_PREPARED.has(firstKeyword(sql).toUpperCase())) {
          this.#forgetNames();
        }
        return result;
      } catch (error) {
        if (!named || !namesUnusable(error)) throw error;
        this.#forgetNames();
        // The statement did not run; outside a transaction it can run again
        // at once, under a new name. Inside one, the server has failed the
        // transaction: the caller rolls back, and its next call re-parses.
        if (inTransaction) throw error;
        return await client.query(config());
      }
    } catch (error) {
      const mapped = mapError(error);
      if (mapped instanceof ConnectionLostError) this.#lost(client);
      else await readyAfterError(client);
      if (
        extended && mapped instanceof PostgresError &&
        mapped.code === "42601" && /multiple commands/.test(mapped.message)
      ) {
        throw new RangeError(
          `Cannot ${method} as 'sql' must hold one statement: ${mapped.message}`,
          { cause: error },
        );
      }
      throw mapped;
    }
  }

  #name(sql: string): string {
    let name = this.#names.get(sql);
    if (name === undefined) {
      name = `leased_outbox_${this.#generation}_${this.#names.size + 1}`;
      this.#names.set(sql, name);
    }
    return name;
  }

  /**
   * Gives the named statements new names, so each is parsed and planned
   * again at its next use (see {@linkcode namesUnusable}).
   */
  #forgetNames(): void {
    this.#names.clear();
    this.#generation++;
  }

  /**
   * Forgets a broken client, remembering whether a transaction died with it:
   * not one whose ROLLBACK or COMMIT was on its way, which has ended either
   * way (the server rolls back what it did not commit).
   */
  #lost(client: PgClient): void {
    if (this.#client !== client) return;
    this.#lostInTransaction = this.#ending === 0 && openTransaction(client);
    this.#client = undefined;
    client.end().catch(() => {});
  }

  async #session(): Promise<PgClient> {
    if (this.#client !== undefined) return this.#client;
    this.#connecting ??= this.#connect().finally(() => {
      this.#connecting = undefined;
    });
    return await this.#connecting;
  }

  async #connect(): Promise<PgClient> {
    const options = this.#options;
    const config: PgClientConfig = {
      connectionString: this.#url,
      connectionTimeoutMillis: options.connectTimeoutMs ?? 10_000,
      application_name: options.applicationName ?? "leased-outbox",
      types,
    };
    if (options.statementTimeoutMs) {
      config.statement_timeout = options.statementTimeoutMs;
    }
    if (options.lockTimeoutMs) config.lock_timeout = options.lockTimeoutMs;
    if (options.schema !== undefined) {
      config.options = `-c search_path=${options.schema}`;
    }
    let client: PgClient;
    try {
      client = new pg.Client(config);
    } catch {
      // node-postgres's own message quotes the whole URL, password and all.
      throw new TypeError(
        "Cannot connect as 'url' is not a URL node-postgres can read: a /, ?, # or @ in the user or password must be percent-encoded, and the port at most 65535",
      );
    }
    // node-postgres emits 'error' for a connection lost while idle; without
    // a listener that would end the process.
    client.on("error", () => this.#lost(client));
    client.on("notification", (message) => {
      for (const listener of this.#listeners.get(message.channel) ?? []) {
        try {
          listener(message.payload ?? "");
        } catch (error) {
          reportError(error);
        }
      }
    });
    try {
      await client.connect();
      if (
        this.#createSchema && options.schema !== undefined &&
        (await client.query({
            text: "SELECT 1 FROM pg_namespace WHERE nspname = $1",
            values: [options.schema],
          })).rows.length === 0
      ) {
        // CREATE SCHEMA IF NOT EXISTS fails in one of two sessions running
        // it at once; the outbox set-up's advisory lock lines them up. The
        // simple protocol runs both in one implicit transaction, which
        // holds the lock. The name is a checked identifier. Only for a
        // missing schema: an upgrade holds that lock as long as it takes,
        // and a connection waits for it in the outbox's set-up alone.
        await client.query({
          text:
            `SELECT pg_advisory_xact_lock(hashtext('leased_outbox:${options.schema}'));
            CREATE SCHEMA IF NOT EXISTS ${quoteIdentifier(options.schema)}`,
          values: [],
        });
      }
      this.#createSchema = false;
      for (const channel of this.#listeners.keys()) {
        await client.query({
          text: `LISTEN ${quoteIdentifier(channel)}`,
          values: [],
        });
      }
    } catch (error) {
      client.end().catch(() => {});
      throw mapError(error, true);
    }
    if (this.#closed) {
      await client.end().catch(() => {});
      throw new Error("Cannot query as the driver is closed");
    }
    this.#client = client;
    return client;
  }
}

/**
 * Opens one connection to PostgreSQL.
 *
 * @param url A `postgres://user:password@host:port/database` URL (libpq's
 * form, `?sslmode=require` included).
 * @param options See {@linkcode PostgresDriverOptions}.
 * @returns The connected driver.
 * @throws {TypeError} When an option is invalid.
 * @throws {ConnectionLostError} When the server cannot be reached.
 */
export async function connectPostgres(
  url: string,
  options: PostgresDriverOptions = {},
): Promise<PostgresDriver> {
  checkDriverOptions(url, options);
  const driver = new PostgresDriver(url, options);
  await driver.connect();
  return driver;
}

/**
 * Opens an outbox on PostgreSQL: connects, creates the schema (and the
 * `schema` option's PostgreSQL schema) when missing under an advisory lock,
 * and judges leases by the server's clock unless `now` says otherwise.
 *
 * @param url A `postgres://user:password@host:port/database` URL.
 * @param options See {@linkcode PostgresOutboxOptions}.
 * @returns The outbox; it owns the connection and closes it.
 * @throws {TypeError | RangeError} When an option is invalid, naming it.
 * @throws {ConnectionLostError} When the server cannot be reached.
 *
 * @example Enqueue, claim, acknowledge
 * ```ts ignore
 * import { openPostgres } from "@leased/outbox/postgres";
 *
 * await using outbox = await openPostgres("postgres://app@127.0.0.1/app");
 * await outbox.enqueue({ to: "ada@example.com" });
 * const lease = await outbox.claim({ leaseMs: 30_000 });
 * if (lease) await outbox.acknowledge(lease);
 * ```
 */
export async function openPostgres<P = unknown>(
  url: string,
  options: PostgresOutboxOptions = {},
): Promise<Outbox<P>> {
  if (options === null || typeof options !== "object") {
    throw new TypeError(
      `Cannot open outbox as 'options' must be an object: current value is ${
        String(options)
      }`,
    );
  }
  const driverOptions: Record<string, unknown> = {};
  const outboxOptions: Record<string, unknown> = { now: "database" };
  for (const [name, value] of Object.entries(options)) {
    if (value === undefined) continue;
    if (DRIVER_OPTIONS.includes(name as keyof PostgresDriverOptions)) {
      driverOptions[name] = value;
    } else outboxOptions[name] = value;
  }
  // A lock wait past busyTimeoutMs is a BusyError on PostgreSQL too; an
  // invalid busyTimeoutMs is left for Outbox.open to refuse by name.
  const busyTimeoutMs = options.busyTimeoutMs ?? 5_000;
  if (
    driverOptions["lockTimeoutMs"] === undefined &&
    Number.isSafeInteger(busyTimeoutMs) && busyTimeoutMs >= 0
  ) {
    driverOptions["lockTimeoutMs"] = lockTimeoutFor(busyTimeoutMs);
  }
  checkDriverOptions(url, driverOptions);
  // Connects at the outbox's first statement, once it has checked its own
  // options: bad input changes nothing, not even the schema.
  const driver = new PostgresDriver(url, driverOptions, true);
  try {
    return await Outbox.open<P>(driver, outboxOptions as OutboxOptions);
  } catch (error) {
    await driver.close();
    throw error;
  }
}

/**
 * Whether `error` says the connection's named statements cannot be used as
 * they are: gone from the server (26000: dropped by SQL node-postgres does
 * not see, or a pooler that changed the server connection), or planned for
 * a table whose columns changed since (0A000, "cached plan must not change
 * result type").
 */
function namesUnusable(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return code === "26000" ||
    (code === "0A000" && /cached plan/.test(String(error)));
}

/**
 * The `lock_timeout` that ends lock waits as an outbox's `busyTimeoutMs`
 * says: 1 ms for 0 (which waits for no lock; the server's 0 would wait for
 * ever), and the server's longest for a longer one.
 *
 * @ignore
 * @param busyTimeoutMs A valid `busyTimeoutMs`.
 * @returns Milliseconds.
 */
export function lockTimeoutFor(busyTimeoutMs: number): number {
  return Math.min(Math.max(busyTimeoutMs, 1), MAX_TIMEOUT_MS);
}

/**
 * Whether `url` is one this driver connects to: `postgres://` or
 * `postgresql://`, the scheme in any case (RFC 3986), as node-postgres
 * reads it.
 *
 * @ignore
 * @param url Text.
 * @returns Whether it names a PostgreSQL server.
 */
export function isPostgresUrl(url: string): boolean {
  return /^postgres(ql)?:\/\//i.test(url);
}

/** Validates a URL and driver options before anything connects. */
function checkDriverOptions(url: string, options: PostgresDriverOptions): void {
  if (typeof url !== "string" || !isPostgresUrl(url)) {
    throw new TypeError(
      `Cannot connect as 'url' must be a postgres:// URL: current value ${
        typeof url !== "string"
          // A URL object's text holds its password.
          ? `is ${url === null ? "null" : `of type ${typeof url}`}`
          : /^[a-z][a-z0-9+.-]*:/i.test(url)
          // Its scheme alone: whatever follows may hold a password.
          ? `begins ${JSON.stringify(url.slice(0, url.indexOf(":") + 1))}`
          : "has no scheme"
      }`,
    );
  }
  if (options === null || typeof options !== "object") {
    throw new TypeError(
      `Cannot connect as 'options' must be an object: current value is ${
        String(options)
      }`,
    );
  }
  for (const name of Object.keys(options)) {
    if (!DRIVER_OPTIONS.includes(name as keyof PostgresDriverOptions)) {
      throw new TypeError(
        `Cannot connect as '${name}' is not an option: the options are ${
          DRIVER_OPTIONS.join(", ")
        }`,
      );
    }
  }
  for (
    const field of [
      "connectTimeoutMs",
      "statementTimeoutMs",
      "lockTimeoutMs",
    ] as const
  ) {
    checkInteger("connect", field, options[field], 0, MAX_TIMEOUT_MS);
  }
  const name = options.applicationName;
  if (
    name !== undefined &&
    (typeof name !== "string" || !APPLICATION_NAME.test(name))
  ) {
    throw new TypeError(
      `Cannot connect as 'applicationName' must be at most 63 printable ASCII characters: current value is ${
        typeof name === "string"
          ? JSON.stringify(name.slice(0, 70))
          : String(name)
      }`,
    );
  }
  checkBoolean("connect", "prepare", options.prepare, true);
  checkBoolean("connect", "listen", options.listen, true);
  // A string only: SCHEMA.test would read anything else as String(it), an
  // array ["jobs"] or an object's toString included, and the schema's name
  // goes into SQL as given.
  const schema: unknown = options.schema;
  if (
    schema !== undefined &&
    (typeof schema !== "string" || !SCHEMA.test(schema))
  ) {
    throw new TypeError(
      `Cannot connect as 'schema' must be a lowercase identifier of at most 63 characters, not beginning with pg_: current value is ${
        typeof schema === "string"
          ? JSON.stringify(schema.slice(0, 70))
          : describe(schema)
      }`,
    );
  }
}

/**
 * Waits for the ReadyForQuery that follows a server's error: node-postgres
 * rejects at the ErrorResponse, and the transaction status it reports
 * (`E` after an error inside a transaction) only changes with the
 * ReadyForQuery, which may come in a later packet.
 */
function readyAfterError(client: PgClient): Promise<void> {
  if (client.readyForQuery) return Promise.resolve();
  const connection = client.connection;
  return new Promise((resolve) => {
    const done = () => {
      for (const event of EVENTS) connection.off(event, done);
      resolve();
    };
    const EVENTS = ["readyForQuery", "end", "error"];
    for (const event of EVENTS) connection.on(event, done);
  });
}

/** Whether the server said the client is in a transaction, also a failed one. */
function openTransaction(client: PgClient): boolean {
  const status = client.getTransactionStatus();
  return status === "T" || status === "E";
}

/** Maps a node-postgres error to the typed error for it. */
function mapError(error: unknown, connecting = false): Error {
  const message = error instanceof Error ? error.message : String(error);
  const code = (error as { code?: unknown } | null)?.code;
  const sqlstate = typeof code === "string" && /^[0-9A-Z]{5}$/.test(code)
    ? code
    : undefined;
  if (sqlstate === undefined) {
    if (connecting || LOST.some((text) => message.includes(text))) {
      return new ConnectionLostError(message, "08006", { cause: error });
    }
    return error instanceof Error ? error : new Error(message);
  }
  // Class 08 connection exceptions; 57P01–57P03 admin, crash or startup
  // shutdown; 53300 too many connections; the server ending the session
  // for idle_in_transaction_session_timeout (25P03), transaction_timeout
  // (25P04) or idle_session_timeout (57P05).
  // 08P01, a protocol violation (a bind of the wrong parameter count),
  // leaves the connection working.
  if (
    (sqlstate.startsWith("08") && sqlstate !== "08P01") ||
    /^57P0[1235]$|^25P0[34]$/.test(sqlstate)
  ) {
    return new ConnectionLostError(message, sqlstate, { cause: error });
  }
  if (connecting && sqlstate === "53300") {
    return new ConnectionLostError(message, sqlstate, { cause: error });
  }
  if (sqlstate === "57014") {
    return new StatementTimeoutError(message, { cause: error });
  }
  if (sqlstate === "55P03") return new BusyError(message, 5, { cause: error });
  return new PostgresError(message, sqlstate, { cause: error });
}

function toParam(value: SqlValue): unknown {
  if (typeof value === "bigint") {
    if (value > 0x7fffffffffffffffn || value < -0x8000000000000000n) {
      throw new RangeError(
        `Cannot bind ${value}n as it is outside the 64-bit integer range`,
      );
    }
    return value.toString();
  }
  return value;
}

function parseInt8(text: string): number | bigint {
  const n = Number(text);
  return Number.isSafeInteger(n) ? n : BigInt(text);
}

function parseBytea(text: string): Uint8Array {
  // The server's bytea_output is hex by default: "\x" then two digits a byte.
  const bytes = new Uint8Array((text.length - 2) / 2);
  for (let i = 0; i < bytes.length; i++) {
    bytes[i] = parseInt(text.slice(2 + 2 * i, 4 + 2 * i), 16);
  }
  return bytes;
}

function quoteIdentifier(name: string): string {
  return `"${name.replaceAll('"', '""')}"`;
}
