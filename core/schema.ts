/**
 * Opening an outbox's schema on either engine: an engine whose dialect
 * sets its schema up itself (`setup`, PostgreSQL) creates or upgrades it
 * under the dialect's lock; SQLite's numbered steps run in
 * `dialects/sqlite/migrate.ts`.
 *
 * @module
 */
import { SchemaVersionError } from "../errors.ts";
import { openSqlite } from "../dialects/sqlite/migrate.ts";
import type { OutboxCore } from "./context.ts";

/**
 * Creates, upgrades or checks the outbox's schema, then listens for other
 * connections' enqueues when the driver can.
 *
 * @returns What stops listening, when it listens.
 */
export async function openSchema(
  core: OutboxCore,
): Promise<(() => Promise<void>) | undefined> {
  if (core.sql.setup === undefined) {
    await openSqlite(core);
    return undefined;
  }
  return await setUp(core);
}

/**
 * Opens on an engine whose dialect sets its schema up itself (PostgreSQL):
 * creates or upgrades it under the dialect's lock, then listens for other
 * connections' enqueues when the driver can.
 */
async function setUp(
  core: OutboxCore,
): Promise<(() => Promise<void>) | undefined> {
  const driver = core.driver;
  const sql = core.sql;
  await core.write("open outbox", async () => {
    const version = async () => {
      const [present] = await driver.query(sql.schemaPresent!);
      if (!present?.["present"]) {
        if (present?.["events"]) {
          throw new Error(
            "Cannot open outbox as the schema's table outbox_events is not an outbox's: there is no outbox_schema table beside it, which every version of the outbox creates with it; rename that table, or keep the outbox in another schema (the `schema` option)",
          );
        }
        return 0;
      }
      const [row] = await driver.query(sql.schemaVersion!);
      return Number(row?.["version"] ?? 0);
    };
    // Set-up takes locks that stop running workers for a moment: only
    // an opener that finds the schema missing or older takes them (one
    // that finds it newer refuses it at once, waiting for nothing).
    let found = await version();
    if (found > sql.version!) {
      throw new SchemaVersionError(found, sql.version!);
    }
    if (found < sql.version!) {
      for (const statement of [sql.lock!].flat()) {
        await driver.run(statement);
      }
      found = await version();
      if (found < sql.version!) {
        await driver.exec(sql.setup!);
        found = await version();
      }
    }
    if (found !== sql.version) {
      throw new SchemaVersionError(found, sql.version!);
    }
  }, { expire: false });
  return await driver.watchEnqueues?.(() => core.enqueued());
}
