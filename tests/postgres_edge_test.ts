/**
 * The edge function example (examples/edge/) against the real server: an
 * order and its event commit together or not at all, and the drain stops
 * at its bounds.
 */
import assert from "node:assert/strict";
import { connectPostgres, openPostgres } from "../drivers/postgres.ts";
import type { Lease, Outbox } from "../mod.ts";
import {
  drain,
  type OrderPlaced,
  ordersHandler,
  setUpOrders,
} from "../examples/edge/orders.ts";
import { sharedPostgres } from "../scripts/postgres_server.ts";

async function shop(): Promise<
  {
    outbox: Outbox<OrderPlaced>;
    post(body: unknown, query?: string): Promise<Response>;
  }
> {
  const server = await sharedPostgres();
  const outbox = await openPostgres<OrderPlaced>(server.url, {
    schema: await server.createSchema(),
    listen: false,
  });
  await setUpOrders(outbox);
  const handle = ordersHandler(outbox);
  return {
    outbox,
    post: (body, query = "") =>
      handle(
        new Request(`http://edge.test/orders${query}`, {
          method: "POST",
          body: typeof body === "string" ? body : JSON.stringify(body),
        }),
      ),
  };
}

async function counts(outbox: Outbox<OrderPlaced>) {
  return await outbox.transaction(async (tx) => {
    const [orders] = await tx.query("SELECT count(*) AS n FROM orders");
    const [events] = await tx.query("SELECT count(*) AS n FROM outbox_events");
    return { orders: orders?.["n"], events: events?.["n"] };
  });
}

Deno.test("edge example: POST /orders commits the order and its event together", async () => {
  const { outbox, post } = await shop();
  await using _ = outbox;
  const response = await post({ total: 4200 });
  assert.equal(response.status, 201);
  const { order, eventId } = await response.json();
  const lease = await outbox.claim();
  assert.equal(lease?.eventId, eventId);
  assert.deepEqual(lease?.payload, {
    type: "order.placed",
    order,
    total: 4200,
  });
});

Deno.test("edge example: a failure after both writes leaves neither the order nor its event", async () => {
  const { outbox, post } = await shop();
  await using _ = outbox;
  assert.equal((await post({ total: 10 }, "?fail")).status, 500);
  assert.equal((await post({ total: -1 })).status, 400);
  assert.equal((await post("{")).status, 400);
  assert.deepEqual(await counts(outbox), { orders: 0, events: 0 });
});

Deno.test("edge example: the drain delivers at most maxEvents and leaves the rest pending", async () => {
  const { outbox, post } = await shop();
  await using _ = outbox;
  for (let i = 1; i <= 5; i++) await post({ total: i });
  const keys: string[] = [];
  const report = await drain(outbox, (lease: Lease<OrderPlaced>) => {
    keys.push(`${lease.eventId}:${lease.fence}`);
    return Promise.resolve();
  }, { maxEvents: 3, batch: 2 });
  assert.deepEqual(report, { delivered: 3, failed: 0, stale: 0 });
  assert.equal(new Set(keys).size, 3);
  const stats = await outbox.stats();
  assert.deepEqual([stats.done, stats.pending], [3, 2]);
});

Deno.test("edge example: the drain acknowledges each batch in the call that claims the next", async () => {
  const { outbox, post } = await shop();
  await using _ = outbox;
  for (let i = 1; i <= 5; i++) await post({ total: i });
  const calls: string[] = [];
  const claim = outbox.claim.bind(outbox);
  outbox.claim = ((options: { max: number }) => {
    calls.push(`claim ${options.max}`);
    return claim(options);
  }) as typeof outbox.claim;
  const acknowledgeAndClaim = outbox.acknowledgeAndClaim.bind(outbox);
  outbox.acknowledgeAndClaim = async (leases, options) => {
    const result = await acknowledgeAndClaim(leases, options);
    calls.push(
      `acknowledge ${leases.length} + claim ${options.max}: ${result.leases.length}`,
    );
    return result;
  };
  const report = await drain(outbox, () => Promise.resolve(), { batch: 2 });
  assert.deepEqual(report, { delivered: 5, failed: 0, stale: 0 });
  assert.deepEqual(calls, [
    "claim 2",
    "acknowledge 2 + claim 2: 2",
    "acknowledge 2 + claim 2: 1",
    "acknowledge 1 + claim 2: 0",
  ]);
  assert.equal((await outbox.stats()).done, 5);
});

Deno.test("edge example: the drain stops claiming once maxMs has passed", async () => {
  const { outbox, post } = await shop();
  await using _ = outbox;
  for (let i = 1; i <= 10; i++) await post({ total: i });
  const started = performance.now();
  let calls = 0;
  // The first delivery succeeds at once; the second is still running when
  // maxMs passes (however slow the machine), and no claim follows. Timed
  // deliveries against a short maxMs failed this test on a loaded machine,
  // whose first claim alone outlasted it.
  const report = await drain(outbox, async (_lease, signal) => {
    if (++calls === 1) return;
    await new Promise((resolve) =>
      signal.addEventListener("abort", resolve, { once: true })
    );
  }, { maxMs: 1_000, batch: 1, retryDelayMs: 60_000 });
  assert.deepEqual(report, { delivered: 1, failed: 1, stale: 0 });
  assert.equal(calls, 2);
  assert.ok(performance.now() - started < 5_000);
  const stats = await outbox.stats();
  assert.deepEqual([stats.done, stats.pending, stats.leased], [1, 9, 0]);
});

Deno.test("edge example: the drain returns at maxMs while a delivery hangs, aborting the deliveries still running and releasing them for a retry", async () => {
  const { outbox, post } = await shop();
  await using _ = outbox;
  const { eventId: hung } = await (await post({ total: 1 })).json();
  const { eventId: aborted } = await (await post({ total: 2 })).json();
  const signals: AbortSignal[] = [];
  const started = performance.now();
  const report = await drain(outbox, (lease, signal) => {
    signals.push(signal);
    // One ignores its signal and never settles; the other gives up on it.
    if (lease.eventId === hung) return new Promise(() => {});
    return new Promise((_, reject) =>
      signal.addEventListener("abort", () => reject(signal.reason))
    );
  }, { maxMs: 200, retryDelayMs: 60_000 });
  // Before, the drain waited for ever on the hung delivery.
  const tookMs = performance.now() - started;
  assert.ok(tookMs >= 200 && tookMs < 2_000, String(tookMs));
  assert.deepEqual(report, { delivered: 0, failed: 2, stale: 0 });
  assert.ok(signals.every((signal) => signal.aborted));
  for (const eventId of [hung, aborted]) {
    const explanation = await outbox.explain(eventId);
    assert.equal(explanation?.state, "pending");
    assert.match(String(explanation?.lastError), /the drain's 200 ms were up/);
  }
});

Deno.test("edge example: a release that fails leaves that event to its lease and the drain acknowledges the rest", async () => {
  const { outbox, post } = await shop();
  await using _ = outbox;
  const ids: number[] = [];
  for (let i = 1; i <= 3; i++) {
    ids.push((await (await post({ total: i })).json()).eventId);
  }
  outbox.release = () => Promise.reject(new Error("database is busy"));
  const report = await drain(outbox, (lease) => {
    if (lease.eventId === ids[1]) throw new Error("webhook answered 503");
    return Promise.resolve();
  });
  // Before, the failed release threw out of the drain, leaving the two
  // delivered events unacknowledged.
  assert.deepEqual(report, { delivered: 2, failed: 1, stale: 0 });
  const stats = await outbox.stats();
  assert.deepEqual([stats.done, stats.leased], [2, 1]);
  assert.equal((await outbox.explain(ids[1]!))?.state, "leased");
});

Deno.test("edge example: a delivery that rejects with an unprintable reason is released, and the batch's other deliveries are acknowledged", async () => {
  const { outbox, post } = await shop();
  await using _ = outbox;
  const ids: number[] = [];
  for (let i = 1; i <= 5; i++) {
    ids.push((await (await post({ total: i })).json()).eventId);
  }
  const unprintable = Object.create(null);
  assert.throws(() => String(unprintable), TypeError);
  const report = await drain(
    outbox,
    (lease) =>
      lease.eventId === ids[2]
        ? Promise.reject(unprintable)
        : Promise.resolve(),
    { retryDelayMs: 60_000 },
  );
  // Before, the drain rejected and left the four delivered events leased,
  // to be delivered again once their leases lapsed.
  assert.deepEqual(report, { delivered: 4, failed: 1, stale: 0 });
  const stats = await outbox.stats();
  assert.deepEqual([stats.done, stats.pending, stats.leased], [4, 1, 0]);
  const released = await outbox.explain(ids[2]!);
  assert.equal(released?.state, "pending");
  assert.equal(
    released?.lastError,
    "a delivery failure that cannot be printed",
  );
});

Deno.test("edge example: a failed delivery is released with its error for a later retry", async () => {
  const { outbox, post } = await shop();
  await using _ = outbox;
  const { eventId } = await (await post({ total: 1 })).json();
  const report = await drain(outbox, () => {
    throw new Error("webhook answered 503");
  }, { retryDelayMs: 60_000 });
  assert.deepEqual(report, { delivered: 0, failed: 1, stale: 0 });
  const explanation = await outbox.explain(eventId);
  assert.equal(explanation?.state, "pending");
  assert.equal(explanation?.lastError, "Error: webhook answered 503");
  assert.equal(await outbox.claim(), null);
});

Deno.test("edge example: main.ts serves orders and drains them to the webhook with the event's identity and fence", async () => {
  const server = await sharedPostgres();
  const database = await server.createDatabase();
  const received: {
    key: string | null;
    fence: string | null;
    body: unknown;
  }[] = [];
  await using webhook = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen() {} },
    async (request) => {
      received.push({
        key: request.headers.get("idempotency-key"),
        fence: request.headers.get("idempotency-fence"),
        body: await request.json(),
      });
      return new Response("ok");
    },
  );
  const probe = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = probe.addr.port;
  probe.close();
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      new URL("../examples/edge/main.ts", import.meta.url).pathname,
    ],
    env: {
      DATABASE_URL: database,
      WEBHOOK_URL: `http://127.0.0.1:${webhook.addr.port}/`,
      HOSTNAME: "127.0.0.1",
      PORT: String(port),
    },
    stdout: "null",
    stderr: "null",
  }).spawn();
  try {
    const base = `http://127.0.0.1:${port}`;
    let placed: Response | undefined;
    for (let i = 0; i < 200 && placed === undefined; i++) {
      placed = await fetch(`${base}/orders`, {
        method: "POST",
        body: JSON.stringify({ total: 4200 }),
      }).catch(() =>
        new Promise<undefined>((resolve) =>
          setTimeout(() => resolve(undefined), 50)
        )
      );
    }
    assert.equal(placed?.status, 201);
    const { order, identity } = await placed!.json();
    const drained = await fetch(`${base}/drain`, { method: "POST" });
    assert.deepEqual(await drained.json(), {
      delivered: 1,
      failed: 0,
      stale: 0,
    });
    assert.deepEqual(received, [{
      key: identity,
      fence: "1",
      body: { type: "order.placed", order, total: 4200 },
    }]);
  } finally {
    child.kill();
    await child.status;
  }
});

/** A free port on the loopback interface. */
function freePort(): number {
  const probe = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = probe.addr.port;
  probe.close();
  return port;
}

/**
 * Starts examples/edge/main.ts with only `env` (and what Deno needs), and
 * waits until `base` answers `POST /orders`.
 */
async function startEdge(
  env: Record<string, string>,
  base: string,
): Promise<{ child: Deno.ChildProcess; answer: Response }> {
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      new URL("../examples/edge/main.ts", import.meta.url).pathname,
    ],
    clearEnv: true,
    env: {
      PATH: Deno.env.get("PATH") ?? "",
      HOME: Deno.env.get("HOME") ?? "",
      ...(Deno.env.get("DENO_DIR") === undefined
        ? {}
        : { DENO_DIR: Deno.env.get("DENO_DIR")! }),
      ...env,
    },
    stdout: "null",
    stderr: "piped",
  }).spawn();
  for (let i = 0;; i++) {
    const answer = await fetch(`${base}/orders`, {
      method: "POST",
      body: JSON.stringify({ total: 4200 }),
    }).catch((error) => error as Error);
    if (answer instanceof Response) return { child, answer };
    if (i === 600) {
      child.kill();
      await child.status;
      throw answer;
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

async function stopEdge(child: Deno.ChildProcess): Promise<string> {
  child.kill();
  await child.status;
  return await new Response(child.stderr).text();
}

Deno.test("edge example: main.ts listens on 127.0.0.1 by default, and without DATABASE_URL answers and logs the variable's name", async () => {
  const port = freePort();
  const { child, answer } = await startEdge(
    { PORT: String(port) },
    `http://127.0.0.1:${port}`,
  );
  let stderr: string;
  try {
    assert.equal(answer.status, 500);
    assert.deepEqual(await answer.json(), {
      error:
        "DATABASE_URL is not set: set it to the database's URL, e.g. postgres://postgres@127.0.0.1:5432/postgres",
    });
    // Bound to 127.0.0.1, not to every address: another loopback address
    // of this machine finds nothing there.
    await assert.rejects(
      fetch(`http://127.0.0.2:${port}/orders`, { method: "POST" }),
    );
  } finally {
    stderr = await stopEdge(child);
  }
  assert.match(stderr, /edge example: DATABASE_URL is not set/);
});

Deno.test("edge example: main.ts listens where HOSTNAME says", async () => {
  const port = freePort();
  const { child, answer } = await startEdge(
    { PORT: String(port), HOSTNAME: "127.0.0.2" },
    `http://127.0.0.2:${port}`,
  );
  try {
    assert.equal(answer.status, 500);
    await answer.body?.cancel();
    await assert.rejects(
      fetch(`http://127.0.0.1:${port}/orders`, { method: "POST" }),
    );
  } finally {
    await stopEdge(child);
  }
});

Deno.test("edge example: scripts/postgres_server.ts starts a throwaway server for it, prints its DATABASE_URL, and stops it on Ctrl-C", async () => {
  const server = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      new URL("../scripts/postgres_server.ts", import.meta.url).pathname,
    ],
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const stdout = server.stdout.pipeThrough(new TextDecoderStream())
    .getReader();
  let printed = "";
  while (!printed.includes("\n")) {
    const { value, done } = await stdout.read();
    if (done) break;
    printed += value;
  }
  const url =
    /^DATABASE_URL=(postgres:\/\/postgres@127\.0\.0\.1:\d+\/postgres)\n$/
      .exec(printed)?.[1];
  let edge: Deno.ChildProcess | undefined;
  try {
    assert.ok(url !== undefined, printed);
    const port = freePort();
    const started = await startEdge(
      { DATABASE_URL: url, PORT: String(port) },
      `http://127.0.0.1:${port}`,
    );
    edge = started.child;
    assert.equal(started.answer.status, 201);
    assert.equal((await started.answer.json()).order, 1);
  } finally {
    if (edge !== undefined) await stopEdge(edge);
    server.kill("SIGINT");
  }
  const { code } = await server.status;
  await stdout.cancel();
  const stderr = await new Response(server.stderr).text();
  assert.equal(code, 0, stderr);
  assert.match(stderr, /^PostgreSQL \d+ on 127\.0\.0\.1:\d+, a throwaway/);
  // Stopped: nothing answers at its address any more.
  await assert.rejects(connectPostgres(url!, { connectTimeoutMs: 2_000 }));
});
