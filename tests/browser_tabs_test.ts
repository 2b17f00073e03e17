import assert from "node:assert/strict";
import type { Page } from "npm:playwright-core@1.65.1";
import {
  blankPage,
  browserTest,
  mutedLeader,
  openSession,
  PATHS,
  type Session,
  until,
} from "./fixtures/browser/harness.ts";

async function appPage(session: Session, query: string): Promise<Page> {
  const page = await session.context.newPage();
  await page.goto(`${session.server.url}?${query}`);
  await page.waitForFunction(() => "outboxApp" in globalThis);
  return page;
}

/** Queues `count` jobs named `${prefix}-${i}` in the page, all at once. */
function addJobs(page: Page, prefix: string, count: number): Promise<string[]> {
  return page.evaluate(async ({ prefix, count }) => {
    const app = (globalThis as unknown as {
      outboxApp: { add(text: string, job: string): Promise<string> };
    }).outboxApp;
    return await Promise.all(
      Array.from(
        { length: count },
        (_, i) => app.add(`message ${i}`, `${prefix}-${i}`),
      ),
    );
  }, { prefix, count });
}

function stats(page: Page): Promise<Record<string, number>> {
  return page.evaluate(() =>
    (globalThis as unknown as {
      outboxApp: { outbox: { stats(): Promise<Record<string, number>> } };
    }).outboxApp.outbox.stats()
  );
}

function isLeader(page: Page): Promise<boolean> {
  return page.evaluate(() =>
    (globalThis as unknown as { outboxApp: { outbox: { isLeader: boolean } } })
      .outboxApp.outbox.isLeader
  );
}

function deliveredJobs(session: Session): string[] {
  return session.server.deliveries.map((delivery) =>
    (delivery.body as { job: string }).job
  ).sort();
}

/**
 * Waits until exactly `jobs` reached the endpoint and were acknowledged, then
 * checks that nothing is left pending, leased or dead.
 */
async function assertDrained(
  session: Session,
  page: Page,
  jobs: readonly string[],
  timeoutMs: number,
): Promise<void> {
  await until(
    () => session.server.deliveries.length >= jobs.length,
    timeoutMs,
    `${jobs.length} deliveries`,
  );
  assert.deepEqual(deliveredJobs(session), [...jobs].sort());
  await until(
    async () => (await stats(page)).done === jobs.length,
    10_000,
    `${jobs.length} acknowledgements`,
  );
  const counts = await stats(page);
  assert.deepEqual(
    [counts["pending"], counts["leased"], counts["done"], counts["dead"]],
    [0, 0, jobs.length, 0],
  );
}

function jobNames(prefix: string, count: number): string[] {
  return Array.from({ length: count }, (_, i) => `${prefix}-${i}`);
}

Deno.test(
  {
    name:
      "persistence: events enqueued in a shared outbox are still there and claimable after a reload",
    ...browserTest,
  },
  async () => {
    await using session = await openSession();
    const page = await blankPage(session);
    const ids = await page.evaluate(async (paths) => {
      const m = await import(paths.bundle);
      const outbox = await m.openSharedOutbox("persist");
      const ids = [];
      for (const n of [1, 2, 3]) {
        ids.push((await outbox.enqueue({ n })).eventId);
      }
      return ids;
    }, PATHS);
    assert.deepEqual(ids, [1, 2, 3]);

    await page.reload();
    const after = await page.evaluate(async (paths) => {
      const m = await import(paths.bundle);
      const outbox = await m.openSharedOutbox("persist");
      const stats = await outbox.stats();
      const lease = await outbox.claim();
      const acknowledged = await outbox.acknowledge(lease);
      return {
        pending: stats.pending,
        lease: [lease.eventId, lease.fence, lease.payload],
        acknowledged,
        leader: outbox.isLeader,
      };
    }, PATHS);
    assert.deepEqual(after, {
      pending: 3,
      lease: [1, 1, { n: 1 }],
      acknowledged: true,
      leader: true,
    });
  },
);

Deno.test(
  {
    name:
      "two tabs enqueue concurrently while the leader drains to the endpoint: every job delivered, none lost",
    ...browserTest,
  },
  async () => {
    await using session = await openSession();
    const query = "outbox=tabs&backoffMinMs=50";
    const first = await appPage(session, query);
    const second = await appPage(session, query);
    await until(() => isLeader(first), 10_000, "the first tab to lead");
    assert.equal(await isLeader(second), false);

    const [ids1, ids2] = await Promise.all([
      addJobs(first, "A", 40),
      addJobs(second, "B", 40),
    ]);
    assert.equal(new Set([...ids1, ...ids2]).size, 80);
    await assertDrained(
      session,
      second,
      [...jobNames("A", 40), ...jobNames("B", 40)],
      30_000,
    );
    assert.equal(
      new Set(session.server.keys).size + session.server.duplicates(),
      session.server.keys.length,
    );
  },
);

Deno.test(
  {
    name:
      "two outboxes whose first events both have id 1 are both delivered: the page shows their identities and the endpoint dedupes on them",
    ...browserTest,
  },
  async () => {
    await using session = await openSession();
    const first = await appPage(session, "outbox=origin-a&retryBaseMs=50");
    const second = await appPage(session, "outbox=origin-b&retryBaseMs=50");
    await until(
      async () => await isLeader(first) && await isLeader(second),
      10_000,
      "each tab to lead its outbox",
    );
    const [[a], [b]] = await Promise.all([
      addJobs(first, "A", 1),
      addJobs(second, "B", 1),
    ]);
    const uuid =
      /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
    assert.match(a!, uuid);
    assert.match(b!, uuid);
    assert.notEqual(a, b);
    await until(
      () => session.server.deliveries.length >= 2,
      10_000,
      "both deliveries",
    );
    assert.deepEqual(
      session.server.deliveries.map(({ identity, fence, body }) => [
        identity,
        fence,
        (body as { job: string }).job,
      ]).sort(),
      [[a, 1, "A-0"], [b, 1, "B-0"]].sort(),
    );
    // Both events are event 1 of their outbox: ids would have merged them.
    const ids = await Promise.all(
      [first, second].map((page) =>
        page.evaluate(async () => {
          const { outbox } = (globalThis as unknown as {
            outboxApp: {
              outbox: { explain(id: number): Promise<{ identity: string }> };
            };
          }).outboxApp;
          return (await outbox.explain(1)).identity;
        })
      ),
    );
    assert.deepEqual(ids, [a, b]);
    // A refresh that read the endpoint between the two deliveries lists one
    // of them: wait for a list with two items, then check what it says.
    await until(
      async () => (await first.locator("#delivered li").count()) === 2,
      5_000,
      "the page to list both deliveries",
    );
    const listed = await first.locator("#delivered li").allTextContents();
    assert.deepEqual(
      listed.sort(),
      [`message 0 (${a}, fence 1)`, `message 0 (${b}, fence 1)`].sort(),
    );

    // The endpoint never applies a redelivery of an identity, under any fence.
    const deliver = async (fence: number) => {
      const response = await fetch(`${session.server.url}deliver`, {
        method: "POST",
        headers: {
          "content-type": "application/json",
          "Idempotency-Key": a!,
          "Idempotency-Fence": String(fence),
        },
        body: JSON.stringify({ text: "again", job: "A-0" }),
      });
      return [response.status, (await response.json()).status];
    };
    assert.deepEqual(await deliver(1), [200, "duplicate"]);
    assert.deepEqual(await deliver(5), [200, "duplicate"]);
    assert.equal(session.server.deliveries.length, 2);
    assert.equal(session.server.duplicates(), 2);
  },
);

Deno.test(
  {
    name:
      "closing the leader tab mid-run: another tab becomes leader and the run completes",
    ...browserTest,
  },
  async () => {
    await using session = await openSession({ deliveryDelayMs: 20 });
    const query = "outbox=takeover&backoffMinMs=50&leaseMs=2000";
    const leader = await appPage(session, query);
    const follower = await appPage(session, query);
    await until(() => isLeader(leader), 10_000, "the first tab to lead");

    await Promise.all([
      addJobs(leader, "A", 30),
      addJobs(follower, "B", 30),
    ]);
    await until(
      () => session.server.deliveries.length >= 10,
      10_000,
      "10 deliveries",
    );
    assert.ok(session.server.deliveries.length < 60, "closed mid-run");
    await leader.close();
    await until(() => isLeader(follower), 10_000, "the follower to lead");
    await addJobs(follower, "C", 10);

    await assertDrained(
      session,
      follower,
      [...jobNames("A", 30), ...jobNames("B", 30), ...jobNames("C", 10)],
      30_000,
    );
  },
);

Deno.test(
  {
    name:
      "the example retries with backoff while the endpoint is down, keeps the jobs across a reload, and drains when it is back",
    ...browserTest,
  },
  async () => {
    await using session = await openSession();
    session.server.down = true;
    const page = await appPage(
      session,
      "outbox=offline&backoffMinMs=100&backoffMaxMs=400",
    );
    await until(() => isLeader(page), 10_000, "the tab to lead");
    await addJobs(page, "D", 5);
    await until(
      () => session.server.keys.length >= 10,
      10_000,
      "retries against the down endpoint",
    );
    assert.equal(session.server.deliveries.length, 0);
    const retried = await page.evaluate(async () => {
      const { outbox } = (globalThis as unknown as {
        outboxApp: {
          outbox: {
            explain(id: number): Promise<{ lastError: string | null }>;
          };
        };
      }).outboxApp;
      return (await outbox.explain(1))?.lastError;
    });
    assert.equal(retried, "Error: endpoint answered 503");

    await page.reload();
    await page.waitForFunction(() => "outboxApp" in globalThis);
    assert.equal((await stats(page)).done, 0);
    session.server.down = false;
    await assertDrained(session, page, jobNames("D", 5), 10_000);
  },
);

/**
 * A tab that opens the shared outbox `name` first, so it leads, enqueues
 * `payloads` and keeps the outbox as its page's `outbox`.
 */
async function leaderTab(
  session: Session,
  name: string,
  payloads: readonly string[],
): Promise<Page> {
  const leader = await blankPage(session);
  await leader.evaluate(async ({ paths, name, payloads }) => {
    const m = await import(paths.bundle);
    const outbox = await m.openSharedOutbox(name);
    for (const payload of payloads) await outbox.enqueue(payload);
    Object.assign(globalThis, { outbox });
  }, { paths: PATHS, name, payloads });
  return leader;
}

/**
 * Claims on a `leaderTab` until an event can be claimed again (a closed
 * tab's lease handed back): its lease, its ledger and the count of done
 * events.
 */
async function reclaim(leader: Page): Promise<{
  lease: [number, number];
  history: [string, string | null][];
  done: number;
}> {
  return await leader.evaluate(async () => {
    const { outbox } = globalThis as unknown as {
      outbox: {
        claim(): Promise<{ eventId: number; attempt: number } | null>;
        explain(id: number): Promise<
          { history: { kind: string; detail: string | null }[] }
        >;
        stats(): Promise<{ done: number }>;
      };
    };
    for (;;) {
      const lease = await outbox.claim();
      if (lease !== null) {
        const { history } = await outbox.explain(lease.eventId);
        return {
          lease: [lease.eventId, lease.attempt] as [number, number],
          history: history.map(({ kind, detail }) =>
            [kind, detail] as [string, string | null]
          ),
          done: (await outbox.stats()).done,
        };
      }
      await new Promise((r) => setTimeout(r, 20));
    }
  });
}

Deno.test(
  {
    name:
      "a closing follower tab releases its leases on pagehide, so the leader claims them at once",
    ...browserTest,
  },
  async () => {
    await using session = await openSession();
    const leader = await leaderTab(session, "handback", ["job"]);
    const follower = await blankPage(session);
    const claimed = await follower.evaluate(async (paths) => {
      const m = await import(paths.bundle);
      const outbox = await m.openSharedOutbox("handback");
      const lease = await outbox.claim({ leaseMs: 600_000 });
      return [outbox.isLeader, lease.eventId, outbox.heldLeases().length];
    }, PATHS);
    assert.deepEqual(claimed, [false, 1, 1]);

    const closedAt = Date.now();
    await follower.close();
    const reclaimed = await reclaim(leader);
    const elapsedMs = Date.now() - closedAt;
    assert.deepEqual(reclaimed.lease, [1, 2]);
    assert.deepEqual(reclaimed.history.map(([kind]) => kind), [
      "claimed",
      "released",
      "claimed",
    ]);
    assert.equal(reclaimed.history[1]?.[1], "tab closed");
    assert.ok(elapsedMs < 5_000, `reclaimed after ${elapsedMs} ms`);
  },
);

Deno.test(
  {
    name:
      "a follower tab's acknowledgeAndClaim acknowledges and claims in one call, holds the new leases and hands them back on pagehide",
    ...browserTest,
  },
  async () => {
    await using session = await openSession();
    const leader = await leaderTab(session, "fold", ["a", "b"]);
    const follower = await blankPage(session);
    const folded = await follower.evaluate(async (paths) => {
      const m = await import(paths.bundle);
      const outbox = await m.openSharedOutbox("fold");
      const first = await outbox.claim({ max: 1, leaseMs: 600_000 });
      const next = await outbox.acknowledgeAndClaim(first, {
        max: 1,
        leaseMs: 600_000,
      });
      return {
        leader: outbox.isLeader,
        acknowledged: next.acknowledged,
        claimed: next.leases.map((l: { eventId: number }) => l.eventId),
        held: outbox.heldLeases().map((l: { eventId: number }) => l.eventId),
      };
    }, PATHS);
    assert.deepEqual(folded, {
      leader: false,
      acknowledged: [true],
      claimed: [2],
      held: [2],
    });

    await follower.close();
    const reclaimed = await reclaim(leader);
    assert.deepEqual(reclaimed.lease, [2, 2]);
    assert.deepEqual(reclaimed.history.map(([kind]) => kind), [
      "claimed",
      "released",
      "claimed",
    ]);
    assert.equal(reclaimed.done, 1);
  },
);

for (const method of ["claim", "acknowledgeAndClaim"] as const) {
  Deno.test(
    {
      name:
        `a follower tab that goes away while its ${method} is in flight: the leader hands the new lease back at once`,
      ...browserTest,
    },
    async () => {
      await using session = await openSession();
      const leader = await leaderTab(session, `inflight-${method}`, ["a", "b"]);
      const follower = await blankPage(session);
      await follower.evaluate(async ({ paths, name, method }) => {
        const m = await import(paths.bundle);
        const outbox = await m.openSharedOutbox(name);
        const first = await outbox.claim({ max: 1, leaseMs: 600_000 });
        // The call goes out, and the page hides before its reply.
        const call = method === "claim"
          ? outbox.claim({ max: 1, leaseMs: 600_000 })
          : outbox.acknowledgeAndClaim(first, { max: 1, leaseMs: 600_000 });
        call.catch(() => {});
        globalThis.dispatchEvent(new Event("pagehide"));
      }, { paths: PATHS, name: `inflight-${method}`, method });
      await follower.close();
      // Whichever event the call took (a release on pagehide may let it
      // take event 1 again), no 600 s lease stays with the closed tab.
      const left = await leader.evaluate(async () => {
        const { outbox } = globalThis as unknown as {
          outbox: {
            stats(): Promise<{ leased: number; pending: number }>;
            explain(id: number): Promise<
              { history: { kind: string; detail: string | null }[] }
            >;
          };
        };
        const deadline = Date.now() + 5_000;
        let stats = await outbox.stats();
        while (stats.leased > 0 && Date.now() < deadline) {
          await new Promise((resolve) => setTimeout(resolve, 50));
          stats = await outbox.stats();
        }
        const releases = [];
        for (const id of [1, 2]) {
          for (const { kind, detail } of (await outbox.explain(id)).history) {
            if (kind === "released") releases.push(detail);
          }
        }
        return { leased: stats.leased, releases };
      });
      assert.equal(left.leased, 0);
      assert.ok(left.releases.length > 0);
      assert.ok(left.releases.every((detail) => detail === "tab closed"));
    },
  );
}

Deno.test(
  {
    name:
      "calls forwarded from a follower tab return the leader's results and typed errors, and wake the leader",
    ...browserTest,
  },
  async () => {
    await using session = await openSession();
    const leader = await blankPage(session);
    await leader.evaluate(async (paths) => {
      const m = await import(paths.bundle);
      const outbox = await m.openSharedOutbox("forward");
      const counter = { enqueued: 0 };
      outbox.addEventListener("enqueue", () => counter.enqueued++);
      Object.assign(globalThis, { outbox, counter });
    }, PATHS);
    const follower = await blankPage(session);
    const seen = await follower.evaluate(async (paths) => {
      const m = await import(paths.bundle);
      const outbox = await m.openSharedOutbox("forward");
      const bytes = await outbox.enqueue(new Uint8Array([1, 2, 255]));
      const lease = await outbox.claim();
      const renewed = typeof await outbox.renew(lease, 60_000);
      const acknowledged = await outbox.acknowledge(lease);
      const stale = await outbox.acknowledge(lease);
      let invalid: unknown[] = [];
      try {
        await outbox.enqueue("x", { delayMs: -1 });
      } catch (error) {
        invalid = [error instanceof RangeError, (error as Error).message];
      }
      return {
        leader: outbox.isLeader,
        eventId: bytes.eventId,
        payload: Array.from(lease.payload as Uint8Array),
        renewed,
        acknowledged,
        stale,
        invalid,
        stats: await outbox.stats(),
      };
    }, PATHS);
    assert.equal(seen.leader, false);
    assert.equal(seen.eventId, 1);
    assert.deepEqual(seen.payload, [1, 2, 255]);
    assert.equal(seen.renewed, "number");
    assert.equal(seen.acknowledged, true);
    assert.equal(seen.stale, false);
    assert.equal(seen.invalid[0], true);
    assert.match(String(seen.invalid[1]), /'delayMs'/);
    assert.deepEqual(
      [seen.stats.pending, seen.stats.leased, seen.stats.done],
      [0, 0, 1],
    );
    assert.equal(
      await leader.evaluate(() =>
        (globalThis as unknown as { counter: { enqueued: number } }).counter
          .enqueued
      ),
      1,
    );
  },
);

// The call's identity is minted in the follower's tab, or given by the
// caller; either way the event is the call's own, so it is not reported as
// deduplicated, while a later enqueue of a given identity is.
for (const given of [false, true]) {
  Deno.test(
    {
      name: given
        ? "an enqueue with its own identity that the old leader stored but never answered says deduplicated false when the new leader runs it again; a later enqueue of that identity says true"
        : "an enqueue the old leader stored but never answered is stored once when the new leader runs it again",
      ...browserTest,
    },
    async () => {
      await using session = await openSession();
      const name = given ? "once-given" : "once";
      const leader = await mutedLeader(session, name);
      const follower = await blankPage(session);
      const options = given
        ? { identity: "0190a7d6-0000-7000-8000-000000000001" }
        : {};
      await follower.evaluate(async ({ paths, name, options }) => {
        const m = await import(paths.bundle);
        const outbox = await m.openSharedOutbox(name);
        Object.assign(globalThis, {
          outbox,
          enqueued: outbox.enqueue({ job: 1 }, options),
        });
      }, { paths: PATHS, name, options });
      await until(
        () =>
          leader.evaluate(async () =>
            (await (globalThis as unknown as {
              outbox: { stats(): Promise<{ pending: number }> };
            }).outbox.stats()).pending === 1
          ),
        5_000,
        "the leader to store the forwarded enqueue",
      );
      await leader.close();
      const result = await follower.evaluate(async (options) => {
        const { outbox, enqueued } = globalThis as unknown as {
          outbox: {
            isLeader: boolean;
            enqueue(
              payload: unknown,
              options: unknown,
            ): Promise<{ deduplicated: boolean }>;
            stats(): Promise<{ pending: number }>;
            explain(id: number): Promise<{ identity: string }>;
          };
          enqueued: Promise<
            { eventId: number; identity: string; deduplicated: boolean }
          >;
        };
        const { identity, ...stored } = await enqueued;
        return {
          stored,
          leader: outbox.isLeader,
          pending: (await outbox.stats()).pending,
          // The one stored event is the call's, under the identity it
          // returned.
          explained: (await outbox.explain(1)).identity === identity,
          again: "identity" in options
            ? (await outbox.enqueue({ job: 1 }, options)).deduplicated
            : null,
        };
      }, options);
      assert.deepEqual(result, {
        stored: { eventId: 1, deduplicated: false },
        leader: true,
        pending: 1,
        explained: true,
        again: given ? true : null,
      });
    },
  );
}

Deno.test(
  {
    name:
      "an acknowledge, a batch acknowledge, an acknowledgeAndClaim and a release the old leader committed but never answered answer true when the new leader runs them again; a stale lease re-sent still answers false",
    ...browserTest,
  },
  async () => {
    await using session = await openSession();
    const name = "ended-once";
    const leader = await blankPage(session);
    await leader.evaluate(async ({ paths, name }) => {
      const m = await import(paths.bundle);
      const outbox = await m.openSharedOutbox(name);
      await outbox.stats();
      Object.assign(globalThis, { outbox });
    }, { paths: PATHS, name });
    const follower = await blankPage(session);
    await follower.evaluate(async ({ paths, name }) => {
      const m = await import(paths.bundle);
      const outbox = await m.openSharedOutbox(name);
      for (let job = 1; job <= 6; job++) await outbox.enqueue({ job });
      const leases = await outbox.claim({ max: 5 });
      Object.assign(globalThis, { outbox, leases });
    }, { paths: PATHS, name });
    // From now on the leader commits what it is sent, but its replies never
    // leave, as if it went away between its commit and its reply.
    await leader.evaluate(() => {
      const post = BroadcastChannel.prototype.postMessage;
      BroadcastChannel.prototype.postMessage = function (message) {
        if ((message as { type?: string })?.type !== "reply") {
          post.call(this, message);
        }
      };
    });
    await follower.evaluate(() => {
      const g = globalThis as unknown as Record<string, unknown> & {
        outbox: Record<string, (...args: unknown[]) => Promise<unknown>>;
        leases: { token: string }[];
      };
      const [a, b, c, d, e] = g.leases;
      g["calls"] = Promise.all([
        g.outbox["acknowledge"]!(a),
        g.outbox["acknowledge"]!([b, { ...e, token: "0".repeat(32) }]),
        g.outbox["acknowledgeAndClaim"]!([c], { max: 1 }),
        g.outbox["release"]!(d),
      ]);
    });
    await until(
      () =>
        leader.evaluate(async () => {
          const stats = await (globalThis as unknown as {
            outbox: { stats(): Promise<Record<string, number>> };
          }).outbox.stats();
          // a, b and c done, d pending again beside job 6, which the
          // acknowledgeAndClaim took; e still leased.
          return stats["done"] === 3 && stats["pending"] === 1;
        }),
      10_000,
      "the leader to commit the four calls",
    );
    const next = await blankPage(session);
    await next.evaluate(async ({ paths, name }) => {
      const m = await import(paths.bundle);
      Object.assign(globalThis, { outbox: await m.openSharedOutbox(name) });
    }, { paths: PATHS, name });
    await leader.close();
    const answers = await follower.evaluate(async () => {
      const [acknowledged, batch, fused, released] =
        await (globalThis as unknown as { calls: Promise<unknown[]> })
          .calls;
      return {
        acknowledged,
        batch,
        fused: (fused as { acknowledged: boolean[] }).acknowledged,
        released,
      };
    });
    assert.deepEqual(answers, {
      acknowledged: true,
      // e's token was never current: stale, re-sent or not.
      batch: [true, false],
      fused: [true],
      released: true,
    });
  },
);

Deno.test(
  {
    name:
      "when the leader's database worker dies, the leader steps down and the queue goes on in a new worker",
    ...browserTest,
  },
  async () => {
    await using session = await openSession();
    const leader = await blankPage(session);
    await leader.evaluate(async (paths) => {
      const m = await import(paths.bundle);
      const outbox = await m.openSharedOutbox("crash");
      await outbox.enqueue("before");
      Object.assign(globalThis, { outbox });
    }, PATHS);
    const follower = await blankPage(session);
    await follower.evaluate(async (paths) => {
      const m = await import(paths.bundle);
      Object.assign(globalThis, {
        outbox: await m.openSharedOutbox("crash"),
      });
    }, PATHS);

    const worker = leader.workers().find((w) =>
      w.url().endsWith("/browser_worker.js")
    );
    assert.ok(worker, "the leader's database worker");
    await worker.evaluate(() => {
      setTimeout(() => {
        throw new Error("simulated crash");
      });
    });
    await until(
      async () =>
        !(await leader.evaluate(() =>
          (globalThis as unknown as { outbox: { isLeader: boolean } }).outbox
            .isLeader
        )),
      5_000,
      "the leader to step down",
    );
    const after = await follower.evaluate(async () => {
      const { outbox } = globalThis as unknown as {
        outbox: {
          isLeader: boolean;
          enqueue(payload: unknown): Promise<{ eventId: number }>;
          claim(options: { max: number }): Promise<{ payload: unknown }[]>;
        };
      };
      const { eventId } = await outbox.enqueue("after");
      const leases = await outbox.claim({ max: 10 });
      return {
        eventId,
        payloads: leases.map((lease) => lease.payload),
        leader: outbox.isLeader,
      };
    });
    assert.deepEqual(after, {
      eventId: 2,
      payloads: ["before", "after"],
      leader: true,
    });
  },
);

Deno.test(
  {
    name:
      "a reloading leader tab hands its leases back through its worker, so they are claimable at once after the reload",
    ...browserTest,
  },
  async () => {
    await using session = await openSession();
    const page = await blankPage(session);
    const claimed = await page.evaluate(async (paths) => {
      const m = await import(paths.bundle);
      const outbox = await m.openSharedOutbox("reload");
      await outbox.enqueue("a");
      await outbox.enqueue("b");
      const leases = await outbox.claim({ max: 2, leaseMs: 600_000 });
      return [outbox.isLeader, leases.length];
    }, PATHS);
    assert.deepEqual(claimed, [true, 2]);

    await page.reload();
    const after = await page.evaluate(async (paths) => {
      const m = await import(paths.bundle);
      const outbox = await m.openSharedOutbox("reload");
      const leases = await outbox.claim({ max: 2 });
      const { history } = await outbox.explain(1);
      return {
        leases: leases.map((lease: { payload: string; attempt: number }) => [
          lease.payload,
          lease.attempt,
        ]),
        history: history.map((entry: { kind: string; detail: string }) => [
          entry.kind,
          entry.detail,
        ]) as [string, string][],
      };
    }, PATHS);
    assert.deepEqual(after.leases, [["a", 2], ["b", 2]]);
    assert.deepEqual(after.history.map(([kind]) => kind), [
      "claimed",
      "released",
      "claimed",
    ]);
    assert.equal(after.history[1]?.[1], "tab closed");
  },
);
