/**
 * File maintenance on an engine that keeps freed pages in its file
 * (SQLite, through its dialect's `maintenance` statements): giving pages
 * back after a purge, and the WAL checkpoint glue of `maintain()` and
 * `stats()`.
 *
 * @module
 */
import { checkBoolean, checkOptions } from "../validate.ts";
import { checkpointWal, type WalStats } from "../wal.ts";
import type { OutboxCore } from "./context.ts";
import type { Stats } from "./shapes.ts";

/** What {@linkcode maintain} reports (`Outbox.maintain`). */
interface Maintained {
  reclaimedBytes: number;
  freePages: number;
  autoVacuum: "none" | "full" | "incremental";
  wal?: WalStats;
}

/** Gives freed pages back to the file system (`Outbox.maintain`). */
export async function maintain(
  core: OutboxCore,
  options: { readonly vacuum?: boolean },
): Promise<Maintained> {
  const op = "maintain";
  checkOptions(op, options, ["vacuum"]);
  checkBoolean(op, "vacuum", options.vacuum, false);
  if (core.isClosed()) throw new Error(`Cannot ${op} as the outbox is closed`);
  const sql = core.sql.maintenance;
  if (sql === undefined) {
    // PostgreSQL's autovacuum returns freed space to the table itself.
    throw new Error(
      `Cannot ${op} as it concerns SQLite's free pages: PostgreSQL's autovacuum reclaims space itself`,
    );
  }
  const driver = core.driver;
  const read = async (pragma: string) =>
    Number(Object.values((await driver.query(pragma))[0] ?? {})[0]);
  return await core.mutex.run(async () => {
    const pageSize = await read(sql.pageSize);
    const pagesBefore = await read(sql.pageCount);
    // Neither runs inside a transaction: VACUUM cannot, and
    // incremental_vacuum takes the write lock itself.
    if (options.vacuum) {
      await driver.exec(`${sql.autoVacuum}; VACUUM`);
    } else {
      // It frees one page per step: a query steps it to the end, where
      // exec would stop after the first.
      await driver.query(sql.incrementalVacuum);
    }
    const mode = await read(sql.autoVacuumMode);
    const wal = await checkpointWal(driver, "TRUNCATE");
    return {
      reclaimedBytes: Math.max(
        0,
        (pagesBefore - await read(sql.pageCount)) * pageSize,
      ),
      freePages: await read(sql.freelistCount),
      autoVacuum: mode === 2 ? "incremental" : mode === 1 ? "full" : "none",
      ...(wal === undefined ? {} : { wal }),
    };
  });
}

/**
 * `stats` with the WAL's size after a passive checkpoint, on an engine
 * with file maintenance in WAL mode; `stats` as it is otherwise.
 */
export async function withWal(core: OutboxCore, stats: Stats): Promise<Stats> {
  if (core.sql.maintenance === undefined) return stats;
  const wal = await core.mutex.run(() => checkpointWal(core.driver, "PASSIVE"));
  return wal === undefined ? stats : { ...stats, wal };
}
