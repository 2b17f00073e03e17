/**
 * The example's own server, on 127.0.0.1 only (a secure context, so OPFS
 * works): it serves the page and the bundle, and it is the endpoint the
 * page delivers queued messages to.
 *
 * The endpoint is what a careful recipient looks like: it applies each
 * delivery through an {@linkcode Inbox}, which dedupes on the event's
 * identity (the `Idempotency-Key` header), so a repeated delivery (the same
 * claim sent again, or a later claim of an event whose acknowledgement was
 * lost) is absorbed, and events of different outboxes and browsers, whose
 * ids all start at 1, never merge. It can be switched down (503) and up
 * again to watch jobs retry with backoff and drain.
 *
 * Run with `deno task serve:browser` (it builds the bundle first).
 *
 * @module
 */
import { Inbox, readDeliveryHeaders } from "../../mod.ts";
import { openSqliteWasm } from "../../deno/sqlite_wasm.ts";
import { buildBrowser } from "./build.ts";

/** One message the endpoint applied. */
export interface Delivery {
  /** The event's identity: what the endpoint dedupes on. */
  readonly identity: string;
  /** The fence of the claim that delivered it. */
  readonly fence: number;
  /** The message as the page sent it. */
  readonly body: unknown;
}

/** Options for {@linkcode serveExample}. */
export interface ExampleServerOptions {
  /** @default {0} (any free port) */
  readonly port?: number;
  /** Where the bundle was built. @default {the example's build/ directory} */
  readonly buildDir?: URL;
  /** Extra static files served under `/fixtures/` (tests). */
  readonly fixturesDir?: URL;
  /**
   * Send COOP/COEP headers, making pages cross-origin isolated (so the
   * worker can use the `opfs` VFS).
   *
   * @default {false}
   */
  readonly isolated?: boolean;
  /** Delay before the endpoint answers, in ms. @default {0} */
  readonly deliveryDelayMs?: number;
}

/** A running example server. */
export interface ExampleServer {
  /** The page's URL, e.g. `http://127.0.0.1:8123/`. */
  readonly url: string;
  /** Applied deliveries, one per event, in arrival order. */
  readonly deliveries: Delivery[];
  /** Every identity received, repeats and refused ones included. */
  readonly keys: string[];
  /** How many deliveries the inbox refused (duplicate or stale). */
  readonly duplicates: () => number;
  /** Whether the endpoint answers 503. */
  down: boolean;
  /** Stops listening. */
  shutdown(): Promise<void>;
}

const pageDir = new URL("./", import.meta.url);

const TYPES: Record<string, string> = {
  html: "text/html; charset=utf-8",
  js: "text/javascript; charset=utf-8",
  wasm: "application/wasm",
  css: "text/css; charset=utf-8",
};

/**
 * Starts the example server.
 *
 * @param options See {@linkcode ExampleServerOptions}.
 * @returns The running server.
 */
export function serveExample(
  options: ExampleServerOptions = {},
): ExampleServer {
  const buildDir = options.buildDir ?? new URL("build/", pageDir);
  // The endpoint's own database, in memory: the example shows the inbox,
  // not where the recipient keeps its data.
  const inbox = openSqliteWasm(":memory:").then((driver) => Inbox.open(driver));
  const keys: string[] = [];
  let duplicates = 0;
  const state: { down: boolean } = { down: false };
  const deliveries: Delivery[] = [];
  const headers = (type: string): Headers => {
    // no-cache (every use asks the server again), not no-store, which
    // keeps pages out of the browser's back-forward cache.
    const result = new Headers({
      "content-type": type,
      "cache-control": "no-cache",
    });
    if (options.isolated) {
      result.set("cross-origin-opener-policy", "same-origin");
      result.set("cross-origin-embedder-policy", "require-corp");
    }
    return result;
  };

  const server = Deno.serve(
    { hostname: "127.0.0.1", port: options.port ?? 0, onListen() {} },
    async (request) => {
      const { pathname } = new URL(request.url);
      if (pathname === "/deliver" && request.method === "POST") {
        const body = await request.json();
        if (options.deliveryDelayMs) {
          await new Promise((r) => setTimeout(r, options.deliveryDelayMs));
        }
        let delivery;
        try {
          delivery = readDeliveryHeaders(request.headers);
        } catch (error) {
          return new Response(String(error), { status: 400 });
        }
        const { identity, fence } = delivery;
        keys.push(identity);
        if (state.down) {
          return new Response("endpoint down", { status: 503 });
        }
        const result = await (await inbox).accept(identity, fence, () => {
          deliveries.push({ identity, fence, body });
          return Promise.resolve();
        });
        if (result.status !== "accepted") duplicates++;
        return Response.json({ identity, status: result.status }, {
          status: result.status === "stale" ? 409 : 200,
          headers: headers("application/json"),
        });
      }
      if (pathname === "/endpoint" && request.method === "POST") {
        state.down = (await request.text()) === "down";
        return new Response(null, { status: 204 });
      }
      if (pathname === "/deliveries") {
        return new Response(
          JSON.stringify({
            down: state.down,
            deliveries: deliveries.slice(-20),
          }),
          { headers: headers("application/json") },
        );
      }
      const file = pathname === "/"
        ? new URL("index.html", pageDir)
        : pathname.startsWith("/build/")
        ? new URL(pathname.slice("/build/".length), buildDir)
        : options.fixturesDir && pathname.startsWith("/fixtures/")
        ? new URL(pathname.slice("/fixtures/".length), options.fixturesDir)
        : undefined;
      if (file === undefined || pathname.includes("..")) {
        return new Response("not found", { status: 404 });
      }
      try {
        const extension = file.pathname.split(".").pop() ?? "";
        return new Response(await Deno.readFile(file), {
          headers: headers(TYPES[extension] ?? "application/octet-stream"),
        });
      } catch {
        return new Response("not found", { status: 404 });
      }
    },
  );
  return {
    url: `http://127.0.0.1:${server.addr.port}/`,
    deliveries,
    keys,
    duplicates: () => duplicates,
    get down() {
      return state.down;
    },
    set down(value: boolean) {
      state.down = value;
    },
    shutdown: async () => {
      await server.shutdown();
      await (await inbox).close();
    },
  };
}

if (import.meta.main) {
  await buildBrowser();
  const port = Number(Deno.args[0] ?? 8000);
  const server = serveExample({ port });
  console.log(`Outbox example at ${server.url}`);
}
