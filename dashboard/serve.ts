/**
 * Serves the dashboard on its own port: what `outbox ui` runs. Binds
 * 127.0.0.1 unless told otherwise, since the dashboard is an admin door.
 *
 * @module
 */
import {
  dashboard,
  type DashboardOptions,
  type DashboardSource,
} from "./mod.ts";

/** Options of {@linkcode serveDashboard}. */
export interface ServeDashboardOptions extends DashboardOptions {
  /** The TCP port; `0` picks a free one. @default {8080} */
  readonly port?: number;
  /** The address to bind. @default {"127.0.0.1"} */
  readonly hostname?: string;
  /** Stops the server when it aborts. */
  readonly signal?: AbortSignal;
}

/** A running dashboard server. */
export interface DashboardServer extends AsyncDisposable {
  /** Where it answers, e.g. `http://127.0.0.1:8080/`. */
  readonly url: string;
  /** Resolves once the server has stopped. */
  readonly finished: Promise<void>;
  /** Stops the server. */
  shutdown(): Promise<void>;
}

/**
 * Serves {@linkcode dashboard} over `source` with `Deno.serve`.
 *
 * @param source The outbox to show.
 * @param options See {@linkcode ServeDashboardOptions}.
 * @returns The running server.
 * @throws {TypeError | RangeError} When an option is invalid (see
 * {@linkcode dashboard}), or the port is not an integer from 0 to 65535.
 */
export function serveDashboard(
  source: DashboardSource,
  options: ServeDashboardOptions = {},
): DashboardServer {
  const { port = 8080, hostname = "127.0.0.1", signal, ...rest } = options;
  if (!Number.isInteger(port) || port < 0 || port > 65_535) {
    throw new RangeError(
      `Cannot serve dashboard as 'port' must be an integer from 0 to 65535: current value is ${port}`,
    );
  }
  const handler = dashboard(source, rest);
  const server = Deno.serve({
    port,
    hostname,
    onListen: () => {},
    ...(signal === undefined ? {} : { signal }),
  }, handler);
  const address = server.addr;
  const host = address.hostname.includes(":")
    ? `[${address.hostname}]`
    : address.hostname;
  const base = (rest.basePath ?? "").replace(/\/+$/, "");
  return {
    url: `http://${host}:${address.port}${base}/`,
    finished: server.finished,
    shutdown: () => server.shutdown(),
    [Symbol.asyncDispose]: () => server.shutdown(),
  };
}
