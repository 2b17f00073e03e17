/**
 * The `outbox` tool's entry: reads the command line, finds the command in
 * the table ({@linkcode COMMANDS}), runs it, and turns what it threw into
 * an exit code and one line on stderr.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { PostgresError, SqliteError } from "../errors.ts";
import { MAX_BATCH, MAX_DURATION_MS } from "../lease.ts";
import {
  checkBoolean,
  checkFunction,
  checkName,
  checkOptions,
  checkSignal,
  describe,
} from "../validate.ts";
import { isPostgresUrl } from "../drivers/postgres.ts";
import { duration } from "./args.ts";
import {
  type Command,
  type OptionSpec,
  type OptionValues,
  UsageError,
} from "./command.ts";
import { COMMANDS } from "./commands.ts";
import { colorByDefault, message, printable, writeLine } from "./format.ts";
import { GLOBAL_OPTIONS } from "./options.ts";
import { credentialsOf, redacted } from "./redact.ts";

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

// SQLITE_CANTOPEN.
const CANTOPEN = 14;
const HELP = "see outbox --help";

/** Every option of every command, for the parser; each name once. */
const OPTIONS: Record<string, OptionSpec> = Object.assign(
  {},
  ...COMMANDS.map((command) => command.options ?? {}),
  GLOBAL_OPTIONS,
);

/**
 * Runs one command line of the `outbox` tool.
 *
 * @param args The arguments after the program's name.
 * @param io Where output goes; see {@linkcode CliIo}.
 * @returns The exit code: 0 done, 1 a runtime error, 2 a usage error.
 * @throws {TypeError} When `args` is not an array of strings, or `io` not
 * a {@linkcode CliIo} (a caller's mistake, not the command line's: no exit
 * code), naming the field.
 */
export async function main(
  args: readonly string[],
  io: CliIo = {},
): Promise<number> {
  checkMainArguments(args, io);
  const out = io.stdout ?? writeLine;
  // No message prints a password of the command line.
  const credentials = args.flatMap(credentialsOf);
  // An argument or a database's text quoted in a message is shown, not
  // acted on, as in every other output.
  const err = (line: string) =>
    (io.stderr ?? console.error)(
      redacted(credentials, line).split("\n").map(printable).join("\n"),
    );
  let file: string | undefined;
  let command: Command | undefined = COMMANDS.find((c) => c.name === args[0]);
  try {
    const { values, positionals } = parseCommandLine(args);
    if (values["help"] === true) {
      out(usage());
      return 0;
    }
    const [name, database, ...rest] = positionals;
    if (name === undefined) throw new UsageError("no command given");
    command = COMMANDS.find((c) => c.name === name);
    if (command === undefined) {
      throw new UsageError(
        `unknown command '${name}' (commands: ${
          COMMANDS.map((c) => c.name).join(", ")
        })`,
      );
    }
    if (database === undefined) {
      throw new UsageError(`${name} needs a database`);
    }
    file = database;
    for (const option of Object.keys(values)) {
      if (!(option in GLOBAL_OPTIONS) && !(option in (command.options ?? {}))) {
        throw new UsageError(`--${option} does not apply to ${name}`);
      }
    }
    const queue = values["queue"];
    if (typeof queue === "string") checkName("select a queue", "queue", queue);
    // As the driver reads it: a PostgreSQL URL, or else a file.
    const postgres = isPostgresUrl(database);
    if (values["schema"] !== undefined && !postgres) {
      throw new UsageError("--schema applies to a PostgreSQL database only");
    }
    const busyTimeout = values["busy-timeout"];
    await command.run({
      database,
      postgres,
      rest,
      options: values,
      json: values["json"] === true,
      out,
      color: io.color ?? colorByDefault(),
      now: io.now ?? Date.now,
      busyTimeoutMs: typeof busyTimeout === "string"
        ? duration("--busy-timeout", busyTimeout, { max: MAX_DURATION_MS })
        : 5_000,
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
      err(
        command === undefined
          ? `outbox: ${error.message}; ${HELP}`
          : `outbox: ${error.message}\nusage: outbox ${
            synopsis(command)
          }; ${HELP}`,
      );
      return 2;
    }
    // SQLite's own message names no file; the opens add it, and this adds
    // it to an error of the command's statements.
    err(
      `outbox: ${
        (error instanceof SqliteError || error instanceof PostgresError) &&
          file !== undefined
          ? `${file}: ${message(error)}${
            // The Deno file VFS says which file and why; node:sqlite does not.
            error instanceof SqliteError && (error.code & 0xff) === CANTOPEN &&
              !error.message.includes(": ")
              ? " (its journal, in the same directory, could not be created: is the directory writable?)"
              : ""}`
          : message(error)
      }`,
    );
    return 1;
  }
}

/** Checks `main`'s own arguments, before anything reads them. */
function checkMainArguments(args: unknown, io: unknown): void {
  const op = "run outbox";
  if (!Array.isArray(args) || !args.every((arg) => typeof arg === "string")) {
    throw new TypeError(
      `Cannot ${op} as 'args' must be an array of strings: current value is ${
        describe(args)
      }`,
    );
  }
  checkOptions(op, io, IO_FIELDS, "io");
  const given = io as Record<string, unknown>;
  for (const field of ["stdout", "stderr", "now"]) {
    if (given[field] !== undefined) {
      checkFunction(op, `io.${field}`, given[field]);
    }
  }
  checkBoolean(op, "io.color", given["color"], false);
  checkSignal(op, "io.signal", given["signal"]);
}

const IO_FIELDS = ["stdout", "stderr", "color", "now", "signal"];

function parseCommandLine(
  args: readonly string[],
): { values: OptionValues; positionals: string[] } {
  let parsed;
  try {
    parsed = parseArgs({
      args: negativeValuesJoined(args),
      options: OPTIONS,
      allowPositionals: true,
      strict: true,
      tokens: true,
    });
  } catch (error) {
    throw new UsageError(message(error));
  }
  // parseArgs keeps the last of a repeated option: `--limit 5 --limit 6`
  // would list 6 and say nothing of the 5.
  const given = new Set<string>();
  for (const token of parsed.tokens) {
    if (token.kind !== "option") continue;
    const spec = OPTIONS[token.name];
    if (spec?.type !== "string" || spec.multiple === true) continue;
    if (given.has(token.name)) {
      throw new UsageError(`--${token.name} may be given once: got it twice`);
    }
    given.add(token.name);
  }
  return {
    values: parsed.values as OptionValues,
    positionals: parsed.positionals,
  };
}

/**
 * `args` with a value-taking option and a value that starts with `-` and
 * a digit written as one (`--after -1` as `--after=-1`): parseArgs refuses
 * the two apart as ambiguous, which would hide the option's own message
 * (`--after must be an integer of at least 0: got "-1"`). Any other value
 * starting with `-` stays apart, so `--queue --json` is still refused.
 */
function negativeValuesJoined(args: readonly string[]): string[] {
  const joined: string[] = [];
  for (let i = 0; i < args.length; i++) {
    const arg = args[i]!;
    if (arg === "--") {
      joined.push(...args.slice(i));
      break;
    }
    const next = args[i + 1];
    const name = arg.slice(2);
    if (
      arg.startsWith("--") && Object.hasOwn(OPTIONS, name) &&
      OPTIONS[name]!.type === "string" && next !== undefined &&
      /^-\d/.test(next)
    ) {
      joined.push(`${arg}=${next}`);
      i++;
    } else {
      joined.push(arg);
    }
  }
  return joined;
}

/** `list <db> <state> [--queue <name>] …`: a command and its own options. */
function synopsis(command: Command): string {
  return [
    command.name,
    command.synopsis,
    ...Object.entries(command.options ?? {}).map(([name, spec]) =>
      `[--${name}${spec.value === undefined ? "" : ` ${spec.value}`}]`
    ),
  ].filter((part) => part !== "").join(" ");
}

const USAGE_WIDTH = 80;

/** `text` in lines of at most `width` characters, broken between words. */
function wrap(text: string, width: number): string[] {
  const lines: string[] = [];
  let line = "";
  for (const word of text.split(/\s+/)) {
    if (line !== "" && line.length + 1 + word.length > width) {
      lines.push(line);
      line = word;
    } else {
      line = line === "" ? word : `${line} ${word}`;
    }
  }
  return [...lines, line];
}

/** The whole usage, from the table of commands and their options. */
function usage(): string {
  const column = (left: string, right: string, width: number) =>
    wrap(right, USAGE_WIDTH - width - 3).map((line, i) =>
      `  ${(i === 0 ? left : "").padEnd(width)} ${line}`
    ).join("\n");
  const commands = COMMANDS.map((c) =>
    column(`${c.name} ${c.synopsis}`, c.summary, 28)
  );
  const seen = new Set<string>();
  const options: string[] = [];
  for (const [name, spec] of Object.entries(OPTIONS)) {
    if (seen.has(name)) continue;
    seen.add(name);
    const users = name in GLOBAL_OPTIONS
      ? []
      : COMMANDS.filter((c) => c.options?.[name] !== undefined).map((c) =>
        c.name
      );
    const flag = `${
      spec.short === undefined ? "" : `-${spec.short}, `
    }--${name}${spec.value === undefined ? "" : ` ${spec.value}`}`;
    options.push(
      column(
        flag,
        users.length === 0 ? spec.help : `${users.join(", ")}: ${spec.help}`,
        22,
      ),
    );
  }
  return `Usage: outbox <command> <database> [argument] [options]

Commands:
${commands.join("\n")}

Options:
${options.join("\n")}

The database is a file path (or a file: URI), or a PostgreSQL URL
(postgres://user:password@host:port/database). Read-only commands (stats,
list, explain, watch) open it read-only; no command creates an outbox.
A command takes at most ${MAX_BATCH} event ids.
Exit codes: 0 done, 1 a runtime error, 2 a usage error.`;
}
