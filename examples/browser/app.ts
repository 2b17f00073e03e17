/**
 * The example page: messages typed here are queued in the shared outbox and
 * delivered to the server's `/deliver` endpoint by the leader tab, with the
 * event's identity as `Idempotency-Key` and the claim's fence as
 * `Idempotency-Fence` (`deliveryHeaders`). Failed deliveries are released
 * with exponential backoff and retried until the endpoint is back.
 *
 * Query parameters (the tests use them): `outbox` (name), `leaseMs`,
 * `maxAttempts`, `retryBaseMs`, `retryMaxMs`, `concurrency`.
 *
 * @module
 */
import { openSharedOutbox } from "../../browser.ts";
import { deliveryHeaders } from "../../inbox.ts";
import type { Lease } from "../../lease.ts";

/** What one queued job carries. */
export interface Message {
  /** The text typed. */
  readonly text: string;
  /** A unique id of the job, to check end to end that none is lost. */
  readonly job: string;
}

const params = new URL(location.href).searchParams;
const retryBaseMs = Number(params.get("retryBaseMs") ?? 1_000);
const retryMaxMs = Number(params.get("retryMaxMs") ?? 30_000);
const concurrency = Number(params.get("concurrency") ?? 2);
const leaseMs = Number(params.get("leaseMs") ?? 15_000);
const maxAttempts = Number(params.get("maxAttempts") ?? 20);
const idleMs = 1_000;

const outbox = await openSharedOutbox<Message>(
  params.get("outbox") ?? "messages",
  { leaseMs, maxAttempts },
);

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

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

function backoffMs(attempt: number): number {
  const ms = Math.min(retryMaxMs, retryBaseMs * 2 ** (attempt - 1));
  return Math.round(ms * (0.8 + Math.random() * 0.4));
}

async function deliver(lease: Lease<Message>): Promise<void> {
  const response = await fetch("/deliver", {
    method: "POST",
    headers: { "content-type": "application/json", ...deliveryHeaders(lease) },
    body: JSON.stringify(lease.payload),
  });
  await response.body?.cancel();
  if (!response.ok) throw new Error(`endpoint answered ${response.status}`);
}

async function drainLoop(): Promise<void> {
  while (outbox.isLeader) {
    let lease: Lease<Message> | null;
    try {
      lease = await outbox.claim();
    } catch (error) {
      show(error);
      await sleep(500);
      continue;
    }
    if (lease === null) {
      // Wake on new work from any tab; the timer only covers delayed
      // retries coming due (and is throttled while the tab is hidden).
      await new Promise<void>((resolve) => {
        const wake = () => {
          clearTimeout(timer);
          outbox.removeEventListener("enqueue", wake);
          resolve();
        };
        const timer = setTimeout(wake, idleMs);
        outbox.addEventListener("enqueue", wake);
      });
      continue;
    }
    try {
      await deliver(lease);
      await outbox.acknowledge(lease);
    } catch (error) {
      await outbox.release(lease, {
        delayMs: backoffMs(lease.attempt),
        error: String(error),
      }).catch(show);
    }
  }
}

let draining = false;
function drain(): void {
  if (draining || !outbox.isLeader) return;
  draining = true;
  Promise.all(Array.from({ length: concurrency }, drainLoop)).finally(() => {
    draining = false;
  });
}

// The few DOM members used, declared here rather than through the DOM lib,
// whose globals would clash with Deno's when the repository is checked.
interface Element {
  textContent: string | null;
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

async function refresh(): Promise<void> {
  try {
    const stats = await outbox.stats();
    for (const key of ["pending", "leased", "done", "dead"] as const) {
      $(key).textContent = String(stats[key]);
    }
    $("oldest").textContent = stats.pending === 0
      ? "nothing"
      : `${Math.round(stats.oldestPendingAgeMs / 1000)} s`;
    const dead = await outbox.deadLetters({ limit: 20 });
    $("dead-letters").hidden = dead.length === 0;
    $("dead-list").replaceChildren(...dead.map((letter) => {
      const item = document.createElement("li");
      const retry = document.createElement("button");
      retry.textContent = "retry";
      retry.addEventListener("click", () => {
        outbox.retry(letter.eventId).then(refresh, show);
      });
      item.append(
        `${letter.payload.text} (${letter.identity}, ${letter.attempts} attempts: ${letter.lastError}) `,
        retry,
      );
      return item;
    }));
    $("role").textContent = outbox.isLeader
      ? "leader (delivers)"
      : "follower (forwards to the leader)";
    const response = await fetch("/deliveries");
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
outbox.addEventListener("leaderchange", drain);
drain();
setInterval(refresh, 500);
void refresh();

// Handles for the browser tests.
Object.assign(globalThis, { outboxApp: { outbox, add } });
