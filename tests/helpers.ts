/**
 * Test helpers: a manual clock, snapshots for "nothing changed" checks, a
 * count of the statements outboxes send, and a wait for a PostgreSQL
 * connection to wait for a lock.
 */
import assert from "node:assert/strict";
import type { Driver, Row, RunResult, SqlValue } from "../driver.ts";
import { PostgresDriver } from "../drivers/postgres.ts";
import { type Dialect, Outbox, type OutboxOptions } from "../mod.ts";
import type { DriverCase } from "./drivers.ts";
import type { TransactionStatus } from "../types.ts";

/** A clock tests move by hand: `clock.now` is the injected `now()`. */
export class ManualClock {
  /** @param ms Starting time, epoch milliseconds. */
  constructor(public ms = 0) {}
  /** The injected clock function. */
  readonly now = (): number => this.ms;
  /** Sets the time. */
  set(ms: number): void {
    this.ms = ms;
  }
  /** Moves the time forward (or back, when negative). */
  advance(ms: number): void {
    this.ms += ms;
  }
}

/**
 * Every row of both tables plus a count of writes, for byte-identical
 * comparisons: SQLite's `total_changes()`, or on PostgreSQL each row's
 * `xmin`, which any write of the row changes, even of the same values.
 */
export async function snapshot(driver: Driver): Promise<{
  events: Row[];
  attempts: Row[];
  totalChanges: number;
}> {
  if (driver instanceof PostgresDriver) {
    const events = await driver.query(
      "SELECT *, xmin::text AS xmin FROM outbox_events ORDER BY id",
    );
    const attempts = await driver.query(
      "SELECT *, xmin::text AS xmin FROM outbox_attempts ORDER BY id",
    );
    return { events, attempts, totalChanges: 0 };
  }
  const events = await driver.query("SELECT * FROM outbox_events ORDER BY id");
  const attempts = await driver.query(
    "SELECT * FROM outbox_attempts ORDER BY id",
  );
  const [row] = await driver.query("SELECT total_changes() AS n");
  return { events, attempts, totalChanges: Number(row?.["n"]) };
}

// The columns of an event row on PostgreSQL, in both of its tables.
const EVENT_ROW =
  "id, queue, state, payload, payload_bytes, dedup_key, ordering_key, due_at, lease_until, token, fence, attempt, max_attempts, last_error, created_at, updated_at, done_at, claimed_at, identity, priority, concurrency_key";

/** One event's row as stored (with its `xmin` on PostgreSQL, see snapshot). */
export async function eventRow(
  driver: Driver,
  id: number,
): Promise<Row | undefined> {
  const [row] = driver instanceof PostgresDriver
    ? await driver.query(
      // Version 8 keeps done events in outbox_done, its columns alike;
      // version 9's lease markers are outbox_events' alone.
      `SELECT ${EVENT_ROW}, xmin::text AS xmin FROM outbox_events WHERE id = $1
        UNION ALL SELECT ${EVENT_ROW}, xmin::text AS xmin FROM outbox_done
        WHERE id = $1`,
      [id],
    )
    : await driver.query("SELECT * FROM outbox_events WHERE id = ?", [id]);
  return row;
}

/** What a contract test receives: a manual clock and outboxes on one database. */
export interface Harness {
  readonly clock: ManualClock;
  /** Opens one outbox per connection, in turn, on the manual clock. */
  open(options?: OutboxOptions): Promise<Outbox[]>;
  /** The first connection, for reading rows as stored. */
  readonly raw: Driver;
  /**
   * How many statements the outboxes have sent to SQLite so far: unchanged
   * across a call means it ran no SQL, and bound nothing into the engine.
   */
  sent(): number;
}

/** A connection that counts the statements sent through it. */
class CountingDriver implements Driver {
  sent = 0;
  readonly busyWait?: (timeoutMs: number) => Promise<void>;
  readonly inTransaction?: () => boolean;
  readonly transactionStatus?: () => TransactionStatus;

  readonly watchEnqueues?: (
    listener: () => void,
  ) => Promise<() => Promise<void>>;

  readonly dialect?: Dialect;

  constructor(readonly inner: Driver) {
    if (inner.dialect) this.dialect = inner.dialect;
    if (inner.busyWait) this.busyWait = (ms) => inner.busyWait!(ms);
    if (inner.watchEnqueues) {
      this.watchEnqueues = (listener) => inner.watchEnqueues!(listener);
    }
    if (inner.inTransaction) this.inTransaction = () => inner.inTransaction!();
    if (inner.transactionStatus) {
      this.transactionStatus = () => inner.transactionStatus!();
    }
  }

  query(sql: string, params?: readonly SqlValue[]): Promise<Row[]> {
    this.sent++;
    return this.inner.query(sql, params);
  }

  run(sql: string, params?: readonly SqlValue[]): Promise<RunResult> {
    this.sent++;
    return this.inner.run(sql, params);
  }

  exec(sql: string): Promise<void> {
    this.sent++;
    return this.inner.exec(sql);
  }

  close(): Promise<void> {
    return this.inner.close();
  }
}

/** Registers `Deno.test("<driver>: <name>")` with a fresh database and clock. */
export function driverTest(
  driver: DriverCase,
  name: string,
  fn: (harness: Harness) => Promise<void>,
): void {
  Deno.test(`${driver.name}: ${name}`, async () => {
    const connections = await driver.open();
    const clock = new ManualClock();
    const counted = connections.drivers.map((d) => new CountingDriver(d));
    const open = async (options: OutboxOptions = {}) => {
      const outboxes = [];
      for (const d of counted) {
        outboxes.push(
          await Outbox.open(d, {
            now: clock.now,
            ...options,
          }),
        );
      }
      return outboxes;
    };
    const sent = () => counted.reduce((sum, d) => sum + d.sent, 0);
    try {
      await fn({ clock, open, raw: connections.drivers[0]!, sent });
    } finally {
      await connections.close();
    }
  });
}

/** What a benchmark script printed: its markdown table lines and its JSON. */
export interface BenchOutput {
  readonly tableLines: string[];
  readonly rows: {
    name: string;
    value: number;
    anchorValue: number;
    ratio: number;
  }[];
  readonly smoke: boolean;
}

/**
 * Runs a `bench/` script with `--smoke` and parses its table and JSON, the
 * only things its stdout may hold.
 *
 * @param script The script's file name in `bench/`.
 * @param env Variables added to the script's environment.
 */
export async function runBenchSmoke(
  script: string,
  env: Record<string, string> = {},
): Promise<BenchOutput> {
  const output = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      "--config",
      new URL("../deno.json", import.meta.url).pathname,
      new URL(`../bench/${script}`, import.meta.url).pathname,
      "--smoke",
    ],
    env,
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!output.success) {
    // Only the end: the progress lines before it say nothing, and a CI log
    // may keep only a part of a long message.
    const stderr = new TextDecoder().decode(output.stderr).trimEnd();
    throw new Error(
      `bench/${script} exited with code ${output.code}; its stderr ended:\n${
        stderr.split("\n").slice(-15).join("\n")
      }`,
    );
  }
  const [table, json] = new TextDecoder().decode(output.stdout).trim().split(
    "\n\n",
  );
  const { rows, smoke } = JSON.parse(json!);
  return { tableLines: table!.split("\n"), rows, smoke };
}

/** A temporary directory that `await using` removes with its contents. */
export interface TempDir extends AsyncDisposable {
  readonly path: string;
}

/**
 * Makes a temporary directory (under `TMPDIR`) for one test.
 *
 * @param prefix Starts the directory's name.
 * @returns The directory; dispose it with `await using`, on every path out.
 */
export async function tempDir(prefix = "outbox-test-"): Promise<TempDir> {
  const path = await Deno.makeTempDir({ prefix });
  return {
    path,
    [Symbol.asyncDispose]: () => Deno.remove(path, { recursive: true }),
  };
}

/**
 * Turns a version 9 schema back into version 8's layout, its events kept:
 * a lease's deadline in `due_at` too, no lease markers, the default
 * fillfactor, version 8's indexes of outbox_events (each naming `state`)
 * in place of version 9's; records version 8.
 */
export async function asPostgresVersion8(db: Driver): Promise<void> {
  await db.exec(POSTGRES_AS_VERSION_8);
}

/** The SQL of {@linkcode asPostgresVersion8}. */
export const POSTGRES_AS_VERSION_8 = `DROP INDEX outbox_events_ready;
    DROP INDEX outbox_events_key_order;
    DROP INDEX outbox_events_key_leases;
    DROP INDEX outbox_events_concurrency_leases;
    DROP INDEX outbox_events_last_leases;
    UPDATE outbox_events SET due_at = lease_until WHERE state = 'leased';
    ALTER TABLE outbox_events DROP COLUMN keyed_lease,
      DROP COLUMN last_lease, RESET (fillfactor);
    CREATE INDEX outbox_events_claim_priority
      ON outbox_events (queue, priority DESC, due_at, id)
      WHERE state IN ('pending', 'leased');
    CREATE INDEX outbox_events_last_attempt ON outbox_events (due_at)
      WHERE state = 'leased' AND attempt >= max_attempts;
    CREATE INDEX outbox_events_ordering
      ON outbox_events (queue, ordering_key, id)
      WHERE state IN ('pending', 'leased') AND ordering_key IS NOT NULL;
    CREATE INDEX outbox_events_ordering_leased
      ON outbox_events (queue, ordering_key, due_at)
      WHERE state = 'leased' AND ordering_key IS NOT NULL;
    CREATE INDEX outbox_events_concurrency
      ON outbox_events (queue, concurrency_key, due_at)
      WHERE state = 'leased' AND concurrency_key IS NOT NULL;
    DELETE FROM outbox_schema;
    INSERT INTO outbox_schema (version, applied_at) VALUES (8, 0)`;

/**
 * Turns a version 9 schema back into version 7's layout, its events kept
 * (version 8's first, {@linkcode asPostgresVersion8}): done events back in
 * outbox_events, no keys table, the identity, dedup and done indexes of
 * outbox_events, the ledger views over outbox_events alone; records
 * version 7.
 */
export async function asPostgresVersion7(db: Driver): Promise<void> {
  await asPostgresVersion8(db);
  await db.exec(`DROP VIEW outbox_ledger;
    DROP VIEW outbox_unwritten_attempts;
    INSERT INTO outbox_events SELECT * FROM outbox_done;
    DROP VIEW outbox_all;
    DROP TABLE outbox_done;
    DROP TABLE outbox_keys;
    CREATE UNIQUE INDEX outbox_events_identity ON outbox_events (identity);
    CREATE UNIQUE INDEX outbox_events_dedup ON outbox_events (queue, dedup_key)
      WHERE dedup_key IS NOT NULL;
    CREATE INDEX outbox_events_done ON outbox_events (done_at)
      WHERE state = 'done';
    CREATE VIEW outbox_unwritten_attempts AS
      SELECT e.id AS event_id, e.fence AS fence, k.kind AS kind,
        CASE k.n WHEN 1 THEN e.claimed_at ELSE e.done_at END AS at,
        e.token AS token,
        CASE k.n WHEN 1 THEN e.lease_until END AS lease_until,
        NULL::text AS detail, k.n AS n
      FROM outbox_events AS e
      JOIN (VALUES (1, 'claimed'), (2, 'acknowledged')) AS k (n, kind)
        ON e.state = 'done' OR (k.n = 1 AND e.state = 'leased')
      WHERE NOT EXISTS (SELECT 1 FROM outbox_attempts AS a
        WHERE a.event_id = e.id AND a.fence = e.fence AND a.kind = k.kind);
    CREATE VIEW outbox_ledger AS
      SELECT id AS seq, event_id, fence, kind, at, token, lease_until, detail
      FROM outbox_attempts
      UNION ALL
      SELECT (SELECT coalesce(max(id), 0) FROM outbox_attempts) + n, event_id,
        fence, kind, at, token, lease_until, detail
      FROM outbox_unwritten_attempts;
    DELETE FROM outbox_schema;
    INSERT INTO outbox_schema (version, applied_at) VALUES (7, 0)`);
}

/**
 * Resolves once the connection named `name` (its application_name) waits
 * for a lock; fails when `pending` settles first or after 10 s.
 */
export async function untilWaiting(
  watcher: Driver,
  name: string,
  pending: Promise<unknown>,
): Promise<void> {
  assert.equal(
    await waitingOrSettled(watcher, name, pending),
    "waiting",
    `${name} waits`,
  );
}

/**
 * Resolves to "waiting" once the connection named `name` (its
 * application_name) waits for a lock, or to "settled" once `pending` has
 * settled without that; fails after 10 s of neither.
 */
export async function waitingOrSettled(
  watcher: Driver,
  name: string,
  pending: Promise<unknown>,
): Promise<"waiting" | "settled"> {
  let settled = false;
  pending.then(() => settled = true, () => settled = true);
  const deadline = performance.now() + 10_000;
  for (;;) {
    const rows = await watcher.query(
      "SELECT 1 FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'",
      [name],
    );
    if (rows.length > 0) return "waiting";
    if (settled) return "settled";
    assert.ok(performance.now() < deadline, `${name} neither waits nor ends`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}
