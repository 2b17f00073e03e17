/**
 * Opening a SQLite database's outbox schema: a new file gets
 * `auto_vacuum = INCREMENTAL` before its first table, then the schema
 * (`schema.sql`) is created, or an older one upgraded step by step, in the
 * opening transaction, and the connection is checked to be writable.
 *
 * @module
 */
import { type Driver, integerOf } from "../../driver.ts";
import { BusyError, SchemaVersionError, SqliteError } from "../../errors.ts";
import { SCHEMA_SQL, SCHEMA_VERSION } from "../../schema.ts";
import type { OutboxCore } from "../../core/context.ts";
import { SQL } from "../sqlite.ts";
import { UPGRADES, VERSION_TABLE_SQL } from "./migrations/mod.ts";

/** Creates, upgrades or checks the schema of a SQLite outbox at open. */
export async function openSqlite(core: OutboxCore): Promise<void> {
  const driver = core.driver;
  await core.mutex.run(async () => {
    try {
      const [tables] = await driver.query(SQL.tableCount);
      if (Number(tables?.["n"]) === 0) await driver.exec(SQL.autoVacuum);
    } catch (error) {
      // Locked: another connection is writing, so the database exists.
      if (!(error instanceof BusyError)) throw error;
    }
  });
  await core.write("open outbox", async () => {
    await migrate(driver);
    try {
      await driver.run(SQL.writable);
    } catch (error) {
      if (error instanceof SqliteError && error.primaryCode === 8) {
        throw new Error(
          "Cannot open outbox as the connection is read-only: its calls take the write lock (claims, acknowledgements and the admin calls first make lapsed last-attempt leases dead letters)",
          { cause: error },
        );
      }
      throw error;
    }
  }, { expire: false });
}

/**
 * Creates or upgrades the schema inside the opening transaction: concurrent
 * first opens take turns on the write lock, so each version is applied and
 * recorded once.
 */
export async function migrate(driver: Driver): Promise<void> {
  const tables = new Set(
    (await driver.query(SQL.tables)).map((row) => String(row["name"])),
  );
  let version: number;
  if (tables.has("outbox_schema")) {
    const [row] = await driver.query(SQL.schemaVersion);
    version = row === undefined ? 0 : integerOf(row, "version");
  } else if (tables.has("outbox_events")) {
    await checkLegacyTable(driver);
    const [shape] = await driver.query(SQL.legacyShape);
    version = Number(shape?.["identity"]) > 0
      ? 4
      : Number(shape?.["claimed_at"]) > 0
      ? 3
      : Number(shape?.["triggers"]) > 0
      ? 1
      : 2;
    // The older release wrote this user_version; one that differs is the
    // application's, set after that release last opened the file.
    const [row] = await driver.query(SQL.userVersion);
    if (row !== undefined && integerOf(row, "user_version") === version) {
      await driver.run(SQL.resetUserVersion);
    }
    await driver.exec(VERSION_TABLE_SQL);
    await driver.run(SQL.recordVersion, [version]);
  } else {
    await driver.exec(SCHEMA_SQL);
    return;
  }
  if (version > SCHEMA_VERSION) {
    throw new SchemaVersionError(version, SCHEMA_VERSION);
  }
  for (; version < SCHEMA_VERSION; version++) {
    const step = UPGRADES.get(version);
    if (step === undefined) {
      throw new SchemaVersionError(version, SCHEMA_VERSION);
    }
    await driver.exec(step);
    await driver.run(SQL.recordVersion, [version + 1]);
  }
}

/**
 * Every column of version 1's `outbox_events`, which every later version
 * kept: a table of that name without them is the application's own, not
 * an outbox of a release before `outbox_schema`.
 */
const LEGACY_COLUMNS = [
  "id",
  "queue",
  "state",
  "payload",
  "dedup_key",
  "ordering_key",
  "due_at",
  "lease_until",
  "token",
  "fence",
  "attempt",
  "max_attempts",
  "last_error",
  "created_at",
  "updated_at",
  "done_at",
];

/**
 * Refuses an `outbox_events` table that is not an outbox's, before any
 * upgrade step would fail on it with an engine error naming one column.
 */
async function checkLegacyTable(driver: Driver): Promise<void> {
  const columns = new Set(
    (await driver.query(SQL.legacyColumns)).map((row) => String(row["name"])),
  );
  const missing = LEGACY_COLUMNS.filter((name) => !columns.has(name));
  if (missing.length === 0) return;
  throw new Error(
    `Cannot open outbox as the database's table outbox_events is not an outbox's: it has no column ${
      missing.map((name) => `'${name}'`).join(", ")
    } (and no outbox_schema table); rename that table, or keep the outbox in another database`,
  );
}
