/**
 * The engine contract's shared types: how each engine spells the core's
 * statements, what state an event and a transaction are in. A leaf: it
 * imports nothing of ours, so drivers, dialects and the core all import
 * it without a cycle.
 *
 * @module
 */

/**
 * The statements every engine spells: the keys of a {@linkcode Dialect}.
 * `SQL` in `dialects/sqlite.ts` (and, for the admin calls, `ADMIN_SQL` in
 * `dialects/sqlite/admin.ts`) holds SQLite's text for each, with what its
 * parameters mean.
 */
export type StatementName =
  | "begin"
  | "commit"
  | "rollback"
  | "savepoint"
  | "releaseSavepoint"
  | "rollbackToSavepoint"
  | "insert"
  | "existing"
  | "insertAll"
  | "insertAlike"
  | "existingAll"
  | "exhausted"
  | "expire"
  | "candidates"
  | "tokenUsed"
  | "claim"
  | "claimOne"
  | "ledger"
  | "writeUnwritten"
  | "ledgerAll"
  | "acknowledge"
  | "acknowledgeAll"
  | "renew"
  | "release"
  | "stale"
  | "deadLetters"
  | "stats"
  | "event"
  | "eventByIdentity"
  | "history"
  | "unclaimable"
  | "list"
  | "listEnqueued"
  | "listEnqueuedInQueue"
  | "cancel"
  | "redrive"
  | "purgeable"
  | "purgeLedger"
  | "purge"
  | "queues"
  | "queuesPage"
  | "queueCount"
  | "nextDue"
  | "joinSavepoint"
  | "releaseJoin"
  | "rollbackJoin"
  | "readBegin"
  | "outboxPresent"
  | "schemaVersion"
  | "acknowledgedSince"
  | "activity"
  | "dedupKeyEvent"
  | "dedupKeyEventAnyQueue";

/**
 * How the core's statements are spelled on one engine: SQL text only, no
 * I/O. The core decides which statement runs and with what; a dialect says
 * how it is written. SQLite's is `SQLITE` in `dialects/sqlite.ts` (its
 * schema steps are SQLite's own); PostgreSQL's is `POSTGRES` in
 * `dialects/postgres.ts`, each
 * statement taking the same parameters in the same order.
 */
export interface Dialect extends Readonly<Record<StatementName, string>> {
  /** Reads the database server's clock as `now`, epoch milliseconds. */
  readonly now?: string;
  /**
   * `now` and `exhausted` in one statement, saving a round trip at the
   * start of every transaction on the server's clock: a row with `now`,
   * and `id` and `fence` of each exhausted lease (`null` when none).
   */
  readonly nowExhausted?: string;
  /**
   * Locks event rows (parameter: their ids as a JSON array), in id order,
   * for engines whose transactions run side by side: a transaction writes
   * an event's unwritten ledger entries only while it holds the event's
   * row, so two never wait for each other's entries on the ledger's unique
   * index while holding the rows each other needs (a deadlock). SQLite's
   * one writer needs none.
   */
  readonly lockEvents?: string;
  /**
   * A claim as one statement, outside a transaction (autocommit is its
   * transaction), for engines where every round trip costs: the clock, the
   * candidates' locks and the claim. Parameters: now (null: the server's
   * clock), queue, max, maxPayloadBytes, leaseMs, and one 32-character
   * token per possible lease. Rows: `now`, `refused` and each lease's event
   * row as claimed, in claim order (one row of nulls but `now` when none).
   * It honours the queue's flow control as the general path does (`flow`).
   * It refuses (`refused` 1, nothing changed) whatever needs ledger entries
   * or dead letters first: a lapsed lease to take over, a lapsed
   * last-attempt lease, an unclaimable candidate; and what it cannot count
   * exactly: a batch the per-key limit left short, a claim of the queue
   * that committed after its snapshot. The general path then claims.
   */
  readonly claimInOne?: string;
  /**
   * `claimInOne` after the fenced acknowledgement of the leases in a JSON
   * array of [event id, fence, token] (parameter 7), all or none, in the
   * same statement: one round trip and one commit for the processing loop's
   * acknowledge-then-claim. A stale lease, a lease listed twice, or
   * whatever refuses the claim refuses the whole statement (`refused` 1,
   * nothing changed).
   */
  readonly acknowledgeAndClaimInOne?: string;
  /**
   * The errors' `code`s with which a one-statement call (`claimInOne`,
   * `acknowledgeInOne`, `acknowledgeAllInOne`, `acknowledgeAndClaimInOne`)
   * refuses, having changed nothing, and the general path runs instead: a
   * text payload that is not JSON; a serialization failure or deadlock,
   * which a statement outside a transaction meets when the session's
   * default isolation is above read committed, where the general path's
   * transactions are not.
   */
  readonly refusedInOne?: readonly string[];
  /**
   * The errors' `code`s with which the server rolled a transaction back
   * for contention alone (a deadlock's victim, a serialization failure):
   * nothing in it changed, so the outbox's own transactions run again, until
   * `busyTimeoutMs`. Not `transaction(fn)`, whose body is the application's
   * code, nor a call joined to the application's transaction.
   */
  readonly rerun?: readonly string[];
  /**
   * `queues` with each count stopping at `?1` (so its cost does not grow
   * with the table), in the same rows. Optional: without it the counts are
   * exact whatever the limit.
   */
  readonly queuesUpTo?: string;
  /**
   * Whether a statement's error fails the whole transaction, which then
   * only rolls back (PostgreSQL). A call through `transaction(fn)`'s `tx`
   * that fails part-way without a statement failing then fails the
   * transaction too (`tx.enqueueBatch`), where SQLite's undoes the call
   * alone under a savepoint: no subtransaction, nor its two round trips, on
   * the batch's path.
   */
  readonly errorFailsTransaction?: boolean;
  /** The flow-control and schedule statements (`core/flow.ts`). */
  readonly flow?: FlowStatements;
  /** The inbox's statements (`inbox.ts`). */
  readonly inbox?: InboxStatements;
  /**
   * Whether one write transaction at a time holds the database (SQLite): the
   * lookup after an insert skipped for a taken key runs under the write lock
   * that insert took, so it always finds the row the insert met, and one
   * that finds none met no key: a trigger skipped the insert
   * (`RAISE(IGNORE)`), which running the round again cannot get past.
   * Absent (PostgreSQL): a purge may have deleted that row in between, and
   * the round runs again (`core/insert_or_find.ts`); an enqueue's statement
   * itself fails when a trigger skipped its insert.
   */
  readonly oneWriter?: boolean;
  /**
   * The fenced acknowledgement of one lease as one statement, outside a
   * transaction. Parameters: now (null: the server's clock), event id,
   * token, fence. Rows: `now`, and `acknowledged`: 1, or 0 with nothing
   * changed when the lease is stale or a lapsed last-attempt lease is to
   * become a dead letter first (the general path then acknowledges).
   */
  readonly acknowledgeInOne?: string;
  /**
   * `acknowledgeInOne` for several leases, given as a JSON array of
   * [event id, fence, token]: all of them, or none.
   */
  readonly acknowledgeAllInOne?: string;
  /**
   * Whether `enqueueBatch` and a group of `enqueue` calls run `insertAll`
   * or `insertAlike` as one statement outside a transaction (its own
   * commit), with a null now for the server's clock, instead of BEGIN, the
   * clock's read, the insert and COMMIT: for engines where every round trip
   * costs. A batch whose keys met existing events looks those up with one
   * more statement.
   */
  readonly insertAllInOne?: boolean;
  /**
   * `insertAlike` for a batch whose identities the outbox minted (UUIDv7,
   * unique by construction) and that has no dedup key, where the keys
   * table is written without the conflict check (PostgreSQL's
   * `outbox_keys`): every event is inserted, and a repeated identity fails
   * the statement. Its parameters differ: $1 now (or null), $2 the
   * payloads' JSON texts as the elements of one JSON array, $3 queue, $4
   * delay in ms, $5 max_attempts, $6 the identities as an array literal
   * (`{a,b}`); it answers one row, `ids`, the events' ids in array order,
   * comma-separated. Absent: `insertAlike`.
   */
  readonly insertMinted?: string;
  /**
   * Takes the lock that lines up openers setting the schema up, held to
   * the end of the transaction (instead of SQLite's schema steps): one
   * statement, or several run in order, which may also set what the wait
   * and the set-up run under.
   */
  readonly lock?: string | readonly string[];
  /** Creates what is missing of the schema, run under `lock`. */
  readonly setup?: string;
  /**
   * Answers `present`: whether the schema's version table exists; and
   * `events`, whether a table named `outbox_events` does (every version
   * creates both at once, so one without the other is not an outbox's).
   */
  readonly schemaPresent?: string;
  /** The schema version `setup` creates. */
  readonly version?: number;
  /**
   * For an engine that keeps freed pages in its file and may keep a
   * write-ahead log beside it (SQLite): the statements with which
   * `Outbox.maintain()` gives pages back, and the mark that `stats()`
   * reports the WAL. Absent (PostgreSQL, whose autovacuum reclaims space
   * itself): `maintain()` refuses and `stats()` reports no WAL.
   */
  readonly maintenance?: {
    /** Answers the page size in bytes. */
    readonly pageSize: string;
    /** Answers the number of pages in the file. */
    readonly pageCount: string;
    /** Answers the number of free pages. */
    readonly freelistCount: string;
    /** Answers the auto_vacuum mode: 0 none, 1 full, 2 incremental. */
    readonly autoVacuumMode: string;
    /** Sets auto_vacuum to incremental (a full `VACUUM` after it applies it). */
    readonly autoVacuum: string;
    /** Frees the free pages, one per step. */
    readonly incrementalVacuum: string;
  };
}

/** What `Outbox.enqueue` reports. */
export interface EnqueueResult {
  /** The event's id in this database (the original one when deduplicated). */
  readonly eventId: number;
  /**
   * The event's global identity, UUID text (the original one when
   * deduplicated): what recipients dedupe on.
   */
  readonly identity: string;
  /** `true` when `dedupKey` matched an existing event and nothing was inserted. */
  readonly deduplicated: boolean;
}

/** The state of an event. */
export type EventState = "pending" | "leased" | "done" | "dead";

/**
 * A connection's transaction as its engine reports it
 * (`Driver.transactionStatus`): `idle`, none is open (SQLite's
 * `sqlite3_get_autocommit()` is 1, PostgreSQL's ReadyForQuery status `I`);
 * `open`, one is open and can still commit (`T`); `failed`, one is open
 * but the server will only roll it back (PostgreSQL's `E`, after an error);
 * `lost`, the connection was lost inside it, so the server rolled it back
 * and the driver refuses its statements until the caller's `ROLLBACK`
 * (PostgreSQL: a terminated backend, a session timeout, a network failure).
 */
export type TransactionStatus = "idle" | "open" | "failed" | "lost";

/**
 * The inbox's statements one engine spells (SQLite's are `SQLITE_INBOX` in
 * `dialects/sqlite_inbox.ts`, PostgreSQL's `POSTGRES_INBOX` in
 * `dialects/postgres_inbox.ts`).
 *
 * @ignore
 */
export interface InboxStatements {
  /** Creates the inbox's table and index when missing (several statements). */
  readonly schema: string;
  /**
   * Records an identity (identity, fence, now) unless it is recorded
   * already: answers the row's `fence` when it inserted, no row when not.
   */
  readonly record: string;
  /**
   * Run when `record` inserted nothing: answers `fence` of the identity's
   * record, or no row. With one writer (SQLite, `Dialect.oneWriter`) it
   * reads (identity): no row means a trigger skipped the insert. Without
   * (PostgreSQL) it takes `record`'s parameters and, when no row holds the
   * identity any more, records it (`recorded` 1 then), failing when a
   * trigger skipped that insert (`core/insert_or_find.ts`).
   */
  readonly accepted: string;
  /** Deletes the records accepted before a time (epoch milliseconds). */
  readonly purge: string;
}

/**
 * The flow and schedule statements one engine spells (SQLite's are
 * `SQLITE_FLOW` in `dialects/sqlite_flow.ts`, PostgreSQL's
 * `POSTGRES_FLOW` in `dialects/postgres_flow.ts`).
 *
 * @ignore
 */
export interface FlowStatements {
  /** A queue's row (none when nothing is set). On PostgreSQL it locks it. */
  readonly settings: string;
  readonly allSettings: string;
  readonly pause: string;
  readonly limits: string;
  readonly prune: string;
  /**
   * A claim that took leases under a limit writes the queue's row: the
   * tokens left (null without a rate limit) and when.
   */
  readonly take: string;
  readonly schedule: string;
  readonly unschedule: string;
  readonly schedules: string;
  readonly anyDue: string;
  readonly due: string;
  readonly advance: string;
}
