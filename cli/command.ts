/**
 * What every command of the `outbox` tool is made of: its entry in the
 * table ({@linkcode Command}), the options it may take, and the context
 * it runs in. A leaf: it imports nothing of the CLI's.
 *
 * @module
 */

/** One option of the command line, as `node:util`'s `parseArgs` reads it. */
export interface OptionSpec {
  readonly type: "string" | "boolean";
  /** The option may be given more than once (each value kept). */
  readonly multiple?: boolean;
  /** A one-letter alias. */
  readonly short?: string;
  /** What the usage shows after the name, e.g. `<n>`. */
  readonly value?: string;
  /** One line of help for the usage. */
  readonly help: string;
}

/** A command of the `outbox` tool: one module each, one entry in the table. */
export interface Command {
  /** What the user types, e.g. `list`. */
  readonly name: string;
  /** Its arguments after the name, e.g. `<db> <state>`. */
  readonly synopsis: string;
  /** What it does, for the usage (may span lines). */
  readonly summary: string;
  /**
   * The options it takes besides the global ones (`--json`,
   * `--busy-timeout`, `--schema`, `--help`): a shared spec of `options.ts`
   * or one of its own. Any other option is refused for it.
   */
  readonly options?: Readonly<Record<string, OptionSpec>>;
  /** Runs it; a {@linkcode UsageError} exits 2, any other error 1. */
  run(context: Context): Promise<void>;
}

/** The parsed options: strings, flags, or lists of strings. */
export type OptionValues = Readonly<
  Record<string, string | boolean | string[] | undefined>
>;

/** Where a command runs: its database, arguments, options and output. */
export interface Context {
  /** As given: a file path, a `file:` URI or a PostgreSQL URL. */
  readonly database: string;
  readonly postgres: boolean;
  /** The arguments after the database. */
  readonly rest: readonly string[];
  readonly options: OptionValues;
  /** Whether `--json` was given. */
  readonly json: boolean;
  readonly out: (line: string) => void;
  readonly color: boolean;
  readonly now: () => number;
  readonly busyTimeoutMs: number;
  readonly signal: AbortSignal | undefined;
}

/** A mistake in the command line: exit code 2, and a pointer to `--help`. */
export class UsageError extends Error {
  override name = "UsageError";
}

/** A string option's value, if given. */
export function stringOption(
  context: Context,
  name: string,
): string | undefined {
  const value = context.options[name];
  return typeof value === "string" ? value : undefined;
}

/** A boolean option: given or not. */
export function flagOption(context: Context, name: string): boolean {
  return context.options[name] === true;
}

/** A repeatable string option's values, if given. */
export function stringsOption(
  context: Context,
  name: string,
): string[] | undefined {
  const value = context.options[name];
  return Array.isArray(value) ? value : undefined;
}

/**
 * The signal a long-running command (`watch`, `ui`) stops at: the
 * context's, or else Ctrl-C (SIGINT), listened to until disposed.
 */
export function interruption(context: Context): Disposable & {
  readonly signal: AbortSignal;
} {
  if (context.signal !== undefined) {
    return { signal: context.signal, [Symbol.dispose]() {} };
  }
  const controller = new AbortController();
  const interrupt = () => controller.abort();
  Deno.addSignalListener("SIGINT", interrupt);
  return {
    signal: controller.signal,
    [Symbol.dispose]: () => Deno.removeSignalListener("SIGINT", interrupt),
  };
}
