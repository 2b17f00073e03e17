/**
 * The demo's seam between engines: every process (the demo, the producer,
 * the workers) reaches its database through an {@linkcode Engine}, which
 * holds the little SQL that differs between SQLite and PostgreSQL. The
 * recipient keeps a database of its own on the same engine
 * ({@linkcode Engine.recipient}): a SQLite file beside the outbox's, or a
 * PostgreSQL schema beside the outbox's schema.
 *
 * PostgreSQL's modules load only when the demo runs on it, so the SQLite
 * demo fetches no `pg`.
 *
 * @module
 */
import { BusyError, type Driver, Outbox, type OutboxOptions } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";

/** The queue the demo's order events go to. */
export const QUEUE = "orders";

/** Where the demo's outbox lives and the SQL that differs there. */
export interface Engine {
  /** The engine and its durability, as printed in the demo's header. */
  readonly name: string;
  /** Where the run's outbox is, for the header. */
  readonly where: string;
  /** Where the seed scenario runs, for its heading. */
  readonly seedWhere: string;
  /**
   * The command-line arguments that lead the child process `name` here,
   * through a path {@linkcode Engine.hold} can hold.
   */
  argsFor(name: string): string[];
  /** The demo's own tables, created before the run. */
  readonly setupSql: readonly string[];
  /** Inserts an order (customer, total_cents, poison) returning its `id`. */
  readonly insertOrderSql: string;
  /** An expression over `e.payload`: 1 for a poison order, else 0. */
  readonly poisonSql: string;
  /**
   * The outbox's events in every state, for the demo's own reads
   * (PostgreSQL keeps done events in a table of their own).
   */
  readonly eventsTable: string;
  /**
   * Opens an outbox on a fresh connection; `name` labels a worker's
   * connections where the engine can show them.
   */
  openOutbox(options?: OutboxOptions, name?: string): Promise<Outbox>;
  /** Opens an outbox of its own for the seed scenario, on `now`'s clock. */
  openSeedOutbox(now: () => number): Promise<Outbox>;
  /** A plain connection, for the demo's reads. */
  openMonitor(): Promise<Driver>;
  /**
   * Makes the statements of the process `name` wait (on SQLite, every
   * writer's: the demo takes the write lock), so that a worker stopped now
   * sits between its deliveries and their acknowledgements.
   */
  hold(name: string, outbox: Outbox, monitor: Driver): Promise<Hold>;
  /** The engine's own check of the outbox's storage: `"ok"` when sound. */
  integrity(monitor: Driver): Promise<string>;
  /** The recipient's own database, on the same engine. */
  readonly recipient: Recipient;
  /** Drops what the demo made, unless it was asked to keep it. */
  close(): Promise<void>;
}

/** The recipient's database: a second one, with its inbox. */
export interface Recipient {
  /** Where it is, for the header. */
  readonly where: string;
  /** Opens a connection to it. */
  open(): Promise<Driver>;
  /** The recipient's business table: one row per shipped order. */
  readonly shipmentsSql: string;
  /**
   * Records an order's shipment (identity, order id, fence), counting
   * applications rather than inserting once, so that the demo would see an
   * effect applied twice if the inbox ever let one through.
   */
  readonly shipSql: string;
  /** The engine's own check of the recipient's storage: `"ok"` when sound. */
  integrity(db: Driver): Promise<string>;
}

/** What {@linkcode Engine.hold} holds. */
export interface Hold {
  /**
   * Called once the process is stopped: whether it is stopped outside any
   * transaction (inside one, it would keep the others from what it holds).
   * On SQLite this lets the writers go; on PostgreSQL the process's own
   * statements stay held until {@linkcode Hold.resume}.
   */
  stopped(): Promise<boolean>;
  /** Lets the process's held statements go, right before it resumes. */
  resume(): void;
}

/** Opens one SQLite connection to `path`: the product's default driver. */
export function openDatabase(path: string): Promise<Driver> {
  return openSqliteWasm(path);
}

/** The demo on a SQLite file at `path`, the seed scenario beside it. */
export function sqliteEngine(path: string): Engine {
  const seedPath = `${path.replace(/[^/]*$/, "")}seed.db`;
  const recipientPath = `${path}.recipient.db`;
  const integrity = async (db: Driver) =>
    String((await db.query("PRAGMA integrity_check"))[0]?.["integrity_check"]);
  return {
    name:
      "SQLite WASM 3.54.1 + Deno file VFS (journal_mode=wal, synchronous=full)",
    where: path,
    seedWhere: seedPath,
    argsFor: () => ["--db", path],
    setupSql: [
      `CREATE TABLE IF NOT EXISTS orders (
        id INTEGER PRIMARY KEY,
        customer TEXT NOT NULL,
        total_cents INTEGER NOT NULL,
        poison INTEGER NOT NULL
      ) STRICT`,
      "CREATE TABLE IF NOT EXISTS demo_probe (id INTEGER PRIMARY KEY, at INTEGER) STRICT",
    ],
    insertOrderSql:
      "INSERT INTO orders (customer, total_cents, poison) VALUES (?, ?, ?) RETURNING id",
    poisonSql: "coalesce(json_extract(e.payload, '$.poison'), 0)",
    eventsTable: "outbox_events",
    async openOutbox(options = {}) {
      return await Outbox.open(await openDatabase(path), {
        queue: QUEUE,
        ...options,
      });
    },
    async openSeedOutbox(now) {
      return await Outbox.open(await openDatabase(seedPath), {
        now,
        leaseMs: 10,
      });
    },
    openMonitor: () => openDatabase(path),
    async hold(_name, outbox) {
      let stopped!: () => void;
      const go = new Promise<void>((resolve) => stopped = resolve);
      let began!: () => void;
      const holding = new Promise<void>((resolve) => began = resolve);
      const done = outbox.transaction(async (tx) => {
        began();
        await go;
        // Committing a write needs every other connection's shared lock
        // gone: it proves the process was not stopped inside a transaction.
        await tx.run("INSERT INTO demo_probe (at) VALUES (?)", [Date.now()]);
      });
      await Promise.race([holding, done]);
      return {
        async stopped() {
          stopped();
          try {
            await done;
            return true;
          } catch (error) {
            if (error instanceof BusyError) return false;
            throw error;
          }
        },
        resume() {},
      };
    },
    integrity,
    recipient: {
      where: recipientPath,
      open: () => openDatabase(recipientPath),
      shipmentsSql: `CREATE TABLE IF NOT EXISTS shipments (
        identity TEXT PRIMARY KEY,
        order_id INTEGER NOT NULL,
        fence INTEGER NOT NULL,
        applied INTEGER NOT NULL
      ) STRICT`,
      shipSql:
        `INSERT INTO shipments (identity, order_id, fence, applied) VALUES (?, ?, ?, 1)
        ON CONFLICT (identity) DO UPDATE SET applied = applied + 1`,
      integrity,
    },
    close: async () => {},
  };
}

/**
 * The demo on PostgreSQL at `url`, in the schema `schema` (created when
 * missing), the seed scenario in `${schema}_seed` and the recipient in
 * `${schema}_recipient`; `close` drops the three unless `keep`.
 */
export async function postgresEngine(
  url: string,
  schema: string,
  keep = true,
): Promise<Engine> {
  const { connectPostgres, openPostgres } = await lazy<
    typeof import("../drivers/postgres.ts")
  >("../drivers/postgres.ts");
  const seedSchema = `${schema}_seed`;
  const recipientSchema = `${schema}_recipient`;
  const application = (name: string) => `leased-outbox-demo-${name}`;
  const gates = new Map<string, Gate>();
  const shown = new URL(url);
  if (shown.password) shown.password = "***";
  const admin = async (sql: string) => {
    const db = await connectPostgres(url, { listen: false });
    try {
      return await db.query(sql);
    } finally {
      await db.close();
    }
  };
  const [version] = await admin("SHOW server_version");
  return {
    name: `PostgreSQL ${
      String(version?.["server_version"]).split(" ")[0]
    } via npm:pg (server clock, synchronous_commit as configured)`,
    where: `${shown.href} schema ${schema}`,
    seedWhere: `schema ${seedSchema}`,
    argsFor(name) {
      const gate = startGate(new URL(url));
      gates.set(name, gate);
      return ["--db", gate.url, "--schema", schema];
    },
    setupSql: [
      `CREATE TABLE IF NOT EXISTS orders (
        id bigserial PRIMARY KEY,
        customer text NOT NULL,
        total_cents integer NOT NULL,
        poison integer NOT NULL
      )`,
    ],
    insertOrderSql:
      "INSERT INTO orders (customer, total_cents, poison) VALUES ($1, $2, $3) RETURNING id",
    poisonSql:
      "CASE WHEN e.payload::jsonb ->> 'poison' = 'true' THEN 1 ELSE 0 END",
    eventsTable: "outbox_all",
    openOutbox: (options = {}, name = "demo") =>
      openPostgres(url, {
        schema,
        queue: QUEUE,
        applicationName: application(name),
        ...options,
      }),
    openSeedOutbox: (now) =>
      openPostgres(url, { schema: seedSchema, now, leaseMs: 10 }),
    openMonitor: () => connectPostgres(url, { schema, listen: false }),
    hold(name, _outbox, monitor) {
      const gate = gates.get(name)!;
      gate.pause();
      return Promise.resolve({
        async stopped() {
          // A statement that got through before the pause runs to its end.
          await new Promise((resolve) => setTimeout(resolve, 50));
          const [row] = await monitor.query(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = $1 AND xact_start IS NOT NULL",
            [application(name)],
          );
          return Number(row?.["n"]) === 0;
        },
        resume: () => gate.resume(),
      });
    },
    integrity: (monitor) => btreeCheck(monitor, schema, schema),
    recipient: {
      where: `${shown.href} schema ${recipientSchema}`,
      async open() {
        // The connection's schema is created by the outbox's set-up alone.
        await admin(`CREATE SCHEMA IF NOT EXISTS ${recipientSchema}`);
        return await connectPostgres(url, {
          schema: recipientSchema,
          listen: false,
          applicationName: application("recipient"),
          // The wait for another acceptance of one identity ends here.
          lockTimeoutMs: 10_000,
        });
      },
      shipmentsSql: `CREATE TABLE IF NOT EXISTS shipments (
        identity text PRIMARY KEY,
        order_id bigint NOT NULL,
        fence bigint NOT NULL,
        applied integer NOT NULL
      )`,
      shipSql:
        `INSERT INTO shipments (identity, order_id, fence, applied) VALUES ($1, $2, $3, 1)
        ON CONFLICT (identity) DO UPDATE SET applied = shipments.applied + 1`,
      // amcheck made in the outbox's schema (by `integrity`) when missing.
      integrity: (db) => btreeCheck(db, recipientSchema, schema),
    },
    async close() {
      for (const gate of gates.values()) gate.close();
      if (keep) return;
      for (const name of [schema, seedSchema, recipientSchema]) {
        await admin(`DROP SCHEMA IF EXISTS ${name} CASCADE`);
      }
    },
  };
}

/**
 * amcheck's B-tree check of every index of the schema `schema`, every
 * index entry matched to its row: `"ok"` when sound. The extension is made
 * in the schema `home` (and dropped with it) unless it exists.
 */
async function btreeCheck(
  db: Driver,
  schema: string,
  home: string,
): Promise<string> {
  try {
    await db.exec(`CREATE EXTENSION IF NOT EXISTS amcheck SCHEMA ${home}`);
    const [found] = await db.query(
      "SELECT extnamespace::regnamespace::text AS name FROM pg_extension WHERE extname = 'amcheck'",
    );
    const rows = await db.query(
      `SELECT ${found?.["name"]}.bt_index_check(c.oid, true)
       FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
       JOIN pg_am AS a ON a.oid = c.relam
       WHERE c.relnamespace = $1::regnamespace AND a.amname = 'btree'`,
      [schema],
    );
    return rows.length > 0 ? "ok" : "no indexes";
  } catch (error) {
    return `failed: ${(error as Error).message}`;
  }
}

/**
 * A TCP relay to the server whose client-to-server direction can be
 * paused: a process connected through it keeps running, but what it sends
 * (an acknowledgement, say) waits in the relay, like a network partition.
 */
interface Gate {
  /** The URL to connect through the relay. */
  readonly url: string;
  pause(): void;
  resume(): void;
  close(): void;
}

/** Starts a {@linkcode Gate} on 127.0.0.1 to the server of `url`. */
function startGate(url: URL): Gate {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const conns = new Set<Deno.Conn>();
  let open = Promise.resolve();
  let resume = () => {};
  (async () => {
    for await (const client of listener) {
      let server: Deno.Conn;
      try {
        server = await Deno.connect({
          hostname: url.hostname,
          port: Number(url.port || 5432),
        });
      } catch {
        client.close();
        continue;
      }
      conns.add(client).add(server);
      server.readable.pipeTo(client.writable).catch(() => {});
      client.readable.pipeThrough(
        new TransformStream({
          async transform(chunk, controller) {
            await open;
            controller.enqueue(chunk);
          },
        }),
      ).pipeTo(server.writable).catch(() => {});
    }
  })().catch(() => {});
  const through = new URL(url);
  through.hostname = "127.0.0.1";
  through.port = String((listener.addr as Deno.NetAddr).port);
  return {
    url: through.href,
    pause() {
      open = new Promise((resolve) => resume = resolve);
    },
    resume() {
      resume();
      open = Promise.resolve();
    },
    close() {
      listener.close();
      for (const conn of conns) {
        try {
          conn.close();
        } catch {
          // Closed by its peer already.
        }
      }
    },
  };
}

/**
 * Imports `specifier` (relative to this module) when called. A literal
 * `import()` would not do: Deno fetches the npm packages of every literal
 * import up front, `pg` and the server's binaries for a SQLite run too.
 */
export function lazy<T>(specifier: string): Promise<T> {
  return import(new URL(specifier, import.meta.url).href);
}

/** The engine a child process was pointed at with {@linkcode Engine.args}. */
export function engineFromArgs(args: readonly string[]): Promise<Engine> {
  const db = flag(args, "db");
  if (db === undefined) throw new TypeError("--db is required");
  const schema = flag(args, "schema");
  return schema === undefined
    ? Promise.resolve(sqliteEngine(db))
    : postgresEngine(db, schema);
}

/** A payload of the demo's events. */
export interface OrderPlaced {
  readonly type: "order.placed";
  readonly orderId: number;
  readonly totalCents: number;
  /** A poison event: the receiver always refuses it. */
  readonly poison: boolean;
}

/** Reads `--name value` from the command line, or `fallback`. */
export function flag(
  args: readonly string[],
  name: string,
): string | undefined {
  const i = args.indexOf(`--${name}`);
  return i === -1 ? undefined : args[i + 1];
}

/** Reads a positive integer flag. */
export function intFlag(
  args: readonly string[],
  name: string,
  fallback: number,
): number {
  const text = flag(args, name);
  if (text === undefined) return fallback;
  const value = Number(text);
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new RangeError(
      `--${name} must be a non-negative integer: current value is ${text}`,
    );
  }
  return value;
}
