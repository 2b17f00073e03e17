/**
 * The dashboard in real Chromium (Debian's, through playwright-core): a
 * reader's path through the pages, a redrive by clicking, and stored
 * markup that must stay text with nothing run.
 */
import assert from "node:assert/strict";
import { chromium, type Page } from "npm:playwright-core@1.65.1";
import { Outbox } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { serveDashboard } from "../dashboard/serve.ts";
import {
  browserTest,
  CHROMIUM_ARGS,
  CHROMIUM_PATH,
} from "./fixtures/browser/harness.ts";
import { chromiumTmp } from "./fixtures/browser/chromium.ts";

const XSS = `<img src=x onerror="document.title='pwned'">`;

async function withDashboard(
  actions: boolean | {
    actions: boolean;
    refreshMs: number;
    javaScript: boolean;
  },
  fill: (outbox: Outbox) => Promise<void>,
  fn: (
    page: Page,
    url: string,
    outbox: Outbox,
    problems: string[],
  ) => Promise<void>,
): Promise<void> {
  await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
  await fill(outbox);
  const settings = typeof actions === "boolean"
    ? { actions, refreshMs: 0, javaScript: true }
    : actions;
  await using server = serveDashboard(outbox, {
    port: 0,
    actions: settings.actions,
    basePath: "/admin/outbox",
    refreshMs: settings.refreshMs,
  });
  await using tmp = await chromiumTmp();
  const browser = await chromium.launch({
    executablePath: CHROMIUM_PATH,
    args: [...CHROMIUM_ARGS],
    env: tmp.env,
  });
  try {
    const page = await browser.newPage({
      javaScriptEnabled: settings.javaScript,
    });
    // CSP violations, script errors and dialogs: none may happen.
    const problems: string[] = [];
    page.on("console", (message) => {
      if (message.type() === "error") problems.push(message.text());
    });
    page.on("pageerror", (error) => problems.push(error.message));
    page.on("dialog", (dialog) => {
      problems.push(`dialog: ${dialog.message()}`);
      dialog.dismiss();
    });
    await fn(page, server.url, outbox, problems);
  } finally {
    await browser.close();
  }
}

async function deadLetter(outbox: Outbox, queue: string, error: string) {
  const { eventId } = await outbox.enqueue({ to: "ada" }, {
    queue,
    maxAttempts: 1,
  });
  const lease = await outbox.claim({ queue });
  assert.equal(lease?.eventId, eventId);
  await outbox.release(lease!, { error });
  return eventId;
}

Deno.test({
  name:
    "in Chromium, the dashboard's overview leads to a queue's events, one event and its timeline",
  ...browserTest,
  fn: () =>
    withDashboard(false, async (outbox) => {
      await outbox.enqueue({ to: "ada@example.com" }, { queue: "mail" });
      const { eventId } = await outbox.enqueue({ to: "bob@example.com" }, {
        queue: "mail",
      });
      const lease = await outbox.claim({ queue: "mail" });
      await outbox.acknowledge(lease!);
      assert.notEqual(lease?.eventId, eventId);
    }, async (page, url, _outbox, problems) => {
      await page.goto(url);
      assert.equal(await page.title(), "Overview · Outbox");
      const row = page.locator("tbody tr", { hasText: "mail" });
      assert.deepEqual(
        (await row.locator("td").allInnerTexts()).slice(0, 5),
        ["mail", "1", "0", "1", "0"],
      );
      await row.locator("a.state-pending").click();
      await page.waitForURL(/state=pending/);
      await page.locator("tbody tr a").first().click();
      await page.waitForURL(/\/events\/\d+$/);
      assert.match(await page.locator("pre").innerText(), /bob@example\.com/);
      assert.match(await page.locator("h2").first().innerText(), /^Event \d+$/);
      await page.goto(`${url}events?state=done`);
      await page.locator("tbody tr a").first().click();
      const kinds = await page.locator("tbody tr td:nth-child(2)")
        .allInnerTexts();
      assert.deepEqual(kinds, ["claimed", "acknowledged"]);
      // The stylesheet applied (the CSP let it load).
      assert.equal(
        await page.evaluate(
          `getComputedStyle(document.body).fontFamily.includes("system-ui")`,
        ),
        true,
      );
      assert.deepEqual(problems, []);
    }),
});

Deno.test({
  name:
    "in Chromium, with actions on, a click redrives a dead letter and it shows pending",
  ...browserTest,
  fn: () =>
    withDashboard(
      true,
      (outbox) => deadLetter(outbox, "mail", "smtp down").then(() => {}),
      async (page, url, outbox, problems) => {
        await page.goto(`${url}dead`);
        assert.match(await page.locator("tbody").innerText(), /smtp down/);
        await page.getByRole("link", { name: "Redrive…" }).first().click();
        await page.getByRole("button", { name: "redrive" }).click();
        assert.match(
          await page.locator("[role=status]").innerText(),
          /Redrove event \d+: pending again\./,
        );
        const stats = await outbox.stats({ queue: "mail" });
        assert.equal(stats.dead, 0);
        assert.equal(stats.pending, 1);
        await page.goto(url);
        assert.deepEqual(
          (await page.locator("tbody tr", { hasText: "mail" }).locator("td")
            .allInnerTexts()).slice(1, 5),
          ["1", "0", "0", "0"],
        );
        assert.deepEqual(problems, []);
      },
    ),
});

Deno.test({
  name:
    "in Chromium, a payload and an error holding markup show as text and nothing runs",
  ...browserTest,
  fn: () =>
    withDashboard(true, async (outbox) => {
      await outbox.enqueue({ html: XSS }, { queue: "web" });
      await deadLetter(
        outbox,
        "mail",
        `<script>document.title='pwned'</script>${XSS}`,
      );
    }, async (page, url, _outbox, problems) => {
      for (
        const path of [
          "",
          "events?state=pending",
          "dead",
          "events/1",
          "events/2",
        ]
      ) {
        await page.goto(`${url}${path}`);
        assert.notEqual(await page.title(), "pwned", path);
        assert.equal(await page.locator("main img").count(), 0, path);
        assert.equal(await page.locator("main script").count(), 0, path);
      }
      await page.goto(`${url}events/1`);
      assert.match(
        await page.locator("pre").innerText(),
        /<img src=x onerror=/,
      );
      await page.goto(`${url}dead`);
      assert.match(
        await page.locator("tbody").innerText(),
        /<script>document\.title/,
      );
      assert.deepEqual(problems, []);
    }),
});

Deno.test({
  name:
    "in Chromium, an open overview shows a new event without a reload (real time: the page polls)",
  ...browserTest,
  fn: () =>
    withDashboard(
      { actions: false, refreshMs: 100, javaScript: true },
      async (outbox) => {
        await outbox.enqueue({ n: 1 }, { queue: "mail" });
      },
      async (page, url, outbox, problems) => {
        await page.goto(url);
        const pending = page.locator("tbody tr", { hasText: "mail" })
          .locator("a.state-pending");
        assert.equal(await pending.innerText(), "1");
        let loads = 0;
        page.on("load", () => loads++);
        await outbox.enqueue({ n: 2 }, { queue: "mail" });
        await outbox.enqueue({ n: 3 }, { queue: "sms" });
        await page.locator("tbody tr", { hasText: "sms" }).waitFor();
        assert.equal(await pending.innerText(), "2");
        assert.equal(loads, 0);
        assert.deepEqual(problems, []);
      },
    ),
});

Deno.test({
  name:
    "in Chromium with JavaScript off, the overview and an event read the same",
  ...browserTest,
  fn: () =>
    withDashboard(
      { actions: false, refreshMs: 5000, javaScript: false },
      async (outbox) => {
        await outbox.enqueue({ to: "ada" }, { queue: "mail" });
      },
      async (page, url, _outbox, problems) => {
        await page.goto(url);
        assert.deepEqual(
          (await page.locator("tbody tr", { hasText: "mail" }).locator("td")
            .allInnerTexts()).slice(0, 5),
          ["mail", "1", "0", "0", "0"],
        );
        await page.goto(`${url}events?state=pending`);
        await page.locator("tbody tr a").first().click();
        await page.waitForURL(/\/events\/1$/);
        assert.match(await page.locator("pre").innerText(), /"to": "ada"/);
        assert.match(await page.locator("dl").innerText(), /Due/);
        assert.match(await page.locator("main").innerText(), /Never claimed/);
        assert.deepEqual(problems, []);
      },
    ),
});
