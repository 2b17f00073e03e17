/**
 * The `outbox` command: looks after a queue in production, beside live
 * workers. `deno task outbox <command> <database> [argument] [options]`, or
 * `deno run -A jsr:@leased/outbox/cli …` once published.
 *
 * The database is a SQLite file or a PostgreSQL URL
 * (`postgres://user:password@host/database`, with `--schema` for an outbox
 * other than the one the connection's `search_path` leads to). Read-only
 * commands (`stats`, `list`, `explain`, `watch`) open it read-only (a file
 * with `?mode=ro`) through {@linkcode OutboxReader}: they never write,
 * never create or upgrade the schema, and wait on a writer's lock for
 * `--busy-timeout`. The others open it read-write through
 * {@linkcode Outbox} after the same check, so neither creates an outbox
 * where there is none. A file in WAL mode (as
 * `openNodeSqlite` leaves it by default) opens through `node:sqlite`, which
 * shares its WAL index with the WASM VFS's connections and, unlike them,
 * reads it read-only too and on any CPU. A PostgreSQL outbox is judged by
 * the server's clock, as `openPostgres` judges it; a URL's password never
 * appears in the output.
 *
 * Exit codes: 0 done, 1 a runtime error (no such file, not an outbox, lock
 * held too long), 2 a usage error (with the usage on stderr).
 *
 * @example Print the counts of a database as JSON
 * ```ts
 * import { main } from "@leased/outbox/cli";
 * import { Outbox } from "@leased/outbox";
 * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
 * import assert from "node:assert/strict";
 *
 * const dir = await Deno.makeTempDir();
 * {
 *   await using outbox = await Outbox.open(await openSqliteWasm(`${dir}/o.db`));
 *   await outbox.enqueue({ to: "ada@example.com" });
 * }
 * const lines: string[] = [];
 * const code = await main(["stats", `${dir}/o.db`, "--json"], {
 *   stdout: (line) => lines.push(line),
 * });
 * assert.equal(code, 0);
 * assert.equal(JSON.parse(lines[0]!).pending, 1);
 * await Deno.remove(dir, { recursive: true });
 * ```
 *
 * @module
 */
import { parseArgs } from "node:util";
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import {
  BusyError,
  PostgresError,
  READONLY_ROLLBACK,
  SqliteError,
} from "./errors.ts";
import {
  type Explanation,
  MAX_BATCH,
  MAX_DURATION_MS,
  Outbox,
} from "./lease.ts";
import { checkName } from "./validate.ts";
import type { EventInfo, QueueCounts } from "./admin.ts";
import { OutboxReader } from "./reader.ts";
import { openNodeSqlite } from "./drivers/node_sqlite.ts";
import { openSqliteWasm } from "./deno/sqlite_wasm.ts";
import {
  FLOW_OPTIONS_USAGE,
  FLOW_USAGE,
  type FlowContext,
  flowNote,
  limitsCommand,
  pauseCommand,
  schedulesCommand,
} from "./cli/flow.ts";
import {
  connectPostgres,
  isPostgresUrl,
  lockTimeoutFor,
  openPostgres,
} from "./drivers/postgres.ts";

/** Where {@linkcode main} writes, and its clock; the process's by default. */
export interface CliIo {
  /** Writes one line of output. @default {a write to stdout; a closed pipe ends the command with exit 0} */
  readonly stdout?: (line: string) => void;
  /** Writes one line of errors. @default {console.error} */
  readonly stderr?: (line: string) => void;
  /** Whether the output may be coloured. @default {a TTY without NO_COLOR} */
  readonly color?: boolean;
  /** The wall clock, epoch milliseconds. @default {Date.now} */
  readonly now?: () => number;
  /** Ends `watch` when it aborts. @default {SIGINT (Ctrl-C)} */
  readonly signal?: AbortSignal;
}

const USAGE = `Usage: outbox <command> <database> [argument] [options]

Commands:
  stats <db>                   counts per queue and state, oldest pending, acks in the last minute
  list <db> <state>            events in a state (pending, leased, dead, done), by id
  explain <db> <event>         one event (id or identity): its state and ledger timeline
  watch <db>                   live counts and rates until Ctrl-C
  redrive <db> [event...]      dead letters (these, or all of --queue, or all) back to pending
  retry <db> <event>...        the same, for the events named
  cancel <db> <event>...       pending events to the dead letters ("cancelled"), undelivered,
                               in one transaction: all of them or none
  purge <db> --older-than <d>  delete done events and dead letters older than d, 1,000 per
                               transaction (run it again to finish one that failed)
${FLOW_USAGE}

Options:
  --json                 machine-readable output (stats: one JSON object)
  --queue <name>         only this queue
  --limit <n>            list: events per page (default 100)
  --after <id>           list: the page after this event id
  --older-than <d>       purge: age, like 500ms, 30s, 15m, 12h, 7d or 1h30m
  --state <s,...>        purge: states to delete (done, dead; default both)
  --interval <d>         watch: refresh period (default 2s)
${FLOW_OPTIONS_USAGE}
  --busy-timeout <d>     how long to wait for a writer's lock (default 5s)
  --schema <name>        PostgreSQL: the schema the outbox is in (default: where
                         the connection's search_path leads, usually public)
  -h, --help             this text

The database is a file path (or a file: URI), or a PostgreSQL URL
(postgres://user:password@host:port/database). Read-only commands open it
read-only; no command creates an outbox.
Commands take at most ${MAX_BATCH} event ids.`;

const OPTIONS = {
  json: { type: "boolean" },
  queue: { type: "string" },
  limit: { type: "string" },
  after: { type: "string" },
  "older-than": { type: "string" },
  state: { type: "string", multiple: true },
  interval: { type: "string" },
  "per-key": { type: "string" },
  "per-second": { type: "string" },
  "busy-timeout": { type: "string" },
  schema: { type: "string" },
  help: { type: "boolean", short: "h" },
} as const;

/** The commands an option means something to; the others refuse it. */
const APPLIES_TO: Record<string, readonly string[]> = {
  queue: ["stats", "list", "watch", "redrive"],
  limit: ["list"],
  after: ["list"],
  "older-than": ["purge"],
  state: ["purge"],
  interval: ["watch"],
  "per-key": ["limits"],
  "per-second": ["limits"],
};

const RATE_WINDOW_MS = 60_000;
// SQLITE_CANTOPEN.
const CANTOPEN = 14;
// Under the longest delay setTimeout keeps (2^31 - 1 ms): a longer one
// fires at once.
const MAX_INTERVAL_MS = 24 * 86_400_000;
const UNITS: Record<string, number> = {
  ms: 1,
  s: 1_000,
  m: 60_000,
  h: 3_600_000,
  d: 86_400_000,
};

/** A mistake in the command line: exit code 2, with the usage. */
class UsageError extends Error {
  override name = "UsageError";
}

type Options = {
  json?: boolean;
  queue?: string;
  limit?: string;
  after?: string;
  "older-than"?: string;
  state?: string[];
  interval?: string;
  "per-key"?: string;
  "per-second"?: string;
  "busy-timeout"?: string;
  schema?: string;
  help?: boolean;
};

interface Context {
  /** As given: a file path, a `file:` URI or a PostgreSQL URL. */
  readonly database: string;
  readonly postgres: boolean;
  readonly rest: string[];
  readonly options: Options;
  readonly out: (line: string) => void;
  readonly color: boolean;
  readonly now: () => number;
  readonly busyTimeoutMs: number;
  readonly signal: AbortSignal | undefined;
}

const COMMANDS: Record<string, (context: Context) => Promise<void>> = {
  stats,
  list,
  explain,
  watch,
  retry,
  redrive,
  cancel,
  purge,
  pause: (context) => pauseCommand(flowContext(context), true),
  resume: (context) => pauseCommand(flowContext(context), false),
  limits: (context) => limitsCommand(flowContext(context)),
  schedules: (context) => schedulesCommand(flowContext(context)),
};

/** What the flow commands (cli/flow.ts) take of a command line. */
function flowContext(context: Context): FlowContext {
  return {
    rest: context.rest,
    json: context.options.json === true,
    perKey: context.options["per-key"],
    perSecond: context.options["per-second"],
    out: context.out,
    open: () => openOutbox(context),
    table: (headers, rows) => table(context, headers, rows, []),
  };
}

/**
 * Runs one command line of the `outbox` tool.
 *
 * @param args The arguments after the program's name.
 * @param io Where output goes; see {@linkcode CliIo}.
 * @returns The exit code: 0 done, 1 a runtime error, 2 a usage error.
 */
export async function main(
  args: readonly string[],
  io: CliIo = {},
): Promise<number> {
  const out = io.stdout ?? writeLine;
  // No message prints a password of the command line.
  const credentials = args.flatMap(credentialsOf);
  const err = (line: string) =>
    (io.stderr ?? console.error)(
      credentials.reduce(
        (text, [secret, mask]) => text.replaceAll(secret, mask),
        line,
      ),
    );
  let file: string | undefined;
  try {
    const { values, positionals } = parseCommandLine(args);
    if (values.help) {
      out(USAGE);
      return 0;
    }
    const [command, database, ...rest] = positionals;
    file = database;
    if (command === undefined) throw new UsageError("no command given");
    const run = COMMANDS[command];
    if (run === undefined) {
      throw new UsageError(`unknown command ${JSON.stringify(command)}`);
    }
    if (database === undefined) {
      throw new UsageError(`${command} needs a database`);
    }
    for (const option of Object.keys(values)) {
      const commands = APPLIES_TO[option];
      if (commands !== undefined && !commands.includes(command)) {
        throw new UsageError(`--${option} does not apply to ${command}`);
      }
    }
    if (values.queue !== undefined) {
      checkName("select a queue", "queue", values.queue);
    }
    // As the driver reads it: a PostgreSQL URL, or else a file.
    const postgres = isPostgresUrl(database);
    if (values.schema !== undefined && !postgres) {
      throw new UsageError("--schema applies to a PostgreSQL database only");
    }
    await run({
      database,
      postgres,
      rest,
      options: values,
      out,
      color: io.color ?? colorByDefault(),
      now: io.now ?? Date.now,
      busyTimeoutMs: values["busy-timeout"] === undefined
        ? 5_000
        : duration("--busy-timeout", values["busy-timeout"], {
          max: MAX_DURATION_MS,
        }),
      signal: io.signal,
    });
    return 0;
  } catch (error) {
    // The reader of the output is gone (`watch | head`): stop quietly.
    if (error instanceof Deno.errors.BrokenPipe) return 0;
    // The library's checks of an argument (an id, an identity) run before
    // any SQL, and say which argument is wrong.
    if (
      error instanceof UsageError || error instanceof TypeError ||
      error instanceof RangeError
    ) {
      err(`outbox: ${error.message}\n\n${USAGE}`);
      return 2;
    }
    // SQLite's own message names no file; the opens add it (withPath), and
    // this adds it to an error of the command's statements.
    err(
      `outbox: ${
        (error instanceof SqliteError || error instanceof PostgresError) &&
          file !== undefined
          ? `${file}: ${message(error)}${
            error instanceof SqliteError && (error.code & 0xff) === CANTOPEN
              ? " (its journal, in the same directory, could not be created: is the directory writable?)"
              : ""
          }`
          : message(error)
      }`,
    );
    return 1;
  }
}

function parseCommandLine(args: readonly string[]) {
  try {
    return parseArgs({
      args: [...args],
      options: OPTIONS,
      allowPositionals: true,
      strict: true,
    }) as { values: Options; positionals: string[] };
  } catch (error) {
    throw new UsageError(message(error));
  }
}

async function stats(context: Context): Promise<void> {
  const { out, options } = context;
  noArguments(context, "stats");
  await using reader = await openReader(context);
  const summary = await readSummary(reader, context);
  if (options.json) {
    out(JSON.stringify(summary));
    return;
  }
  out(summaryTable(context, summary));
}

function summaryTable(context: Context, summary: Summary): string {
  // A queue paused or limited adds a column (cli/flow.ts's note).
  const flow = summary.queues.some((q) => flowNote(q) !== "-");
  return table(
    context,
    [
      "queue",
      "pending",
      "leased",
      "done",
      "dead",
      "oldest pending",
      "acks last 60 s",
      ...flow ? ["flow"] : [],
    ],
    [...summary.queues, { ...summary, queue: "total" }].map((q) => [
      q.queue,
      q.pending,
      q.leased,
      q.done,
      q.dead,
      q.pending === 0 ? "-" : age(q.oldestPendingAgeMs),
      q.acknowledgedLastMinute,
      ...flow ? ["queues" in q ? "" : flowNote(q)] : [],
    ]),
    [1, 2, 3, 4, 6],
  );
}

interface QueueSummary {
  readonly queue: string;
  readonly pending: number;
  readonly leased: number;
  readonly done: number;
  readonly dead: number;
  readonly oldestPendingAgeMs: number;
  readonly acknowledgedLastMinute: number;
  readonly paused?: true;
  readonly perKey?: number;
  readonly perSecond?: number;
}

interface Summary extends Omit<QueueSummary, "queue"> {
  readonly at: string;
  readonly queues: QueueSummary[];
}

async function readSummary(
  reader: OutboxReader,
  context: Context,
): Promise<Summary> {
  const [now, all, acknowledged] = await reader.snapshot(async () => {
    // PostgreSQL's outboxes judge by the server's clock: ages and the rate's
    // window by the same one, whatever this machine's clock says.
    const now = await reader.databaseNow() ?? context.now();
    return [
      now,
      await reader.queues(),
      await reader.acknowledgedSince(now - RATE_WINDOW_MS),
    ] as const;
  });
  const queues = all.filter((q) =>
    context.options.queue === undefined || q.queue === context.options.queue
  );
  const rows = queues.map((q: QueueCounts): QueueSummary => ({
    queue: q.queue,
    pending: q.pending,
    leased: q.leased,
    done: q.done,
    dead: q.dead,
    oldestPendingAgeMs: q.oldestPendingAt === null
      ? 0
      : Math.max(0, now - q.oldestPendingAt),
    acknowledgedLastMinute: acknowledged.get(q.queue) ?? 0,
    ...q.paused ? { paused: true as const } : {},
    ...q.perKey === undefined ? {} : { perKey: q.perKey },
    ...q.perSecond === undefined ? {} : { perSecond: q.perSecond },
  }));
  const sum = (key: "pending" | "leased" | "done" | "dead") =>
    rows.reduce((total, row) => total + row[key], 0);
  return {
    at: new Date(now).toISOString(),
    pending: sum("pending"),
    leased: sum("leased"),
    done: sum("done"),
    dead: sum("dead"),
    oldestPendingAgeMs: Math.max(0, ...rows.map((r) => r.oldestPendingAgeMs)),
    acknowledgedLastMinute: rows.reduce(
      (total, r) => total + r.acknowledgedLastMinute,
      0,
    ),
    queues: rows,
  };
}

async function list(context: Context): Promise<void> {
  const { out, options, rest } = context;
  const [state, ...extra] = rest;
  if (
    state !== "pending" && state !== "leased" && state !== "dead" &&
    state !== "done"
  ) {
    throw new UsageError(
      `list needs a state (pending, leased, dead or done): got ${
        state === undefined ? "none" : JSON.stringify(state)
      }`,
    );
  }
  if (extra.length > 0) throw new UsageError(`unexpected ${extra.join(" ")}`);
  const limit = options.limit === undefined
    ? 100
    : count("--limit", options.limit, 1);
  const afterId = options.after === undefined
    ? 0
    : count("--after", options.after, 0);
  await using reader = await openReader(context);
  const events = await reader.list({
    state,
    limit,
    afterId,
    ...(options.queue === undefined ? {} : { queue: options.queue }),
  });
  const next = events.length === limit ? events.at(-1)!.id : null;
  if (options.json) {
    out(JSON.stringify({ state, events, next }));
    return;
  }
  const now = await reader.databaseNow() ?? context.now();
  out(table(
    context,
    [
      "id",
      "identity",
      "queue",
      "attempt",
      state === "leased"
        ? "lease until"
        : state === "pending"
        ? "due"
        : "since",
      "last error",
    ],
    events.map((event: EventInfo) => [
      event.id,
      event.identity,
      event.queue,
      `${event.attempt}/${event.maxAttempts}`,
      relative(
        state === "dead" || state === "done" ? event.updatedAt : event.dueAt,
        now,
      ),
      clip(event.lastError ?? "-", 60),
    ]),
    [0],
  ));
  out(
    next === null
      ? `${events.length} ${state}`
      : `${events.length} ${state}; next page: --after ${next}`,
  );
}

async function explain(context: Context): Promise<void> {
  const { out, options } = context;
  const [key, ...extra] = context.rest;
  if (key === undefined) {
    throw new UsageError("explain needs an event id or identity");
  }
  if (extra.length > 0) throw new UsageError("explain takes one event");
  // Digits are an id; anything else must be an identity (checked by explain).
  const eventKey = /^\d+$/.test(key) ? count("event id", key, 1) : key;
  await using reader = await openReader(context);
  const event = await reader.explain(eventKey);
  if (event === null) throw new Error(`no event ${key}`);
  if (options.json) {
    out(JSON.stringify(event));
    return;
  }
  out(describeEvent(event));
  const start = event.history[0]?.at ?? 0;
  out(
    table(
      context,
      ["at", "+", "fence", "what", "token", "detail"],
      event.history.map((entry) => [
        new Date(entry.at).toISOString(),
        age(entry.at - start),
        entry.fence,
        entry.kind,
        entry.token === null ? "-" : clip(entry.token, 10),
        entry.leaseUntil === null
          ? clip(entry.detail ?? "", 60)
          : `lease until ${new Date(entry.leaseUntil).toISOString()}`,
      ]),
      [1, 2],
    ),
  );
}

function describeEvent(event: Explanation): string {
  return printable(
    `event ${event.eventId} (${event.identity}) in queue ${event.queue}: ${event.state}, attempt ${event.attempt}/${event.maxAttempts}, fence ${event.fence}${
      event.lastError === null
        ? ""
        : `, last error ${JSON.stringify(event.lastError)}`
    }`,
  );
}

async function watch(context: Context): Promise<void> {
  noArguments(context, "watch");
  const intervalMs = context.options.interval === undefined
    ? 2_000
    : duration("--interval", context.options.interval, {
      min: 1,
      max: MAX_INTERVAL_MS,
    });
  const controller = new AbortController();
  const signal = context.signal ?? controller.signal;
  const interrupt = () => controller.abort();
  if (context.signal === undefined) Deno.addSignalListener("SIGINT", interrupt);
  try {
    await using reader = await openReader(context);
    const live = context.color && !context.options.json;
    let previous: { at: number; done: number } | undefined;
    while (!signal.aborted) {
      const summary = await readSummary(reader, context);
      const at = context.now();
      // Per second over the last interval, from the change in done events.
      const perSecond = previous === undefined || at === previous.at
        ? null
        : Math.max(0, summary.done - previous.done) * 1000 / (at - previous.at);
      previous = { at, done: summary.done };
      if (context.options.json) {
        context.out(
          JSON.stringify({ ...summary, acknowledgedPerSecond: perSecond }),
        );
      } else if (live) {
        // A terminal gets the whole table redrawn in place.
        context.out(
          `\x1b[H\x1b[2J${summary.at}  acks ${
            perSecond === null ? "-" : perSecond.toFixed(1)
          }/s now (Ctrl-C to stop)\n${summaryTable(context, summary)}`,
        );
      } else {
        context.out(
          `${summary.at}  pending ${summary.pending}  leased ${summary.leased}  done ${summary.done}  dead ${summary.dead}  oldest pending ${
            summary.pending === 0 ? "-" : age(summary.oldestPendingAgeMs)
          }  acks ${summary.acknowledgedLastMinute}/min${
            perSecond === null ? "" : `  ${perSecond.toFixed(1)}/s now`
          }`,
        );
      }
      await abortableSleep(intervalMs, signal);
    }
  } finally {
    if (context.signal === undefined) {
      Deno.removeSignalListener("SIGINT", interrupt);
    }
  }
}

async function redrive(context: Context): Promise<void> {
  const ids = context.rest.length === 0
    ? undefined
    : someIds(context, "redrive");
  if (ids !== undefined && context.options.queue !== undefined) {
    throw new UsageError("redrive takes event ids or --queue, not both");
  }
  await using outbox = await openOutbox(context);
  const redriven = await outbox.redrive(
    ids !== undefined
      ? { ids }
      : context.options.queue === undefined
      ? {}
      : { queue: context.options.queue },
  );
  report(context, { redriven }, `redrove ${redriven} dead letters`);
}

async function retry(context: Context): Promise<void> {
  someIds(context, "retry");
  await redrive(context);
}

async function cancel(context: Context): Promise<void> {
  const ids = someIds(context, "cancel");
  await using outbox = await openOutbox(context);
  const cancelled = await outbox.cancel(ids);
  report(
    context,
    { cancelled },
    `cancelled ${cancelled.length} of ${ids.length}: ${
      cancelled.join(" ") || "none was pending"
    }`,
  );
}

async function purge(context: Context): Promise<void> {
  noArguments(context, "purge");
  const olderThan = context.options["older-than"];
  if (olderThan === undefined) throw new UsageError("purge needs --older-than");
  const olderThanMs = duration("--older-than", olderThan);
  const states = (context.options.state ?? ["done,dead"]).flatMap((s) =>
    s.split(",")
  );
  for (const state of states) {
    if (state !== "done" && state !== "dead") {
      throw new UsageError(
        `--state must be done or dead: got ${JSON.stringify(state)}`,
      );
    }
  }
  await using outbox = await openOutbox(context);
  const purged = await outbox.purge({
    olderThanMs,
    states: states as ("done" | "dead")[],
  }).catch((error) => {
    throw new Error(
      `purge stopped: ${
        message(error)
      }; batches deleted before stay deleted, and running it again finishes`,
      { cause: error },
    );
  });
  report(
    context,
    { purged },
    `purged ${purged} events (${states.join(", ")}) older than ${olderThan}`,
  );
}

function report(context: Context, json: object, text: string): void {
  context.out(context.options.json ? JSON.stringify(json) : text);
}

async function openReader(context: Context): Promise<OutboxReader> {
  let driver;
  if (context.postgres) {
    driver = await withPath(context, () =>
      connectPostgres(context.database, {
        ...postgresOptions(context),
        lockTimeoutMs: lockTimeoutFor(context.busyTimeoutMs),
      }));
  } else {
    const url = fileUrl(context.database);
    url.searchParams.set("mode", "ro");
    driver = await open(context, url);
  }
  return await withPath(
    context,
    () => OutboxReader.open(driver, { busyTimeoutMs: context.busyTimeoutMs }),
  );
}

async function openOutbox(context: Context): Promise<Outbox> {
  if (context.postgres) {
    // Checked first, as a file is: openPostgres creates what is missing.
    await (await openReader(context)).close();
    return await withPath(context, () =>
      openPostgres(context.database, {
        ...postgresOptions(context),
        busyTimeoutMs: context.busyTimeoutMs,
      }));
  }
  const url = fileUrl(context.database);
  url.searchParams.set("mode", "rw");
  // Checked read-only first: Outbox.open would create the schema in any
  // database that has none. A crashed writer's hot journal stops a
  // read-only connection; a read-write one rolls it back on its first read.
  await openReader(context).catch(async (error) => {
    if (
      !(error.cause instanceof SqliteError &&
        error.cause.code === READONLY_ROLLBACK)
    ) {
      throw error;
    }
    const driver = await open(context, url);
    try {
      await withPath(
        context,
        () => driver.query("SELECT count(*) FROM sqlite_schema"),
      );
    } finally {
      await driver.close();
    }
    return await openReader(context);
  }).then((reader) => reader.close());
  const driver = await open(context, url);
  return await withPath(
    context,
    () => Outbox.open(driver, { busyTimeoutMs: context.busyTimeoutMs }),
  );
}

function postgresOptions(context: Context) {
  return {
    ...(context.options.schema === undefined
      ? {}
      : { schema: context.options.schema }),
    applicationName: "leased-outbox cli",
    listen: false,
  };
}

async function open(context: Context, url: URL) {
  const options = { busyTimeoutMs: context.busyTimeoutMs };
  return await withPath(
    context,
    async () =>
      await isWal(url)
        ? await openNodeSqlite(new URL(url.pathname, url), {
          ...options,
          readOnly: url.searchParams.get("mode") === "ro",
        })
        : await openSqliteWasm(url, options),
  );
}

/**
 * Whether the file's header marks it WAL mode (the file format read and
 * write versions, bytes 18 and 19, are 2). A file that cannot be read is
 * left to the open that follows, which reports why.
 */
async function isWal(url: URL): Promise<boolean> {
  let file: Deno.FsFile;
  try {
    file = await Deno.open(new URL(url.pathname, url));
  } catch {
    return false;
  }
  using _ = file;
  const header = new Uint8Array(20);
  let read = 0;
  while (read < header.length) {
    const n = await file.read(header.subarray(read));
    if (n === null) return false;
    read += n;
  }
  return header[18] === 2 || header[19] === 2;
}

async function withPath<T>(context: Context, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (error) {
    // An option the driver refuses (--schema) is a usage error.
    if (error instanceof TypeError) throw error;
    const why = error instanceof BusyError
      ? `locked by another connection for longer than --busy-timeout (${context.busyTimeoutMs} ms)`
      : error instanceof SqliteError && /not a database/.test(error.message)
      ? "not an outbox database (not SQLite)"
      : /no outbox/.test(message(error))
      ? `not an outbox database (no outbox tables${
        !context.postgres
          ? ""
          : context.options.schema === undefined
          ? " where its search_path leads"
          : ` in schema ${context.options.schema}`
      })`
      : message(error);
    throw new Error(`cannot open ${context.database}: ${why}`, {
      cause: error,
    });
  }
}

/**
 * The parts of `database` that hold a password, each with what replaces it
 * in a message: a URL's `user:password@` (up to the last `@`, as URL
 * parsers read an unencoded one, and a `/`, `?` or `#` in a password), its
 * query's `…password=` pairs, or all of a libpq `key=value` string that
 * names a password.
 */
function credentialsOf(database: string): [string, string][] {
  const scheme = /^[a-z][a-z0-9+.-]*:/i.exec(database)?.[0];
  if (scheme === undefined) {
    return /password\s*=/i.test(database) ? [[database, "***"]] : [];
  }
  const found: [string, string][] = [];
  const rest = database.slice(scheme.length).replace(/^\/{0,2}/, "");
  const userinfo = rest.slice(0, rest.lastIndexOf("@") + 1);
  if (userinfo.includes(":")) found.push([userinfo, "***@"]);
  const query = database.indexOf("?");
  for (const pair of query < 0 ? [] : database.slice(query + 1).split(/[&#]/)) {
    const key = /^[a-z_]*password=/i.exec(pair)?.[0];
    if (key !== undefined) found.push([pair, `${key}***`]);
  }
  // Also as a client may quote them, decoded.
  return found.flatMap(([text, mask]) => {
    try {
      const decoded = decodeURIComponent(text);
      return decoded === text
        ? [[text, mask]]
        : [[text, mask], [decoded, mask]];
    } catch {
      return [[text, mask]];
    }
  });
}

function fileUrl(path: string): URL {
  // `deno task` runs in the project's directory; INIT_CWD is where the
  // user typed the command, which a relative path is relative to.
  const cwd = Deno.env.get("INIT_CWD") ?? Deno.cwd();
  if (!path.startsWith("file:")) return pathToFileURL(resolve(cwd, path));
  // `file:o.db` is relative, as SQLite reads a URI filename without `//`
  // or `/`; the URL parser would put it at the root.
  const relative = /^file:([^/?#][^?#]*)(.*)$/.exec(path);
  if (relative === null) return new URL(path);
  const url = pathToFileURL(
    resolve(cwd, decodeURIComponent(relative[1]!)),
  );
  return new URL(relative[2]!, url);
}

function noArguments(context: Context, command: string): void {
  if (context.rest.length > 0) {
    throw new UsageError(
      `${command} takes no argument after the database: got ${
        context.rest.join(" ")
      }`,
    );
  }
}

function someIds(context: Context, command: string): number[] {
  if (context.rest.length === 0) {
    throw new UsageError(`${command} needs an event id`);
  }
  if (context.rest.length > MAX_BATCH) {
    throw new UsageError(
      `${command} takes at most ${MAX_BATCH} event ids: got ${context.rest.length}`,
    );
  }
  return context.rest.map((id) => count("event id", id, 1));
}

function count(name: string, text: string, min: number): number {
  const n = Number(text);
  if (!/^\d+$/.test(text) || !Number.isSafeInteger(n) || n < min) {
    throw new UsageError(
      `${name} must be an integer of at least ${min}: got ${
        JSON.stringify(text)
      }`,
    );
  }
  return n;
}

/**
 * `500ms`, `30s`, `15m`, `12h`, `7d`, or several together (`1h30m`), in
 * milliseconds, from `min` to `max`.
 */
function duration(
  name: string,
  text: string,
  { min = 0, max = Number.MAX_SAFE_INTEGER } = {},
): number {
  const parts = [...text.matchAll(/(\d+)(ms|s|m|h|d)/g)];
  if (parts.length === 0 || parts.map((p) => p[0]).join("") !== text) {
    throw new UsageError(
      `${name} must be a duration like 500ms, 30s, 15m, 12h, 7d or 1h30m: got ${
        JSON.stringify(text)
      }`,
    );
  }
  const ms = parts.reduce(
    (sum, [, n, unit]) => sum + Number(n) * UNITS[unit!]!,
    0,
  );
  if (!Number.isSafeInteger(ms) || ms > max) {
    throw new UsageError(
      `${name} must be at most ${spelled(max)}: got ${JSON.stringify(text)}`,
    );
  }
  if (ms < min) {
    throw new UsageError(
      `${name} must be at least ${spelled(min)}: got ${JSON.stringify(text)}`,
    );
  }
  return ms;
}

/** A duration as {@linkcode duration} reads it, in its largest exact unit. */
function spelled(ms: number): string {
  const [unit, size] = Object.entries(UNITS).findLast(([, size]) =>
    ms % size === 0
  )!;
  return `${ms / size}${unit}`;
}

/** A duration for people: `850 ms`, `4.2 s`, `3.5 min`, `2.1 h`, `3.0 d`. */
function age(ms: number): string {
  if (ms < 1_000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1_000).toFixed(1)} s`;
  if (ms < 3_600_000) return `${(ms / 60_000).toFixed(1)} min`;
  if (ms < 86_400_000) return `${(ms / 3_600_000).toFixed(1)} h`;
  return `${(ms / 86_400_000).toFixed(1)} d`;
}

function relative(at: number, now: number): string {
  return at > now ? `in ${age(at - now)}` : `${age(now - at)} ago`;
}

function clip(text: string, length: number): string {
  const line = text.replaceAll(/\s+/g, " ");
  return line.length <= length ? line : `${line.slice(0, length - 1)}…`;
}

/**
 * `text` with the characters a terminal acts on rather than shows (C0 and
 * C1 controls, DEL, bidirectional overrides) written as `\u` escapes: a
 * queue name or an error text stored by any producer must not move the
 * cursor, recolour the screen or reorder what an operator reads.
 */
function printable(text: string): string {
  return text.replaceAll(
    // Matching control characters is the point.
    // deno-lint-ignore no-control-regex
    /[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`,
  );
}

/** Padded columns; `right` lists the columns aligned right (numbers). */
function table(
  context: Context,
  header: readonly string[],
  rows: readonly (readonly (string | number)[])[],
  right: readonly number[],
): string {
  const cells = [
    header,
    ...rows.map((row) => row.map((cell) => printable(String(cell)))),
  ];
  const widths = header.map((_, i) =>
    Math.max(...cells.map((row) => row[i]!.length))
  );
  const lines = cells.map((row) =>
    row.map((cell, i) =>
      right.includes(i) ? cell.padStart(widths[i]!) : cell.padEnd(widths[i]!)
    ).join("  ").trimEnd()
  );
  if (context.color) lines[0] = `\x1b[1m${lines[0]}\x1b[22m`;
  return lines.join("\n");
}

const encoder = new TextEncoder();

/**
 * Writes a line to stdout; unlike `console.log`, throws
 * `Deno.errors.BrokenPipe` once the reader is gone, which ends the command.
 */
function writeLine(line: string): void {
  const bytes = encoder.encode(`${line}\n`);
  for (let written = 0; written < bytes.length;) {
    written += Deno.stdout.writeSync(bytes.subarray(written));
  }
}

function colorByDefault(): boolean {
  return Deno.stdout.isTerminal() && !Deno.env.get("NO_COLOR");
}

function abortableSleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done);
  });
}

function message(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

if (import.meta.main) Deno.exit(await main(Deno.args));
