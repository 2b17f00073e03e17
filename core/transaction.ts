/**
 * The one transaction runner of the outbox, the inbox and the reader:
 * turn-taking on a shared connection, joining the application's
 * transaction, busy retry, deadlock reruns, `COMMIT` and `ROLLBACK`.
 *
 * Two rules hold here and nowhere else:
 * - **The engine's state is the truth.** After a statement inside a
 *   transaction fails, caught or not, the runner asks the engine
 *   ({@linkcode Driver.transactionStatus}) whether the transaction is still
 *   open and can still commit. Once it has ended or failed, every later
 *   statement of it throws {@linkcode TransactionEndedError} without
 *   running (never in autocommit), and no `COMMIT` is sent; once the
 *   connection was lost inside it, {@linkcode ConnectionLostError}.
 * - **Joining follows the caller, not the handle.** A call joins the
 *   application's transaction only when made inside a scope the application
 *   marked ({@linkcode withinApplication}); any other call waits for that
 *   transaction to end, then runs in its own.
 *
 * @module
 */
import {
  type Driver,
  type Row,
  type RunResult,
  type SqlValue,
  transactionControl,
} from "../driver.ts";
import {
  BusyError,
  ConnectionLostError,
  ConstraintError,
  PostgresError,
  TransactionEndedError,
} from "../errors.ts";
import type { Dialect, TransactionStatus } from "../types.ts";
import { checkFunction, describe } from "../validate.ts";
import { asyncContext } from "./async_context.ts";
import { jitteredWait, lockWait, nextBackoff } from "./backoff.ts";

const mutexes = new WeakMap<Driver, Mutex>();

// How often a call past its deadline in line looks again for a transaction
// body ahead of it, in milliseconds.
const LINE_POLL_MS = 10;

/**
 * A transaction of the runner's, as its statements see it: whether the
 * engine ended or failed it, and after which statement.
 */
interface Live {
  ended: boolean;
  failedBy: string;
  cause: unknown;
}

/**
 * The mutex of a connection, shared by every outbox, inbox and reader on it,
 * so their transactions never interleave.
 *
 * @ignore
 */
export function driverMutex(driver: Driver): Mutex {
  let mutex = mutexes.get(driver);
  if (mutex === undefined) mutexes.set(driver, mutex = new Mutex());
  return mutex;
}

/**
 * Serializes async sections: each runs after the previous one settles. A
 * connection's mutex also holds what its holders share about the
 * connection's transaction.
 *
 * @ignore
 */
export class Mutex {
  #tail: Promise<unknown> = Promise.resolve();
  #sections = 0;
  /**
   * Whether the transaction open on the connection is an outbox's or an
   * inbox's own (from its BEGIN to its COMMIT or ROLLBACK, when its holder
   * clears it), not the application's: a call made meanwhile does not join
   * it.
   */
  transaction = false;
  /** The runner's transaction (or joined section) running now, if any. */
  current: Live | undefined;
  /**
   * Application scopes ({@linkcode withinApplication}) running on this
   * connection: where the runtime has no `AsyncLocalStorage`, a call made
   * while any runs counts as made inside one.
   */
  applicationScopes = 0;
  /**
   * Transaction bodies (`transaction(fn)`'s and `accept`'s `fn`, the
   * application's code) running on this connection now.
   */
  bodies = 0;

  /**
   * Runs one try of a holder's BEGIN (`begin`) as its own transaction: from
   * the try on, until it fails; between tries, a transaction the
   * application opens is the application's.
   */
  async begin<T>(begin: () => Promise<T>): Promise<T> {
    this.transaction = true;
    try {
      return await begin();
    } catch (error) {
      this.transaction = false;
      throw error;
    }
  }

  /** Whether a section is running or waiting to run. */
  get held(): boolean {
    return this.#sections > 0;
  }

  run<T>(fn: () => Promise<T>): Promise<T> {
    this.#sections++;
    const result = this.#tail.then(fn);
    const settled = () => {
      this.#sections--;
    };
    this.#tail = result.then(settled, settled);
    return result;
  }
}

/**
 * A running `transaction(fn)`, `accept` or application scope, as the async
 * context of its `fn` sees it.
 */
interface Scope {
  readonly mutex: Mutex;
  readonly application: boolean;
  /** Which transaction's body it is (not for an application scope). */
  readonly body?: TransactionBody;
  open: boolean;
  readonly outer: Scope | undefined;
}

/**
 * Which scopes the current async context runs inside (see
 * {@linkcode asyncContext}). Where the runtime has none (browsers), a
 * nested call is not detected and waits, and an application scope covers
 * every call made while it runs.
 */
const scopes = asyncContext<Scope>();

async function inScope<T>(scope: Scope, fn: () => Promise<T>): Promise<T> {
  try {
    return await (scopes?.run(scope, fn) ?? fn());
  } finally {
    scope.open = false;
  }
}

function findScope(mutex: Mutex, application: boolean): Scope | undefined {
  for (let scope = scopes?.getStore(); scope; scope = scope.outer) {
    if (
      scope.open && scope.mutex === mutex && scope.application === application
    ) return scope;
  }
  return undefined;
}

/**
 * Which transaction a body runs for: an outbox's `transaction(fn)`, or an
 * inbox's `accept(fn)`.
 *
 * @ignore
 */
export type TransactionBody = "transaction" | "accept";

/**
 * Runs `fn`, the body of a transaction holding `mutex` (an outbox's
 * `transaction(fn)`, an inbox's `accept`: `body`), so that calls it makes
 * on the same connection can see, through
 * {@linkcode insideTransactionBody}, that they would wait for the
 * transaction that waits for them, and name it.
 *
 * @ignore
 */
export function runTransactionBody<T>(
  mutex: Mutex,
  body: TransactionBody,
  fn: () => Promise<T>,
): Promise<T> {
  const outer = scopes?.getStore();
  mutex.bodies++;
  return inScope({ mutex, application: false, body, open: true, outer }, fn)
    .finally(() => mutex.bodies--);
}

/**
 * Runs `fn` outside every transaction body and application scope the
 * current async context is in: what it starts (a processor's stopping:
 * its releases and acknowledgements) is the loop's own work, not a call
 * nested in the transaction of the code that asked for it, so it waits
 * for that transaction to end rather than being refused as nested.
 *
 * @ignore
 */
export function outsideTransactions<T>(fn: () => T): T {
  // run() with no store rather than exit(): in Deno, what exit() runs sees
  // the outer store again after its first await.
  return scopes === undefined
    ? fn()
    : scopes.run(undefined as unknown as Scope, fn);
}

/**
 * Which transaction's body, holding `mutex`, the current async context
 * runs inside (the innermost): `undefined` when none, and always where the
 * runtime has no `AsyncLocalStorage`.
 *
 * @ignore
 */
export function insideTransactionBody(
  mutex: Mutex,
): TransactionBody | undefined {
  return findScope(mutex, false)?.body;
}

/**
 * Runs `fn` as part of the application's transaction on the connection of
 * `mutex`: the outbox's and the inbox's calls made inside it join the
 * transaction the application has open there (and run on their own when
 * none is). Calls made anywhere else wait for that transaction to end.
 *
 * @ignore
 * @param op The public call, for the error.
 * @param mutex The connection's mutex.
 * @param fn The application's code.
 * @returns What `fn` returned.
 * @throws {TypeError} When `fn` is not a function.
 */
export async function withinApplication<T>(
  op: string,
  mutex: Mutex,
  fn: () => Promise<T>,
): Promise<T> {
  checkFunction(op, "fn", fn);
  const outer = scopes?.getStore();
  mutex.applicationScopes++;
  try {
    return await inScope({ mutex, application: true, open: true, outer }, fn);
  } finally {
    mutex.applicationScopes--;
  }
}

/** Whether the current async context is inside an application scope of `mutex`. */
function insideApplicationScope(mutex: Mutex): boolean {
  return scopes === undefined
    ? mutex.applicationScopes > 0
    : findScope(mutex, true) !== undefined;
}

/** What a call asks of {@linkcode TransactionRunner.run}. */
export interface RunOptions<T> {
  /**
   * Made inside the application's scope ({@linkcode TransactionRunner.joins}):
   * when the application's transaction is open, `fn` runs inside it under a
   * savepoint, skipping the line.
   */
  readonly join?: boolean;
  /**
   * The call as one statement, tried first outside any transaction; it
   * resolves to `undefined` (or fails with one of the dialect's
   * `refusedInOne` codes) when it refused, having changed nothing.
   */
  readonly inOne?: (() => Promise<T | undefined>) | undefined;
  /**
   * Whether a transaction the server rolled back for contention alone (the
   * dialect's `rerun` codes) runs again with `fn`: not when `fn` is the
   * application's code. @default {true}
   */
  readonly rerun?: boolean;
  /**
   * Whether `SQLITE_BUSY` met by any statement (a read transaction's)
   * runs the transaction again, until `busyTimeoutMs`. @default {false}
   */
  readonly rerunBusy?: boolean;
  /**
   * Runs instead when a constraint refused the transaction as a whole,
   * ending it with nothing committed (the engine says so): the COMMIT (a
   * deferred constraint), or a statement whose refusal rolled the whole
   * transaction back (SQLite's `RAISE(ROLLBACK)` in a trigger), where no
   * savepoint could undo the statement alone.
   */
  readonly refused?: (() => Promise<T>) | undefined;
  /** The statement that begins the transaction. @default {dialect.begin} */
  readonly begin?: string;
}

/**
 * The one transaction runner: one per outbox, inbox or reader, sharing the
 * connection's {@linkcode Mutex} with the others on it.
 *
 * @ignore
 */
export class TransactionRunner {
  /**
   * The connection as the runner's holder must use it: each statement sent
   * inside the runner's transaction is checked against the engine's state.
   */
  readonly driver: Driver;
  /** The connection's mutex. */
  readonly mutex: Mutex;
  /**
   * The calls that do not join the application's transaction, in the order
   * they were made. One that gives the connection up to the application's
   * transaction keeps its place: no later call commits before it, and
   * close() waits for it.
   */
  readonly line: Mutex = new Mutex();
  readonly #raw: Driver;
  readonly #sql: Dialect;
  readonly #busyTimeoutMs: number;
  readonly #waitNote: string;
  /** The savepoint statements, which a failed transaction still takes. */
  readonly #control: ReadonlySet<string>;

  /**
   * @param driver The connection.
   * @param sql The engine's statements.
   * @param busyTimeoutMs How long a call waits for a lock or for the
   * application's transaction, in milliseconds.
   * @param waitNote What the error of a call that waited past it adds
   * about which calls join the application's transaction.
   */
  constructor(
    driver: Driver,
    sql: Dialect,
    busyTimeoutMs: number,
    waitNote: string,
  ) {
    this.#raw = driver;
    this.#sql = sql;
    this.#busyTimeoutMs = busyTimeoutMs;
    this.#waitNote = waitNote;
    this.mutex = driverMutex(driver);
    this.#control = new Set([
      sql.savepoint,
      sql.releaseSavepoint,
      sql.rollbackToSavepoint,
      sql.joinSavepoint,
      sql.releaseJoin,
      sql.rollbackJoin,
    ]);
    this.driver = this.#guarded(driver);
  }

  /**
   * The engine's word on the connection's transaction; `undefined` when
   * the driver cannot say.
   */
  status(): TransactionStatus | undefined {
    const raw = this.#raw;
    if (raw.transactionStatus !== undefined) return raw.transactionStatus();
    if (raw.inTransaction !== undefined) {
      return raw.inTransaction() ? "open" : "idle";
    }
    return undefined;
  }

  /** Whether the engine says a transaction is open (or failed) on the connection. */
  #open(): boolean {
    const status = this.status();
    return status === "open" || status === "failed";
  }

  /** Whether the application has a transaction open on the connection. */
  inApplicationTransaction(): boolean {
    return this.#raw.inTransaction?.() === true && !this.mutex.transaction;
  }

  /**
   * Whether a call made now joins the application's transaction: it is
   * open, and the call is made inside the application's scope.
   */
  joins(): boolean {
    return insideApplicationScope(this.mutex) &&
      this.inApplicationTransaction();
  }

  /**
   * Throws when the runner's transaction running now has ended or failed
   * at the engine, or its connection was lost.
   *
   * @throws {TransactionEndedError} Naming `op` and the statement.
   * @throws {ConnectionLostError} When the connection was lost.
   */
  checkLive(op: string): void {
    const live = this.mutex.current;
    if (live !== undefined) this.#checkLive(op, live);
  }

  /**
   * Runs `fn` in a transaction of its own on the connection, in line after
   * the calls made before it; or, when `join` and the application's
   * transaction is open, inside it under a savepoint (`joined` is then
   * true). A call that finds the application's transaction open and does
   * not join it waits for it to end, until `busyTimeoutMs`.
   *
   * @throws {BusyError} When the database or the application's transaction
   * stays locked past `busyTimeoutMs`.
   * @throws {TransactionEndedError} When the engine ended or failed the
   * transaction and `fn` went on: nothing of it was committed.
   * @throws {ConnectionLostError} When the connection was lost inside the
   * transaction: nothing of it was committed.
   */
  run<T>(
    op: string,
    fn: (joined: boolean) => Promise<T>,
    options: RunOptions<T> = {},
  ): Promise<T> {
    // Counted from the call, so a wait in line for a call that waits for
    // the application's transaction counts towards this one's wait for it.
    const deadline = performance.now() + this.#busyTimeoutMs;
    // A call made inside the application's transaction must not wait for
    // one that waits for that transaction to end.
    if (options.join) return this.inTurn(op, fn, options, deadline);
    return this.#whenFree(
      this.line,
      op,
      deadline,
      () => this.inTurn(op, fn, options, deadline),
    );
  }

  /**
   * Runs `turn` when the call's turn at `mutex` (the runner's line, or the
   * connection's mutex) comes. Past `deadline`, a call still waiting while
   * a transaction body (the application's code, which may run for ever)
   * holds the connection gives up with BusyError, as it would waiting for
   * that transaction's lock on another connection; behind the outbox's own
   * statements alone it waits on.
   */
  #whenFree<T>(
    mutex: Mutex,
    op: string,
    deadline: number,
    turn: () => Promise<T>,
  ): Promise<T> {
    // Nothing ahead: no wait to bound (and no timer on the hot path).
    if (!mutex.held) return mutex.run(turn);
    // The turn's start clears the timer, and giving up sets no other: the
    // check runs only while the call waits.
    let gaveUp = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const queued = mutex.run(() => {
      if (gaveUp) return Promise.resolve(undefined as T);
      clearTimeout(timer);
      return turn();
    });
    return new Promise<T>((resolve, reject) => {
      queued.then(resolve, reject);
      const check = () => {
        if (this.mutex.bodies > 0) {
          gaveUp = true;
          reject(
            new BusyError(
              `Cannot ${op} as a transaction on this connection (its fn) ran for longer than ${this.#busyTimeoutMs} ms (busyTimeoutMs) ahead of it`,
            ),
          );
          return;
        }
        timer = setTimeout(check, LINE_POLL_MS);
      };
      timer = setTimeout(check, Math.max(0, deadline - performance.now()));
    });
  }

  /** {@linkcode TransactionRunner.run}, once the call's turn in line has come. */
  async inTurn<T>(
    op: string,
    fn: (joined: boolean) => Promise<T>,
    options: RunOptions<T>,
    deadline: number = performance.now() + this.#busyTimeoutMs,
  ): Promise<T> {
    const { join = false, inOne, refused } = options;
    for (let retried = false;; retried = true) {
      // A held mutex may be this connection's own transaction, which a
      // queued call just waits for; after a retry it is the application's.
      if (
        !join && (retried ||
          !this.mutex.held && this.inApplicationTransaction())
      ) {
        await this.#untilApplicationCommits(op, deadline, retried);
      }
      const outcome = await this.#whenFree(
        this.mutex,
        op,
        deadline,
        async (): Promise<
          { value: T } | { refused: true } | null
        > => {
          if (this.inApplicationTransaction()) {
            return join ? { value: await this.#joined(fn) } : null;
          }
          if (inOne !== undefined) {
            let value: T | undefined;
            try {
              value = await inOne();
            } catch (error) {
              if (!this.#sql.refusedInOne?.includes(errorCode(error))) {
                throw error;
              }
            }
            if (value !== undefined) return { value };
          }
          return await this.#own(op, fn, options);
        },
      );
      // Still this call's turn in line, out of the connection's mutex.
      if (outcome !== null) {
        return "refused" in outcome ? await refused!() : outcome.value;
      }
    }
  }

  /**
   * Runs `fn` in a transaction of its own, under the mutex: `null` when the
   * application began a transaction first.
   */
  async #own<T>(
    op: string,
    fn: (joined: boolean) => Promise<T>,
    { rerun = true, rerunBusy = false, refused, begin }: RunOptions<T>,
  ): Promise<{ value: T } | { refused: true } | null> {
    const sql = this.#sql;
    const busyDeadline = performance.now() + this.#busyTimeoutMs;
    for (let backoffMs = 1;; backoffMs = nextBackoff(backoffMs)) {
      // The application may have begun a transaction on the connection
      // while this call awaited (its one statement, a rerun's or a busy
      // retry's backoff): a BEGIN now would run inside it, and COMMIT the
      // application's writes. Wait for it to end, as a call that finds one
      // does.
      const began = await this.#untilNotBusy(
        op,
        busyDeadline,
        begin ?? sql.begin,
        () => this.inApplicationTransaction(),
        true,
      );
      if (!began) return null;
      const live: Live = { ended: false, failedBy: "", cause: undefined };
      let committing = false;
      this.mutex.current = live;
      try {
        const value = await fn(false);
        committing = true;
        this.#checkLive(op, live);
        await this.#untilNotBusy(op, busyDeadline, sql.commit);
        return { value };
      } catch (error) {
        // Once the engine ended it, a ROLLBACK would find none, or one the
        // application began since.
        if (!live.ended && this.status() !== "idle") {
          await this.#raw.run(sql.rollback).catch(() => {});
        }
        // A deferred constraint is checked at COMMIT, past every savepoint,
        // and a RAISE(ROLLBACK) ends the transaction, savepoints and all:
        // the caller may run the work again otherwise, once the engine no
        // longer says a transaction is open (live.ended: it said idle), so
        // that nothing of it can commit twice.
        if (
          refused !== undefined && (committing || live.ended) &&
          refusedByConstraint(error) && !this.#open()
        ) return { refused: true };
        const remainingMs = busyDeadline - performance.now();
        const contention = rerun &&
            sql.rerun?.includes(errorCode(error)) === true ||
          rerunBusy && error instanceof BusyError;
        // Contention that outlasts busyTimeoutMs is a BusyError, whatever
        // form it took: a lock held, or (PostgreSQL) a deadlock whose
        // victim this transaction kept being.
        if (!contention) throw error;
        if (remainingMs <= 0) throw this.#busy(op, error);
        // As for a busy database: the winner goes on.
        if (error instanceof BusyError) {
          await lockWait(this.#raw, remainingMs, backoffMs);
        } else await jitteredWait(remainingMs, backoffMs);
      } finally {
        this.mutex.current = undefined;
        this.mutex.transaction = false;
      }
    }
  }

  /**
   * Runs `fn` inside the application's open transaction, under a savepoint
   * so that a failure undoes the call's statements and nothing else; the
   * application's `COMMIT` or `ROLLBACK` decides the rest. No retry on
   * `SQLITE_BUSY`: inside a transaction that began deferred, waiting for the
   * write lock can deadlock with the writer holding it.
   */
  async #joined<T>(fn: (joined: boolean) => Promise<T>): Promise<T> {
    const sql = this.#sql;
    await this.#raw.run(sql.joinSavepoint);
    const live: Live = { ended: false, failedBy: "", cause: undefined };
    this.mutex.current = live;
    try {
      const value = await fn(true);
      await this.#raw.run(sql.releaseJoin);
      return value;
    } catch (error) {
      if (!live.ended) {
        await this.#raw.run(sql.rollbackJoin).catch(() => {});
        await this.#raw.run(sql.releaseJoin).catch(() => {});
      }
      throw error;
    } finally {
      this.mutex.current = undefined;
    }
  }

  /**
   * Throws when the engine says `live` has ended or failed (remembering an
   * end: a transaction the application begins later is not this one).
   */
  #checkLive(op: string, live: Live): void {
    if (!live.ended) {
      const status = this.status();
      if (status === "open" || status === undefined) return;
      if (status === "lost") throw connectionLost(op, live.cause);
      if (status === "idle") live.ended = true;
    }
    throw new TransactionEndedError(
      op,
      live.failedBy,
      live.ended ? "ended" : "failed",
      { cause: live.cause },
    );
  }

  /** After `sql` failed inside `live`: asks the engine what is left of it. */
  #failed(live: Live, sql: string, error: unknown): void {
    if (error instanceof TransactionEndedError) return;
    const status = this.status();
    if (status === "open" || status === undefined) return;
    if (status === "idle") live.ended = true;
    live.failedBy = sql;
    live.cause = error;
  }

  /** `driver` with its statements checked inside the runner's transactions. */
  #guarded(raw: Driver): Driver {
    const statement = async <R>(
      sql: string,
      send: () => Promise<R>,
    ): Promise<R> => {
      const live = this.mutex.current;
      // The savepoints' own statements still run in a failed transaction:
      // a rollback to one is what revives it.
      if (live === undefined || this.#control.has(sql)) return await send();
      this.#checkLive("run the statement", live);
      try {
        return await send();
      } catch (error) {
        this.#failed(live, sql, error);
        throw error;
      }
    };
    const view: Driver = {
      query: (sql, params) => statement(sql, () => raw.query(sql, params)),
      run: (sql, params) => statement(sql, () => raw.run(sql, params)),
      exec: (sql) => statement(sql, () => raw.exec(sql)),
      close: () => raw.close(),
      ...(raw.dialect === undefined ? {} : { dialect: raw.dialect }),
      ...(raw.busyWait === undefined
        ? {}
        : { busyWait: (ms: number) => raw.busyWait!(ms) }),
      ...(raw.watchEnqueues === undefined
        ? {}
        : { watchEnqueues: (l: () => void) => raw.watchEnqueues!(l) }),
      ...(raw.inTransaction === undefined
        ? {}
        : { inTransaction: () => raw.inTransaction!() }),
      ...(raw.transactionStatus === undefined
        ? {}
        : { transactionStatus: () => raw.transactionStatus!() }),
    };
    return view;
  }

  /**
   * Waits, polling with jittered backoff, until no transaction the
   * application began is open on the connection; after a retry (`pause`)
   * it waits once in any case, so a call that keeps finding the
   * application's transaction inside the mutex still meets its deadline.
   */
  async #untilApplicationCommits(
    op: string,
    deadline: number,
    pause: boolean,
  ): Promise<void> {
    for (
      let backoffMs = 1;
      pause || this.inApplicationTransaction();
      backoffMs = nextBackoff(backoffMs), pause = false
    ) {
      const remainingMs = deadline - performance.now();
      if (remainingMs <= 0) {
        throw new BusyError(
          `Cannot ${op} as the application's transaction on this connection stayed open for ${this.#busyTimeoutMs} ms: ${this.#waitNote}`,
        );
      }
      await jitteredWait(remainingMs, backoffMs);
    }
  }

  /**
   * Runs `sql` (a BEGIN or COMMIT), retrying `SQLITE_BUSY` until
   * `deadline`. Resolves to `false`, having run nothing more, when `yieldTo`
   * says so before a try (an application transaction opened meanwhile).
   * `begins`: each try is the holder's own BEGIN (`Mutex.begin`).
   */
  async #untilNotBusy(
    op: string,
    deadline: number,
    sql: string,
    yieldTo?: () => boolean,
    begins = false,
  ): Promise<boolean> {
    for (let backoffMs = 1;; backoffMs = nextBackoff(backoffMs)) {
      if (yieldTo?.()) return false;
      try {
        const run = () => this.#raw.run(sql);
        await (begins ? this.mutex.begin(run) : run());
        return true;
      } catch (error) {
        if (!(error instanceof BusyError)) throw error;
        const remainingMs = deadline - performance.now();
        if (remainingMs <= 0) throw this.#busy(op, error);
        await lockWait(this.#raw, remainingMs, backoffMs);
      }
    }
  }

  #busy(op: string, error: unknown): BusyError {
    return error instanceof BusyError
      ? new BusyError(
        `Cannot ${op} as the database stayed locked for ${this.#busyTimeoutMs} ms`,
        error.code,
        { cause: error },
      )
      : new BusyError(
        `Cannot ${op} as its transaction was rolled back for contention (${
          errorCode(error)
        }) and run again for ${this.#busyTimeoutMs} ms`,
        5,
        { cause: error },
      );
  }
}

/**
 * The error of a call that finds the connection lost inside its
 * transaction: no statement failed, the server rolled the transaction back
 * when the session ended. `cause`: the error of the statement that met the
 * loss, when one did (not when the session ended while the transaction sat
 * idle, as `idle_in_transaction_session_timeout` ends it).
 */
function connectionLost(op: string, cause: unknown): ConnectionLostError {
  return new ConnectionLostError(
    `Cannot ${op} as the connection was lost inside the transaction: the server rolled it back, and nothing of it commits`,
    cause instanceof ConnectionLostError ? cause.code : undefined,
    cause === undefined ? undefined : { cause },
  );
}

/** The `run` and `query` of a transaction handle. */
export interface TransactionStatements {
  /** Runs one of the caller's statements inside the transaction. */
  run(sql: string, params?: readonly SqlValue[]): Promise<RunResult>;
  /** Runs one of the caller's queries inside the transaction. */
  query(sql: string, params?: readonly SqlValue[]): Promise<Row[]>;
}

/**
 * The `run` and `query` of a transaction handle (the outbox's and the
 * inbox's): each checks that the handle's transaction is still live, then
 * refuses transaction control before the statement reaches the driver.
 *
 * @ignore
 * @param driver The connection the transaction runs on (a runner's).
 * @param inside Throws when the handle's transaction has ended.
 * @returns The two methods.
 */
export function transactionStatements(
  driver: Driver,
  inside: (method: string) => void,
): TransactionStatements {
  return {
    run: async (sql, params) => {
      inside("run");
      checkStatement("run", sql, params);
      return await driver.run(sql, params);
    },
    query: async (sql, params) => {
      inside("query");
      checkStatement("query", sql, params);
      return await driver.query(sql, params);
    },
  };
}

/**
 * Refuses SQL that is not a string, parameters that are not an array, and
 * SQL whose first keyword begins, ends or rolls back a transaction, before
 * it runs: the one home of this check for the outbox's and the inbox's
 * transactions.
 */
function checkStatement(
  op: string,
  sql: unknown,
  params: unknown,
): void {
  if (typeof sql !== "string") {
    throw new TypeError(
      `Cannot ${op} as 'sql' must be a string: current value is ${
        describe(sql)
      }`,
    );
  }
  if (params !== undefined && !Array.isArray(params)) {
    throw new TypeError(
      `Cannot ${op} as 'params' must be an array: current value is ${
        describe(params)
      }`,
    );
  }
  const keyword = transactionControl(sql);
  if (keyword !== "") {
    throw new RangeError(
      `Cannot ${op} as 'sql' must not control the transaction: found ${keyword}; the transaction commits when fn returns and rolls back when it throws`,
    );
  }
}

/** Whether a constraint refused the statement, on either engine. */
export function refusedByConstraint(error: unknown): boolean {
  return error instanceof ConstraintError ||
    error instanceof PostgresError && error.code.startsWith("23");
}

/** An error's `code` (a SQLSTATE on PostgreSQL), as text, or "" when none. */
export function errorCode(error: unknown): string {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === "string" ? code : "";
}
