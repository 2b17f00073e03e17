/**
 * An edge function's two jobs, kept apart from the runtime so a test can
 * drive them: the request handler commits an order and its event in one
 * transaction, and the bounded drain delivers up to N events or for at most
 * T ms, then returns (for scheduled invocations, which are cut off after a
 * time limit): deliveries still running at T are aborted and released for a
 * retry.
 *
 * @module
 */
import type { Lease, Outbox } from "../../mod.ts";

/** What `order.placed` carries. */
export interface OrderPlaced {
  readonly type: "order.placed";
  readonly order: number;
  readonly total: number;
}

/** Creates the orders table when missing. */
export async function setUpOrders(outbox: Outbox<OrderPlaced>): Promise<void> {
  await outbox.transaction((tx) =>
    tx.run(
      "CREATE TABLE IF NOT EXISTS orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, total integer NOT NULL CHECK (total > 0))",
    )
  );
}

/**
 * Handles `POST /orders` with `{ "total": 4200 }`: the order row and its
 * event commit together, or neither does.
 */
export function ordersHandler(
  outbox: Outbox<OrderPlaced>,
): (request: Request) => Promise<Response> {
  return async (request) => {
    const url = new URL(request.url);
    if (request.method !== "POST" || url.pathname !== "/orders") {
      return new Response("not found", { status: 404 });
    }
    let total: unknown;
    try {
      ({ total } = await request.json());
    } catch {
      return Response.json({ error: "body must be JSON" }, { status: 400 });
    }
    if (!Number.isSafeInteger(total) || (total as number) <= 0) {
      return Response.json({ error: "total must be a positive integer" }, {
        status: 400,
      });
    }
    const placed = await outbox.transaction(async (tx) => {
      const [row] = await tx.query(
        "INSERT INTO orders (total) VALUES ($1) RETURNING id",
        [total as number],
      );
      const order = Number(row?.["id"]);
      const { eventId, identity } = await tx.enqueue(
        { type: "order.placed", order, total: total as number },
        { dedupKey: `order-${order}` },
      );
      // A failure after both writes (here on request, for the test) rolls
      // both back.
      if (url.searchParams.has("fail")) throw new Error("failed on request");
      return { order, eventId, identity };
    }).catch((error: Error) => error);
    if (placed instanceof Error) {
      return Response.json({ error: placed.message }, { status: 500 });
    }
    return Response.json(placed, { status: 201 });
  };
}

/** Options of {@linkcode drain}. */
export interface DrainOptions {
  /** Most events to deliver. @default {100} */
  readonly maxEvents?: number;
  /**
   * How long the drain runs, in milliseconds: no claim after it, and
   * deliveries still running then are aborted (their signal) and released
   * for a retry. The drain returns after its last acknowledgement and the
   * releases of those deliveries, a round trip each.
   *
   * @default {10000}
   */
  readonly maxMs?: number;
  /** Events claimed per transaction. @default {10} */
  readonly batch?: number;
  /** Lease per claim, longer than one delivery takes, in milliseconds. @default {30000} */
  readonly leaseMs?: number;
  /** Delay before a failed event is tried again, in milliseconds. @default {5000} */
  readonly retryDelayMs?: number;
}

/** What one drain did. */
export interface DrainReport {
  readonly delivered: number;
  readonly failed: number;
  /** Delivered, but the lease had been lost by then (another drain has it). */
  readonly stale: number;
}

/**
 * Claims and delivers events until `maxEvents` were handled, `maxMs`
 * passed, or none is due: the scheduled edge invocation's bounded share of
 * the work. Each event is acknowledged after `deliver` resolves, or
 * released for a retry when it throws or is still running at `maxMs`
 * (`deliver` gets a signal that aborts then, for its `fetch`); the
 * recipient dedupes on the event's identity (`deliveryHeaders(lease)`), as
 * a delivery that ignored the signal and got through is delivered again. A
 * batch's acknowledgements go with the next batch's claim
 * (`acknowledgeAndClaim`): one round trip and one commit per batch. A
 * release that fails (the database busy) leaves that event leased until its
 * lease lapses, then it is claimed again; the drain goes on.
 */
export async function drain(
  outbox: Outbox<OrderPlaced>,
  deliver: (lease: Lease<OrderPlaced>, signal: AbortSignal) => Promise<void>,
  options: DrainOptions = {},
): Promise<DrainReport> {
  const maxEvents = options.maxEvents ?? 100;
  const maxMs = options.maxMs ?? 10_000;
  const timeUp = new AbortController();
  const timer = setTimeout(
    () => timeUp.abort(new Error(`cut off: the drain's ${maxMs} ms were up`)),
    maxMs,
  );
  const cutOff = new Promise<never>((_, reject) =>
    timeUp.signal.addEventListener(
      "abort",
      () => reject(timeUp.signal.reason),
    )
  );
  cutOff.catch(() => {});
  try {
    return await drainUntil(outbox, deliver, options, {
      maxEvents,
      signal: timeUp.signal,
      cutOff,
    });
  } finally {
    clearTimeout(timer);
  }
}

async function drainUntil(
  outbox: Outbox<OrderPlaced>,
  deliver: (lease: Lease<OrderPlaced>, signal: AbortSignal) => Promise<void>,
  options: DrainOptions,
  { maxEvents, signal, cutOff }: {
    maxEvents: number;
    /** Aborts at `maxMs`. */
    signal: AbortSignal;
    cutOff: Promise<never>;
  },
): Promise<DrainReport> {
  const leaseMs = options.leaseMs ?? 30_000;
  let delivered = 0;
  let failed = 0;
  let stale = 0;
  // The next claim's size, `pending` delivered events not yet counted; 0
  // when the drain is to stop.
  const next = (pending = 0) =>
    !signal.aborted
      ? Math.min(
        options.batch ?? 10,
        maxEvents - delivered - failed - stale - pending,
      )
      : 0;
  const first = next();
  let leases = first > 0 ? await outbox.claim({ max: first, leaseMs }) : [];
  while (leases.length > 0) {
    // async: a deliver that throws at once fails its event, not the drain.
    const outcomes = await Promise.allSettled(
      leases.map(async (lease) =>
        await Promise.race([deliver(lease, signal), cutOff])
      ),
    );
    const done = leases.filter((_, i) => outcomes[i]!.status === "fulfilled");
    for (const [i, lease] of leases.entries()) {
      const outcome = outcomes[i]!;
      if (outcome.status === "rejected") {
        failed++;
        await outbox.release(lease, {
          delayMs: options.retryDelayMs ?? 5_000,
          error: errorText(outcome.reason),
        }).catch(() => {});
      }
    }
    const max = next(done.length);
    let acknowledged: boolean[];
    if (max > 0) {
      ({ acknowledged, leases } = await outbox.acknowledgeAndClaim(done, {
        max,
        leaseMs,
      }));
    } else {
      acknowledged = await outbox.acknowledge(done);
      leases = [];
    }
    for (const ok of acknowledged) {
      if (ok) delivered++;
      else stale++;
    }
  }
  return { delivered, failed, stale };
}

/**
 * The error text a released event keeps: whatever the delivery rejected
 * with, as text the outbox accepts (at most 1,000 characters, no NUL, no
 * lone surrogate). `String(reason)` throws for `Object.create(null)` or an
 * error whose `message` getter throws: such a reason gets a fixed text.
 */
function errorText(reason: unknown): string {
  let text: string;
  try {
    text = String(reason);
  } catch {
    text = "a delivery failure that cannot be printed";
  }
  return text.replaceAll("\0", "\uFFFD").slice(0, 1_000).toWellFormed();
}
