/**
 * Takes the screenshots of docs/dashboard.md: an outbox with a few queues
 * in every state, served by the dashboard, photographed in Debian's
 * Chromium (`deno run -A scripts/dashboard_screenshots.ts`).
 *
 * @module
 */
import { chromium } from "npm:playwright-core@1.65.1";
import { Outbox } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { serveDashboard } from "../dashboard/serve.ts";
import {
  CHROMIUM_ARGS,
  CHROMIUM_PATH,
} from "../tests/fixtures/browser/chromium.ts";

const MINUTE = 60_000;
const start = Date.now() - 50 * MINUTE;
const clock = { now: start };
await using outbox = await Outbox.open(await openSqliteWasm(":memory:"), {
  now: () => clock.now,
});
// Fifty minutes of a mail queue, a webhook queue that fails now and then,
// and an sms queue with a backlog.
for (let minute = 0; minute < 50; minute++) {
  clock.now = start + minute * MINUTE;
  const n = 20 + Math.round(15 * Math.sin(minute / 6));
  await outbox.enqueueBatch(
    Array.from({ length: n }, (_, i) => ({
      payload: {
        to: `user${minute * 100 + i}@example.com`,
        template: "receipt",
      },
      queue: "mail",
    })),
  );
  await outbox.enqueueBatch(
    Array.from({ length: 6 }, (_, i) => ({
      payload: {
        url: "https://hooks.example.com/orders",
        order: minute * 10 + i,
      },
      queue: "webhooks",
      maxAttempts: 2,
    })),
  );
  clock.now += 20_000;
  for (const queue of ["mail", "webhooks"]) {
    for (const lease of await outbox.claim({ queue, max: 100 })) {
      const payload = lease.payload as { order?: number };
      if (queue === "webhooks" && (payload.order ?? 0) % 7 === 3) {
        await outbox.release(lease, {
          error:
            "POST https://hooks.example.com/orders: 503 Service Unavailable",
        });
      } else {
        await outbox.acknowledge(lease);
      }
    }
  }
}
clock.now = start + 50 * MINUTE;
await outbox.enqueueBatch(
  Array.from({ length: 137 }, (_, i) => ({
    payload: { to: "+15550100", text: `Your code is ${100_000 + i}` },
    queue: "sms",
  })),
);
await outbox.claim({ queue: "sms", max: 4 });

await using server = serveDashboard(outbox, {
  port: 0,
  actions: true,
  refreshMs: 0,
  now: () => clock.now,
});
const browser = await chromium.launch({
  executablePath: CHROMIUM_PATH,
  args: [...CHROMIUM_ARGS],
});
try {
  const page = await browser.newPage({
    viewport: { width: 1100, height: 640 },
  });
  const out = new URL("../docs/images/", import.meta.url);
  await page.goto(server.url);
  await page.screenshot({
    path: new URL("dashboard-overview.png", out).pathname,
  });
  await page.goto(`${server.url}dead`);
  await page.locator("tbody tr a").first().click();
  await page.screenshot({
    path: new URL("dashboard-event.png", out).pathname,
    fullPage: true,
  });
  const phone = await browser.newPage({
    viewport: { width: 390, height: 760 },
  });
  await phone.goto(server.url);
  await phone.screenshot({
    path: new URL("dashboard-phone.png", out).pathname,
  });
} finally {
  await browser.close();
}
