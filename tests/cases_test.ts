/**
 * The acceptance cases of ../shared/cases/README.md that concern lease
 * semantics and bad input, on every driver.
 */
import assert from "node:assert/strict";
import { driverTest, eventRow, type Harness, snapshot } from "./helpers.ts";
import { DRIVERS } from "./drivers.ts";

for (const driver of DRIVERS) {
  const test = (name: string, fn: (t: Harness) => Promise<void>) =>
    driverTest(driver, name, fn);

  test("C01: a stale acknowledge after takeover returns false and changes nothing", async ({ clock, open, raw }) => {
    const [a, b] = await open();
    const { eventId } = await a!.enqueue({ n: 1 });
    const leaseA = await a!.claim({ leaseMs: 10 });
    clock.set(10);
    const leaseB = await b!.claim({ leaseMs: 10 });
    assert.equal(leaseB?.eventId, eventId);
    assert.equal(leaseB?.attempt, 2);
    assert.equal(leaseB?.fence, 2);
    assert.notEqual(leaseB?.token, leaseA?.token);
    clock.set(12);
    const before = await eventRow(raw, eventId);
    assert.equal(await a!.acknowledge(leaseA!), false);
    assert.deepEqual(await eventRow(raw, eventId), before);
    assert.equal(before?.["lease_until"], 20);
    assert.equal(before?.["token"], leaseB?.token);
    clock.set(13);
    assert.equal(await b!.acknowledge(leaseB!), true);
    assert.equal((await eventRow(raw, eventId))?.["state"], "done");
    const history = (await a!.explain(eventId))!.history.map((e) =>
      `${e.kind}:${e.fence}`
    );
    assert.deepEqual(history, [
      "claimed:1",
      "expired:1",
      "claimed:2",
      "stale_acknowledge:1",
      "acknowledged:2",
    ]);
  });

  test("C01: the same worker claiming twice gets two tokens and its first is stale", async ({ clock, open }) => {
    const [a] = await open();
    await a!.enqueue("x");
    const first = await a!.claim({ leaseMs: 10 });
    clock.set(10);
    const second = await a!.claim({ leaseMs: 10 });
    assert.notEqual(first!.token, second!.token);
    assert.match(second!.token, /^[0-9a-f]{32}$/);
    assert.equal(await a!.acknowledge(first!), false);
    assert.equal(await a!.acknowledge(second!), true);
  });

  test("C02: a stale release or renew does not touch the new owner's row", async ({ clock, open, raw }) => {
    const [a, b] = await open({ maxAttempts: 2 });
    const { eventId } = await a!.enqueue("x");
    const leaseA = await a!.claim({ leaseMs: 10 });
    clock.set(10);
    const leaseB = await b!.claim({ leaseMs: 10 });
    clock.set(12);
    const before = await eventRow(raw, eventId);
    assert.equal(
      await a!.release(leaseA!, { error: "boom", delayMs: 5 }),
      false,
    );
    assert.equal(await a!.renew(leaseA!, 10), false);
    const after = await eventRow(raw, eventId);
    assert.deepEqual(after, before);
    assert.equal(after?.["attempt"], 2);
    assert.equal(after?.["last_error"], "lease expired");
    assert.equal(after?.["lease_until"], 20);
    assert.equal(after?.["token"], leaseB!.token);
    assert.deepEqual(await a!.deadLetters(), []);
  });

  test("C03: renew of a lapsed lease returns false and the event stays claimable", async ({ clock, open, raw }) => {
    const [a, b] = await open();
    const { eventId } = await a!.enqueue("x");
    const leaseA = await a!.claim({ leaseMs: 10 });
    clock.set(15);
    assert.equal(await a!.renew(leaseA!, 10), false);
    assert.equal((await eventRow(raw, eventId))?.["lease_until"], 10);
    assert.equal((await b!.claim({ leaseMs: 10 }))?.eventId, eventId);
  });

  test("C03: renew after another worker's takeover returns false and keeps its deadline", async ({ clock, open, raw }) => {
    const [a, b] = await open();
    const { eventId } = await a!.enqueue("x");
    const leaseA = await a!.claim({ leaseMs: 10 });
    clock.set(10);
    await b!.claim({ leaseMs: 10 });
    clock.set(11);
    assert.equal(await a!.renew(leaseA!, 100), false);
    assert.equal((await eventRow(raw, eventId))?.["lease_until"], 20);
  });

  test("C04: renew really extends the lease and the row shows the new deadline", async ({ clock, open, raw }) => {
    const [a, b] = await open();
    const { eventId } = await a!.enqueue("x");
    const lease = await a!.claim({ leaseMs: 30_000 });
    clock.set(15_000);
    assert.equal(await a!.renew(lease!, 30_000), 45_000);
    assert.equal((await eventRow(raw, eventId))?.["lease_until"], 45_000);
    clock.set(31_000);
    assert.equal(await b!.claim(), null);
  });

  test("C04: renew with an empty or missing token throws TypeError before any SQL", async ({ open, raw, sent }) => {
    const [a] = await open();
    await a!.enqueue("x");
    const lease = await a!.claim();
    const before = await snapshot(raw);
    const statements = sent();
    for (const token of ["", undefined, null, 7, "has space"]) {
      await assert.rejects(
        () => a!.renew({ ...lease!, token } as never, 10),
        (e: unknown) =>
          e instanceof TypeError && e.message.includes("'lease.token'"),
      );
    }
    assert.equal(sent(), statements);
    assert.deepEqual(await snapshot(raw), before);
  });

  test("C06: a clock stepping backwards never shortens or resurrects a lease", async ({ clock, open, raw }) => {
    const [a, b] = await open();
    clock.set(1000);
    const { eventId } = await a!.enqueue("x");
    const lease = await a!.claim({ leaseMs: 30 });
    assert.equal(lease?.leaseUntil, 1030);
    clock.set(400);
    const renewed = await a!.renew(lease!, 30);
    assert.equal(renewed, 1030);
    assert.equal((await eventRow(raw, eventId))?.["lease_until"], 1030);
    clock.set(401);
    assert.equal(await b!.claim(), null);
    clock.set(1030);
    const taken = await b!.claim();
    assert.equal(taken?.eventId, eventId);
    assert.equal(taken?.attempt, 2);
  });

  test("C11: crash-only failures use up attempts and end in the dead letters", async ({ clock, open, raw }) => {
    const [a, b] = await open({ maxAttempts: 2 });
    const { eventId } = await a!.enqueue({ job: 1 });
    assert.equal((await a!.claim({ leaseMs: 10 }))?.attempt, 1);
    clock.set(10);
    assert.equal((await b!.claim({ leaseMs: 10 }))?.attempt, 2);
    clock.set(20);
    assert.equal(await a!.claim({ leaseMs: 10 }), null);
    const dead = await b!.deadLetters();
    assert.equal(dead.length, 1);
    assert.equal(dead[0]?.eventId, eventId);
    assert.equal(dead[0]?.attempts, 2);
    assert.equal(dead[0]?.lastError, "lease expired");
    const leftLeased = await raw.query(
      "SELECT id FROM outbox_events WHERE state = 'leased' AND lease_until <= 20",
    );
    assert.deepEqual(leftLeased, []);
    assert.equal(await a!.redrive({ ids: [eventId] }), 1);
    const again = await a!.claim({ leaseMs: 10 });
    assert.equal(again?.eventId, eventId);
    assert.equal(again?.attempt, 1);
    assert.equal(again?.fence, 3);
  });

  test("C11: an exhausted lapsed lease is a dead letter even before any claim sweeps it", async ({ clock, open }) => {
    const [a, b] = await open({ maxAttempts: 1 });
    const { eventId } = await a!.enqueue("x");
    const lease = await a!.claim({ leaseMs: 10 });
    clock.set(10);
    assert.equal(await a!.acknowledge(lease!), false);
    assert.equal((await b!.stats()).dead, 1);
    assert.equal((await b!.explain(eventId))?.state, "dead");
  });

  test("C13: NaN, infinite, negative, zero, fractional, string and null arguments throw before any SQL", async ({ open, raw, sent }) => {
    const [a] = await open();
    await a!.enqueue("keep");
    const lease = await a!.claim();
    const before = await snapshot(raw);
    const statements = sent();
    const rejects = async (fn: () => Promise<unknown>, field: string) => {
      await assert.rejects(
        fn,
        (e: unknown) =>
          (e instanceof TypeError || e instanceof RangeError) &&
          e.message.includes(`'${field}'`),
      );
    };
    for (
      const leaseMs of [
        NaN,
        Infinity,
        -Infinity,
        -1,
        0,
        1.5,
        "10",
        null,
        31_536_000_001,
      ]
    ) {
      await rejects(() => a!.claim({ leaseMs } as never), "leaseMs");
      await rejects(() => a!.renew(lease!, leaseMs as never), "leaseMs");
    }
    for (const delayMs of [NaN, Infinity, -1, 2.5, "1"]) {
      await rejects(() => a!.enqueue("x", { delayMs } as never), "delayMs");
      await rejects(() => a!.release(lease!, { delayMs } as never), "delayMs");
    }
    for (const maxAttempts of [0, -1, 2.5, NaN, Infinity, "2"]) {
      await rejects(
        () => a!.enqueue("x", { maxAttempts } as never),
        "maxAttempts",
      );
    }
    for (const max of [0, -1, 1.5, NaN, 10_001]) {
      await rejects(() => a!.claim({ max } as never), "max");
    }
    await rejects(
      () => a!.acknowledge({ ...lease!, eventId: NaN }),
      "lease.eventId",
    );
    await rejects(
      () => a!.acknowledge({ ...lease!, fence: -1 }),
      "lease.fence",
    );
    await rejects(() => a!.acknowledge(null as never), "lease");
    await rejects(() => a!.claim({ token: "not a token" }), "token");
    await rejects(() => a!.release(lease!, { error: 42 } as never), "error");
    await rejects(() => a!.enqueue(undefined as never), "payload");
    await rejects(() => a!.enqueue("x", { queue: "" }), "queue");
    await rejects(() => a!.enqueue("x", { dedupKey: "a\0b" }), "dedupKey");
    await rejects(() => a!.enqueue("x", { dedupKey: "\uD800" }), "dedupKey");
    await rejects(() => a!.enqueue("x", { queue: "\uDC00" }), "queue");
    await rejects(
      () => a!.acknowledge([lease!, , lease!] as never),
      "leases[1]",
    );
    await rejects(() => a!.release(lease!, { error: "cut\0here" }), "error");
    await rejects(() => a!.redrive({ ids: [0] }), "ids[0]");
    await rejects(() => a!.purge({ olderThanMs: -5 }), "olderThanMs");
    assert.equal(sent(), statements);
    assert.deepEqual(await snapshot(raw), before);
    // BEGIN fails inside an open transaction, so this proves none was left open.
    await raw.exec("BEGIN; ROLLBACK");
    assert.deepEqual(await a!.deadLetters(), []);
    // The valid neighbours succeed.
    assert.equal(
      (await a!.enqueue("y", { delayMs: 0, maxAttempts: 1 })).deduplicated,
      false,
    );
    assert.equal((await a!.claim({ leaseMs: 1 }))?.leaseUntil, 1);
  });

  test("C13: options are validated when the outbox opens", async ({ open }) => {
    await assert.rejects(() => open({ leaseMs: NaN }), RangeError);
    await assert.rejects(() => open({ busyTimeoutMs: -1 }), RangeError);
    await assert.rejects(() => open({ maxAttempts: 0 }), RangeError);
    await assert.rejects(() => open({ now: 5 as never }), TypeError);
  });

  test("C14: payload size limits hold at exactly the limit and one byte over", async ({ open, raw, sent }) => {
    const [a] = await open({ maxPayloadBytes: 1024 * 1024 });
    const exact = crypto.getRandomValues(new Uint8Array(65536));
    const payload = new Uint8Array(1024 * 1024);
    for (let i = 0; i < 16; i++) payload.set(exact, i * 65536);
    const before = await snapshot(raw);
    const statements = sent();
    await assert.rejects(
      () => a!.enqueue(new Uint8Array(1024 * 1024 + 1)),
      (e: unknown) =>
        e instanceof RangeError && e.message.includes("'payload'"),
    );
    await assert.rejects(() => a!.enqueue("é".repeat(600_000)), RangeError);
    // No BEGIN either, so no transaction was left open.
    assert.equal(sent(), statements);
    assert.deepEqual(await snapshot(raw), before);
    await a!.enqueue(payload);
    const lease = await a!.claim();
    const digest = async (bytes: Uint8Array) =>
      new Uint8Array(
        await crypto.subtle.digest("SHA-256", bytes as Uint8Array<ArrayBuffer>),
      );
    assert.deepEqual(
      await digest(lease!.payload as Uint8Array),
      await digest(payload),
    );
  });

  test("C14: a 600 MB buffer is refused without being copied and the process lives on", async ({ open, sent }) => {
    const [a] = await open({ maxPayloadBytes: 1024 * 1024 });
    const huge = new Uint8Array(600 * 1024 * 1024);
    const statements = sent();
    await assert.rejects(() => a!.enqueue(huge), RangeError);
    // Nothing reached the driver, which alone copies values into SQLite.
    assert.equal(sent(), statements);
    assert.equal((await a!.enqueue("after")).deduplicated, false);
  });
}
