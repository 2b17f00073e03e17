/** What the browser tests' harness (tests/fixtures/browser/harness.ts) leaves where. */
import assert from "node:assert/strict";
import {
  blankPage,
  browserTest,
  openSession,
} from "./fixtures/browser/harness.ts";

/** The entries of this process's TMPDIR that Chromium names as its own. */
function chromiumEntries(): string[] {
  const tmp = Deno.env.get("TMPDIR") ?? "/tmp";
  return [...Deno.readDirSync(tmp)].map((entry) => entry.name).filter((
    name,
  ) => /^\.?org\.chromium\./.test(name));
}

Deno.test(
  {
    name:
      "browser harness: Chromium's temporary files go with its profile, never in the tests' TMPDIR, which deno task test requires empty",
    ...browserTest,
  },
  async () => {
    const before = chromiumEntries();
    {
      await using session = await openSession();
      const page = await blankPage(session);
      assert.equal(await page.evaluate(() => 6 * 7), 42);
      // While it runs: Chromium keeps a directory of its own there.
      assert.deepEqual(chromiumEntries(), before);
    }
    assert.deepEqual(chromiumEntries(), before);
  },
);
