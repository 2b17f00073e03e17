/**
 * Takes the README's screenshot of the example (`screenshot.png` here): a
 * few messages delivered, then the endpoint switched off, so some wait for
 * their next try and one, allowed a single attempt, gave up. Headless
 * Chromium through the browser tests' harness.
 *
 * Usage: `deno run -A examples/browser/screenshot.ts`
 *
 * @module
 */
import type { Page } from "npm:playwright-core@1.65.1";
import { openSession, until } from "../../tests/fixtures/browser/harness.ts";

const out = new URL("./screenshot.png", import.meta.url);

function enqueue(page: Page, text: string, maxAttempts?: number) {
  return page.evaluate(({ text, maxAttempts }) => {
    const { outbox } = (globalThis as unknown as {
      outboxApp: {
        outbox: {
          enqueue(p: unknown, o: { maxAttempts?: number }): Promise<unknown>;
        };
      };
    }).outboxApp;
    return outbox.enqueue(
      { text, job: crypto.randomUUID() },
      maxAttempts === undefined ? {} : { maxAttempts },
    );
  }, { text, maxAttempts });
}

await using session = await openSession();
const page = await session.context.newPage();
await page.setViewportSize({ width: 820, height: 900 });
await page.goto(
  `${session.server.url}?outbox=shot&maxAttempts=20&backoffMinMs=20000&backoffMaxMs=60000`,
);
await page.waitForFunction(() => "outboxApp" in globalThis);
for (
  const text of ["Welcome, Ada", "Your order #1041 shipped", "Invoice #88"]
) {
  await enqueue(page, text);
}
await until(
  () => session.server.deliveries.length === 3,
  20_000,
  "3 deliveries",
);
session.server.down = true;
await enqueue(page, "Password reset for grace@example.com", 1);
for (
  const text of ["Your order #1042 shipped", "Weekly digest", "Invoice #89"]
) {
  await enqueue(page, text);
}
await until(
  async () =>
    (await page.$$("#dead-letters-list tr")).length === 1 &&
    (await page.$$eval(
        "#waiting-events-list tr td:nth-child(5)",
        (cells) => cells.filter((cell) => cell.textContent !== "–").length,
      )) === 3,
  20_000,
  "every attempt to have failed once",
);
await page.waitForTimeout(600);
await page.screenshot({ path: out.pathname, fullPage: true });
console.log(`wrote ${out.pathname}`);
