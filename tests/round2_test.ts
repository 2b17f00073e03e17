/**
 * Cases R01, R02, R04, R05, R07, R10 and R11 of ../shared/cases/ROUND2.md,
 * mapped onto this project's API (`stop()` with `stopTimeoutMs` as the grace
 * period, `handlerTimeoutMs`, per-key FIFO with `orderingKey`, `purge` and
 * `maintain`, the loop's wake-ups).
 */
import assert from "node:assert/strict";
import { type Driver, type Lease, Outbox } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { DatabaseSync } from "node:sqlite";
import { processEvents, type Timers } from "../worker.ts";
import { ADMIN_SQL } from "../dialects/sqlite/admin.ts";
import { SQL } from "../dialects/sqlite.ts";
import { fixture, ManualTimers } from "./worker_fixture.ts";
import { ManualClock } from "./helpers.ts";

async function leased(outbox: Outbox): Promise<number[]> {
  return (await outbox.list({ state: "leased" })).map((e) => e.id);
}

Deno.test("R01: stop() gives back a handler's lease when the grace period ends, claims nothing more, and the handler's late acknowledgement is stale, not thrown", async () => {
  await using f = await fixture();
  const e1 = (await f.outbox.enqueue({ n: 1 })).eventId;
  const e2 = (await f.outbox.enqueue({ n: 2 })).eventId;
  const late = Promise.withResolvers<boolean>();
  let e2Signal: AbortSignal | undefined;
  let e2Lease: Lease<unknown> | undefined;
  const processor = processEvents(f.outbox, async (lease, { signal }) => {
    if (lease.eventId === e1) {
      await new Promise<void>((resolve) => f.time.setTimeout(resolve, 500));
      return;
    }
    e2Signal = signal;
    e2Lease = lease;
    // Would need 10 s; ignores nothing, but outlives the grace period.
    await new Promise<void>((resolve) => f.time.setTimeout(resolve, 10_000));
    late.resolve(f.outbox.acknowledge(lease));
    await late.promise;
  }, f.options({ concurrency: 2, leaseMs: 120_000, stopTimeoutMs: 2_000 }));
  const start = f.wall.ms;
  await f.time.advance(1_000, f.wall);
  assert.equal((await f.outbox.explain(e1))?.state, "done");
  let stopped = false;
  const stopping = processor.stop().then(() => stopped = true);
  await f.time.advance(500, f.wall);
  const { eventId: e7 } = await f.outbox.enqueue({ n: 7 });
  await f.time.advance(1_499, f.wall);
  assert.equal(stopped, false);
  assert.equal(e2Signal?.aborted, false);
  await f.time.advance(1, f.wall);
  await stopping;
  assert.equal(e2Signal?.aborted, true);
  assert.equal((e2Signal?.reason as DOMException).name, "AbortError");
  // Given back at t=3000 with no delay: another worker claims it now, not at
  // t=120000; e7 was never claimed by the stopped worker.
  assert.deepEqual(await leased(f.outbox), []);
  const [e2Info] = await f.outbox.list({ state: "pending", limit: 1 });
  assert.equal(e2Info?.id, e2);
  assert.equal(e2Info?.dueAt, start + 3_000);
  const b = await f.outbox.claim({ max: 2 });
  assert.deepEqual(b.map((l) => l.eventId), [e7, e2]);
  await f.time.advance(7_000, f.wall);
  assert.equal(await late.promise, false);
  assert.equal(e2Lease?.fence, 1);
  assert.equal(processor.counters.claimed, 2);
  assert.deepEqual(f.errors, []);
});

Deno.test("R02: a handler that ignores its signal past handlerTimeoutMs is aborted, no longer renewed and released, keeps its slot until it settles, and stop() does not wait for it", async () => {
  await using f = await fixture();
  const e1 = (await f.outbox.enqueue({ n: 1 })).eventId;
  const e2 = (await f.outbox.enqueue({ n: 2 })).eventId;
  const zombie = Promise.withResolvers<void>();
  const failures: unknown[] = [];
  let signal1: AbortSignal | undefined;
  let lease1: Lease<unknown> | undefined;
  const zombieAck = Promise.withResolvers<boolean>();
  const processor = processEvents(
    f.outbox,
    async (lease, context) => {
      signal1 = context.signal;
      lease1 = lease;
      await zombie.promise;
      zombieAck.resolve(f.outbox.acknowledge(lease));
      await zombieAck.promise;
    },
    f.options({
      concurrency: 1,
      leaseMs: 1_000,
      renewIntervalMs: 400,
      marginMs: 100,
      handlerTimeoutMs: 1_500,
      onHandlerError: (error) => failures.push(error),
    }),
  );
  const start = f.wall.ms;
  await f.time.advance(1_499, f.wall);
  assert.equal(signal1?.aborted, false);
  await f.time.advance(1, f.wall);
  assert.equal(signal1?.aborted, true);
  assert.equal((signal1?.reason as DOMException).name, "TimeoutError");
  assert.equal(failures.length, 1);
  assert.equal((failures[0] as DOMException).name, "TimeoutError");
  // Released with its backoff (100 ms in the fixture), the attempt counted.
  const [e1Info] = await f.outbox.list({ state: "pending", limit: 1 });
  assert.equal(e1Info?.id, e1);
  assert.equal(e1Info?.attempt, 1);
  assert.equal(e1Info?.dueAt, start + 1_600);
  assert.match(e1Info?.lastError ?? "", /ran past handlerTimeoutMs/);
  await f.time.advance(100, f.wall);
  // Another worker takes e1 (attempt 2, next fence) and e2; W's one slot is
  // still the zombie's, so W started nothing. W had claimed e2 ahead and gave
  // it back unstarted when its renewal fell due (400 ms): its first attempt,
  // at the next fence.
  const b = await f.outbox.claim({ max: 2, leaseMs: 60_000 });
  assert.deepEqual(b.map((l) => [l.eventId, l.attempt, l.fence]), [
    [e2, 1, 2],
    [e1, 2, 2],
  ]);
  assert.equal(processor.counters.claimed, 1);
  // No renewal of the zombie's lease after it timed out.
  await f.time.advance(2_000, f.wall);
  const renewals = (await f.outbox.explain(e1))!.history.filter((e) =>
    e.kind === "renewed"
  ).map((e) => e.at - start);
  assert.deepEqual(renewals, [400, 800, 1_200]);
  // stop() returns at once: the zombie's lease was given back already.
  let stopped = false;
  const stopping = processor.stop().then(() => stopped = true);
  await f.time.advance(0, f.wall);
  assert.equal(stopped, true);
  await stopping;
  assert.equal(processor.inFlight, 1);
  zombie.resolve();
  assert.equal(await zombieAck.promise, false);
  assert.equal(lease1?.fence, 1);
  assert.equal((await f.outbox.explain(e1))?.state, "leased");
  assert.deepEqual(f.errors, []);
});

Deno.test("R04: per-key FIFO claims one head per key in a batch, a retrying key blocks only itself, and a dead letter does not block its key (the park policy)", async () => {
  const clock = new ManualClock(0);
  await using outbox = await Outbox.open(await openSqliteWasm(":memory:"), {
    now: clock.now,
    maxAttempts: 2,
  });
  const ids: Record<string, number> = {};
  for (
    const [name, key] of [
      ["a1", "k1"],
      ["a2", "k1"],
      ["b1", "k2"],
      ["c1", "k3"],
      ["c2", "k3"],
    ] as const
  ) {
    ids[name] = (await outbox.enqueue(name, { orderingKey: key })).eventId;
  }
  const names = (leases: Lease<unknown>[]) => leases.map((l) => l.payload);
  const first = await outbox.claim({ max: 3 });
  assert.deepEqual(names(first), ["a1", "b1", "c1"]);
  await outbox.release(first[0]!, { delayMs: 1_000, error: "boom" });
  assert.deepEqual(await outbox.acknowledge(first.slice(1)), [true, true]);
  clock.set(10);
  assert.deepEqual(names(await outbox.claim({ max: 3 })), ["c2"]);
  clock.set(1_000);
  const [again] = await outbox.claim({ max: 3 });
  assert.equal(again?.payload, "a1");
  assert.equal(again?.attempt, 2);
  await outbox.release(again!, { error: "boom again" });
  assert.equal((await outbox.explain(ids["a1"]!))?.state, "dead");
  clock.set(1_002);
  await outbox.enqueue("d1", { orderingKey: "k4" });
  assert.deepEqual(names(await outbox.claim({ max: 3 })), ["a2", "d1"]);
});

Deno.test("R05: a long run keeps at most concurrency events running and as many claimed ahead, one listener on the stop signal, and a bounded number of timers (5,000 events, reduced from 100,000)", async () => {
  await using f = await fixture();
  const total = 5_000;
  await f.outbox.transaction(async (tx) => {
    const payload = { pad: "x".repeat(1_000) };
    for (let i = 0; i < total; i++) await tx.enqueue(payload);
  });
  // The long-lived stop signal, its listeners counted.
  const stop = new AbortController();
  let listeners = 0;
  let maxListeners = 0;
  const signal = stop.signal;
  const add = signal.addEventListener.bind(signal);
  const remove = signal.removeEventListener.bind(signal);
  signal.addEventListener = ((...args: Parameters<typeof add>) => {
    maxListeners = Math.max(maxListeners, ++listeners);
    add(...args);
  }) as typeof add;
  signal.removeEventListener = ((...args: Parameters<typeof remove>) => {
    listeners--;
    remove(...args);
  }) as typeof remove;
  const live = new Set<unknown>();
  let maxTimers = 0;
  const timers: Timers = {
    setTimeout: (callback, delayMs) => {
      const handle: unknown = f.time.setTimeout(() => {
        live.delete(handle);
        callback();
      }, delayMs);
      live.add(handle);
      maxTimers = Math.max(maxTimers, live.size);
      return handle;
    },
    clearTimeout: (handle) => {
      live.delete(handle);
      f.time.clearTimeout(handle);
    },
  };
  let done = 0;
  let maxClaimed = 0;
  const concurrency = 4;
  const processor = processEvents(f.outbox, async (_lease, { signal }) => {
    // A fake I/O call that takes the per-event signal and settles in 0-2 ms.
    await new Promise<void>((resolve, reject) => {
      const onAbort = () => reject(signal.reason);
      signal.addEventListener("abort", onAbort, { once: true });
      f.time.setTimeout(() => {
        signal.removeEventListener("abort", onAbort);
        resolve();
      }, done % 3);
    });
    done++;
  }, f.options({ concurrency, leaseMs: 30_000, signal, timers }));
  let nextSample = 0;
  while (done < total) {
    await f.time.advance(1, f.wall);
    if (done >= nextSample) {
      maxClaimed = Math.max(maxClaimed, (await leased(f.outbox)).length);
      nextSample += 1_000;
    }
  }
  stop.abort();
  await processor.stop();
  assert.equal(processor.counters.acknowledged, total);
  assert.ok(maxClaimed <= 2 * concurrency, `claimed at once: ${maxClaimed}`);
  assert.equal(maxListeners, 1);
  assert.equal(listeners, 0);
  // A renewal and a watchdog timer per running handler, one per lease
  // claimed ahead (its give-back), plus the loop's wait.
  assert.ok(
    maxTimers <= 3 * concurrency + 1,
    `timers pending at once: ${maxTimers}`,
  );
});

Deno.test("R07: a new database has auto_vacuum INCREMENTAL before its first table; purge deletes in batches of 1,000 and maintain() shrinks the file (20,000 events, reduced from 200,000)", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const path = `${dir}/outbox.db`;
    const inner = await openSqliteWasm(path);
    let batch = 0;
    let largest = 0;
    const counting: Driver = {
      query: (sql, params) => inner.query(sql, params),
      run: (sql, params) => {
        if (sql === ADMIN_SQL.purge) {
          largest = Math.max(largest, JSON.parse(String(params?.[0])).length);
          batch++;
        }
        return inner.run(sql, params);
      },
      exec: (sql) => inner.exec(sql),
      close: () => inner.close(),
      ...(inner.busyWait ? { busyWait: inner.busyWait.bind(inner) } : {}),
    };
    await using outbox = await Outbox.open(counting);
    const [mode] = await inner.query("PRAGMA auto_vacuum");
    assert.equal(mode?.["auto_vacuum"], 2);
    const sizeBefore = (await Deno.stat(path)).size;
    const total = 20_000;
    const pad = "x".repeat(2_048);
    for (let i = 0; i < total; i += 1_000) {
      await outbox.transaction(async (tx) => {
        for (let j = 0; j < 1_000; j++) await tx.enqueue({ pad });
      });
      await outbox.acknowledge(await outbox.claim({ max: 1_000 }));
    }
    const sizeFull = (await Deno.stat(path)).size;
    assert.ok(sizeFull > 40_000_000, `file of ${sizeFull} bytes`);
    assert.equal(await outbox.purge({ olderThanMs: 0 }), total);
    assert.equal(largest, 1_000);
    assert.equal(batch, 20);
    const { reclaimedBytes, freePages, autoVacuum } = await outbox.maintain();
    assert.equal(autoVacuum, "incremental");
    const [pages] = await inner.query("PRAGMA page_count");
    assert.ok(freePages <= Number(pages?.["page_count"]) / 100);
    const sizeAfter = (await Deno.stat(path)).size;
    assert.ok(reclaimedBytes >= sizeFull - sizeAfter - 4_096);
    assert.ok(
      sizeAfter <= sizeBefore + 1_048_576,
      `file of ${sizeAfter} bytes, was ${sizeBefore} when new`,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("R07: on a legacy database with auto_vacuum NONE, maintain() says so, and maintain({ vacuum: true }) reclaims the bytes or fails with BusyError while another connection reads", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const path = `${dir}/legacy.db`;
    // Made by another program: openSqliteWasm gives a new file
    // incremental auto-vacuum.
    const app = new DatabaseSync(path);
    app.exec("CREATE TABLE app (x INTEGER)");
    app.close();
    await using outbox = await Outbox.open(await openSqliteWasm(path));
    for (let i = 0; i < 200; i++) {
      await outbox.enqueue({ pad: "x".repeat(4_000) });
    }
    await outbox.acknowledge(await outbox.claim({ max: 200 }));
    await outbox.purge({ olderThanMs: 0 });
    const plain = await outbox.maintain();
    assert.equal(plain.autoVacuum, "none");
    assert.equal(plain.reclaimedBytes, 0);
    assert.ok(plain.freePages > 100);
    const reader = await openSqliteWasm(path);
    await reader.exec("BEGIN");
    await reader.query("SELECT count(*) FROM app");
    await assert.rejects(() => outbox.maintain({ vacuum: true }), {
      name: "BusyError",
    });
    await reader.exec("COMMIT");
    await reader.close();
    const vacuumed = await outbox.maintain({ vacuum: true });
    assert.equal(vacuumed.autoVacuum, "incremental");
    assert.ok(vacuumed.reclaimedBytes > 100 * 4_096);
    assert.equal(vacuumed.freePages, 0);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("R10: one enqueue of 100 events wakes every idle processor sharing the outbox at once; while all are busy an enqueue sends no claim, and a processor that finishes claims again before it sleeps", async () => {
  const inner = await openSqliteWasm(":memory:");
  let claims = 0;
  const counting: Driver = {
    query: (sql, params) => {
      if (sql === SQL.candidates) claims++;
      return inner.query(sql, params);
    },
    run: (sql, params) => inner.run(sql, params),
    exec: (sql) => inner.exec(sql),
    close: () => inner.close(),
  };
  await using f = await fixture(counting);
  const running = new Set<number>();
  const gate = Promise.withResolvers<void>();
  const processors = Array.from(
    { length: 8 },
    () =>
      processEvents(f.outbox, async (lease) => {
        running.add(lease.eventId);
        await gate.promise;
      }, f.options({ pollMinMs: 5_000, pollMaxMs: 5_000 })),
  );
  await f.time.advance(0, f.wall);
  assert.equal(running.size, 0);
  await f.outbox.transaction(async (tx) => {
    for (let i = 0; i < 100; i++) await tx.enqueue({ i });
  });
  await f.time.advance(0, f.wall);
  assert.equal(running.size, 8);
  const busyClaims = claims;
  await f.outbox.enqueue({ i: 100 });
  await f.time.advance(0, f.wall);
  assert.equal(claims, busyClaims);
  gate.resolve();
  while ((await f.outbox.stats()).done < 101) await f.time.advance(0, f.wall);
  assert.equal(f.time.ms, 0);
  assert.equal(running.size, 101);
  await Promise.all(processors.map((p) => p.stop()));
});

Deno.test("R11: an idle processor's timer is armed for the next due time: a delayed event, a release's backoff and a dead worker's lease deadline each start on time, not at the next poll", async () => {
  await using f = await fixture();
  const starts: [unknown, number][] = [];
  const start = f.wall.ms;
  // (f) a dead worker's lease on an event lapses at t=30000.
  await f.outbox.enqueue("abandoned");
  await f.outbox.claim({ leaseMs: 30_000 });
  const processor = processEvents(f.outbox, (lease) => {
    starts.push([lease.payload, f.wall.ms - start]);
    if (lease.payload === "retried" && lease.attempt === 1) {
      throw new Error("fail once");
    }
  }, f.options({ pollMinMs: 5_000, pollMaxMs: 5_000, backoffMinMs: 3_000 }));
  await f.time.advance(0, f.wall);
  // (c) a delayed enqueue while the processor sleeps.
  await f.outbox.enqueue("delayed", { delayMs: 2_000 });
  await f.time.advance(100, f.wall);
  // (d) a handler failure with a 3000 ms backoff.
  await f.outbox.enqueue("retried");
  await f.time.advance(40_000, f.wall);
  await processor.stop();
  assert.deepEqual(starts, [
    ["retried", 100],
    ["delayed", 2_000],
    ["retried", 3_100],
    ["abandoned", 30_000],
  ]);
});

/**
 * The driver without its watch of other connections' enqueues, as on a
 * filesystem whose changes cannot be watched: the loop has only its polls.
 */
function withoutWatch(driver: Driver): Driver {
  return new Proxy(driver, {
    get(target, property) {
      if (property === "watchEnqueues") return undefined;
      const value = Reflect.get(target, property, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
}

async function anotherConnection(
  watch: boolean,
  body: (
    enqueue: () => Promise<void>,
    starts: number[],
    time: ManualTimers,
    wall: ManualClock,
  ) => Promise<void>,
): Promise<void> {
  const dir = await Deno.makeTempDir();
  try {
    const path = `${dir}/outbox.db`;
    const wall = new ManualClock(1_000_000);
    const time = new ManualTimers();
    const driver = await openSqliteWasm(path);
    await using w = await Outbox.open(watch ? driver : withoutWatch(driver), {
      now: wall.now,
    });
    await using other = await Outbox.open(await openSqliteWasm(path), {
      now: wall.now,
    });
    const starts: number[] = [];
    const processor = processEvents(w, () => {
      starts.push(time.ms);
    }, {
      pollMinMs: 5_000,
      pollMaxMs: 5_000,
      now: wall.now,
      monotonicNow: time.monotonicNow,
      timers: time,
    });
    await time.advance(0, wall);
    await time.advance(1_000, wall);
    await body(
      async () => {
        await other.enqueue("from elsewhere");
      },
      starts,
      time,
      wall,
    );
    await processor.stop();
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("R11: an event enqueued through another connection is claimed by the next poll where the database's files cannot be watched", async () => {
  await anotherConnection(false, async (enqueue, starts, time, wall) => {
    await enqueue();
    await time.advance(3_999, wall);
    assert.deepEqual(starts, []);
    await time.advance(101, wall);
    assert.deepEqual(starts, [5_000]);
  });
});

Deno.test("R11: an event enqueued through another connection wakes the idle processor through its watch, before the next poll", async () => {
  await anotherConnection(true, async (enqueue, starts) => {
    await enqueue();
    // Real time is the subject here: the watch's wake comes from the
    // filesystem, while the injected clock stands still at 1,000.
    const deadline = Date.now() + 10_000;
    while (starts.length === 0 && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    assert.deepEqual(starts, [1_000]);
  });
});
