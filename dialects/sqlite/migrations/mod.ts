/**
 * SQLite's schema upgrade steps, one frozen file each, numbered by the
 * version each starts from: step `n` brings a version `n` database to
 * version `n + 1`, inside the transaction that opens it, and
 * `outbox_schema` records `n + 1`. A new schema version adds its own file
 * here (`000n_what.ts`, never editing a released one) and its shape to
 * schema.sql, which stays the fresh database's schema;
 * tests/schema_test.ts checks that a fresh and an upgraded database match.
 *
 * @module
 */
import { MIGRATION_0001 } from "./0001_drop_ledger_triggers.ts";
import { MIGRATION_0002 } from "./0002_claimed_at_and_ledger_views.ts";
import { MIGRATION_0003 } from "./0003_identity.ts";
import { MIGRATION_0004 } from "./0004_identity_trigger.ts";
import { MIGRATION_0005 } from "./0005_dashboard_indexes.ts";
import { MIGRATION_0006 } from "./0006_flow_control.ts";
import { MIGRATION_0007 } from "./0007_ordering_leases.ts";
import { MIGRATION_0008 } from "./0008_id_floor.ts";

/**
 * The version table, which databases of releases that kept their version
 * in `PRAGMA user_version` (versions 1 to 4) lack. Frozen, as the steps.
 */
export const VERSION_TABLE_SQL = `CREATE TABLE outbox_schema (
  version INTEGER PRIMARY KEY,
  applied_at INTEGER NOT NULL
) STRICT;

`;

/**
 * The schema upgrades, keyed by the version each starts from.
 *
 * @ignore
 */
export const UPGRADES: ReadonlyMap<number, string> = new Map([
  [1, MIGRATION_0001],
  [2, MIGRATION_0002],
  [3, MIGRATION_0003],
  [4, MIGRATION_0004],
  [5, MIGRATION_0005],
  [6, MIGRATION_0006],
  [7, MIGRATION_0007],
  [8, MIGRATION_0008],
]);
