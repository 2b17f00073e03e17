/**
 * The demo's recipient on 127.0.0.1: a second real database with an inbox.
 * Each delivery's effect (recording the shipment of an order) commits with
 * its identity in one transaction, so a redelivery, under any fence, is
 * refused as a duplicate and a lower fence than the accepted one as stale.
 * Poison orders are refused with 422, every time, before the inbox.
 *
 * @module
 */
import { Inbox } from "../mod.ts";
import { openDatabase, type OrderPlaced } from "./db.ts";

/** The recipient's business table: one row per shipped order. */
export const SHIPMENTS_SQL = `CREATE TABLE IF NOT EXISTS shipments (
  identity TEXT PRIMARY KEY,
  order_id INTEGER NOT NULL,
  fence INTEGER NOT NULL,
  applied INTEGER NOT NULL
) STRICT`;

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
 * Starts the recipient on a free port of 127.0.0.1, with its database at
 * `path`.
 *
 * @param path The recipient's database file.
 * @param latencyMs How long each delivery takes, like a real endpoint.
 */
export async function startReceiver(
  path: string,
  latencyMs: number,
): Promise<Receiver> {
  const driver = await openDatabase(path);
  await driver.exec(SHIPMENTS_SQL);
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
      // Counting applications, rather than inserting once, lets the demo
      // see an effect applied twice if the inbox ever let one through.
      await tx.run(
        `INSERT INTO shipments (identity, order_id, fence, applied) VALUES (?, ?, ?, 1)
         ON CONFLICT (identity) DO UPDATE SET applied = applied + 1`,
        [identity, order.orderId, fence],
      );
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
