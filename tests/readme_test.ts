/**
 * The README's browser snippet cannot run under `deno test --doc` (it needs
 * OPFS and navigator.locks, and the browser tests run the example that does
 * the same), so it is marked `ignore` there; this type-checks it.
 */
import assert from "node:assert/strict";

Deno.test("the README's browser snippet type-checks against browser/outbox.ts", async () => {
  const readme = await Deno.readTextFile(
    new URL("../README.md", import.meta.url),
  );
  const section = readme.slice(readme.indexOf("## In the browser"));
  const start = section.indexOf("```ts ignore\n") + "```ts ignore\n".length;
  const snippet = section.slice(start, section.indexOf("```", start));
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
        JSON.stringify(new URL("../browser/outbox.ts", import.meta.url).href),
      ).replace(
        `"@leased/outbox"`,
        JSON.stringify(new URL("../mod.ts", import.meta.url).href),
      ),
    );
    const { success, stderr } = await new Deno.Command(Deno.execPath(), {
      args: [
        "check",
        "--config",
        new URL("../deno.json", import.meta.url).pathname,
        file,
      ],
      stdout: "null",
      stderr: "piped",
    }).output();
    assert.ok(success, new TextDecoder().decode(stderr));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
