/**
 * SQLite's write-ahead log, seen and kept small: how many bytes it holds,
 * whether a reader holds its checkpoints back, and a truncating checkpoint.
 * Read with `PRAGMA wal_checkpoint` (https://sqlite.org/pragma.html#pragma_wal_checkpoint),
 * whose answer is `busy`, `log` (frames in the WAL) and `checkpointed`
 * (frames copied into the database file).
 *
 * A reader's snapshot keeps the WAL frames after it from being copied into
 * the database file, and a WAL is only rewritten from its start once every
 * frame is copied: while one read transaction stays open, every commit
 * appends, and the WAL grows without bound.
 *
 * @module
 */
import type { Driver } from "./driver.ts";
import { SqliteError } from "./errors.ts";

/**
 * The `PRAGMA journal_size_limit` the drivers set on the connections they
 * open, in bytes: after a checkpoint resets the WAL (or a rollback journal
 * in `persist` mode), the next commit truncates its file to this size. Above
 * the WAL's size with SQLite's default auto-checkpoint (1,000 pages of 4,096
 * bytes, about 3.9 MiB), so a WAL in its usual cycle is never truncated, and
 * one that grew behind a long reader shrinks back once the reader leaves.
 *
 * @ignore
 */
export const JOURNAL_SIZE_LIMIT_BYTES = 8 * 1024 * 1024;

/** The write-ahead log of a SQLite database in WAL mode, from {@linkcode Outbox.stats}. */
export interface WalStats {
  /**
   * Bytes of the WAL since it was last reset: its 32-byte header plus each
   * frame's page and 24-byte header. `0` once it is truncated or reset.
   */
  readonly sizeBytes: number;
  /**
   * Whether a checkpoint just stopped short of the WAL's end because a
   * reader's snapshot still needs the pages it would overwrite: while it
   * stays `true`, the WAL grows with every commit (see `docs/wal.md`).
   */
  readonly checkpointHeldBack: boolean;
}

/**
 * Runs a checkpoint on `driver`'s connection and reads the WAL's state from
 * its answer. `"PASSIVE"` copies what no reader needs and waits for nothing
 * (cheap once the WAL is copied), and goes on to `"TRUNCATE"` when it
 * copied a WAL larger than {@linkcode JOURNAL_SIZE_LIMIT_BYTES} whole;
 * `"TRUNCATE"` also truncates the WAL file to zero bytes when no reader or
 * writer uses it, and is `"PASSIVE"` otherwise.
 *
 * @ignore
 * @param driver A SQLite connection, outside any transaction (a checkpoint
 * cannot run inside one).
 * @param mode The checkpoint's mode.
 * @returns The WAL's state; `undefined` when the database is not in WAL
 * mode, the connection is in a transaction or read-only, or another
 * connection was checkpointing at that moment.
 * @throws {SqliteError} When the checkpoint fails otherwise (e.g.
 * {@linkcode DatabaseMovedError} for `"TRUNCATE"` on a moved file).
 */
export async function checkpointWal(
  driver: Driver,
  mode: "PASSIVE" | "TRUNCATE",
): Promise<WalStats | undefined> {
  if (driver.inTransaction?.()) return undefined;
  const [journal] = await driver.query("PRAGMA journal_mode");
  if (journal?.["journal_mode"] !== "wal") return undefined;
  let row;
  try {
    [row] = await driver.query(`PRAGMA wal_checkpoint(${mode})`);
  } catch (error) {
    // SQLITE_READONLY: a read-only connection cannot checkpoint.
    if (error instanceof SqliteError && error.primaryCode === 8) {
      return undefined;
    }
    throw error;
  }
  const log = Number(row?.["log"]);
  const checkpointed = Number(row?.["checkpointed"]);
  // -1: the checkpoint lock was taken, so nothing was read.
  if (!(log >= 0 && checkpointed >= 0)) return undefined;
  const [page] = await driver.query("PRAGMA page_size");
  const pageSize = Number(page?.["page_size"]);
  const stats = {
    sizeBytes: log === 0 ? 0 : 32 + log * (pageSize + 24),
    checkpointHeldBack: checkpointed < log,
  };
  if (
    mode === "PASSIVE" && !stats.checkpointHeldBack &&
    stats.sizeBytes > JOURNAL_SIZE_LIMIT_BYTES
  ) {
    // A WAL that grew behind a reader now gone, and is all copied: the
    // commit that would bring it under journal_size_limit may be far off.
    // Truncating copies nothing more; it only fails while a connection
    // uses the WAL, and then the next write shrinks it anyway.
    return await checkpointWal(driver, "TRUNCATE").catch((error) => {
      if (error instanceof SqliteError) return stats;
      throw error;
    }) ?? stats;
  }
  return stats;
}
