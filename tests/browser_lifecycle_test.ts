/**
 * The shared outbox through the page lifecycle, in headless Chromium: a
 * leader that does not answer, a frozen leader, a leader in the
 * back-forward cache, and leases at pagehide. Headless Chromium keeps every
 * page visible, which the DevTools protocol cannot freeze: see `freeze()`.
 *
 * @module
 */
import assert from "node:assert/strict";
import type { Page } from "npm:playwright-core@1.65.1";
import {
  blankPage,
  browserTest,
  openSession,
  PATHS,
  type Session,
  until,
} from "./fixtures/browser/harness.ts";

// The page's view of the bundle and of what the tests keep in it.
// deno-lint-ignore no-explicit-any
type Any = any;

/**
 * Opens the shared outbox `name` in a new blank page (which leads when it is
 * the first), keeps it as the page's `outbox`, and, when `loop` is set,
 * starts a delivery loop on `leaderchange` as the docs show, recording the
 * payloads it handles in `delivered`.
 */
async function tab(
  session: Session,
  name: string,
  options: { loop?: boolean; busyTimeoutMs?: number } = {},
): Promise<Page> {
  const page = await blankPage(session);
  await page.evaluate(async ({ paths, name, options }) => {
    const m = await import(paths.bundle);
    const outbox = await m.openSharedOutbox(
      name,
      options.busyTimeoutMs === undefined
        ? {}
        : { busyTimeoutMs: options.busyTimeoutMs },
    );
    const delivered: unknown[] = [];
    let processor: Any;
    const lead = () => {
      if (outbox.isLeader && processor === undefined) {
        processor = m.processEvents(outbox, (lease: Any) => {
          delivered.push(lease.payload);
        }, { pollMaxMs: 200 });
      } else if (!outbox.isLeader && processor !== undefined) {
        processor.stop();
        processor = undefined;
      }
    };
    if (options.loop) outbox.addEventListener("leaderchange", lead);
    Object.assign(globalThis, { m, outbox, delivered });
    await outbox.stats();
  }, { paths: PATHS, name, options });
  return page;
}

/**
 * Freezes `page` as far as headless Chromium lets a test: the DevTools
 * protocol's `Page.setWebLifecycleState` is a no-op for a visible page, and
 * headless Chromium keeps every page visible (checked: a timer kept firing
 * and no `freeze` event came), so the page gets the `freeze` event the
 * browser fires before it stops the page's tasks. The back-forward cache
 * test below has Chromium freeze a page for real.
 */
async function freeze(page: Page): Promise<void> {
  await page.evaluate(() =>
    (globalThis as Any).document.dispatchEvent(new Event("freeze"))
  );
}

function isLeader(page: Page): Promise<boolean> {
  return page.evaluate(() => (globalThis as Any).outbox.isLeader);
}

function delivered(page: Page): Promise<unknown[]> {
  return page.evaluate(() => (globalThis as Any).delivered);
}

/** Claims event `payload` in `page` under a 10-minute lease, kept there. */
async function holdLease(page: Page): Promise<number> {
  return await page.evaluate(async () => {
    const { outbox } = globalThis as Any;
    const lease = await outbox.claim({ leaseMs: 600_000 });
    return lease.eventId;
  });
}

/** The kinds and details of an event's ledger, read in `page`. */
function history(page: Page, eventId: number): Promise<[string, string][]> {
  return page.evaluate(async (eventId) => {
    const { history } = await (globalThis as Any).outbox.explain(eventId);
    return history.map((
      entry: { kind: string; detail: string },
    ) => [entry.kind, entry.detail]);
  }, eventId);
}

Deno.test(
  {
    name:
      "a call forwarded to a leader tab that does not answer fails with BusyError after busyTimeoutMs, and the leader does not run it later",
    ...browserTest,
  },
  async () => {
    await using session = await openSession();
    const leader = await tab(session, "hung");
    const follower = await tab(session, "hung", { busyTimeoutMs: 500 });
    assert.deepEqual([await isLeader(leader), await isLeader(follower)], [
      true,
      false,
    ]);
    // The leader's main thread stops at its next statement: the call's
    // message waits unread, as in a hung or frozen tab.
    const cdp = await leader.context().newCDPSession(leader);
    await cdp.send("Debugger.enable");
    await cdp.send("Debugger.pause");
    const outcome = await follower.evaluate(async () => {
      const { m, outbox } = globalThis as Any;
      const startedAt = Date.now();
      const settled = await Promise.race([
        outbox.enqueue("late").then(
          () => ({ name: "stored", message: "" }),
          (error: Error) => ({
            name: error.name,
            busy: error instanceof m.BusyError,
            message: error.message,
          }),
        ),
        new Promise((resolve) =>
          setTimeout(() => resolve({ name: "still pending" }), 15_000)
        ),
      ]);
      return { ...settled as object, elapsedMs: Date.now() - startedAt };
    }) as { name: string; busy: boolean; message: string; elapsedMs: number };
    await cdp.send("Debugger.resume");
    assert.equal(outcome.name, "BusyError");
    assert.equal(outcome.busy, true);
    assert.match(outcome.message, /did not take the call on within 500 ms/);
    assert.ok(outcome.elapsedMs >= 500, `failed after ${outcome.elapsedMs} ms`);
    // Awake again, the leader reads the call too late to run it.
    const after = await leader.evaluate(async () => {
      const { outbox } = globalThis as Any;
      await new Promise((resolve) => setTimeout(resolve, 200));
      return (await outbox.stats()).pending;
    });
    assert.equal(after, 0);
    // The follower's next call goes through.
    const next = await follower.evaluate(async () =>
      (await (globalThis as Any).outbox.enqueue("next")).eventId
    );
    assert.equal(next, 1);
  },
);

Deno.test(
  {
    name:
      "a call the leader took on and then stopped answering for is never reported as not run: sent again after a leader announcement and unanswered, it fails saying it may have run",
    ...browserTest,
  },
  async () => {
    await using session = await openSession();
    const leader = await tab(session, "resent");
    const follower = await tab(session, "resent", { busyTimeoutMs: 500 });
    assert.deepEqual([await isLeader(leader), await isLeader(follower)], [
      true,
      false,
    ]);
    const leaderTab = await leader.evaluate(() =>
      (globalThis as Any).outbox.tab
    );
    // The leader's worker gets work that keeps it busy for a while.
    await leader.evaluate(() => {
      const { outbox } = globalThis as Any;
      (globalThis as Any).busy = Promise.all(
        Array.from({ length: 1_000 }, (_, i) => outbox.enqueue(i)),
      );
    });
    // The follower's call: the leader takes it on (received) and passes it
    // to its worker, behind that work.
    await follower.evaluate(() => {
      const { m, outbox } = globalThis as Any;
      (globalThis as Any).call = outbox.enqueue("taken-on").then(
        () => "stored",
        (error: Error) =>
          error instanceof m.BusyError ? error.message : String(error),
      );
    });
    await new Promise((resolve) => setTimeout(resolve, 300));
    // Then the leader's thread stops (its worker goes on), just after it
    // announced itself once more, as it does for every tab that says hello:
    // the follower sends the call again, and nobody takes that copy on.
    const cdp = await leader.context().newCDPSession(leader);
    await cdp.send("Debugger.enable");
    await cdp.send("Debugger.pause");
    const outcome = await follower.evaluate(async (leaderTab) => {
      const channel = new BroadcastChannel("leased-outbox:resent");
      channel.postMessage({ type: "leader", tab: leaderTab });
      channel.close();
      return await (globalThis as Any).call;
    }, leaderTab);
    await cdp.send("Debugger.resume");
    const stored = await leader.evaluate(async () => {
      const { busy, outbox } = globalThis as Any;
      await busy;
      return (await outbox.list({ state: "pending", limit: 10, afterId: 995 }))
        .map((e: Any) => e.payload);
    });
    assert.ok(stored.includes("taken-on"), JSON.stringify(stored));
    assert.doesNotMatch(outcome, /did not run/);
    assert.match(outcome, /it may have run/);
  },
);

Deno.test(
  {
    name:
      "a frozen leader tab gives up leadership and its leases: another tab takes over, its loop started on leaderchange delivers, and the thawed tab follows",
    ...browserTest,
  },
  async () => {
    await using session = await openSession();
    const leader = await tab(session, "frozen", { loop: false });
    await leader.evaluate(() => (globalThis as Any).outbox.enqueue("a"));
    assert.equal(await holdLease(leader), 1);
    const follower = await tab(session, "frozen", { loop: true });
    await follower.evaluate(() => (globalThis as Any).outbox.enqueue("b"));
    assert.equal(await isLeader(follower), false);

    await freeze(leader);
    await until(() => isLeader(follower), 20_000, "the follower to lead");
    await until(
      async () => (await delivered(follower)).length === 2,
      20_000,
      "both events delivered by the new leader's loop",
    );
    assert.deepEqual((await delivered(follower)).sort(), ["a", "b"]);
    // Event 1 was handed back by the frozen tab, not left to its lease.
    assert.deepEqual((await history(follower, 1)).slice(0, 3), [
      ["claimed", null],
      ["released", "tab closed"],
      ["claimed", null],
    ]);

    await leader.evaluate(() =>
      (globalThis as Any).document.dispatchEvent(new Event("resume"))
    );
    const thawed = await leader.evaluate(async () => {
      const { outbox } = globalThis as Any;
      const { eventId } = await outbox.enqueue("c");
      return { leader: outbox.isLeader, eventId };
    });
    assert.deepEqual(thawed, { leader: false, eventId: 3 });
    await until(
      async () => (await delivered(follower)).length === 3,
      20_000,
      "the thawed tab's event delivered",
    );
  },
);

Deno.test(
  {
    name:
      "a frozen follower tab leaves the queue for leadership, so the tab after it takes over, and rejoins the queue on resume",
    ...browserTest,
  },
  async () => {
    await using session = await openSession();
    const leader = await tab(session, "queue");
    const frozen = await tab(session, "queue");
    const next = await tab(session, "queue");
    // Counts the database workers the frozen tab starts: a frozen tab
    // granted the lock could not run, so it must not be granted it.
    await frozen.evaluate(() => {
      const Original = (globalThis as Any).Worker;
      (globalThis as Any).started = 0;
      (globalThis as Any).Worker = class extends Original {
        constructor(...args: unknown[]) {
          super(...args);
          (globalThis as Any).started++;
        }
      };
    });
    await freeze(frozen);
    await leader.close();
    await until(() => isLeader(next), 20_000, "the tab after it to lead");
    assert.deepEqual(
      await frozen.evaluate(() => [
        (globalThis as Any).outbox.isLeader,
        (globalThis as Any).started,
      ]),
      [false, 0],
    );
    await frozen.evaluate(() =>
      (globalThis as Any).document.dispatchEvent(new Event("resume"))
    );
    await next.close();
    await until(() => isLeader(frozen), 20_000, "the resumed tab to lead");
  },
);

Deno.test(
  {
    name:
      "a leader tab that goes into the back-forward cache (pagehide persisted) gives up leadership and its leases to another tab, whose loop carries on",
    ...browserTest,
  },
  async () => {
    await using session = await openSession({}, { backForwardCache: true });
    const leader = await tab(session, "cached");
    await leader.evaluate(() => {
      const { outbox } = globalThis as Any;
      addEventListener("pagehide", (event) => {
        localStorage.setItem(
          "persisted",
          String((event as Event & { persisted: boolean }).persisted),
        );
      });
      return outbox.enqueue("a");
    });
    assert.equal(await holdLease(leader), 1);
    const follower = await tab(session, "cached", { loop: true });
    assert.equal(await isLeader(follower), false);

    await leader.goto(`${session.server.url}fixtures/blank.html?away`);
    assert.equal(
      await leader.evaluate(() => localStorage.getItem("persisted")),
      "true",
    );
    await until(() => isLeader(follower), 20_000, "the follower to lead");
    await until(
      async () => (await delivered(follower)).length === 1,
      20_000,
      "the cached tab's event delivered",
    );
    assert.deepEqual((await history(follower, 1)).slice(0, 2), [
      ["claimed", null],
      ["released", "tab closed"],
    ]);
  },
);

Deno.test(
  {
    name:
      "a leader tab's leases are released at pagehide every time: five runs of freeze then navigate, and five of close",
    ...browserTest,
  },
  async () => {
    await using session = await openSession();
    let leader = await tab(session, "runs");
    for (let run = 0; run < 10; run++) {
      // The tab that takes over, and sees what the leader left.
      const next = await tab(session, "runs");
      assert.equal(await isLeader(leader), true, `run ${run}: the leader`);
      await leader.evaluate(() => (globalThis as Any).outbox.enqueue("job"));
      const claimed = await holdLease(leader);
      if (run < 5) {
        await freeze(leader);
        await leader.goto(`${session.server.url}fixtures/blank.html?away`);
      }
      await leader.close();
      await until(() => isLeader(next), 20_000, `run ${run}: a new leader`);
      await until(
        async () =>
          (await history(next, claimed)).some(([kind]) => kind === "released"),
        20_000,
        `run ${run}: event ${claimed}'s lease released`,
      );
      assert.deepEqual(await history(next, claimed), [
        ["claimed", null],
        ["released", "tab closed"],
      ]);
      // Done with it, so the next run's claim takes the next run's event.
      const finished = await next.evaluate(async () => {
        const { outbox } = globalThis as Any;
        return await outbox.acknowledge(await outbox.claim());
      });
      assert.equal(finished, true);
      leader = next;
    }
  },
);
