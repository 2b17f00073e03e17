/**
 * An option given as null is refused, naming it, as a wrong value of any
 * other kind: it is not taken for the option's default (a config file's
 * null would otherwise pick the default silently, and for purge's states
 * the widest one).
 */
import assert from "node:assert/strict";
import { Inbox, Outbox } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { dashboard } from "../dashboard/mod.ts";

Deno.test("purge() and schedule() refuse a null states, timezone or missed, and change nothing", async () => {
  await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
  const { eventId } = await outbox.enqueue({ n: 1 });
  assert.equal(await outbox.acknowledge((await outbox.claim())!), true);
  await assert.rejects(
    outbox.purge({ olderThanMs: 0, states: null as never }),
    new TypeError(
      `Cannot purge as 'states' must be a non-empty array of "done" and "dead": current value is null`,
    ),
  );
  assert.equal((await outbox.explain(eventId))?.state, "done");
  await assert.rejects(
    outbox.schedule("hourly", "0 * * * *", {}, { timezone: null as never }),
    new TypeError(
      "Cannot schedule as 'timezone' must be an IANA time zone name: current value is null",
    ),
  );
  await assert.rejects(
    outbox.schedule("hourly", "0 * * * *", {}, { missed: null as never }),
    new RangeError(
      `Cannot schedule as 'missed' must be "latest" or "all": current value is null`,
    ),
  );
  assert.deepEqual(await outbox.schedules(), []);
});

Deno.test("Inbox.open refuses a null now", async () => {
  await assert.rejects(
    async () =>
      await Inbox.open(await openSqliteWasm(":memory:"), {
        now: null as never,
      }),
    new TypeError(
      "Cannot open inbox as 'now' must be a function: current value is null",
    ),
  );
});

Deno.test("dashboard() refuses a null actions or refreshMs", async () => {
  await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
  assert.throws(
    () => dashboard(outbox, { actions: null as never }),
    new TypeError(
      "Cannot create dashboard as 'actions' must be a boolean: current value is null",
    ),
  );
  assert.throws(
    () => dashboard(outbox, { refreshMs: null as never }),
    {
      message:
        "Cannot create dashboard as 'refreshMs' must be an integer from 0 to 2147483647: current value is null",
    },
  );
});
