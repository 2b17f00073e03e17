import assert from "node:assert/strict";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { openSqliteWasm } from "../sqlite_wasm_deno.ts";

const root = dirname(dirname(fileURLToPath(import.meta.url)));

Deno.test("the demo applies every event's effect once at its inbox recipient through a crash and a pause, and its summary adds up", async () => {
  const dir = await Deno.makeTempDir({ prefix: "demo-test-" });
  const path = join(dir, "outbox.db");
  const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      join(root, "demo.ts"),
      path,
      "--events",
      "60",
      "--poison",
      "3",
      "--lease-ms",
      "1000",
      "--json",
    ],
    cwd: root,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const output = new TextDecoder().decode(stdout);
  assert.equal(code, 0, output + new TextDecoder().decode(stderr));

  // The seed scenario's six results, in order.
  const seed = [...output.matchAll(/→ (\S+)$/gm)].map((match) => match[1]);
  assert.deepEqual(seed, ["41", "null", "41", "false", "true", "null"]);

  const summary = JSON.parse(output.trim().split("\n").at(-1)!);
  assert.equal(summary.ok, true);
  assert.equal(summary.events, 60);
  assert.equal(summary.orders, 60);
  assert.equal(summary.delivered, 57);
  assert.equal(summary.deadLetters, 3);
  assert.equal(summary.poisonDead, 3);
  assert.equal(summary.unexpectedDead, 0);
  assert.equal(summary.lost, 0);
  assert.equal(summary.acknowledgedTwice, 0);
  assert.equal(summary.integrity, "ok");
  assert.equal(summary.recipientIntegrity, "ok");
  // Every delivered event's effect was applied exactly once; the inbox
  // refused the rest, and the counts add up to the deliveries received.
  assert.equal(summary.appliedOnce, 57);
  assert.equal(summary.appliedTwice, 0);
  assert.equal(summary.effectsLost, 0);
  assert.equal(summary.accepted, 57);
  assert.equal(summary.inboxRecords, 57);
  assert.equal(
    summary.deliveries,
    summary.accepted + summary.duplicates + summary.stale,
  );
  // Every delivery is a first delivery or a redelivery under a newer fence.
  const fences = Object.entries(
    summary.redeliveryFences as Record<string, number>,
  );
  assert.ok(fences.every(([fence]) => Number(fence) >= 2));
  assert.equal(
    summary.redeliveries,
    fences.reduce((sum, [, n]) => sum + n, 0),
  );
  assert.equal(summary.deliveries, summary.delivered + summary.redeliveries);
  // w1 was killed before it could report; the other two stopped cleanly.
  assert.equal(summary.workers.w1, null);
  const survivors = [summary.workers.w2, summary.workers.w3];
  assert.ok(
    summary.staleAcknowledgements >=
      survivors.reduce((sum, c) => sum + c.staleAcknowledgements, 0),
  );

  // The table shows the same numbers.
  assert.match(
    output,
    /^ {2}events \(orders committed with their event\) +60$/m,
  );
  assert.match(output, /^ {2}lost \/ acknowledged twice +0 \/ 0$/m);
  assert.match(output, /^ {2}integrity_check \(outbox, recipient\) +ok, ok$/m);
  assert.match(
    output,
    new RegExp(
      `^ {2}deliveries received \\(inbox, deduped by identity\\) +${summary.deliveries}: 57 accepted, ${summary.duplicates} duplicate, ${summary.stale} stale \\(\\+\\d+ poison refusals\\)$`,
      "m",
    ),
  );
  assert.match(
    output,
    /^ {2}effects applied once \/ twice \/ lost +57 \/ 0 \/ 0$/m,
  );
  assert.match(
    output,
    new RegExp(
      `^ {2}stale acknowledgements rejected +${summary.staleAcknowledgements}$`,
      "m",
    ),
  );
  assert.match(output, /^ {2}w1 .* SIGKILL at [\d.]+ s$/m);
  assert.match(
    output,
    /^ {2}w2 .* SIGSTOP at [\d.]+ s for [\d.]+ s, then SIGCONT/m,
  );

  // And the file itself, reopened, agrees.
  await using db = await openSqliteWasm(path);
  assert.deepEqual(
    await db.query(
      "SELECT state, count(*) AS n FROM outbox_events GROUP BY state ORDER BY state",
    ),
    [{ state: "dead", n: 3 }, { state: "done", n: 57 }],
  );
  // The recipient's own database: one shipment per delivered event, each
  // applied once, under the identity of its event.
  await using recipient = await openSqliteWasm(`${path}.recipient.db`);
  assert.deepEqual(
    await recipient.query(
      "SELECT applied, count(*) AS n FROM shipments GROUP BY applied",
    ),
    [{ applied: 1, n: 57 }],
  );
  const identities = await db.query(
    "SELECT identity FROM outbox_events WHERE state = 'done' ORDER BY identity",
  );
  assert.deepEqual(
    await recipient.query("SELECT identity FROM shipments ORDER BY identity"),
    identities,
  );
  await Deno.remove(dir, { recursive: true });
});
