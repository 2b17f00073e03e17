/**
 * The one table of drivers every contract test runs against: any divergence
 * between rows is a bug in one of our drivers.
 */
import { join } from "node:path";
import type { Driver } from "../driver.ts";
import { connectPostgres } from "../drivers/postgres.ts";
import { openNodeSqlite } from "../drivers/node_sqlite.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { sharedPostgres } from "../scripts/postgres_server.ts";

/** Two or more connections to one fresh database. */
export interface Connections {
  readonly drivers: readonly Driver[];
  /** Closes every connection and removes the database's files. */
  close(): Promise<void>;
}

/** One row of the table. */
export interface DriverCase {
  readonly name: string;
  /** The engine: suites written in one engine's SQL run on its rows only. */
  readonly engine: "sqlite" | "postgres";
  /** Whether the database lives in a file (durability, crash, multi-process). */
  readonly file: boolean;
  /** Opens `count` connections (default 2) to one fresh database. */
  open(count?: number): Promise<Connections>;
}

/** Opens `count` connections with `open`, closing the ones opened on failure. */
async function connect(
  open: () => Promise<Driver>,
  cleanup: () => Promise<void> = () => Promise.resolve(),
  count = 2,
): Promise<Connections> {
  const drivers: Driver[] = [];
  const close = async () => {
    await Promise.all(drivers.map((driver) => driver.close()));
    await cleanup();
  };
  try {
    for (let i = 0; i < count; i++) drivers.push(await open());
  } catch (error) {
    await close();
    throw error;
  }
  return { drivers, close };
}

/** A fresh directory for one database, removed with its files on cleanup. */
async function tempDatabase(): Promise<
  { path: string; cleanup(): Promise<void> }
> {
  const dir = await Deno.makeTempDir({ prefix: "outbox_contract_" });
  return {
    path: join(dir, "outbox.db"),
    cleanup: () => Deno.remove(dir, { recursive: true }),
  };
}

/** The PostgreSQL row: a fresh schema of the shared test server. */
export const POSTGRES_DRIVER: DriverCase = {
  name: "postgres",
  engine: "postgres",
  file: true,
  async open(count) {
    const server = await sharedPostgres();
    const schema = await server.createSchema();
    return connect(
      () => connectPostgres(server.url, { schema }),
      undefined,
      count,
    );
  },
};

/** Every SQLite row, then PostgreSQL's. */
export const DRIVERS: readonly DriverCase[] = [
  {
    name: "wasm memory",
    engine: "sqlite",
    file: false,
    open(count) {
      const name = `file:/${crypto.randomUUID()}?vfs=memdb`;
      return connect(() => openSqliteWasm(name), undefined, count);
    },
  },
  {
    name: "wasm file",
    engine: "sqlite",
    file: true,
    async open(count) {
      const { path, cleanup } = await tempDatabase();
      // The rollback journal; the default for a new file is the next row's.
      return connect(
        () => openSqliteWasm(path, { journalMode: "truncate" }),
        cleanup,
        count,
      );
    },
  },
  {
    name: "wasm file (wal)",
    engine: "sqlite",
    file: true,
    async open(count) {
      const { path, cleanup } = await tempDatabase();
      return connect(
        () => openSqliteWasm(path, { journalMode: "wal" }),
        cleanup,
        count,
      );
    },
  },
  {
    name: "node:sqlite file",
    engine: "sqlite",
    file: true,
    async open(count) {
      const { path, cleanup } = await tempDatabase();
      return connect(() => openNodeSqlite(path), cleanup, count);
    },
  },
  POSTGRES_DRIVER,
];

/** The SQLite rows, for suites written in SQLite's SQL. */
export const SQLITE_DRIVERS: readonly DriverCase[] = DRIVERS.filter((d) =>
  d.engine === "sqlite"
);
