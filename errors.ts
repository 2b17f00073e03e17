/**
 * Errors callers catch. Bad arguments throw the built-in `TypeError` or
 * `RangeError` instead, naming the field (the convention of Deno's std).
 *
 * @module
 */

/**
 * An error reported by the SQLite engine, carrying its result code
 * (https://sqlite.org/rescode.html).
 *
 * @example Usage
 * ```ts
 * import { SqliteError } from "@leased/outbox";
 * import assert from "node:assert/strict";
 *
 * const error = new SqliteError("disk I/O error", 10);
 * assert.equal(error.primaryCode, 10);
 * ```
 */
export class SqliteError extends Error {
  /** The extended result code, e.g. `2067` for `SQLITE_CONSTRAINT_UNIQUE`. */
  readonly code: number;

  /**
   * Makes an error for a result code.
   *
   * @param message What the engine said.
   * @param code The extended result code.
   * @param options `cause`: the engine's own error object.
   */
  constructor(message: string, code: number, options?: ErrorOptions) {
    super(message, options);
    this.name = "SqliteError";
    this.code = code;
  }

  /** The primary result code: the low 8 bits of {@linkcode SqliteError.code}. */
  get primaryCode(): number {
    return this.code & 0xff;
  }
}

/**
 * The database stayed locked by another connection for longer than
 * `busyTimeoutMs` (`SQLITE_BUSY`, result code 5). The operation changed
 * nothing; calling it again later is safe. On PostgreSQL it is a lock wait
 * past the connection's `lock_timeout` (SQLSTATE `55P03`, in `cause.code`),
 * and `code` is 5 there too, so one check serves both engines.
 *
 * @example Usage
 * ```ts
 * import { BusyError } from "@leased/outbox";
 * import assert from "node:assert/strict";
 *
 * assert.equal(new BusyError("database is locked").code, 5);
 * ```
 */
export class BusyError extends SqliteError {
  /**
   * Makes a busy error.
   *
   * @param message What went wrong.
   * @param code The extended result code (default `5`, `SQLITE_BUSY`).
   * @param options `cause`: the last engine error seen.
   */
  constructor(message: string, code = 5, options?: ErrorOptions) {
    super(message, code, options);
    this.name = "BusyError";
  }
}

/**
 * The database file was renamed, deleted or replaced while the connection
 * had it open (`SQLITE_READONLY_DBMOVED`, extended result code 1032, as
 * native SQLite reports it): writes fail rather than commit to a file that
 * nobody will open again, and nothing changed. Reads go on. Open the file at
 * its new path to write again.
 *
 * @example Usage
 * ```ts
 * import { DatabaseMovedError, SqliteError } from "@leased/outbox";
 * import assert from "node:assert/strict";
 *
 * const error = new DatabaseMovedError("attempt to write a readonly database");
 * assert.ok(error instanceof SqliteError);
 * assert.equal(error.code, 1032);
 * ```
 */
export class DatabaseMovedError extends SqliteError {
  /**
   * Makes the error, saying what happened after the engine's own message.
   *
   * @param message What the engine said.
   * @param options `cause`: the engine's own error object.
   */
  constructor(message: string, options?: ErrorOptions) {
    super(
      `${message} (SQLITE_READONLY_DBMOVED: the database file was renamed, deleted or replaced after this connection opened it; nothing was written, so open it at its new path to write)`,
      READONLY_DBMOVED,
      options,
    );
    this.name = "DatabaseMovedError";
  }
}

const READONLY_DBMOVED = 1032;
/**
 * `SQLITE_READONLY_ROLLBACK`: a read-only connection met a hot journal.
 *
 * @ignore
 */
export const READONLY_ROLLBACK = 776;

/**
 * A constraint failed (`SQLITE_CONSTRAINT`, result code 19), e.g. a `UNIQUE`
 * or `CHECK` in the caller's own SQL inside a transaction.
 *
 * @example Usage
 * ```ts
 * import { ConstraintError } from "@leased/outbox";
 * import assert from "node:assert/strict";
 *
 * assert.equal(new ConstraintError("UNIQUE constraint failed", 2067).primaryCode, 19);
 * ```
 */
export class ConstraintError extends SqliteError {
  /**
   * Makes a constraint error.
   *
   * @param message What the engine said.
   * @param code The extended result code.
   * @param options `cause`: the engine's own error object.
   */
  constructor(message: string, code: number, options?: ErrorOptions) {
    super(message, code, options);
    this.name = "ConstraintError";
  }
}

/**
 * A fenced acknowledgement inside {@linkcode Outbox.transaction} found the
 * lease no longer current (another worker claimed the event, or it was
 * acknowledged already); the whole transaction was rolled back.
 *
 * @example Usage
 * ```ts
 * import { LeaseLostError } from "@leased/outbox";
 * import assert from "node:assert/strict";
 *
 * const error = new LeaseLostError(41, 2);
 * assert.equal(error.eventId, 41);
 * assert.equal(error.fence, 2);
 * ```
 */
export class LeaseLostError extends Error {
  /** The event whose lease was lost. */
  readonly eventId: number;
  /** The fence of the lost lease. */
  readonly fence: number;

  /**
   * Makes the error for a lost lease.
   *
   * @param eventId The event whose lease was lost.
   * @param fence The fence of the lost lease.
   */
  constructor(eventId: number, fence: number) {
    super(`Lease on event ${eventId} (fence ${fence}) is no longer current`);
    this.name = "LeaseLostError";
    this.eventId = eventId;
    this.fence = fence;
  }
}

/**
 * The database's outbox schema is one this release cannot use: newer than
 * {@linkcode SCHEMA_VERSION} (a newer release upgraded it), or a version no
 * upgrade step starts from. {@linkcode Outbox.open} throws it before any
 * claim, having changed nothing; an older worker should stop rather than
 * retry.
 *
 * @example Usage
 * ```ts
 * import { SchemaVersionError } from "@leased/outbox";
 * import assert from "node:assert/strict";
 *
 * const error = new SchemaVersionError(4, 3);
 * assert.equal(error.version, 4);
 * assert.equal(error.supported, 3);
 * ```
 */
export class SchemaVersionError extends Error {
  /** The version recorded in the database's `outbox_schema` table. */
  readonly version: number;
  /** The version this release applies. */
  readonly supported: number;

  /**
   * Makes the error for a schema version this release cannot use.
   *
   * @param version The database's outbox schema version.
   * @param supported The version this release applies.
   * @param op What was being done, for the message. @default {"open outbox"}
   */
  constructor(version: number, supported: number, op = "open outbox") {
    super(
      version > supported
        ? `Cannot ${op} as the database has outbox schema version ${version}, newer than this release's ${supported}: run a release that knows version ${version}`
        : `Cannot ${op} as the database has outbox schema version ${version}, which no upgrade to version ${supported} starts from`,
    );
    this.name = "SchemaVersionError";
    this.version = version;
    this.supported = supported;
  }
}

/**
 * The database holds an integer the outbox cannot represent exactly as a
 * JavaScript number: a row id, fence, attempt, count or time outside
 * ±(2^53 - 1) (`Number.MAX_SAFE_INTEGER`), or a claim that would take a fence
 * or attempt past it. Rounding it would name another event or lease (a lease
 * on a rounded id acknowledges nothing and lets a second claim take the same
 * event), so the call fails instead and its transaction rolls back: nothing
 * changed.
 *
 * @example Usage
 * ```ts
 * import { UnsafeIntegerError } from "@leased/outbox";
 * import assert from "node:assert/strict";
 *
 * const error = new UnsafeIntegerError("id", 2n ** 53n + 1n);
 * assert.equal(error.column, "id");
 * assert.equal(error.value, 2n ** 53n + 1n);
 * ```
 */
export class UnsafeIntegerError extends Error {
  /** The column (or result field) the integer came from. */
  readonly column: string;
  /** The value as read, exactly (a `bigint` past ±2^53). */
  readonly value: unknown;

  /**
   * Makes the error for one value.
   *
   * @param column The column (or result field) the value came from.
   * @param value The value as read.
   */
  constructor(column: string, value: unknown) {
    super(
      `Column '${column}' holds ${
        typeof value === "string" ? JSON.stringify(value) : String(value)
      }, which is not a safe integer (at most ${Number.MAX_SAFE_INTEGER} in magnitude): the outbox refuses to round it`,
    );
    this.name = "UnsafeIntegerError";
    this.column = column;
    this.value = value;
  }
}

/**
 * A call's insert met a taken dedup key or identity, and the row that took
 * it was deleted (a purge on another connection, committed) before the
 * call could read it, in each of `rounds` rounds in a row: on PostgreSQL,
 * where the insert and the lookup are two statements, each with a fresh
 * snapshot. Every round the key is free again, so the call inserts again;
 * one that still meets a row gone each time gives up here. The inbox's
 * lookup records the identity itself when its row is gone, and gives up
 * after that one round (`rounds` 1) when another transaction recorded it
 * again meanwhile. Inside a transaction, nothing of the call is left, even
 * when `transaction(fn)`'s `fn` catches the error (the transaction then
 * rejects with it); a batch enqueued outside one (one statement per round, each
 * its own commit) keeps the events earlier rounds inserted. Calling again
 * with the same keys and identities is safe.
 *
 * @example Usage
 * ```ts
 * import { DedupRaceError } from "@leased/outbox";
 * import assert from "node:assert/strict";
 *
 * const error = new DedupRaceError("enqueue", 5);
 * assert.equal(error.rounds, 5);
 * assert.equal(error.name, "DedupRaceError");
 * ```
 */
export class DedupRaceError extends Error {
  /** The call that gave up, e.g. `"enqueue"`. */
  readonly op: string;
  /** How many rounds of insert and lookup it ran. */
  readonly rounds: number;

  /**
   * Makes the error.
   *
   * @param op The call that gave up.
   * @param rounds How many rounds it ran.
   * @param options `cause`: the statement's error, when one failed.
   */
  constructor(op: string, rounds: number, options?: ErrorOptions) {
    super(
      `Cannot ${op} as the row its dedup key or identity met was deleted before it could be read, ${
        rounds === 1 ? "and taken again" : `in each of ${rounds} rounds`
      } (a purge racing the call): call again`,
      options,
    );
    this.name = "DedupRaceError";
    this.op = op;
    this.rounds = rounds;
  }
}

/**
 * Maps a SQLite result code to the typed error for it.
 *
 * @param message What the engine said.
 * @param code The extended result code.
 * @param cause The engine's own error object.
 * @returns A {@linkcode BusyError}, {@linkcode ConstraintError},
 *   {@linkcode DatabaseMovedError}, {@linkcode StorageFullError} or
 *   {@linkcode SqliteError}.
 */
export function sqliteError(
  message: string,
  code: number,
  cause?: unknown,
): SqliteError {
  const options = cause === undefined ? undefined : { cause };
  if (code === READONLY_DBMOVED) {
    return new DatabaseMovedError(message, options);
  }
  if (code === READONLY_ROLLBACK) {
    // What a read-only connection says of a crashed writer's hot journal.
    message +=
      " (SQLITE_READONLY_ROLLBACK: a writer that crashed left a hot journal, which only a read-write connection can roll back; open the database read-write once, e.g. with Outbox.open or a write command of the outbox CLI, then read it again)";
  }
  switch (code & 0xff) {
    case 5: // SQLITE_BUSY
    case 6: // SQLITE_LOCKED
      return new BusyError(message, code, options);
    case 19:
      return new ConstraintError(message, code, options);
    case 13: // SQLITE_FULL
      return new StorageFullError(message, code, options);
    default:
      return new SqliteError(message, code, options);
  }
}

/**
 * An error reported by PostgreSQL, carrying its SQLSTATE
 * (https://www.postgresql.org/docs/current/errcodes-appendix.html).
 *
 * @example Usage
 * ```ts
 * import { PostgresError } from "@leased/outbox";
 * import assert from "node:assert/strict";
 *
 * const error = new PostgresError("duplicate key value", "23505");
 * assert.equal(error.code, "23505");
 * ```
 */
export class PostgresError extends Error {
  /** The five-character SQLSTATE, e.g. `"23505"` for a unique violation. */
  readonly code: string;

  /**
   * Makes an error for a SQLSTATE.
   *
   * @param message What the server said.
   * @param code The SQLSTATE.
   * @param options `cause`: the client's own error object.
   */
  constructor(message: string, code: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "PostgresError";
    this.code = code;
  }
}

/**
 * The connection to PostgreSQL broke (server restart or crash, a terminated
 * backend, a network failure) or could not be made. A transaction whose
 * `COMMIT` was not yet sent was rolled back by the server; one whose
 * `COMMIT` was in flight may or may not have committed (the message then
 * says the outcome is unknown), as may a single statement outside a
 * transaction. The next transaction opens a new connection.
 *
 * @example Usage
 * ```ts
 * import { ConnectionLostError } from "@leased/outbox";
 * import assert from "node:assert/strict";
 *
 * assert.equal(new ConnectionLostError("server closed the connection").code, "08006");
 * ```
 */
export class ConnectionLostError extends PostgresError {
  /**
   * Makes a connection error.
   *
   * @param message What went wrong.
   * @param code The SQLSTATE, `"08006"` (connection failure) when the server
   * sent none.
   * @param options `cause`: the client's own error object.
   */
  constructor(message: string, code = "08006", options?: ErrorOptions) {
    super(message, code, options);
    this.name = "ConnectionLostError";
  }
}

/**
 * A statement ran past `statement_timeout` (or was canceled), SQLSTATE
 * `57014`. The server rolled the statement back, and the transaction around
 * it fails as a whole.
 *
 * @example Usage
 * ```ts
 * import { StatementTimeoutError } from "@leased/outbox";
 * import assert from "node:assert/strict";
 *
 * assert.equal(new StatementTimeoutError("canceling statement").code, "57014");
 * ```
 */
export class StatementTimeoutError extends PostgresError {
  /**
   * Makes a timeout error.
   *
   * @param message What the server said.
   * @param options `cause`: the client's own error object.
   */
  constructor(message: string, options?: ErrorOptions) {
    super(message, "57014", options);
    this.name = "StatementTimeoutError";
  }
}

/**
 * Thrown by a handler of {@linkcode processEvents} to say "do not retry":
 * the event becomes a dead letter at once, whatever attempts it has left,
 * with this error's text as its last error (BullMQ's `UnrecoverableError`).
 * Use it for failures another attempt cannot fix, such as an HTTP 4xx.
 *
 * @example Usage
 * ```ts
 * import { PermanentError } from "@leased/outbox";
 * import assert from "node:assert/strict";
 *
 * const error = new PermanentError("receiver answered 422", { status: 422 });
 * assert.equal(error.name, "PermanentError");
 * assert.deepEqual(error.data, { status: 422 });
 * ```
 */
export class PermanentError extends Error {
  /** Whatever the handler attached, e.g. the response status; `undefined` when none. */
  readonly data: unknown;

  /**
   * Makes the error.
   *
   * @param message Why the event cannot succeed; kept as its last error.
   * @param data Anything for the `onHandlerError` hook to read.
   * @param options `cause`: the underlying error.
   */
  constructor(message: string, data?: unknown, options?: ErrorOptions) {
    super(message, options);
    this.name = "PermanentError";
    this.data = data;
  }
}

/** The largest `delayMs` of a {@linkcode RetryAfterError}: 365 days. */
const MAX_RETRY_AFTER_MS = 31_536_000_000;

/**
 * Thrown by a handler of {@linkcode processEvents} to say "retry after
 * `delayMs`": the event is released for exactly that delay instead of the
 * loop's backoff (an HTTP `Retry-After`; liteque's `RetryAfterError`). The
 * attempt still counts, so on the last attempt the event becomes a dead
 * letter.
 *
 * @example Usage
 * ```ts
 * import { RetryAfterError } from "@leased/outbox";
 * import assert from "node:assert/strict";
 *
 * const error = new RetryAfterError(30_000, "receiver answered 429");
 * assert.equal(error.delayMs, 30_000);
 * assert.equal(error.message, "receiver answered 429");
 * ```
 */
export class RetryAfterError extends Error {
  /** How long the event waits before it can be claimed again, in milliseconds. */
  readonly delayMs: number;

  /**
   * Makes the error.
   *
   * @param delayMs Milliseconds before the next attempt, an integer from 0
   * to 365 days.
   * @param message Why the attempt failed; kept as the event's last error.
   * @param options `cause`: the underlying error.
   * @throws {RangeError} When `delayMs` is not such an integer.
   */
  constructor(delayMs: number, message?: string, options?: ErrorOptions) {
    if (
      !Number.isInteger(delayMs) || delayMs < 0 || delayMs > MAX_RETRY_AFTER_MS
    ) {
      throw new RangeError(
        `Cannot make RetryAfterError as 'delayMs' must be a non-negative integer at most ${MAX_RETRY_AFTER_MS}: current value is ${
          typeof delayMs === "number" ? delayMs : typeof delayMs
        }`,
      );
    }
    super(message ?? `retry after ${delayMs} ms`, options);
    this.name = "RetryAfterError";
    this.delayMs = delayMs;
  }
}

/**
 * The storage under the database is full, so a write failed and nothing of
 * the call was stored: `SQLITE_FULL` (result code 13) from SQLite on a disk
 * with no room left, or, in the browser, the origin's storage quota, which
 * OPFS enforces by refusing a write (`QuotaExceededError`, which SQLite's
 * OPFS VFS reports as a bare "disk I/O error"). The connection stays usable:
 * once space is freed (the outbox's `purge` of done events and dead letters
 * followed by `maintain`, other data of the origin cleared, or a larger
 * quota granted), the same call succeeds, without reopening.
 * `code` is 13 (`SQLITE_FULL`) and `cause` the error as reported.
 *
 * @example Usage
 * ```ts
 * import { SqliteError, StorageFullError } from "@leased/outbox";
 * import assert from "node:assert/strict";
 *
 * const error = new StorageFullError("database or disk is full");
 * assert.ok(error instanceof SqliteError);
 * assert.equal(error.code, 13);
 * assert.equal(error.name, "StorageFullError");
 * ```
 */
export class StorageFullError extends SqliteError {
  /**
   * Makes the error.
   *
   * @param message What happened and what to do.
   * @param code The extended result code (default `13`, `SQLITE_FULL`).
   * @param options `cause`: the error as reported.
   */
  constructor(message: string, code = 13, options?: ErrorOptions) {
    super(message, code, options);
    this.name = "StorageFullError";
  }
}

/**
 * The transaction a call belongs to has ended, or failed, at the engine:
 * SQLite rolled it back (a trigger's `RAISE(ROLLBACK)`, `INSERT OR
 * ROLLBACK`, some I/O, full-disk and out-of-memory errors), or PostgreSQL
 * failed it (any error inside it; it then answers `COMMIT` with
 * `ROLLBACK`). From then on, every call of that transaction throws it and
 * runs nothing (never in autocommit), no `COMMIT` is sent, and
 * `transaction()` or `accept()` rejects with it: nothing of the
 * transaction was committed.
 *
 * @example Usage
 * ```ts
 * import { TransactionEndedError } from "@leased/outbox";
 * import assert from "node:assert/strict";
 *
 * const error = new TransactionEndedError("enqueue", "INSERT OR ROLLBACK INTO t VALUES (1)", "ended");
 * assert.equal(error.statement, "INSERT OR ROLLBACK INTO t VALUES (1)");
 * assert.equal(error.status, "ended");
 * ```
 */
export class TransactionEndedError extends Error {
  /**
   * The statement after which the engine said the transaction had ended or
   * failed, as sent (clipped to 200 characters); `""` when it is not known
   * (a statement on the application's own handle, or a `COMMIT` that
   * PostgreSQL answered with `ROLLBACK`).
   */
  readonly statement: string;
  /**
   * `ended`: the engine rolled the transaction back (SQLite's autocommit
   * came back on). `failed`: it is still open but can only roll back
   * (PostgreSQL's transaction status `E`, or a `COMMIT` it answered with
   * `ROLLBACK`).
   */
  readonly status: "ended" | "failed";

  /**
   * Makes the error.
   *
   * @param op The call that found the transaction gone, e.g. `"enqueue"`.
   * @param statement The statement that ended or failed it (`""`: unknown).
   * @param status Whether it ended or failed.
   * @param options `cause`: the statement's own error.
   */
  constructor(
    op: string,
    statement: string,
    status: "ended" | "failed",
    options?: ErrorOptions,
  ) {
    const clipped = statement.length <= 200
      ? statement
      : `${statement.slice(0, 197)}...`;
    const after = clipped === ""
      ? "an earlier statement"
      : JSON.stringify(clipped);
    super(
      status === "ended"
        ? `Cannot ${op} as the engine rolled the transaction back after ${after}: nothing of it commits`
        : `Cannot ${op} as the transaction failed after ${after}: the engine will only roll it back, and nothing of it commits`,
      options,
    );
    this.name = "TransactionEndedError";
    this.statement = clipped;
    this.status = status;
  }
}
