/**
 * The demo's recipient on 127.0.0.1: a second real database with an inbox,
 * on the outbox's engine (a SQLite file, or a PostgreSQL schema).
 * Each delivery's effect (recording the shipment of an order) commits with
 * its identity in one transaction, so a redelivery, under any fence, is
 * refused as a duplicate and a lower fence than the accepted one as stale.
 * Poison orders are refused with 422, every time, before the inbox.
 *
 * @module
 */
import { Inbox } from "../mod.ts";
import type { OrderPlaced, Recipient } from "./db.ts";

/** What the recipient has seen. */
export interface Receiver extends AsyncDisposable {
  /** The delivery URL. */
  readonly url: string;
  /** Requests received, poison and refused ones included. */
  requests: number;
  /** Deliveries the inbox accepted: their effect ran. */
  accepted: number;
  /** Deliveries refused as duplicates: the identity was accepted before. */
  duplicates: number;
  /** Deliveries refused as stale: a higher fence was accepted. */
  stale: number;
  /** Refused poison deliveries. */
  refused: number;
  /** Fences of every non-poison delivery per identity, in arrival order. */
  readonly fences: Map<string, number[]>;
}

/**
 * Starts the recipient on a free port of 127.0.0.1, with its database
 * `database`.
 *
 * @param database The recipient's database.
 * @param latencyMs How long each delivery takes, like a real endpoint.
 */
export async function startReceiver(
  database: Recipient,
  latencyMs: number,
): Promise<Receiver> {
  const driver = await database.open();
  await driver.exec(database.shipmentsSql);
  const inbox = await Inbox.open(driver, { busyTimeoutMs: 10_000 });
  const server = Deno.serve({
    hostname: "127.0.0.1",
    port: 0,
    onListen: () => {},
  }, async (request) => {
    receiver.requests++;
    const order = await request.json() as OrderPlaced;
    await new Promise((resolve) => setTimeout(resolve, latencyMs));
    if (order.poison) {
      receiver.refused++;
      return new Response("poison order", { status: 422 });
    }
    const response = await inbox.acceptRequest(request, async (tx) => {
      const identity = request.headers.get("idempotency-key");
      const fence = Number(request.headers.get("idempotency-fence"));
      await tx.run(database.shipSql, [identity, order.orderId, fence]);
    });
    const identity = request.headers.get("idempotency-key") ?? "";
    const fences = receiver.fences.get(identity) ?? [];
    fences.push(Number(request.headers.get("idempotency-fence")));
    receiver.fences.set(identity, fences);
    const answer = await response.clone().text();
    if (answer === "accepted") receiver.accepted++;
    else if (answer === "duplicate") receiver.duplicates++;
    else if (answer === "stale") receiver.stale++;
    return response;
  });
  const receiver: Receiver = {
    url: `http://127.0.0.1:${server.addr.port}/deliver`,
    requests: 0,
    accepted: 0,
    duplicates: 0,
    stale: 0,
    refused: 0,
    fences: new Map(),
    [Symbol.asyncDispose]: async () => {
      await server.shutdown();
      await inbox.close();
    },
  };
  return receiver;
}
