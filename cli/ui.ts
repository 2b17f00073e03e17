/**
 * `outbox ui <db> [--port N] [--hostname H] [--allow-host NAME] [--actions]`:
 * serves the web
 * dashboard over the database until Ctrl-C. Read-only through
 * {@linkcode OutboxReader} unless `--actions`, which opens it read-write
 * through {@linkcode Outbox} and enables redrive, cancel and purge. Binds
 * 127.0.0.1 unless `--hostname` says otherwise: a dashboard is an admin door.
 *
 * @module
 */
import { count, noArguments } from "./args.ts";
import {
  type Command,
  flagOption,
  interruption,
  stringOption,
  stringsOption,
  UsageError,
} from "./command.ts";
import { openOutbox, openReader } from "./open.ts";
import { serveDashboard } from "../dashboard/serve.ts";

export const ui: Command = {
  name: "ui",
  synopsis: "<db>",
  summary:
    "the web dashboard on http://127.0.0.1:8080/ until Ctrl-C (read-only unless --actions)",
  options: {
    port: {
      type: "string",
      value: "<n>",
      help: "the TCP port, 0 for any free one (default 8080)",
    },
    hostname: {
      type: "string",
      value: "<h>",
      help: "the address to bind (default 127.0.0.1)",
    },
    "allow-host": {
      type: "string",
      multiple: true,
      value: "<name>",
      help:
        "also answer requests addressed to this host name (IP addresses, localhost and --hostname always are)",
    },
    actions: {
      type: "boolean",
      help: "offer redrive, cancel and purge (opens the database read-write)",
    },
  },
  async run(context) {
    noArguments(context, "ui");
    const portText = stringOption(context, "port");
    const port = portText === undefined ? 8080 : count("--port", portText, 0);
    if (port > 65_535) {
      throw new UsageError(`--port must be at most 65535: got ${port}`);
    }
    const hostname = stringOption(context, "hostname") ?? "127.0.0.1";
    if (hostname === "") throw new UsageError("--hostname must not be empty");
    const actions = flagOption(context, "actions");
    const allowedHosts = stringsOption(context, "allow-host") ?? [];
    for (const host of allowedHosts) {
      if (!/^[a-z0-9.-]+$/i.test(host)) {
        throw new UsageError(
          `--allow-host must be a host name (letters, digits, '.', '-'): got ${
            JSON.stringify(host)
          }`,
        );
      }
    }
    using interrupted = interruption(context);
    const { signal } = interrupted;
    {
      await using source = actions
        ? await openOutbox(context)
        : await openReader(context);
      await using server = listen(
        () =>
          serveDashboard(source, {
            port,
            hostname,
            actions,
            signal,
            allowedHosts,
          }),
        {
          port,
          hostname,
        },
      );
      context.out(
        context.json
          ? JSON.stringify({ url: server.url, actions })
          : `dashboard on ${server.url} (${
            actions ? "actions on" : "read-only"
          }; Ctrl-C to stop)`,
      );
      await server.finished;
    }
  },
};

/**
 * Runs `serve`, saying which address failed and what to do where Deno's
 * own message names neither ("Address already in use (os error 98)").
 */
function listen<T>(
  serve: () => T,
  { port, hostname }: { port: number; hostname: string },
): T {
  try {
    return serve();
  } catch (error) {
    const where = `${hostname}:${port}`;
    if (error instanceof Deno.errors.AddrInUse) {
      throw new Error(
        `cannot listen on ${where}: the port is in use (another outbox ui?); pick another with --port, or --port 0 for any free one`,
        { cause: error },
      );
    }
    if (error instanceof Deno.errors.AddrNotAvailable) {
      throw new Error(
        `cannot listen on ${where}: --hostname is not an address of this machine`,
        { cause: error },
      );
    }
    if (error instanceof Error && /lookup address/.test(error.message)) {
      throw new Error(
        `cannot listen on ${where}: --hostname is not a name this machine can resolve`,
        { cause: error },
      );
    }
    throw error;
  }
}
