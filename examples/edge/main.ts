/**
 * The edge function itself, as Supabase Edge Functions and Deno Deploy run
 * it: `Deno.serve` with one outbox per isolate, opened on first use from
 * `DATABASE_URL`. `POST /orders` commits an order and its event;
 * `POST /drain` (called by a scheduler, e.g. pg_cron with pg_net, or Deno
 * Deploy's cron) delivers a bounded share of the events to `WEBHOOK_URL`,
 * with the event's identity as `Idempotency-Key` and its fence as
 * `Idempotency-Fence`.
 *
 * LISTEN is off: an isolate does not outlive its requests, and behind a
 * transaction pooler (Supavisor's port 6543) it would not work. Prepared
 * statements are off for the same pooler.
 *
 * Run locally (`docs/edge.md` starts a throwaway PostgreSQL for it):
 *
 * ```sh
 * DATABASE_URL=postgres://… WEBHOOK_URL=http://127.0.0.1:9000/ deno run -A examples/edge/main.ts
 * ```
 *
 * It listens on `HOSTNAME` (default `127.0.0.1`: only this machine) and
 * `PORT` (default 8000); edge platforms choose both themselves. A variable
 * it needs and does not have is named in the answer (500) and on stderr.
 *
 * @module
 */
import { openPostgres } from "../../drivers/postgres.ts";
import { deliveryHeaders, type Outbox } from "../../mod.ts";
import {
  drain,
  type OrderPlaced,
  ordersHandler,
  setUpOrders,
} from "./orders.ts";

/** A setting the function needs is missing from its environment. */
class MissingSetting extends Error {
  override name = "MissingSetting";
  constructor(variable: string, example: string) {
    super(`${variable} is not set: set it to ${example}`);
  }
}

function setting(variable: string, example: string): string {
  const value = Deno.env.get(variable);
  if (value === undefined || value === "") {
    throw new MissingSetting(variable, example);
  }
  return value;
}

let opened: Promise<Outbox<OrderPlaced>> | undefined;
function outbox(): Promise<Outbox<OrderPlaced>> {
  const url = setting(
    "DATABASE_URL",
    "the database's URL, e.g. postgres://postgres@127.0.0.1:5432/postgres",
  );
  opened ??= (async () => {
    const outbox = await openPostgres<OrderPlaced>(
      url,
      // Supavisor's transaction mode: no LISTEN, no named statements.
      { listen: false, prepare: false, statementTimeoutMs: 10_000 },
    );
    await setUpOrders(outbox);
    return outbox;
  })();
  opened.catch(() => opened = undefined);
  return opened;
}

async function handle(request: Request): Promise<Response> {
  const url = new URL(request.url);
  if (request.method === "POST" && url.pathname === "/drain") {
    const webhook = setting(
      "WEBHOOK_URL",
      "the URL that receives each event, e.g. http://127.0.0.1:9000/",
    );
    const report = await drain(await outbox(), async (lease, signal) => {
      const response = await fetch(webhook, {
        method: "POST",
        signal,
        // The recipient dedupes on the identity and orders attempts by
        // the fence.
        headers: {
          "content-type": "application/json",
          ...deliveryHeaders(lease),
        },
        body: JSON.stringify(lease.payload),
      });
      await response.body?.cancel();
      if (!response.ok) throw new Error(`webhook answered ${response.status}`);
    }, { maxEvents: 50, maxMs: 20_000 });
    return Response.json(report);
  }
  return await ordersHandler(await outbox())(request);
}

// Edge platforms pick the address and port themselves; HOSTNAME and PORT
// serve local runs, on this machine only unless HOSTNAME says otherwise.
Deno.serve({
  hostname: Deno.env.get("HOSTNAME") || "127.0.0.1",
  port: Number(Deno.env.get("PORT") || 8000),
}, async (request) => {
  try {
    return await handle(request);
  } catch (error) {
    if (!(error instanceof MissingSetting)) throw error;
    console.error(`edge example: ${error.message}`);
    return Response.json({ error: error.message }, { status: 500 });
  }
});
