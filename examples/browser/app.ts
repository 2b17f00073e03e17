/**
 * The example page: messages typed here are queued in the shared outbox and
 * delivered to the server's `/deliver` endpoint by the leader tab's
 * {@linkcode processEvents} loop, with the event's identity as
 * `Idempotency-Key` and the claim's fence as `Idempotency-Fence`
 * (`deliveryHeaders`). Failed deliveries are released with the loop's
 * exponential backoff and retried until the endpoint is back; an answer the
 * endpoint will never accept (a 4xx) makes the message a dead letter at once.
 *
 * Query parameters (the tests use them): `outbox` (name), `leaseMs`,
 * `maxAttempts`, `backoffMinMs`, `backoffMaxMs`, `concurrency`.
 *
 * @module
 */
import {
  type HandlerContext,
  type Lease,
  openSharedOutbox,
  PermanentError,
  processEvents,
  type Processor,
} from "../../browser/outbox.ts";
import { showEvents } from "./events.ts";
import { deliveryHeaders } from "../../inbox.ts";

/** What one queued job carries. */
export interface Message {
  /** The text typed. */
  readonly text: string;
  /** A unique id of the job, to check end to end that none is lost. */
  readonly job: string;
}

const params = new URL(location.href).searchParams;
const backoffMinMs = Number(params.get("backoffMinMs") ?? 1_000);
const backoffMaxMs = Number(params.get("backoffMaxMs") ?? 30_000);
const concurrency = Number(params.get("concurrency") ?? 2);
const leaseMs = Number(params.get("leaseMs") ?? 15_000);
const maxAttempts = Number(params.get("maxAttempts") ?? 20);

const outbox = await openSharedOutbox<Message>(
  params.get("outbox") ?? "messages",
  { leaseMs, maxAttempts },
);

/**
 * Queues one message.
 *
 * @param text The message.
 * @param job Its job id (a fresh UUID when not given).
 * @returns The event's identity.
 */
async function add(text: string, job = crypto.randomUUID()): Promise<string> {
  const { identity } = await outbox.enqueue({ text, job });
  return identity;
}

async function deliver(
  lease: Lease<Message>,
  { signal }: HandlerContext,
): Promise<void> {
  const response = await fetch("/deliver", {
    method: "POST",
    headers: { "content-type": "application/json", ...deliveryHeaders(lease) },
    body: JSON.stringify(lease.payload),
    signal,
  });
  await response.body?.cancel();
  if (response.status >= 400 && response.status < 500) {
    throw new PermanentError(`endpoint answered ${response.status}`);
  }
  if (!response.ok) throw new Error(`endpoint answered ${response.status}`);
}

// Only the leader tab hosts the database, so only it runs the loop; the
// "enqueue" events it receives from every tab wake the loop at once.
let processor: Processor<Message> | undefined;
function lead(): void {
  if (outbox.isLeader && processor === undefined) {
    processor = processEvents(outbox, deliver, {
      concurrency,
      backoffMinMs,
      backoffMaxMs,
      // Background tabs throttle timers: enqueue events do the waking.
      pollMaxMs: 1_000,
      onError: show,
    });
  } else if (!outbox.isLeader && processor !== undefined) {
    void processor.stop();
    processor = undefined;
  }
}

// The few DOM members used, declared here rather than through the DOM lib,
// whose globals would clash with Deno's when the repository is checked.
interface Element {
  textContent: string | null;
  title: string;
  className: string;
  value: string;
  hidden: boolean;
  append(...nodes: (Element | string)[]): void;
  addEventListener(type: string, listener: (event: Event) => void): void;
  replaceChildren(...nodes: Element[]): void;
}
const document = (globalThis as unknown as {
  document: {
    getElementById(id: string): Element | null;
    createElement(tag: string): Element;
  };
}).document;

const $ = (id: string): Element => document.getElementById(id)!;

function show(error: unknown): void {
  $("error").textContent = String(error);
}

/** The refresh running now, if any; whether another was asked for since. */
let refreshing: Promise<void> | undefined;
let refreshAgain = false;

/**
 * Redraws the page. Refreshes are asked for by the timer, each message added
 * and each click, and they would overlap: a slow older one could then put back
 * a list that a newer one had extended. So one runs at a time, and asks made
 * while it runs are served by one more run after it; the promise returned
 * settles after a run that started after the ask.
 */
function refresh(): Promise<void> {
  if (refreshing !== undefined) {
    refreshAgain = true;
    return refreshing;
  }
  refreshing = (async () => {
    do {
      refreshAgain = false;
      await draw();
    } while (refreshAgain);
    refreshing = undefined;
  })();
  return refreshing;
}

async function draw(): Promise<void> {
  try {
    const stats = await outbox.stats();
    for (const key of ["pending", "leased", "done", "dead"] as const) {
      $(key).textContent = String(stats[key]);
    }
    $("oldest").textContent = stats.pending === 0
      ? "nothing"
      : `${Math.round(stats.oldestPendingAgeMs / 1000)} s`;
    await showEvents(outbox, document, (eventId) => {
      outbox.redrive({ ids: [eventId] }).then(refresh, show);
    });
    $("role").textContent = outbox.isLeader
      ? "leader (delivers)"
      : "follower (forwards to the leader)";
    // Bounded: the next refresh waits for this one.
    const response = await fetch("/deliveries", {
      signal: AbortSignal.timeout(5_000),
    });
    const { down, deliveries } = await response.json() as {
      down: boolean;
      deliveries: { identity: string; fence: number; body: Message }[];
    };
    $("endpoint").textContent = down ? "off" : "on";
    $("toggle").textContent = down ? "switch on" : "switch off";
    $("delivered").replaceChildren(
      ...deliveries.reverse().map(({ identity, fence, body }) => {
        const item = document.createElement("li");
        item.textContent = `${body.text} (${identity}, fence ${fence})`;
        return item;
      }),
    );
  } catch (error) {
    show(error);
  }
}

$("compose").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = $("text");
  add(input.value).then(refresh, show);
  input.value = "";
});
$("toggle").addEventListener("click", async () => {
  const down = $("endpoint").textContent === "on";
  await fetch("/endpoint", { method: "POST", body: down ? "down" : "up" });
  await refresh();
});
outbox.addEventListener("leaderchange", lead);
lead();
setInterval(refresh, 500);
void refresh();

// Handles for the browser tests.
Object.assign(globalThis, { outboxApp: { outbox, add } });
