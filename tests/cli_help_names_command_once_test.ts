import assert from "node:assert/strict";
import { cli } from "./cli_run.ts";

Deno.test("outbox --help names the command of each option once, not 'ui: ui:'", async () => {
  const help = await cli("--help");
  assert.equal(help.code, 0);
  assert.doesNotMatch(help.stdout, /\b(\w+): \1:/);
  assert.match(help.stdout, /--port <n> +ui: the TCP port/);
  assert.match(help.stdout, /--per-second <n\|none> +limits: most claims/);
});
