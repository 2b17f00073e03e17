/**
 * The options of the command line: the global ones every command takes,
 * and the specs that several commands share (a command module names the
 * shared ones it takes and may add its own).
 *
 * @module
 */
import type { OptionSpec } from "./command.ts";

/** The options every command takes. */
export const GLOBAL_OPTIONS: Readonly<Record<string, OptionSpec>> = {
  json: {
    type: "boolean",
    help: "machine-readable output: one JSON value per line",
  },
  "busy-timeout": {
    type: "string",
    value: "<d>",
    help: "how long to wait for a writer's lock (default 5s)",
  },
  schema: {
    type: "string",
    value: "<name>",
    help:
      "PostgreSQL: the schema the outbox is in (default: where the connection's search_path leads, usually public)",
  },
  help: { type: "boolean", short: "h", help: "this text" },
};

/** `--queue <name>`: only this queue. */
export const QUEUE: OptionSpec = {
  type: "string",
  value: "<name>",
  help: "only this queue",
};

/** `--full`: whole payloads instead of their first characters. */
export const FULL: OptionSpec = {
  type: "boolean",
  help:
    "the whole payload (default: its first 40 characters in a list, 200 in explain)",
};
