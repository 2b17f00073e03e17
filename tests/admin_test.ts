/** The admin calls (list, cancel, redrive, purge, queues) and the open and claim defects of issue 15. */
import assert from "node:assert/strict";
import { MAX_PAYLOAD_BYTES, Outbox } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { openNodeSqlite } from "../drivers/node_sqlite.ts";
import { driverTest, type Harness, snapshot } from "./helpers.ts";
import { DRIVERS } from "./drivers.ts";

for (const driver of DRIVERS) {
  const test = (name: string, fn: (t: Harness) => Promise<void>) =>
    driverTest(driver, name, fn);

  test("list() pages through one state by afterId, filtered by queue, with each event's attempt, times, keys and last error", async ({ clock, open }) => {
    const [a] = await open();
    clock.set(10);
    for (const n of [1, 2, 3]) {
      await a!.enqueue({ n }, { dedupKey: `d${n}`, orderingKey: `k${n}` });
    }
    await a!.enqueue({ n: 4 }, { queue: "other" });
    const lease = await a!.claim({ leaseMs: 500 });
    await a!.release(lease!, { error: "503", delayMs: 90 });
    const first = await a!.list({ state: "pending", limit: 2 });
    assert.match(first[0]?.identity ?? "", /^[0-9a-f-]{36}$/);
    assert.deepEqual(first.map(({ identity: _, ...rest }) => rest), [
      {
        id: 1,
        queue: "default",
        state: "pending",
        attempt: 1,
        maxAttempts: 5,
        dueAt: 100,
        leaseUntil: null,
        lastError: "503",
        createdAt: 10,
        updatedAt: 10,
        payload: { n: 1 },
        orderingKey: "k1",
        dedupKey: "d1",
      },
      {
        id: 2,
        queue: "default",
        state: "pending",
        attempt: 0,
        maxAttempts: 5,
        dueAt: 10,
        leaseUntil: null,
        lastError: null,
        createdAt: 10,
        updatedAt: 10,
        payload: { n: 2 },
        orderingKey: "k2",
        dedupKey: "d2",
      },
    ]);
    const next = await a!.list({ state: "pending", afterId: 2 });
    assert.deepEqual(next.map((e) => e.id), [3, 4]);
    const other = await a!.list({ state: "pending", queue: "other" });
    assert.deepEqual(other.map((e) => e.payload), [{ n: 4 }]);
    const leased = await a!.claim({ leaseMs: 700 });
    const [held] = await a!.list({ state: "leased" });
    assert.equal(held?.id, leased?.eventId);
    assert.equal(held?.leaseUntil, 710);
    assert.deepEqual(await a!.list({ state: "done" }), []);
  });

  test("cancel() makes a pending event a dead letter marked cancelled, refuses a leased or done one, and redrive() brings it back", async ({ clock, open }) => {
    const [a] = await open();
    const { eventId } = await a!.enqueue("cancel me");
    const { eventId: leasedId } = await a!.enqueue("leased");
    clock.set(5);
    assert.equal(await a!.cancel(eventId), true);
    assert.equal(await a!.cancel(eventId), false);
    const lease = await a!.claim();
    assert.equal(lease?.eventId, leasedId);
    assert.equal(await a!.cancel(leasedId), false);
    assert.equal(await a!.acknowledge(lease!), true);
    assert.equal(await a!.cancel(leasedId), false);
    assert.equal(await a!.cancel(99), false);
    const [letter] = await a!.deadLetters();
    assert.equal(letter?.eventId, eventId);
    assert.equal(letter?.lastError, "cancelled");
    assert.equal(letter?.deadAt, 5);
    const history = (await a!.explain(eventId))!.history;
    assert.deepEqual(
      history.map((e) => [e.kind, e.detail]),
      [["dead", "cancelled"]],
    );
    assert.equal(await a!.redrive({ ids: [eventId] }), 1);
    assert.equal((await a!.claim())?.eventId, eventId);
  });

  test("cancel() of many ids cancels the pending ones among them in one transaction and returns their ids ascending, with a ledger entry each", async ({ clock, open }) => {
    const [a] = await open();
    const ids: number[] = [];
    for (const n of [1, 2, 3, 4]) ids.push((await a!.enqueue({ n })).eventId);
    const lease = await a!.claim();
    assert.equal(lease?.eventId, ids[0]);
    clock.set(7);
    assert.deepEqual(
      await a!.cancel([ids[3]!, ids[0]!, ids[2]!, ids[3]!, 99]),
      [ids[2], ids[3]],
    );
    assert.deepEqual(await a!.cancel([ids[2]!]), []);
    assert.deepEqual(await a!.cancel([]), []);
    assert.deepEqual(
      (await a!.list({ state: "dead" })).map((e) => [e.id, e.lastError]),
      [[ids[2], "cancelled"], [ids[3], "cancelled"]],
    );
    for (const id of [ids[2]!, ids[3]!]) {
      assert.deepEqual(
        (await a!.explain(id))!.history.map((e) => [e.kind, e.at, e.detail]),
        [["dead", 7, "cancelled"]],
      );
    }
    assert.equal((await a!.explain(ids[1]!))?.state, "pending");
    assert.equal(await a!.acknowledge(lease!), true);
  });

  test("redrive() brings back dead letters by queue or by id with their attempts reset, and counts them", async ({ clock, open }) => {
    const [a] = await open({ maxAttempts: 1 });
    for (const queue of ["mail", "mail", "sms"]) {
      await a!.enqueue(queue, { queue });
      const lease = await a!.claim({ queue });
      await a!.release(lease!, { error: "boom" });
    }
    assert.equal((await a!.queues()).reduce((n, q) => n + q.dead, 0), 3);
    clock.set(50);
    assert.equal(await a!.redrive({ queue: "sms" }), 1);
    assert.equal(await a!.redrive({ queue: "sms" }), 0);
    assert.equal(await a!.redrive({ queue: "mail", ids: [2, 3] }), 1);
    const [pending] = await a!.list({ state: "pending", queue: "mail" });
    assert.equal(pending?.id, 2);
    assert.equal(pending?.attempt, 0);
    assert.equal(pending?.dueAt, 50);
    assert.deepEqual(
      (await a!.explain(2))!.history.map((e) => e.kind).at(-1),
      "retried",
    );
    assert.equal(await a!.redrive(), 1);
    assert.deepEqual((await a!.queues()).map((q) => q.dead), [0, 0]);
  });

  test("purge() deletes done events and dead letters older than a duration, by state, with their ledger", async ({ clock, open, raw }) => {
    const [a] = await open({ maxAttempts: 1 });
    await a!.enqueue("done early");
    await a!.acknowledge((await a!.claim())!);
    clock.set(1_000);
    await a!.enqueue("dead later");
    await a!.release((await a!.claim())!, { error: "boom" });
    clock.set(2_000);
    await a!.enqueue("done late");
    await a!.acknowledge((await a!.claim())!);
    await a!.enqueue("pending");
    clock.set(10_000);
    // Seven days ago is before any of them: a duration, not an epoch time.
    assert.equal(await a!.purge({ olderThanMs: 7 * 86_400_000 }), 0);
    assert.equal(await a!.purge({ olderThanMs: 9_500, states: ["done"] }), 1);
    assert.equal(await a!.purge({ olderThanMs: 8_500, states: ["done"] }), 0);
    assert.equal(await a!.purge({ olderThanMs: 8_500 }), 1);
    assert.equal(await a!.purge({ olderThanMs: 0 }), 1);
    assert.deepEqual(
      (await a!.queues()).map(({ pending, done, dead }) => [
        pending,
        done,
        dead,
      ]),
      [[1, 0, 0]],
    );
    const ledger = await raw.query(
      "SELECT DISTINCT event_id FROM outbox_attempts ORDER BY event_id",
    );
    assert.deepEqual(ledger.map((r) => Number(r["event_id"])), []);
  });

  test("queues() counts every queue's events per state with its oldest pending event's time", async ({ clock, open }) => {
    const [a] = await open();
    assert.deepEqual(await a!.queues(), []);
    clock.set(7);
    await a!.enqueue(1, { queue: "sms" });
    clock.set(9);
    await a!.enqueue(2, { queue: "sms" });
    await a!.enqueue(3, { queue: "mail" });
    await a!.claim({ queue: "mail" });
    assert.deepEqual(await a!.queues(), [
      {
        queue: "mail",
        pending: 0,
        leased: 1,
        done: 0,
        dead: 0,
        oldestPendingAt: null,
      },
      {
        queue: "sms",
        pending: 2,
        leased: 0,
        done: 0,
        dead: 0,
        oldestPendingAt: 7,
      },
    ]);
  });

  test("defect 5: admin calls with a missing or bad id or option throw TypeError or RangeError naming it before any SQL, and nothing changes", async ({ open, raw, sent }) => {
    const [a] = await open({ maxAttempts: 1 });
    await a!.enqueue("x");
    await a!.release((await a!.claim())!, { error: "boom" });
    const before = await snapshot(raw);
    const statements = sent();
    const rejects = async (
      call: () => Promise<unknown>,
      name: string,
      field: string,
    ) => {
      await assert.rejects(call, (error: Error) => {
        assert.equal(error.name, name);
        assert.match(
          error.message,
          new RegExp(`'${field.replace("[", "\\[")}'`),
        );
        return true;
      });
    };
    await rejects(() => a!.explain(undefined as never), "TypeError", "event");
    await rejects(() => a!.cancel(undefined as never), "TypeError", "eventId");
    await rejects(() => a!.cancel(0), "RangeError", "eventId");
    await rejects(() => a!.cancel("1" as never), "TypeError", "eventId");
    await rejects(() => a!.cancel([1, 0]), "RangeError", "eventIds[1]");
    await rejects(
      () => a!.cancel(Array(10_001).fill(1)),
      "TypeError",
      "eventIds",
    );
    await rejects(() => a!.redrive({ ids: "1" as never }), "TypeError", "ids");
    await rejects(() => a!.redrive({ ids: [1, 1.5] }), "RangeError", "ids[1]");
    await rejects(
      () => a!.redrive({ ids: [, 1] as never }),
      "TypeError",
      "ids[0]",
    );
    await rejects(() => a!.redrive({ queue: "" }), "TypeError", "queue");
    await rejects(() => a!.redrive(null as never), "TypeError", "options");
    await rejects(() => a!.list({} as never), "TypeError", "state");
    await rejects(
      () => a!.list({ state: "gone" as never }),
      "TypeError",
      "state",
    );
    await rejects(
      () => a!.list({ state: "dead", limit: 0 }),
      "RangeError",
      "limit",
    );
    await rejects(
      () => a!.list({ state: "dead", limit: 10_001 }),
      "RangeError",
      "limit",
    );
    await rejects(
      () => a!.list({ state: "dead", afterId: -1 }),
      "RangeError",
      "afterId",
    );
    await rejects(
      () => a!.list({ state: "dead", queue: 1 as never }),
      "TypeError",
      "queue",
    );
    await rejects(() => a!.purge({} as never), "TypeError", "olderThanMs");
    await rejects(
      () => a!.purge({ doneBeforeMs: 5 } as never),
      "TypeError",
      "olderThanMs",
    );
    await rejects(
      () => a!.purge({ olderThanMs: -1 }),
      "RangeError",
      "olderThanMs",
    );
    await rejects(
      () => a!.purge({ olderThanMs: 0, states: [] }),
      "TypeError",
      "states",
    );
    await rejects(
      () => a!.purge({ olderThanMs: 0, states: ["pending" as never] }),
      "TypeError",
      "states",
    );
    await rejects(
      () => a!.maintain({ vacuum: 1 as never }),
      "TypeError",
      "vacuum",
    );
    assert.equal(sent(), statements);
    assert.deepEqual(await snapshot(raw), before);
  });

  test("defect 7: an event whose TEXT payload is not JSON becomes a dead letter with the reason, and the claim goes on to the next event", async ({ open, raw }) => {
    const [a] = await open();
    await a!.enqueue({ n: 1 });
    await a!.enqueue({ n: 2 });
    await raw.run("UPDATE outbox_events SET payload = 'not json' WHERE id = 1");
    const [lease] = await a!.claim({ max: 1 });
    assert.equal(lease?.eventId, 2);
    const [letter] = await a!.list({ state: "dead" });
    assert.equal(letter?.id, 1);
    assert.equal(letter?.payload, "not json");
    assert.match(
      letter?.lastError ?? "",
      /^unclaimable: its payload is text but not JSON \(/,
    );
    assert.deepEqual(
      (await a!.explain(1))!.history.map((e) => e.kind),
      ["dead"],
    );
    // The dead letters list it too, with the stored text, rather than fail.
    assert.deepEqual(
      (await a!.deadLetters()).map((d) => [d.eventId, d.payload]),
      [[1, "not json"]],
    );
  });

  test("defect 6: an event whose payload exceeds the claiming outbox's maxPayloadBytes becomes a dead letter, never blocking the queue", async ({ open }) => {
    const [big] = await open({ maxPayloadBytes: 4_096 });
    await big!.enqueue("x".repeat(3_000));
    await big!.enqueue("small");
    const [small] = await open({ maxPayloadBytes: 1_024 });
    const lease = await small!.claim();
    assert.equal(lease?.payload, "small");
    const [letter] = await small!.list({ state: "dead" });
    assert.equal(letter?.id, 1);
    assert.equal(
      letter?.lastError,
      "unclaimable: its payload of 3002 bytes exceeds this outbox's maxPayloadBytes of 1024",
    );
  });

  test("defects 6 and 7 in a batch: unclaimable events among a batch claim's candidates become dead letters, and the batch takes each other event once", async ({ open, raw }) => {
    const [big] = await open({ maxPayloadBytes: 4_096 });
    for (const payload of ["a", "x".repeat(3_000), "b", "c", "d"]) {
      await big!.enqueue(payload);
    }
    await raw.run("UPDATE outbox_events SET payload = 'not json' WHERE id = 3");
    const [small] = await open({ maxPayloadBytes: 1_024 });
    // The first read finds a, the oversized event, the non-JSON one: the
    // batch must not read a again beside c and d.
    const leases = await small!.claim({ max: 3 });
    assert.deepEqual(leases.map((l) => [l.eventId, l.payload]), [
      [1, "a"],
      [4, "c"],
      [5, "d"],
    ]);
    assert.deepEqual(
      (await small!.list({ state: "dead" })).map((letter) => letter.id),
      [2, 3],
    );
    assert.deepEqual(await small!.acknowledge(leases), [true, true, true]);
  });
}

Deno.test("defect 6: maxPayloadBytes is capped at what a claim was measured to read back (256 MiB)", async () => {
  assert.equal(MAX_PAYLOAD_BYTES, 256 * 1024 * 1024);
  await assert.rejects(
    async () =>
      await Outbox.open(await openSqliteWasm(":memory:"), {
        maxPayloadBytes: 512 * 1024 * 1024,
      }),
    {
      name: "RangeError",
      message:
        "Cannot open outbox as 'maxPayloadBytes' must be a positive integer at most 268435456: current value is 536870912",
    },
  );
});

Deno.test("Outbox.open refuses a null queue or now, as every other option, rather than taking it for the default", async () => {
  for (
    const [option, message] of [
      [
        "queue",
        "'queue' must be a string of 1 to 1024 characters, no NUL or lone surrogate: current value is null",
      ],
      ["now", "'now' must be a function: current value is null"],
      [
        "leaseMs",
        "'leaseMs' must be a positive integer: current value is null",
      ],
    ] as const
  ) {
    await assert.rejects(
      async () =>
        await Outbox.open(await openSqliteWasm(":memory:"), {
          [option]: null,
        }),
      new TypeError(`Cannot open outbox as ${message}`),
      option,
    );
  }
});

function openFds(): number {
  return [...Deno.readDirSync("/proc/self/fd")].length;
}

for (
  const [name, connect] of [
    ["wasm file", (path: string) => openSqliteWasm(path)],
    ["node:sqlite file", (path: string) => openNodeSqlite(path)],
  ] as const
) {
  Deno.test(`defect 8: ${name}: 50 failed opens close the connections they own and leak no file descriptors`, async () => {
    const dir = await Deno.makeTempDir();
    try {
      const path = `${dir}/foreign.db`;
      const setup = await connect(path);
      // A schema newer than this release's: every open is refused.
      await setup.exec(
        "CREATE TABLE outbox_schema (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL) STRICT; INSERT INTO outbox_schema VALUES (99, 0)",
      );
      await setup.close();
      // One failure first, so lazily opened runtime files are counted before.
      await assert.rejects(async () => await Outbox.open(await connect(path)));
      const before = openFds();
      for (let i = 0; i < 50; i++) {
        await assert.rejects(
          async () => await Outbox.open(await connect(path)),
          /newer than this release's/,
        );
      }
      assert.equal(openFds(), before);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
}

Deno.test("defect 10: Outbox.open refuses a read-only connection at once, as the README says, and closes it", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const path = `${dir}/outbox.db`;
    await (await Outbox.open(await openSqliteWasm(path))).close();
    const readOnly = await openSqliteWasm(`file:${encodeURI(path)}?mode=ro`);
    await assert.rejects(() => Outbox.open(readOnly), {
      name: "Error",
      message:
        "Cannot open outbox as the connection is read-only: its calls take the write lock (claims, acknowledgements and the admin calls first make lapsed last-attempt leases dead letters)",
    });
    await assert.rejects(() => readOnly.query("SELECT 1"));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
