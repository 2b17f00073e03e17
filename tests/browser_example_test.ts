import assert from "node:assert/strict";
import type { Page } from "npm:playwright-core@1.65.1";
import {
  browserTest,
  openSession,
  type Session,
  until,
} from "./fixtures/browser/harness.ts";

/** Opens the example page and collects what it logs as errors. */
async function examplePage(
  session: Session,
  query: string,
): Promise<{ page: Page; errors: string[] }> {
  const page = await session.context.newPage();
  const errors: string[] = [];
  page.on("console", (message) => {
    if (message.type() === "error") errors.push(message.text());
  });
  page.on("pageerror", (error) => errors.push(String(error)));
  await page.goto(`${session.server.url}?${query}`);
  await page.waitForFunction(() => "outboxApp" in globalThis);
  return { page, errors };
}

function add(page: Page, text: string): Promise<number> {
  return page.evaluate(
    (text) =>
      (globalThis as unknown as {
        outboxApp: { add(text: string): Promise<number> };
      }).outboxApp.add(text),
    text,
  );
}

/** The text of each cell of each row of a list's table body. */
function rows(page: Page, list: string): Promise<string[][]> {
  return page.$$eval(
    `#${list} tr`,
    (trs) =>
      trs.map((tr) =>
        [...tr.querySelectorAll("td")].map((td) => td.textContent ?? "")
      ),
  );
}

/** What the page's outbox lists in a state. */
function listed(
  page: Page,
  state = "pending",
): Promise<{ identity: string; attempt: number; dueAt: number }[]> {
  return page.evaluate(async (state) => {
    const { outbox } = (globalThis as unknown as {
      outboxApp: {
        outbox: {
          list(o: { state: string }): Promise<
            { identity: string; attempt: number; dueAt: number }[]
          >;
        };
      };
    }).outboxApp;
    return await outbox.list({ state });
  }, state);
}

Deno.test(
  {
    name:
      "the example loads without console errors and lists the waiting and dead messages with identity, attempt, next try and last error",
    ...browserTest,
  },
  async () => {
    await using session = await openSession();
    const dead = await examplePage(session, "outbox=gave-up&maxAttempts=1");
    await until(
      async () =>
        (await dead.page.textContent("#role"))?.startsWith("leader") ?? false,
      10_000,
      "the tab to lead",
    );
    await add(dead.page, "delivered at once");
    await until(
      async () => (await dead.page.textContent("#done")) === "1",
      10_000,
      "the first delivery to show as done",
    );
    // Two more refreshes (every 500 ms) with nothing waiting.
    await dead.page.waitForTimeout(1_200);
    assert.deepEqual(dead.errors, []);
    assert.equal(await dead.page.isHidden("#waiting-events"), true);
    assert.equal(await dead.page.isHidden("#dead-letters"), true);

    // From here on the endpoint answers 503, which Chromium logs.
    session.server.down = true;
    await add(dead.page, "refused");
    await dead.page.waitForSelector("#dead-letters-list tr");
    const deadIdentity = (await listed(dead.page, "dead"))[0]?.identity;
    const [deadRow] = await rows(dead.page, "dead-letters-list");
    assert.deepEqual(deadRow!.slice(0, 3), [
      "refused",
      deadIdentity!.slice(-12),
      "1/1",
    ]);
    assert.match(deadRow![3]!, /^gave up at \d/);
    assert.deepEqual(deadRow!.slice(4), [
      "Error: endpoint answered 503",
      "redrive",
    ]);
    assert.equal(
      await dead.page.getAttribute("#dead-letters-list td.identity", "title"),
      deadIdentity,
    );

    const waiting = await examplePage(
      session,
      "outbox=waiting&maxAttempts=20&backoffMinMs=60000&backoffMaxMs=60000",
    );
    await add(waiting.page, "waiting for the endpoint");
    await until(
      async () =>
        (await rows(waiting.page, "waiting-events-list"))[0]?.[4] !== "–",
      10_000,
      "the first failed attempt",
    );
    // The row shows the event as listed: its identity, attempt, when the
    // loop's backoff (up to 60 s, with full jitter) lets it be tried again,
    // and the error of the failed attempt.
    // Full jitter may retry at once: wait for a row that waits.
    let waitingRow: string[] | undefined;
    await until(
      async () => {
        [waitingRow] = await rows(waiting.page, "waiting-events-list");
        return /^in \d+ s$/.test(waitingRow?.[3] ?? "");
      },
      30_000,
      "a backoff to show",
    );
    const [event] = await listed(waiting.page);
    assert.deepEqual(waitingRow!.slice(0, 3), [
      "waiting for the endpoint",
      event!.identity.slice(-12),
      `${event!.attempt}/20`,
    ]);
    assert.ok(event!.attempt >= 1);
    const seconds = Math.ceil((event!.dueAt - Date.now()) / 1000);
    const [, shown] = waitingRow![3]!.match(/^in (\d+) s$/) ?? ["", "0"];
    assert.ok(Math.abs(Number(shown) - seconds) <= 1, waitingRow![3]);
    assert.ok(Number(shown) <= 60);
    assert.equal(waitingRow![4], "Error: endpoint answered 503");
    assert.equal(await waiting.page.isHidden("#dead-letters"), true);

    // Redrive, with the endpoint back: delivered, and the list empties.
    session.server.down = false;
    await dead.page.click("#dead-letters-list button");
    await until(
      () =>
        session.server.deliveries.some((delivery) =>
          (delivery.body as { text: string }).text === "refused"
        ),
      10_000,
      "the redriven delivery",
    );
    await dead.page.waitForSelector("#dead-letters", { state: "hidden" });
  },
);
