/**
 * The README and the `docs/` pages: `deno test --doc` runs their TypeScript
 * blocks (the test task does, README.md and docs/*.md included); these check
 * what it cannot: the browser page's block, which needs OPFS and
 * navigator.locks, type-checks; no block is skipped; the README stays a short
 * door whose links, and the pages', lead somewhere.
 */
import assert from "node:assert/strict";

const root = new URL("../", import.meta.url);

/**
 * Pages written on other branches at the same time as this test, which the
 * README links already: empty this once they are merged.
 */
const PAGES_OF_OTHER_BRANCHES = new Set([
  "docs/what-ends-a-transaction.md",
  "docs/processing-loop.md",
  "docs/persistence-and-platforms.md",
  "docs/wal.md",
  "docs/browser.md",
  "docs/cli.md",
  "docs/edge.md",
  "docs/limits.md",
]);

/** README.md and every docs/*.md, by path from the root, with their text. */
async function pages(): Promise<Map<string, string>> {
  const found = new Map<string, string>();
  found.set("README.md", await Deno.readTextFile(new URL("README.md", root)));
  for await (const entry of Deno.readDir(new URL("docs/", root))) {
    if (entry.isFile && entry.name.endsWith(".md")) {
      const path = `docs/${entry.name}`;
      found.set(path, await Deno.readTextFile(new URL(path, root)));
    }
  }
  return found;
}

/** The fenced code blocks of a markdown text: their info string and body. */
function blocks(markdown: string): { info: string; body: string }[] {
  return [...markdown.matchAll(/^```(.*)\n([\s\S]*?)^```$/gm)].map((m) => ({
    info: m[1]!.trim(),
    body: m[2]!,
  }));
}

/** A markdown text without its fenced code blocks. */
function prose(markdown: string): string {
  return markdown.replace(/^```[\s\S]*?^```$/gm, "");
}

/** GitHub's anchor for a heading: lower case, punctuation dropped, spaces to -. */
function anchor(heading: string): string {
  return heading.trim().toLowerCase().replace(/[^\p{L}\p{N} _-]/gu, "")
    .replaceAll(" ", "-");
}

Deno.test("the browser page's block type-checks against browser/outbox.ts", async () => {
  const page = await Deno.readTextFile(new URL("docs/in-the-browser.md", root));
  const browser = blocks(page).filter((b) => b.info === "ts-browser");
  assert.equal(browser.length, 1);
  const snippet = browser[0]!.body;
  assert.match(snippet, /processEvents\(outbox/);
  // Deliveries carry the identity and fence headers the inbox reads.
  assert.match(snippet, /headers: \{[^}]*\.\.\.deliveryHeaders\(lease\)/);
  assert.doesNotMatch(snippet, /idempotency-key/i);
  const dir = await Deno.makeTempDir();
  try {
    const file = `${dir}/snippet.ts`;
    await Deno.writeTextFile(
      file,
      snippet.replace(
        `"@leased/outbox/browser"`,
        JSON.stringify(new URL("browser/outbox.ts", root).href),
      ).replace(
        `"@leased/outbox"`,
        JSON.stringify(new URL("mod.ts", root).href),
      ),
    );
    const { success, stderr } = await new Deno.Command(Deno.execPath(), {
      args: ["check", "--config", new URL("deno.json", root).pathname, file],
      stdout: "null",
      stderr: "piped",
    }).output();
    assert.ok(success, new TextDecoder().decode(stderr));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("no TypeScript or JavaScript block of the README or the docs is marked ignore", async () => {
  const ignored = [];
  for (const [path, text] of await pages()) {
    for (const { info } of blocks(text)) {
      const [language, ...attributes] = info.split(/[\s,]+/);
      if (
        /^(ts|tsx|typescript|mts|cts|js|jsx|javascript|mjs|cjs)$/.test(
          language!,
        ) && attributes.includes("ignore")
      ) {
        ignored.push(`${path}: ${info}`);
      }
    }
  }
  assert.deepEqual(ignored, []);
});

Deno.test("the README is a door: at most 300 lines, the two commands, a link to every docs page", async () => {
  const all = await pages();
  const readme = all.get("README.md")!;
  assert.ok(readme.split("\n").length <= 300);
  assert.ok(readme.includes("npx -y deno@2.9.6 run -A demo.ts"));
  assert.ok(readme.includes("npx -y deno@2.9.6 task test"));
  const linked = new Set(
    [...readme.matchAll(/\]\((docs\/[^)#]+\.md)(?:#[^)]*)?\)/g)].map((m) =>
      m[1]!
    ),
  );
  const unlinked = [...all.keys()].filter((path) =>
    path.startsWith("docs/") && !linked.has(path)
  );
  assert.deepEqual(unlinked, []);
  assert.ok(linked.size >= 5);
});

Deno.test("every relative link of the README and the docs leads to a file, and to a heading of it", async () => {
  const all = await pages();
  const broken = [];
  for (const [path, text] of all) {
    for (const [, target] of prose(text).matchAll(/\]\(([^)\s]+)\)/g)) {
      if (/^[a-z]+:/.test(target!)) continue; // https:, mailto:
      const [file, fragment] = target!.split("#");
      const resolved = file === ""
        ? path
        : new URL(file!, new URL(path, root)).href.slice(root.href.length);
      if (PAGES_OF_OTHER_BRANCHES.has(resolved)) continue;
      const exists = await Deno.stat(new URL(resolved, root)).then(
        () => true,
        () => false,
      );
      if (!exists) {
        broken.push(`${path}: ${target} (no such file)`);
      } else if (fragment !== undefined) {
        const headings = [
          ...prose(all.get(resolved) ?? "").matchAll(/^#+ (.*)$/gm),
        ].map((m) => anchor(m[1]!));
        if (!headings.includes(fragment)) {
          broken.push(`${path}: ${target} (no such heading)`);
        }
      }
    }
  }
  assert.deepEqual(broken, []);
});
