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
 * ```sh
 * DATABASE_URL=postgres://… WEBHOOK_URL=https://… PORT=8000 deno run -A examples/edge/main.ts
 * ```
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

let opened: Promise<Outbox<OrderPlaced>> | undefined;
function outbox(): Promise<Outbox<OrderPlaced>> {
  opened ??= (async () => {
    const outbox = await openPostgres<OrderPlaced>(
      Deno.env.get("DATABASE_URL")!,
      // Supavisor's transaction mode: no LISTEN, no named statements.
      { listen: false, prepare: false, statementTimeoutMs: 10_000 },
    );
    await setUpOrders(outbox);
    return outbox;
  })();
  opened.catch(() => opened = undefined);
  return opened;
}

// Edge platforms pick the port themselves; PORT serves local runs.
Deno.serve({ port: Number(Deno.env.get("PORT") ?? 8000) }, async (request) => {
  const url = new URL(request.url);
  if (request.method === "POST" && url.pathname === "/drain") {
    const webhook = Deno.env.get("WEBHOOK_URL")!;
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
});
