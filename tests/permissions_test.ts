/** The README's minimal-permission command, run exactly as documented. */
import assert from "node:assert/strict";
import { join } from "node:path";
import { tempDir } from "./helpers.ts";

const root = new URL("../", import.meta.url);

Deno.test("the README's minimal-permission command runs an outbox on a file with any DENO_DIR", async () => {
  const readme = await Deno.readTextFile(new URL("README.md", root));
  const command = readme.match(
    /`(deno run (?:--allow-[\w-]+(?:=\S+)? )+app\.ts)`/,
  )
    ?.[1];
  assert.ok(command, "README names a `deno run --allow-… app.ts` command");
  // Exactly those flags; --no-prompt so a missing one fails, never asks.
  const [, run, ...flagsAndScript] = command.split(" ");

  // A project as README's "Use it in a project" sets one up, and a Deno
  // cache in an unusual place holding only the SQLite package (no network).
  await using project = await tempDir();
  const { imports } = JSON.parse(
    await Deno.readTextFile(new URL("deno.json", root)),
  );
  await Deno.writeTextFile(
    join(project.path, "deno.json"),
    JSON.stringify({
      imports: {
        "@leased/outbox": new URL("mod.ts", root).href,
        "@leased/outbox/sqlite-wasm": new URL("deno/sqlite_wasm.ts", root).href,
        ...imports,
      },
    }),
  );
  await Deno.mkdir(join(project.path, "data"));
  await Deno.writeTextFile(
    join(project.path, "app.ts"),
    `import { Outbox } from "@leased/outbox";
import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
await using outbox = await Outbox.open(await openSqliteWasm("./data/outbox.db"));
await outbox.enqueue({ to: "ada@example.com" });
const lease = await outbox.claim();
console.log(JSON.stringify({ acknowledged: await outbox.acknowledge(lease!) }));
`,
  );
  await using denoDir = await tempDir();
  const info = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json"],
    stdout: "piped",
  }).output();
  const { npmCache } = JSON.parse(new TextDecoder().decode(info.stdout));
  // The npm scopes the outbox's modules import (the WASM build, the
  // OpenTelemetry API, the schedules' cron parser), nothing else.
  const registry = join(denoDir.path, "npm", "registry.npmjs.org");
  await Deno.mkdir(registry, { recursive: true });
  const copy = await new Deno.Command("cp", {
    args: [
      "-R",
      join(npmCache, "registry.npmjs.org", "@sqlite.org"),
      join(npmCache, "registry.npmjs.org", "@opentelemetry"),
      join(npmCache, "registry.npmjs.org", "croner"),
      registry,
    ],
  }).output();
  assert.equal(copy.code, 0);

  const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
    args: [run!, "--no-prompt", ...flagsAndScript],
    cwd: project.path,
    env: {
      DENO_DIR: denoDir.path,
      HTTPS_PROXY: "http://127.0.0.1:9",
      NO_COLOR: "1",
    },
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(code, 0, new TextDecoder().decode(stderr));
  assert.deepEqual(JSON.parse(new TextDecoder().decode(stdout)), {
    acknowledged: true,
  });
});
