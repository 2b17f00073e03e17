/**
 * acknowledgeAndClaim: the acknowledgements and the next batch's claim in
 * one transaction, on every driver; both halves or neither, also when the
 * process is killed mid-call (SIGKILL on a real file).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { UnsafeIntegerError } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { driverTest, eventRow, type Harness } from "./helpers.ts";
import { DRIVERS } from "./drivers.ts";
import { Child } from "./fixtures/vfs_child.ts";

// `deno task test:stress` runs 25.
const TRIALS = Number(Deno.env.get("FOLD_CRASH_TRIALS") ?? 3);

for (const driver of DRIVERS) {
  const test = (name: string, fn: (t: Harness) => Promise<void>) =>
    driverTest(driver, name, fn);

  test("acknowledgeAndClaim acknowledges the leases and claims the next batch in one call", async ({ open }) => {
    const [a] = await open();
    await a!.enqueueBatch([0, 1, 2, 3, 4].map((payload) => ({ payload })));
    const first = await a!.claim({ max: 2 });
    const next = await a!.acknowledgeAndClaim(first, { max: 2 });
    assert.deepEqual(next.acknowledged, [true, true]);
    assert.deepEqual(next.leases.map((l) => [l.payload, l.fence]), [
      [2, 1],
      [3, 1],
    ]);
    assert.equal(new Set(next.leases.map((l) => l.token)).size, 2);
    const stats = await a!.stats();
    assert.deepEqual([stats.pending, stats.leased, stats.done], [1, 2, 2]);
    assert.deepEqual(
      (await a!.explain(first[0]!.eventId))?.history.map((e) => e.kind),
      ["claimed", "acknowledged"],
    );
    // No leases to acknowledge is a plain batch claim; nothing left to
    // claim is a plain batch acknowledge.
    const last = await a!.acknowledgeAndClaim([], { max: 5 });
    assert.deepEqual(last.acknowledged, []);
    assert.deepEqual(last.leases.map((l) => l.payload), [4]);
    const done = await a!.acknowledgeAndClaim(
      [...next.leases, ...last.leases],
      { max: 5 },
    );
    assert.deepEqual(done, { acknowledged: [true, true, true], leases: [] });
    assert.equal((await a!.stats()).done, 5);
  });

  test("acknowledgeAndClaim answers a stale or repeated lease false and still commits the rest", async ({ clock, open }) => {
    const [a, b] = await open();
    await a!.enqueueBatch([0, 1].map((payload) => ({ payload })));
    const [stale] = await a!.claim({ max: 1, leaseMs: 10 });
    const [live] = await a!.claim({ max: 1, leaseMs: 1_000 });
    clock.set(10);
    const [current] = await b!.claim({ max: 1 });
    assert.equal(current?.eventId, stale?.eventId);
    await a!.enqueue(2);
    const next = await a!.acknowledgeAndClaim([stale!, live!, live!], {
      max: 5,
    });
    assert.deepEqual(next.acknowledged, [false, true, false]);
    assert.deepEqual(next.leases.map((l) => l.payload), [2]);
    assert.deepEqual(
      (await a!.explain(stale!.eventId))?.history.map((e) => e.kind),
      ["claimed", "expired", "claimed", "stale_acknowledge"],
    );
    assert.equal(await b!.acknowledge(current!), true);
  });

  test("acknowledgeAndClaim claims the next event of an ordering key whose event it acknowledged", async ({ open }) => {
    const [a] = await open();
    await a!.enqueue("k1", { orderingKey: "k" });
    await a!.enqueue("k2", { orderingKey: "k" });
    const first = await a!.claim({ max: 5 });
    assert.deepEqual(first.map((l) => l.payload), ["k1"]);
    const next = await a!.acknowledgeAndClaim(first, { max: 5 });
    assert.deepEqual(next.leases.map((l) => l.payload), ["k2"]);
  });

  test("acknowledgeAndClaim makes an unclaimable event among the next candidates a dead letter and commits the acknowledgements", async ({ open }) => {
    const [big] = await open();
    await big!.enqueueBatch(
      ["a", "b", "c", "x".repeat(200), "d"].map((payload) => ({ payload })),
    );
    const [small] = await open({ maxPayloadBytes: 64 });
    const held = await small!.claim({ max: 2 });
    const next = await small!.acknowledgeAndClaim(held, { max: 3 });
    assert.deepEqual(next.acknowledged, [true, true]);
    assert.deepEqual(next.leases.map((l) => l.payload), ["c", "d"]);
    const stats = await small!.stats();
    assert.deepEqual([stats.done, stats.leased, stats.dead], [2, 2, 1]);
  });

  test("acknowledgeAndClaim with bad input throws naming the field before any SQL, and nothing changes", async ({ open, sent }) => {
    const [a] = await open();
    await a!.enqueueBatch([0, 1].map((payload) => ({ payload })));
    const [lease] = await a!.claim({ max: 1 });
    const before = sent();
    const bad: [() => Promise<unknown>, ErrorConstructor, RegExp][] = [
      [
        // deno-lint-ignore no-explicit-any
        () => a!.acknowledgeAndClaim(lease as any, { max: 1 }),
        TypeError,
        /'leases' must be an array/,
      ],
      [
        () =>
          a!.acknowledgeAndClaim([lease!, { ...lease!, fence: -1 }], {
            max: 1,
          }),
        RangeError,
        /'leases\[1\]\.fence'/,
      ],
      [
        () => a!.acknowledgeAndClaim([lease!], { max: 0 }),
        RangeError,
        /'max'/,
      ],
      [
        () =>
          a!.acknowledgeAndClaim([lease!], {} as unknown as { max: number }),
        TypeError,
        /'max'/,
      ],
      [
        () => a!.acknowledgeAndClaim([lease!], { max: 1, queue: "" }),
        TypeError,
        /'queue'/,
      ],
      [
        () => a!.acknowledgeAndClaim([lease!], { max: 1, leaseMs: 0.5 }),
        RangeError,
        /'leaseMs'/,
      ],
      [
        () =>
          a!.acknowledgeAndClaim([lease!], {
            max: 1,
            token: "t",
          } as unknown as { max: number }),
        TypeError,
        /'token'/,
      ],
    ];
    for (const [call, type, message] of bad) {
      await assert.rejects(call, (error: unknown) => {
        assert.ok(error instanceof type, String(error));
        assert.match((error as Error).message, /^Cannot acknowledgeAndClaim/);
        assert.match((error as Error).message, message);
        return true;
      });
    }
    assert.equal(sent(), before, "no SQL ran");
    const stats = await a!.stats();
    assert.deepEqual([stats.pending, stats.leased, stats.done], [1, 1, 0]);
  });

  test("acknowledgeAndClaim whose claim is refused (a fence past 2^53 - 1) acknowledges nothing", async ({ open, raw }) => {
    const [a] = await open();
    await a!.enqueueBatch([0, 1].map((payload) => ({ payload })));
    const [lease] = await a!.claim({ max: 1 });
    await raw.run(
      `UPDATE outbox_events SET fence = ${Number.MAX_SAFE_INTEGER} WHERE id = ${
        lease!.eventId + 1
      }`,
    );
    await assert.rejects(
      () => a!.acknowledgeAndClaim([lease!], { max: 1 }),
      UnsafeIntegerError,
    );
    assert.equal((await eventRow(raw, lease!.eventId))?.["state"], "leased");
    assert.equal(await a!.acknowledge(lease!), true);
  });
}

for (const journalMode of ["truncate", "wal"] as const) {
  Deno.test(`acknowledgeAndClaim crash (${journalMode}): ${TRIALS} SIGKILLs mid-loop leave each call's acknowledgements and claim both on disk or neither, and every call that returned on disk`, async () => {
    const dir = await Deno.makeTempDir({ prefix: "fold_crash_" });
    try {
      let calls = 0;
      for (let trial = 0; trial < TRIALS; trial++) {
        const path = join(dir, `outbox${trial}.db`);
        await using child = new Child("fold", path, journalMode);
        const ready = await child.next();
        if (ready !== "ready") assert.fail(`${ready}: ${await child.stderr()}`);
        const returned: { acknowledged: number[]; claimed: number[] }[] = [];
        const ids = (list: string | undefined) =>
          list ? list.split(",").map(Number) : [];
        const reading = (async () => {
          for (let line; (line = await child.next()) !== undefined;) {
            const [kind, acknowledged, claimed] = line.split(" ");
            assert.equal(kind, "F", line);
            returned.push({
              acknowledged: ids(acknowledged),
              claimed: ids(claimed),
            });
          }
        })();
        await new Promise((resolve) =>
          setTimeout(resolve, 50 + Math.random() * 300)
        );
        child.kill();
        assert.equal((await child.status()).signal, "SIGKILL");
        await reading;
        calls += returned.length;

        await using db = await openSqliteWasm(path);
        const [integrity] = await db.query("PRAGMA integrity_check");
        assert.equal(integrity?.["integrity_check"], "ok");
        const state = new Map(
          (await db.query("SELECT id, state FROM outbox_events")).map((row) => [
            Number(row["id"]),
            String(row["state"]),
          ]),
        );
        for (const { acknowledged, claimed } of returned) {
          for (const id of acknowledged) assert.equal(state.get(id), "done");
          for (const id of claimed) {
            assert.ok(["leased", "done"].includes(state.get(id)!), `${id}`);
          }
        }
        // The calls claimed in id order, eight at a time: whatever the kill
        // cut, the file holds done events, then exactly one claimed batch
        // (acknowledgements without their claim would leave none, a claim
        // without its acknowledgements two), then pending ones.
        const states = [...state.entries()].sort(([x], [y]) => x - y).map((
          [, s],
        ) => s);
        const done = states.indexOf("leased");
        assert.ok(done >= 0 && done % 8 === 0, `first leased at ${done}`);
        assert.ok(states.slice(0, done).every((s) => s === "done"));
        assert.ok(states.slice(done, done + 8).every((s) => s === "leased"));
        assert.ok(states.slice(done + 8).every((s) => s === "pending"));
        assert.ok(done >= 8 * returned.length, "a returned call is lost");
      }
      assert.ok(calls > 0, "the child made progress");
      console.log(
        `${journalMode}: ${TRIALS} kills after ${calls} returned calls`,
      );
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
}
