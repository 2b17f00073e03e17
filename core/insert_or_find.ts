/**
 * Insert, or find what the insert met: the one home of the rounds that
 * every "insert unless the key is taken, then look up who took it" runs
 * (an enqueue's dedup key and identity, a batch's, an inbox's acceptance).
 *
 * The insert skips a row whose key is taken (`ON CONFLICT DO NOTHING`);
 * the lookup of the row that took it is a statement of its own, since on
 * PostgreSQL the insert can have waited for that row's transaction, which
 * committed after the insert's snapshot was taken. Under `READ COMMITTED`
 * the lookup's snapshot is fresh, so another transaction's purge that
 * deleted the row and committed in between leaves it nothing to find. The
 * key is free again then: the round is run again, and inserts. A further
 * round needs yet another transaction to take the key and a purge to take
 * it away again inside the same window, so a few rounds suffice.
 *
 * On SQLite this cannot happen: writers are serialized, and the insert
 * took the write lock that the lookup runs under, so no purge commits
 * between them (the dialect's `oneWriter`). A lookup that finds nothing
 * there means the insert met no key: a trigger skipped it with
 * `RAISE(IGNORE)`, which no further round gets past, so the call fails at
 * once with a {@linkcode ConstraintError} naming the table.
 *
 * On PostgreSQL a `BEFORE INSERT` trigger that returns NULL skips the
 * insert the same way, which a lookup cannot tell from a purge race. The
 * statement itself sees it (a key went in, its event did not) and fails
 * with {@linkcode SKIPPED_INSERT}, so its keys are undone with it, and the
 * call fails with the same {@linkcode ConstraintError}. The inbox's has no
 * second table to tell by: its lookup inserts again when it finds no row,
 * and fails with {@linkcode SKIPPED_INSERT} when that insert met no row and
 * stored none, or with {@linkcode RACED_INSERT} when it met one recorded
 * since (`dialects/postgres_inbox.ts`).
 *
 * @module
 */
import { ConstraintError, DedupRaceError, PostgresError } from "../errors.ts";

// SQLITE_CONSTRAINT_TRIGGER: what a trigger's RAISE(ABORT) refuses with.
const CONSTRAINT_TRIGGER = 1811;

/** Where a call inserts: for the error when a trigger skipped the insert. */
export interface InsertTarget {
  /** The table, e.g. `"outbox_events"`. */
  readonly table: string;
  /** The keys a row that took them would hold, e.g. `"its identity"`. */
  readonly keys: string;
  /** Whether the engine has one writer at a time (`Dialect.oneWriter`). */
  readonly oneWriter: boolean;
}

/**
 * What a PostgreSQL statement fails with when a trigger skipped an insert
 * its keys made: its cast to an integer of this text and a number fails
 * (SQLSTATE 22P02), at run time, only in that case.
 */
export const SKIPPED_INSERT = "leased_outbox: a trigger skipped an insert";

/**
 * What a PostgreSQL statement fails with, as for {@linkcode SKIPPED_INSERT},
 * when the insert it made because the row a purge deleted was gone met
 * another row that took the key since: a second race, which the statement
 * cannot read back.
 */
export const RACED_INSERT = "leased_outbox: a purge raced an insert";

/**
 * A PostgreSQL expression that fails its statement with `marker` (SQLSTATE
 * 22P02, the cast to an integer of text that is no number) when it is
 * evaluated, which is at run time only: it reads `at`, a value of the
 * statement's rows.
 */
export const failWith = (
  marker: typeof SKIPPED_INSERT | typeof RACED_INSERT,
  at: string,
): string => `('${marker} ' || ${at})::integer`;

/** How many rounds of insert and lookup a call runs before giving up. */
export const INSERT_ROUNDS = 5;

/**
 * Runs `round` until it settles: it inserts, looks up the rows its insert
 * met, and answers `undefined` when a lookup found nothing (the row was
 * deleted in between), which runs it again.
 *
 * @param op The call, for the error, e.g. `"enqueue"`.
 * @param target Where it inserts, and whether the engine has one writer.
 * @param round One insert and its lookup.
 * @returns What the first settled round answered.
 * @throws {DedupRaceError} When {@linkcode INSERT_ROUNDS} rounds in a row
 * found a row gone, or on PostgreSQL a round's statement failed with
 * {@linkcode RACED_INSERT}.
 * @throws {ConstraintError} When, with one writer, the lookup found nothing,
 * or on PostgreSQL the round's statement failed with
 * {@linkcode SKIPPED_INSERT}: a trigger skipped the insert.
 */
export async function insertOrFind<T>(
  op: string,
  target: InsertTarget,
  round: () => Promise<T | undefined>,
): Promise<T> {
  for (let n = 0; n < INSERT_ROUNDS; n++) {
    let settled: T | undefined;
    try {
      settled = await round();
    } catch (error) {
      if (error instanceof PostgresError && error.code === "22P02") {
        if (error.message.includes(SKIPPED_INSERT)) {
          throw skipped(op, target, "its function returned NULL", error);
        }
        if (error.message.includes(RACED_INSERT)) {
          throw new DedupRaceError(op, n + 1, { cause: error });
        }
      }
      throw error;
    }
    if (settled !== undefined) return settled;
    if (target.oneWriter) throw skipped(op, target, "RAISE(IGNORE)");
  }
  throw new DedupRaceError(op, INSERT_ROUNDS);
}

/** The error of a call whose insert a trigger skipped (`how`). */
function skipped(
  op: string,
  target: InsertTarget,
  how: string,
  cause?: unknown,
): ConstraintError {
  return new ConstraintError(
    `Cannot ${op} as a trigger on ${target.table} skipped its insert (${how}), and no row holds ${target.keys}: it was not stored, and calling again skips it again`,
    CONSTRAINT_TRIGGER,
    cause === undefined ? undefined : { cause },
  );
}
