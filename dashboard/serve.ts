/**
 * Serves the dashboard on its own port: what `outbox ui` runs. Binds
 * 127.0.0.1 unless told otherwise, since the dashboard is an admin door,
 * and answers only requests addressed to it by an IP address, `localhost`
 * or the name it was told to bind: a page whose DNS name an attacker
 * rebinds to 127.0.0.1 is its own origin to the browser, so neither the
 * same-origin check nor the cookie would stop it reading every payload or
 * posting a purge.
 *
 * @module
 */
import {
  dashboard,
  type DashboardOptions,
  type DashboardSource,
} from "./mod.ts";
import {
  checkHost,
  checkInteger,
  checkOptions,
  checkSignal,
  describe,
} from "../validate.ts";

const SERVE_OPTIONS = ["port", "hostname", "signal", "allowedHosts"];
import { basePathOf } from "./base_path.ts";
import { DASHBOARD_OPTIONS } from "./options.ts";

/** Options of {@linkcode serveDashboard}. */
export interface ServeDashboardOptions extends DashboardOptions {
  /** The TCP port; `0` picks a free one. @default {8080} */
  readonly port?: number;
  /** The address to bind. @default {"127.0.0.1"} */
  readonly hostname?: string;
  /** Stops the server when it aborts. */
  readonly signal?: AbortSignal;
  /**
   * Further host names requests may be addressed to (their `Host` header),
   * e.g. `["outbox.internal"]`; IP addresses, `localhost`, `*.localhost`
   * and `hostname` always may. Any other answers 421 and reads nothing.
   *
   * @default {[]}
   */
  readonly allowedHosts?: readonly string[];
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
 * @throws {TypeError | RangeError} When an option is unknown or invalid
 * (see {@linkcode dashboard}): the port not an integer from 0 to 65535,
 * the hostname or an allowed host not a host name, or the signal not an
 * `AbortSignal`. The message names the field.
 */
export function serveDashboard(
  source: DashboardSource,
  options: ServeDashboardOptions = {},
): DashboardServer {
  const op = "serve dashboard";
  checkOptions(op, options, [...SERVE_OPTIONS, ...DASHBOARD_OPTIONS]);
  const rest = Object.fromEntries(
    Object.entries(options).filter(([key]) => !SERVE_OPTIONS.includes(key)),
  ) as DashboardOptions;
  const port = checkInteger(op, "port", options.port, 0, 65_535) ?? 8080;
  const hostname = checkHost(op, "hostname", options.hostname) ??
    "127.0.0.1";
  const signal = checkSignal(op, "signal", options.signal);
  const allowedHosts = options.allowedHosts ?? [];
  if (!Array.isArray(allowedHosts)) {
    throw new TypeError(
      `Cannot ${op} as 'allowedHosts' must be an array of host names: current value is ${
        describe(allowedHosts)
      }`,
    );
  }
  allowedHosts.forEach((host, i) => checkHost(op, `allowedHosts[${i}]`, host));
  const names = new Set(
    [hostname, ...allowedHosts].map((host) => host.toLowerCase()),
  );
  const dashboardHandler = dashboard(source, rest);
  const handler = (request: Request) =>
    addressedHere(new URL(request.url).hostname, names)
      ? dashboardHandler(request)
      : Promise.resolve(
        new Response(
          "Misdirected: this dashboard answers requests to its IP address, localhost, or --hostname only",
          {
            status: 421,
            headers: {
              "content-type": "text/plain; charset=utf-8",
              "content-security-policy": "default-src 'none'",
              "x-content-type-options": "nosniff",
              "cache-control": "no-store",
            },
          },
        ),
      );
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
  const base = basePathOf(op, rest.basePath);
  return {
    url: `http://${host}:${address.port}${base}/`,
    finished: server.finished,
    shutdown: () => server.shutdown(),
    [Symbol.asyncDispose]: () => server.shutdown(),
  };
}

/**
 * Whether a request's host (the URL parser's form of its `Host` header)
 * names this server in a way no DNS answer can redirect: an IP address,
 * `localhost` or a name under it, or one of `names`.
 */
function addressedHere(host: string, names: ReadonlySet<string>): boolean {
  return /^\d{1,3}(\.\d{1,3}){3}$/.test(host) || host.startsWith("[") ||
    host === "localhost" || host.endsWith(".localhost") || names.has(host);
}
