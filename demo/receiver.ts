/**
 * The demo's HTTP receiver on 127.0.0.1: records every delivery and
 * dedupes by the idempotency key `${eventId}:${fence}`, as a real webhook
 * recipient would. Poison orders are refused with 422, every time.
 *
 * @module
 */
import type { OrderPlaced } from "./db.ts";

/** What the receiver has seen. */
export interface Receiver extends AsyncDisposable {
  /** The delivery URL. */
  readonly url: string;
  /** Requests received, poison and duplicates included. */
  requests: number;
  /** Requests whose idempotency key had been seen already (deduped). */
  duplicates: number;
  /** Refused poison deliveries. */
  refused: number;
  /** Fences delivered per event id, in arrival order. */
  readonly fences: Map<number, number[]>;
}

interface Delivery {
  readonly eventId: number;
  readonly fence: number;
  readonly order: OrderPlaced;
}

/**
 * Starts the receiver on a free port of 127.0.0.1.
 *
 * @param latencyMs How long each delivery takes, like a real endpoint.
 */
export function startReceiver(latencyMs: number): Receiver {
  const keys = new Set<string>();
  const server = Deno.serve({
    hostname: "127.0.0.1",
    port: 0,
    onListen: () => {},
  }, async (request) => {
    const delivery = await request.json() as Delivery;
    receiver.requests++;
    await new Promise((resolve) => setTimeout(resolve, latencyMs));
    if (delivery.order.poison) {
      receiver.refused++;
      return new Response("poison order", { status: 422 });
    }
    const key = request.headers.get("idempotency-key") ??
      `${delivery.eventId}:${delivery.fence}`;
    if (keys.has(key)) {
      receiver.duplicates++;
      return new Response("duplicate", { status: 200 });
    }
    keys.add(key);
    const fences = receiver.fences.get(delivery.eventId) ?? [];
    fences.push(delivery.fence);
    receiver.fences.set(delivery.eventId, fences);
    return new Response("ok", { status: 200 });
  });
  const receiver: Receiver = {
    url: `http://127.0.0.1:${server.addr.port}/deliver`,
    requests: 0,
    duplicates: 0,
    refused: 0,
    fences: new Map(),
    [Symbol.asyncDispose]: () => server.shutdown(),
  };
  return receiver;
}
