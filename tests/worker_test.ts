import assert from "node:assert/strict";
import {
  BusyError,
  type Driver,
  type Lease,
  LeaseLostError,
  Outbox,
  type SqlValue,
} from "../mod.ts";
import { SQL, SQLITE } from "../dialects/sqlite.ts";
import { join } from "node:path";
import { openSqliteWasm as openDenoFile } from "../deno/sqlite_wasm.ts";
import { DatabaseMovedError } from "../errors.ts";
import { openSqliteWasm } from "../drivers/sqlite_wasm.ts";
import { type Handler, processEvents, type ProcessOptions } from "../worker.ts";
import {
  type Fixture,
  fixture,
  ManualTimers,
  settle,
  withImmediate,
} from "./worker_fixture.ts";

Deno.test("processEvents() delivers each event once and acknowledges it", async () => {
  await using f = await fixture();
  for (const n of [1, 2, 3]) await f.outbox.enqueue({ n });
  const seen: string[] = [];
  const processor = processEvents(f.outbox, (lease) => {
    seen.push(`${lease.eventId}:${lease.fence}:${lease.attempt}`);
  }, f.options({ concurrency: 2 }));
  await f.time.advance(0, f.wall);
  await processor.stop();
  assert.deepEqual(seen, ["1:1:1", "2:1:1", "3:1:1"]);
  assert.deepEqual(processor.counters, {
    claimed: 3,
    acknowledged: 3,
    staleAcknowledgements: 0,
    leasesLost: 0,
    released: 0,
    dead: 0,
    failed: 0,
  });
  assert.equal((await f.outbox.stats()).done, 3);
  assert.deepEqual(f.errors, []);
});

Deno.test("a stalled handler has its signal aborted, its acknowledge returns false and the event is delivered again with the next fence", async () => {
  await using f = await fixture();
  const { eventId } = await f.outbox.enqueue({ to: "ada@example.com" });
  const gate = Promise.withResolvers<void>();
  const deliveries: string[] = [];
  let stalledSignal: AbortSignal | undefined;
  const handler: Handler<unknown> = async (lease, { signal }) => {
    deliveries.push(`${lease.eventId}:${lease.fence}`);
    if (lease.fence === 1) {
      stalledSignal = signal;
      await gate.promise;
    }
  };
  await using stalled = processEvents(f.outbox, handler, f.options());
  await f.time.advance(0, f.wall);
  assert.equal(stalled.inFlight, 1);

  // The stalled process runs no timers while both clocks pass its lease.
  f.time.jump(1_500, f.wall);
  await using healthy = processEvents(f.outbox, handler, f.options());
  await settle();
  assert.deepEqual(deliveries, [`${eventId}:1`, `${eventId}:2`]);
  assert.equal(healthy.counters.acknowledged, 1);

  // The stalled process wakes: its overdue renewal aborts the handler first.
  await f.time.advance(0, f.wall);
  assert.equal(stalledSignal?.aborted, true);
  assert.equal((stalledSignal?.reason as DOMException).name, "TimeoutError");
  gate.resolve();
  await f.time.advance(0, f.wall);
  assert.deepEqual(stalled.counters, {
    claimed: 1,
    acknowledged: 0,
    staleAcknowledgements: 1,
    leasesLost: 1,
    released: 0,
    dead: 0,
    failed: 0,
  });
  const history = (await f.outbox.explain(eventId))!.history;
  assert.deepEqual(
    history.map((entry) => `${entry.kind}@${entry.fence}`),
    [
      "claimed@1",
      "expired@1",
      "claimed@2",
      "acknowledged@2",
      "stale_acknowledge@1",
    ],
  );
});

Deno.test("the handler's signal fires when renewal is overdue by the monotonic clock alone", async () => {
  await using f = await fixture();
  await f.outbox.enqueue({});
  const gate = Promise.withResolvers<void>();
  let signal: AbortSignal | undefined;
  await using processor = processEvents(f.outbox, async (_, context) => {
    signal = context.signal;
    await gate.promise;
  }, f.options());
  await f.time.advance(0, f.wall);
  // A suspended process: monotonic time passed, the lease clock did not
  // (so the database would still accept a renewal).
  f.time.jump(900);
  await f.time.advance(0);
  assert.equal(signal?.aborted, true);
  assert.match(
    (signal?.reason as DOMException).message,
    /^Lease on event 1 \(fence 1\) is overdue for renewal by the monotonic clock$/,
  );
  gate.resolve();
  await f.time.advance(0);
  // Nobody else claimed it, so the fenced acknowledgement still succeeds.
  assert.deepEqual(processor.counters, {
    claimed: 1,
    acknowledged: 1,
    staleAcknowledgements: 0,
    leasesLost: 1,
    released: 0,
    dead: 0,
    failed: 0,
  });
});

Deno.test("after a sleep the wall clock shows the lease overdue though the monotonic clock stood still", async () => {
  await using f = await fixture();
  await f.outbox.enqueue({});
  const gate = Promise.withResolvers<void>();
  let signal: AbortSignal | undefined;
  await using processor = processEvents(f.outbox, async (_, context) => {
    signal = context.signal;
    await gate.promise;
  }, f.options());
  await f.time.advance(0, f.wall);
  // Linux and macOS stop the monotonic clock while the machine sleeps.
  f.wall.advance(60_000);
  await f.time.advance(333);
  assert.equal(signal?.aborted, true);
  assert.equal(
    (signal?.reason as DOMException).message,
    "Lease on event 1 (fence 1) is overdue for renewal by the wall clock",
  );
  gate.resolve();
  await f.time.advance(0);
  assert.equal(processor.counters.leasesLost, 1);
});

Deno.test("throwIfLost() catches an overdue lease before the timers have run", async () => {
  await using f = await fixture();
  await f.outbox.enqueue({});
  const gate = Promise.withResolvers<void>();
  let outcome = "";
  await using _processor = processEvents(f.outbox, async (_, context) => {
    await gate.promise;
    try {
      context.throwIfLost();
      outcome = "sent";
    } catch (error) {
      outcome = (error as DOMException).name;
      throw error;
    }
  }, f.options());
  await f.time.advance(0, f.wall);
  f.time.jump(850, f.wall);
  gate.resolve();
  await settle();
  assert.equal(outcome, "TimeoutError");
});

Deno.test("renewals keep a long handler's lease live well before each deadline", async () => {
  await using f = await fixture();
  const { eventId } = await f.outbox.enqueue({});
  const gate = Promise.withResolvers<void>();
  let signal: AbortSignal | undefined;
  await using processor = processEvents(f.outbox, async (_, context) => {
    signal = context.signal;
    await gate.promise;
  }, f.options());
  await f.time.advance(3_100, f.wall);
  assert.equal(signal?.aborted, false);
  assert.equal(await f.outbox.claim(), null);
  gate.resolve();
  await f.time.advance(0, f.wall);
  const history = (await f.outbox.explain(eventId))!.history;
  const renewals = history.filter((entry) => entry.kind === "renewed");
  // Every renewInterval (1000 / 3 = 333 ms) from the claim at 1_000_000.
  assert.deepEqual(
    renewals.map((entry) => entry.at - 1_000_000),
    [333, 666, 999, 1332, 1665, 1998, 2331, 2664, 2997],
  );
  assert.deepEqual(
    renewals.map((entry) => entry.leaseUntil! - entry.at),
    Array(9).fill(1_000),
  );
  assert.equal(processor.counters.acknowledged, 1);
  assert.equal(processor.counters.leasesLost, 0);
});

Deno.test("stop() waits for running handlers up to stopTimeoutMs, then releases what remains", async () => {
  await using f = await fixture();
  const first = await f.outbox.enqueue({ n: 1 });
  const second = await f.outbox.enqueue({ n: 2 });
  const gate = Promise.withResolvers<void>();
  const signals = new Map<number, AbortSignal>();
  const processor = processEvents(f.outbox, async (lease, { signal }) => {
    signals.set(lease.eventId, signal);
    if (lease.eventId === first.eventId) return await gate.promise;
    await new Promise((_, reject) => {
      signal.addEventListener("abort", () => reject(signal.reason));
    });
  }, f.options({ concurrency: 2, stopTimeoutMs: 500 }));
  await f.time.advance(0, f.wall);
  const stopped = processor.stop();
  await f.time.advance(100, f.wall);
  gate.resolve();
  await f.time.advance(399, f.wall);
  assert.equal(signals.get(second.eventId)?.aborted, false);
  assert.equal(processor.inFlight, 1);
  await f.time.advance(1, f.wall);
  await stopped;
  assert.equal(processor.inFlight, 0);
  assert.equal(
    (signals.get(second.eventId)?.reason as DOMException).name,
    "AbortError",
  );
  assert.equal(processor.counters.acknowledged, 1);
  assert.equal(processor.counters.released, 1);
  const explained = await f.outbox.explain(second.eventId);
  assert.equal(explained?.state, "pending");
  assert.equal(
    explained?.lastError,
    "processor stopped before the handler finished",
  );
  assert.equal((await f.outbox.claim())?.eventId, second.eventId);
});

Deno.test("stop() releasing an event at its last attempt makes it a dead letter", async () => {
  await using f = await fixture();
  const { eventId } = await f.outbox.enqueue({}, { maxAttempts: 1 });
  const processor = processEvents(
    f.outbox,
    (_, { signal }) =>
      new Promise((_, reject) => {
        signal.addEventListener("abort", () => reject(signal.reason));
      }),
    f.options({ stopTimeoutMs: 0 }),
  );
  await f.time.advance(0, f.wall);
  const stopped = processor.stop();
  await f.time.advance(0, f.wall);
  await stopped;
  assert.deepEqual(
    (await f.outbox.deadLetters()).map((
      dead,
    ) => [dead.eventId, dead.lastError]),
    [[eventId, "processor stopped before the handler finished"]],
  );
  assert.equal(processor.counters.dead, 1);
  assert.equal(processor.counters.released, 0);
});

Deno.test("failed attempts are retried on the configured exponential backoff schedule", async () => {
  await using f = await fixture();
  await f.outbox.enqueue({}, { maxAttempts: 6 });
  const startedAt: number[] = [];
  await using processor = processEvents(
    f.outbox,
    () => {
      startedAt.push(f.time.ms);
      throw new Error("receiver down");
    },
    f.options({ backoffMinMs: 100, backoffMultiplier: 3, backoffMaxMs: 1_000 }),
  );
  await f.time.advance(4_000, f.wall);
  assert.deepEqual(
    startedAt.slice(1).map((at, i) => at - startedAt[i]!),
    [100, 300, 900, 1_000, 1_000],
  );
  assert.equal(processor.counters.released, 5);
  assert.equal(processor.counters.dead, 1);
});

Deno.test("backoffJitter takes a random fraction off each delay", async () => {
  await using f = await fixture();
  const { eventId } = await f.outbox.enqueue({});
  await using _processor = processEvents(f.outbox, () => {
    throw new Error("nope");
  }, f.options({ backoffMinMs: 100, backoffJitter: 0.5, random: () => 0.5 }));
  const delays: number[] = [];
  for (let i = 0; i < 3; i++) {
    await f.time.advance(i === 0 ? 0 : delays.at(-1)! + 10, f.wall);
    const { history } = (await f.outbox.explain(eventId))!;
    const released = history.filter((entry) => entry.kind === "released");
    assert.equal(released.length, i + 1);
    delays.push(await dueIn(f, eventId));
  }
  // 100, 200, 400 ms, each times (1 - 0.5 * 0.5).
  assert.deepEqual(delays, [75, 150, 300]);
});

Deno.test("a random option that returns no number in [0, 1) or throws is reported by name, and the event goes back after the whole backoff", async () => {
  for (
    const [random, says] of [
      [() => 1, "returned 1,"],
      [() => -0.5, "returned -0.5,"],
      [() => NaN, "returned NaN,"],
      [() => "0.5" as unknown as number, "returned string,"],
      [() => {
        throw new Error("no entropy");
      }, "threw: Error: no entropy"],
    ] as const
  ) {
    await using f = await fixture();
    const { eventId } = await f.outbox.enqueue({});
    await using processor = processEvents(f.outbox, () => {
      throw new Error("nope");
    }, f.options({ backoffMinMs: 100, backoffJitter: 0.5, random }));
    await f.time.advance(0, f.wall);
    assert.equal(processor.counters.released, 1, says);
    assert.equal(await dueIn(f, eventId), 100, says);
    assert.equal(f.errors.length, 1, says);
    const [error] = f.errors;
    assert.ok(error instanceof RangeError, says);
    assert.match(error.message, /the random option/);
    assert.ok(error.message.includes(says), error.message);
  }
});

/** How long until a pending event is due, by the lease clock. */
async function dueIn(f: Fixture, eventId: number): Promise<number> {
  const [row] = await f.outbox.transaction((tx) =>
    tx.query(
      "SELECT due_at - updated_at AS ms FROM outbox_events WHERE id = ?",
      [
        eventId,
      ],
    )
  );
  return Number(row?.["ms"]);
}

Deno.test("a poison event ends in the dead letters after maxAttempts with its last error", async () => {
  await using f = await fixture();
  const { eventId } = await f.outbox.enqueue({ poison: true }, {
    maxAttempts: 3,
  });
  await using processor = processEvents(f.outbox, (lease) => {
    throw new Error(`boom on attempt ${lease.attempt}`);
  }, f.options({ backoffMinMs: 20 }));
  await f.time.advance(1_000, f.wall);
  const dead = await f.outbox.deadLetters();
  assert.deepEqual(
    dead.map(({ eventId, attempts, lastError }) => ({
      eventId,
      attempts,
      lastError,
    })),
    [{ eventId, attempts: 3, lastError: "Error: boom on attempt 3" }],
  );
  assert.deepEqual(processor.counters, {
    claimed: 3,
    acknowledged: 0,
    staleAcknowledgements: 0,
    leasesLost: 0,
    released: 2,
    dead: 1,
    failed: 3,
  });
});

Deno.test("the concurrency limit holds while handlers run", async () => {
  await using f = await fixture();
  for (let n = 0; n < 10; n++) await f.outbox.enqueue({ n });
  const gates: PromiseWithResolvers<void>[] = [];
  let running = 0;
  let mostRunning = 0;
  await using processor = processEvents(f.outbox, async () => {
    running++;
    mostRunning = Math.max(mostRunning, running);
    const gate = Promise.withResolvers<void>();
    gates.push(gate);
    await gate.promise;
    running--;
  }, f.options({ concurrency: 3 }));
  await f.time.advance(0, f.wall);
  assert.equal(processor.counters.claimed, 3);
  // Three handlers running, three leases claimed ahead of them.
  assert.equal((await f.outbox.stats()).leased, 6);
  for (let i = 0; i < 10; i++) {
    gates[i]!.resolve();
    await f.time.advance(0, f.wall);
    assert.ok(running <= 3);
  }
  assert.equal(mostRunning, 3);
  assert.equal(processor.counters.acknowledged, 10);
});

Deno.test("handlers that finish together are acknowledged in one transaction", async () => {
  await using f = await fixture();
  for (let n = 0; n < 3; n++) await f.outbox.enqueue({ n });
  const calls = recordWrites(f.outbox);
  const gate = Promise.withResolvers<void>();
  await using processor = processEvents(
    f.outbox,
    () => gate.promise,
    f.options({ concurrency: 3, prefetch: false }),
  );
  await f.time.advance(0, f.wall);
  gate.resolve();
  await f.time.advance(0, f.wall);
  assert.deepEqual(
    calls.filter((call) => call.startsWith("acknowledge")),
    ["acknowledge 3 + claim 3"],
  );
  assert.equal(processor.counters.acknowledged, 3);
});

/**
 * A handler that waits until the test opens the gate of its event's `n`.
 * Disposing it opens every gate, present and future, and lets the
 * processor's writes run, so the processor can stop; dispose it before the
 * processor (declare it after).
 */
function handlerGates(time: ManualTimers) {
  const gates = new Map<number, PromiseWithResolvers<void>>();
  const gate = (n: number) => {
    if (!gates.has(n)) gates.set(n, Promise.withResolvers<void>());
    return gates.get(n)!;
  };
  let all = false;
  return {
    handler: (lease: Lease) => {
      const { n } = lease.payload as { n: number };
      return all ? undefined : gate(n).promise;
    },
    open: (n: number) => gate(n).resolve(),
    async [Symbol.asyncDispose]() {
      all = true;
      for (const { resolve } of gates.values()) resolve();
      await time.advance(0);
    },
  };
}

/**
 * Takes `acknowledgeAndClaim` away from `outbox`, as a custom
 * {@linkcode ProcessableOutbox} may lack it: the loop then acknowledges and
 * claims in separate transactions.
 */
function withoutFolding(outbox: Outbox): Outbox {
  Object.defineProperty(outbox, "acknowledgeAndClaim", { value: undefined });
  return outbox;
}

/**
 * Holds the `nth` call of `outbox[method]` under way until the returned
 * function is called; the other calls go through.
 */
function holdCall(
  outbox: Outbox,
  method: "claim" | "acknowledge" | "acknowledgeAndClaim",
  nth: number,
): () => void {
  const gate = Promise.withResolvers<void>();
  const original = (outbox[method] as (...args: unknown[]) => Promise<unknown>)
    .bind(outbox);
  let calls = 0;
  Object.defineProperty(outbox, method, {
    configurable: true,
    writable: true,
    value: async (...args: unknown[]) => {
      if (++calls === nth) await gate.promise;
      return await original(...args);
    },
  });
  return gate.resolve;
}

/**
 * Records the claims and acknowledgements an outbox is asked for, in order
 * (an acknowledgement with a claim as "acknowledge n + claim max").
 *
 * The writer's tests that count each write's acknowledgements and claims
 * against the slots handlers hold turn `prefetch` off: claiming ahead only
 * adds `concurrency` to each claim, and starts the next handler before the
 * write (its own tests are in `worker_prefetch_test.ts`).
 */
function recordWrites(outbox: Outbox): string[] {
  const calls: string[] = [];
  const claim = outbox.claim.bind(outbox) as (
    options: { max: number },
  ) => Promise<Lease[]>;
  outbox.claim = (async (options: { max: number }) => {
    calls.push(`claim ${options.max}`);
    const leases = await claim(options);
    calls.push(`claimed ${leases.length}`);
    return leases;
  }) as typeof outbox.claim;
  const acknowledge = outbox.acknowledge.bind(outbox);
  outbox.acknowledge = ((leases: Lease[]) => {
    calls.push(`acknowledge ${leases.length}`);
    return acknowledge(leases);
  }) as typeof outbox.acknowledge;
  if (outbox.acknowledgeAndClaim === undefined) return calls;
  const acknowledgeAndClaim = outbox.acknowledgeAndClaim.bind(outbox);
  outbox.acknowledgeAndClaim = async (leases, options) => {
    calls.push(`acknowledge ${leases.length} + claim ${options.max}`);
    const result = await acknowledgeAndClaim(leases, options);
    calls.push(`claimed ${result.leases.length}`);
    return result;
  };
  return calls;
}

Deno.test("64 events at concurrency 16 take one claim of 16, then each acknowledgement of 16 goes with the next claim in one call", async () => {
  await using f = await fixture();
  for (let n = 0; n < 64; n++) await f.outbox.enqueue({ n });
  const calls = recordWrites(f.outbox);
  await using processor = processEvents(
    f.outbox,
    () => {},
    f.options({ concurrency: 16, prefetch: false }),
  );
  await f.time.advance(0, f.wall);
  assert.deepEqual(calls, [
    "claim 16",
    "claimed 16",
    ...Array(3).fill(["acknowledge 16 + claim 16", "claimed 16"]).flat(),
    "acknowledge 16 + claim 16",
    "claimed 0",
    "claim 16",
    "claimed 0",
  ]);
  assert.equal(processor.counters.acknowledged, 64);
  assert.equal(processor.counters.claimed, 64);
  assert.equal((await f.outbox.stats()).done, 64);
});

Deno.test("without acknowledgeAndClaim, 64 events at concurrency 16 take four claims of 16 and four acknowledgements of 16", async () => {
  await using f = await fixture();
  for (let n = 0; n < 64; n++) await f.outbox.enqueue({ n });
  const calls = recordWrites(withoutFolding(f.outbox));
  await using processor = processEvents(
    f.outbox,
    () => {},
    f.options({ concurrency: 16, prefetch: false }),
  );
  await f.time.advance(0, f.wall);
  assert.deepEqual(calls, [
    ...Array(4).fill(["claim 16", "claimed 16", "acknowledge 16"]).flat(),
    // The first empty claim after work, then one after reading when the
    // next event comes due.
    "claim 16",
    "claimed 0",
    "claim 16",
    "claimed 0",
  ]);
  assert.equal(processor.counters.acknowledged, 64);
  assert.equal((await f.outbox.stats()).done, 64);
});

Deno.test("handlers that finish in the same turn of the event loop share one write, however many promise jobs apart", async () => {
  await using f = await fixture();
  for (let n = 1; n <= 4; n++) await f.outbox.enqueue({ n });
  const calls = recordWrites(f.outbox);
  const gate = Promise.withResolvers<void>();
  await using processor = processEvents(
    f.outbox,
    async (lease) => {
      await gate.promise;
      // Each handler finishes a different number of promise jobs after the
      // gate opens, all in the same turn.
      const { n } = lease.payload as { n: number };
      for (let i = 0; i < 10 * n; i++) await null;
    },
    f.options({
      concurrency: 4,
      prefetch: false,
      timers: withImmediate(f.time),
    }),
  );
  await f.time.advance(0, f.wall);
  gate.resolve();
  await f.time.advance(0, f.wall);
  assert.deepEqual(
    calls.filter((call) => call.startsWith("acknowledge")),
    ["acknowledge 4 + claim 4"],
  );
  assert.equal(processor.counters.acknowledged, 4);
});

Deno.test("handlers that finish in separate turns while an acknowledgement with a claim is under way are acknowledged together by the next write", async () => {
  await using f = await fixture();
  for (let n = 1; n <= 8; n++) await f.outbox.enqueue({ n });
  // The first stays under way until the test lets it go.
  const letFold = holdCall(f.outbox, "acknowledgeAndClaim", 1);
  const calls = recordWrites(f.outbox);
  const gates = handlerGates(f.time);
  await using processor = processEvents(
    f.outbox,
    gates.handler,
    f.options({ concurrency: 4, prefetch: false }),
  );
  await using _gates = gates;
  await f.time.advance(0, f.wall);
  gates.open(1);
  await f.time.advance(0, f.wall);
  for (const n of [2, 3, 4]) {
    gates.open(n);
    await settle();
  }
  assert.deepEqual(calls, ["claim 4", "claimed 4", "acknowledge 1 + claim 1"]);
  letFold();
  await f.time.advance(0, f.wall);
  assert.deepEqual(calls, [
    "claim 4",
    "claimed 4",
    "acknowledge 1 + claim 1",
    "claimed 1",
    "acknowledge 3 + claim 3",
    "claimed 3",
  ]);
  assert.equal(processor.counters.acknowledged, 4);
  assert.equal(processor.inFlight, 4);
});

Deno.test("without acknowledgeAndClaim, handlers that finish while a claim is under way are acknowledged together, and the next claim takes every slot they freed", async () => {
  await using f = await fixture();
  for (let n = 1; n <= 8; n++) await f.outbox.enqueue({ n });
  const calls = recordWrites(withoutFolding(f.outbox));
  // The second claim stays under way until the test lets it go.
  const letClaim = holdCall(f.outbox, "claim", 2);
  const gates = handlerGates(f.time);
  await using processor = processEvents(
    f.outbox,
    gates.handler,
    f.options({ concurrency: 4, prefetch: false }),
  );
  await using _gates = gates;
  await f.time.advance(0, f.wall);
  gates.open(1);
  await f.time.advance(0, f.wall);
  gates.open(2);
  gates.open(3);
  await f.time.advance(0, f.wall);
  assert.deepEqual(calls, ["claim 4", "claimed 4", "acknowledge 1"]);
  letClaim();
  await f.time.advance(0, f.wall);
  assert.deepEqual(calls, [
    "claim 4",
    "claimed 4",
    "acknowledge 1",
    "claim 1",
    "claimed 1",
    "acknowledge 2",
    "claim 2",
    "claimed 2",
  ]);
  assert.equal(processor.counters.acknowledged, 3);
  assert.equal(processor.inFlight, 4);
});

Deno.test("without acknowledgeAndClaim, a claim waiting behind an acknowledgement goes first once half the slots are free", async () => {
  await using f = await fixture();
  for (let n = 1; n <= 8; n++) await f.outbox.enqueue({ n });
  const calls = recordWrites(withoutFolding(f.outbox));
  // The first acknowledgement stays under way until the test lets it go.
  const letAcknowledge = holdCall(f.outbox, "acknowledge", 1);
  const gates = handlerGates(f.time);
  await using processor = processEvents(f.outbox, async (lease) => {
    await gates.handler(lease);
    if ((lease.payload as { n: number }).n <= 2) throw new Error("refused");
  }, f.options({ concurrency: 4, prefetch: false }));
  await using _gates = gates;
  await f.time.advance(0, f.wall);
  gates.open(3);
  await f.time.advance(0, f.wall);
  // Two releases free half the slots while 3's acknowledgement is under
  // way: the loop's claim waits for its turn, and 4 finishes behind it. The
  // claim goes before 4's acknowledgement, with 3's slot as well.
  gates.open(1);
  gates.open(2);
  await f.time.advance(0, f.wall);
  gates.open(4);
  await f.time.advance(0, f.wall);
  letAcknowledge();
  await f.time.advance(0, f.wall);
  assert.deepEqual(calls, [
    "claim 4",
    "claimed 4",
    "acknowledge 1",
    "claim 3",
    "claimed 3",
    "acknowledge 1",
    "claim 1",
    "claimed 1",
  ]);
  assert.deepEqual(
    { ...processor.counters },
    {
      claimed: 8,
      acknowledged: 2,
      staleAcknowledgements: 0,
      leasesLost: 0,
      released: 2,
      dead: 0,
      failed: 2,
    },
  );
});

Deno.test("each handler in one acknowledgement batch keeps its own outcome", async () => {
  await using f = await fixture();
  for (let n = 1; n <= 4; n++) await f.outbox.enqueue({ n });
  const calls = recordWrites(f.outbox);
  const gate = Promise.withResolvers<void>();
  await using processor = processEvents(f.outbox, async (lease, context) => {
    const { n } = lease.payload as { n: number };
    if (n === 4) {
      // Someone else gave the event back: this lease is stale now.
      await f.outbox.release(lease, { delayMs: 60_000 });
    }
    await gate.promise;
    if (n === 2) throw new Error("refused");
    if (n === 3) await context.transaction(() => Promise.resolve());
  }, f.options({ concurrency: 4, prefetch: false }));
  await f.time.advance(0, f.wall);
  gate.resolve();
  await f.time.advance(0, f.wall);
  // 1 and 4 in one transaction, with a claim for their slots (2's release
  // and 3's transaction were under way); 2 was released, 3 acknowledged
  // itself.
  assert.deepEqual(
    calls.filter((call) => call.startsWith("acknowledge")),
    ["acknowledge 2 + claim 2"],
  );
  assert.deepEqual(processor.counters, {
    claimed: 4,
    acknowledged: 2,
    staleAcknowledgements: 1,
    leasesLost: 0,
    released: 1,
    dead: 0,
    failed: 1,
  });
  const states = [];
  for (let id = 1; id <= 4; id++) {
    const event = await f.outbox.explain(id);
    states.push(`${event?.state}:${event?.fence}`);
  }
  assert.deepEqual(states, ["done:1", "pending:1", "done:1", "pending:1"]);
  assert.deepEqual(f.errors, []);
});

Deno.test("without acknowledgeAndClaim, an acknowledgement batch that throws counts none of its leases, and its events are delivered again and acknowledged once", async () => {
  await using f = await fixture();
  withoutFolding(f.outbox);
  for (let n = 1; n <= 2; n++) await f.outbox.enqueue({ n });
  const acknowledge = f.outbox.acknowledge.bind(f.outbox);
  let failures = 1;
  f.outbox.acknowledge = ((leases: Lease[]) => {
    if (failures-- > 0) {
      return Promise.reject(new BusyError("database is locked"));
    }
    return acknowledge(leases);
  }) as typeof f.outbox.acknowledge;
  const deliveries: string[] = [];
  await using processor = processEvents(f.outbox, (lease) => {
    deliveries.push(`${lease.eventId}:${lease.fence}`);
  }, f.options({ concurrency: 2 }));
  await f.time.advance(0, f.wall);
  assert.equal(f.errors.length, 1);
  assert.ok(f.errors[0] instanceof BusyError);
  assert.equal(processor.counters.acknowledged, 0);
  assert.equal((await f.outbox.stats()).leased, 2);
  // The leases lapse and the same loop claims the events again.
  await f.time.advance(1_000, f.wall);
  assert.deepEqual(deliveries, ["1:1", "2:1", "1:2", "2:2"]);
  assert.equal(processor.counters.acknowledged, 2);
  assert.equal(processor.counters.staleAcknowledgements, 0);
  assert.equal((await f.outbox.stats()).done, 2);
});

Deno.test("an acknowledgement with a claim that throws is reported, and the acknowledgements go alone, counted once", async () => {
  await using f = await fixture();
  for (let n = 1; n <= 4; n++) await f.outbox.enqueue({ n });
  const calls = recordWrites(f.outbox);
  const recorded = f.outbox.acknowledgeAndClaim.bind(f.outbox);
  let failures = 1;
  f.outbox.acknowledgeAndClaim = (leases, options) => {
    if (failures-- > 0) {
      return Promise.reject(new BusyError("database is locked"));
    }
    return recorded(leases, options);
  };
  const deliveries: string[] = [];
  await using processor = processEvents(f.outbox, (lease) => {
    deliveries.push(`${lease.eventId}:${lease.fence}`);
  }, f.options({ concurrency: 2, prefetch: false }));
  await f.time.advance(0, f.wall);
  assert.equal(f.errors.length, 1);
  assert.ok(f.errors[0] instanceof BusyError);
  assert.deepEqual(calls, [
    "claim 2",
    "claimed 2",
    "acknowledge 2",
    "claim 2",
    "claimed 2",
    "acknowledge 2 + claim 2",
    "claimed 0",
    "claim 2",
    "claimed 0",
  ]);
  assert.deepEqual(deliveries, ["1:1", "2:1", "3:1", "4:1"]);
  assert.equal(processor.counters.acknowledged, 4);
  assert.equal((await f.outbox.stats()).done, 4);
});

Deno.test("a claim waiting for its turn behind an acknowledgement with a claim claims only the slots that call left free", async () => {
  await using f = await fixture();
  for (let n = 1; n <= 8; n++) await f.outbox.enqueue({ n });
  // The first stays under way until the test lets it go.
  const letFold = holdCall(f.outbox, "acknowledgeAndClaim", 1);
  const calls = recordWrites(f.outbox);
  const started: number[] = [];
  const gates = handlerGates(f.time);
  await using processor = processEvents(f.outbox, async (lease) => {
    const { n } = lease.payload as { n: number };
    started.push(n);
    await gates.handler(lease);
    if (n === 1) throw new Error("refused");
  }, f.options({ concurrency: 4, prefetch: false }));
  await using _gates = gates;
  await f.time.advance(0, f.wall);
  gates.open(2);
  await f.time.advance(0, f.wall);
  // 2's acknowledgement (with a claim for its slot) is under way; 1's
  // release frees a slot, so the loop's claim waits for its turn.
  gates.open(1);
  await f.time.advance(0, f.wall);
  assert.deepEqual(calls, ["claim 4", "claimed 4", "acknowledge 1 + claim 1"]);
  letFold();
  await f.time.advance(0, f.wall);
  assert.deepEqual(calls, [
    "claim 4",
    "claimed 4",
    "acknowledge 1 + claim 1",
    "claimed 1",
    "claim 1",
    "claimed 1",
  ]);
  assert.deepEqual(started, [1, 2, 3, 4, 5, 6]);
  assert.equal(processor.inFlight, 4);
  assert.deepEqual(
    { acknowledged: processor.counters.acknowledged, released: 1 },
    { acknowledged: 1, released: processor.counters.released },
  );
});

Deno.test("a handler that finishes while the loop's claim is under way is acknowledged with a claim that counts the slots that claim filled: concurrency holds", async () => {
  await using f = await fixture();
  await f.outbox.enqueue({ n: 1 });
  // The loop's second claim (for its one free slot) stays under way.
  const letClaim = holdCall(f.outbox, "claim", 2);
  const calls = recordWrites(f.outbox);
  const first = Promise.withResolvers<void>();
  let running = 0;
  let most = 0;
  const processor = processEvents(f.outbox, async (lease, { signal }) => {
    most = Math.max(most, ++running);
    try {
      if ((lease.payload as { n: number }).n === 1) await first.promise;
      else {
        await new Promise((resolve) =>
          signal.addEventListener("abort", resolve)
        );
      }
    } finally {
      running--;
    }
  }, f.options({ concurrency: 2, prefetch: false, stopTimeoutMs: 0 }));
  await f.time.advance(0, f.wall);
  assert.deepEqual(calls, ["claim 2", "claimed 1", "claim 1"]);
  for (let n = 2; n <= 4; n++) await f.outbox.enqueue({ n });
  first.resolve();
  await f.time.advance(0, f.wall);
  letClaim();
  for (let i = 0; i < 5; i++) await f.time.advance(0, f.wall);
  assert.deepEqual(calls, [
    "claim 2",
    "claimed 1",
    "claim 1",
    "claimed 1",
    "acknowledge 1 + claim 1",
    "claimed 1",
  ]);
  assert.equal(most, 2);
  assert.equal(processor.inFlight, 2);
  // stopTimeoutMs 0 runs on the manual timers.
  const stopped = processor.stop();
  await f.time.advance(0, f.wall);
  await stopped;
  assert.deepEqual(f.errors, []);
});

Deno.test("stop() during an acknowledgement with a claim waits for the handlers of the leases it claims, then releases them", async () => {
  await using f = await fixture();
  for (let n = 1; n <= 4; n++) await f.outbox.enqueue({ n });
  const letFold = holdCall(f.outbox, "acknowledgeAndClaim", 1);
  const signals = new Map<number, AbortSignal>();
  const processor = processEvents(f.outbox, async (lease, { signal }) => {
    signals.set(lease.eventId, signal);
    if (lease.eventId <= 2) return;
    await new Promise((_, reject) => {
      signal.addEventListener("abort", () => reject(signal.reason));
    });
  }, f.options({ concurrency: 2, stopTimeoutMs: 500 }));
  await f.time.advance(0, f.wall);
  const stopped = processor.stop();
  let done = false;
  void stopped.then(() => done = true);
  letFold();
  await f.time.advance(499, f.wall);
  assert.equal(done, false);
  assert.equal(processor.inFlight, 2);
  await f.time.advance(1, f.wall);
  await stopped;
  assert.equal(processor.inFlight, 0);
  assert.deepEqual([...signals.keys()], [1, 2, 3, 4]);
  assert.equal(signals.get(3)?.aborted, true);
  assert.equal(signals.get(4)?.aborted, true);
  assert.deepEqual({ ...processor.counters }, {
    claimed: 4,
    acknowledged: 2,
    staleAcknowledgements: 0,
    leasesLost: 0,
    released: 2,
    dead: 0,
    // The two handlers rejected with their aborted signal's reason.
    failed: 2,
  });
  const stats = await f.outbox.stats();
  assert.deepEqual({ done: stats.done, pending: stats.pending }, {
    done: 2,
    pending: 2,
  });
  assert.equal(stats.leased, 0);
});

Deno.test("an enqueue in the same process wakes an idle processor at once", async () => {
  await using f = await fixture();
  const seen: unknown[] = [];
  await using _processor = processEvents(f.outbox, (lease) => {
    seen.push(lease.payload);
  }, f.options({ pollMinMs: 60_000, pollMaxMs: 60_000 }));
  await settle();
  await f.outbox.enqueue({ n: 1 });
  await settle();
  await f.outbox.transaction((tx) => tx.enqueue({ n: 2 }));
  await settle();
  assert.deepEqual(seen, [{ n: 1 }, { n: 2 }]);
});

/**
 * Runs `before` just before the outbox's next read of when its next event
 * comes due, and `after` once that read is done but before the loop has its
 * answer (as a PostgreSQL NOTIFY can arrive before the read's COMMIT
 * resolves); once.
 */
function onNextRead(
  f: Fixture,
  hooks: { before?: () => void; after?: () => Promise<unknown> },
): void {
  const original = f.outbox.nextDueInMs.bind(f.outbox);
  let done = false;
  Object.defineProperty(f.outbox, "nextDueInMs", {
    configurable: true,
    value: async (options?: { readonly queue?: string }) => {
      if (done) return await original(options);
      done = true;
      hooks.before?.();
      const dueInMs = await original(options);
      await hooks.after?.();
      return dueInMs;
    },
  });
}

/** Moves the wall clock `ms` forward just before the next read, once. */
function comeDueBeforeNextRead(f: Fixture, ms: number): void {
  onNextRead(f, { before: () => f.wall.advance(ms) });
}

Deno.test("an idle loop claims an event that comes due just before it reads when the next one comes due, not a poll interval later", async () => {
  await using f = await fixture();
  await f.outbox.enqueue({ n: 1 }, { delayMs: 50 });
  comeDueBeforeNextRead(f, 50);
  const seen: unknown[] = [];
  await using _processor = processEvents(f.outbox, (lease) => {
    seen.push(lease.payload);
  }, f.options({ pollMinMs: 60_000, pollMaxMs: 60_000 }));
  await f.time.advance(100);
  assert.deepEqual(seen, [{ n: 1 }]);
});

Deno.test("a loop whose claim first comes back empty after work claims an event that comes due just before its next read, not a poll interval later", async () => {
  await using f = await fixture();
  await f.outbox.enqueue({ n: 1 });
  await f.outbox.enqueue({ n: 2 }, { delayMs: 50 });
  const seen: unknown[] = [];
  await using _processor = processEvents(f.outbox, (lease) => {
    // The loop's reads before this claim are done; the next follows the
    // first claim that comes back empty.
    if (seen.push(lease.payload) === 1) comeDueBeforeNextRead(f, 50);
  }, f.options({ pollMinMs: 60_000, pollMaxMs: 60_000 }));
  await f.time.advance(100);
  assert.deepEqual(seen, [{ n: 1 }, { n: 2 }]);
});

Deno.test("a delayed enqueue whose wake lands while the idle loop reads when the next event comes due is claimed when due, not a poll interval later", async () => {
  await using f = await fixture();
  onNextRead(f, { after: () => f.outbox.enqueue({ n: 1 }, { delayMs: 50 }) });
  const seen: unknown[] = [];
  await using _processor = processEvents(f.outbox, (lease) => {
    seen.push(lease.payload);
  }, f.options({ pollMinMs: 60_000, pollMaxMs: 60_000 }));
  await f.time.advance(100, f.wall);
  assert.deepEqual(seen, [{ n: 1 }]);
});

for (const folding of [true, false]) {
  const writes = folding ? 3 : 4;
  Deno.test(`${folding ? "with" : "without"} acknowledgeAndClaim, an event enqueued while the loop idles costs ${writes} transactions besides its enqueue, and one read outside a transaction`, async () => {
    const driver = counting(await openSqliteWasm(":memory:"));
    await using f = await fixture(driver);
    if (!folding) withoutFolding(f.outbox);
    let handled = 0;
    await using _processor = processEvents(f.outbox, () => {
      handled++;
    }, f.options({ pollMinMs: 60_000, pollMaxMs: 60_000 }));
    await f.time.advance(0, f.wall);
    const perEvent: number[][] = [];
    for (let n = 0; n < 3; n++) {
      const before = [driver.begins, driver.reads];
      await f.outbox.enqueue({ n });
      await f.time.advance(0, f.wall);
      await settle();
      // The woken loop claims without reading first; once the queue is
      // empty again it reads when the next event comes due (no write lock)
      // and claims once.
      perEvent.push([
        driver.begins - before[0]! - 1,
        driver.reads - before[1]!,
      ]);
    }
    assert.equal(handled, 3);
    assert.deepEqual(perEvent, [[writes, 1], [writes, 1], [writes, 1]]);
  });
}

Deno.test("an empty queue is polled with a doubling wait up to pollMaxMs", async () => {
  const driver = await openSqliteWasm(":memory:");
  const time = new ManualTimers();
  // Every claim reads its candidates once.
  const claims: number[] = [];
  const counting: Driver = {
    query: (sql, params) => {
      if (sql === SQL.candidates) claims.push(time.ms);
      return driver.query(sql, params);
    },
    run: (sql, params) => driver.run(sql, params),
    exec: (sql) => driver.exec(sql),
    close: () => driver.close(),
  };
  await using f = await fixture(counting);
  claims.length = 0;
  await using _processor = processEvents(f.outbox, () => {}, {
    ...f.options({ pollMinMs: 10, pollMaxMs: 80 }),
    monotonicNow: time.monotonicNow,
    timers: time,
  });
  await time.advance(400);
  assert.deepEqual(claims, [0, 10, 30, 70, 150, 230, 310, 390]);
});

Deno.test("a claim that throws is reported and the loop goes on", async () => {
  const driver = await openSqliteWasm(":memory:");
  let busy = 0;
  // The claim reads its candidates; the idle loop's read of the next due
  // time, before it, does not.
  const flaky: Driver = {
    query: (sql, params) => {
      if (sql === SQL.candidates && busy > 0) {
        busy--;
        return Promise.reject(new BusyError("database is locked"));
      }
      return driver.query(sql, params);
    },
    run: (sql, params) => driver.run(sql, params),
    exec: (sql) => driver.exec(sql),
    close: () => driver.close(),
  };
  await using f = await fixture(flaky);
  await f.outbox.enqueue({});
  const outbox = await Outbox.open(flaky, {
    now: f.wall.now,
    busyTimeoutMs: 0,
  });
  busy = 1;
  await using processor = processEvents(outbox, () => {}, f.options());
  await f.time.advance(0, f.wall);
  assert.equal(processor.counters.claimed, 0);
  assert.equal(f.errors.length, 1);
  assert.ok(f.errors[0] instanceof BusyError);
  await f.time.advance(10, f.wall);
  assert.equal(processor.counters.acknowledged, 1);
});

Deno.test("throwing onHandlerError and onError hooks never stop the loop: the failed event is released and delivered again", async () => {
  await using f = await fixture();
  const { eventId } = await f.outbox.enqueue({});
  const logged: unknown[][] = [];
  const consoleError = console.error;
  console.error = (...data: unknown[]) => logged.push(data);
  try {
    const attempts: number[] = [];
    await using processor = processEvents(f.outbox, (lease) => {
      attempts.push(lease.attempt);
      if (lease.attempt === 1) throw new Error("handler failed");
    }, {
      ...f.options({ backoffMinMs: 20 }),
      onHandlerError: () => {
        throw new Error("onHandlerError failed");
      },
      onError: () => {
        throw new Error("onError failed");
      },
    });
    await f.time.advance(1_000, f.wall);
    assert.deepEqual(attempts, [1, 2]);
    assert.equal(processor.counters.released, 1);
    assert.equal(processor.counters.acknowledged, 1);
    assert.equal((await f.outbox.explain(eventId))?.state, "done");
    assert.deepEqual(
      logged.map(([message, error]) => [message, (error as Error).message]),
      [["processEvents: the onError hook threw", "onError failed"]],
    );
  } finally {
    console.error = consoleError;
  }
});

Deno.test("a renewal that throws is reported and tried again a quarter interval later", async () => {
  const driver = await openSqliteWasm(":memory:");
  let busy = 0;
  const flaky: Driver = {
    query: (sql, params) => driver.query(sql, params),
    run: (sql, params) => {
      if (sql === "BEGIN IMMEDIATE" && busy > 0) {
        busy--;
        return Promise.reject(new BusyError("database is locked"));
      }
      return driver.run(sql, params);
    },
    exec: (sql) => driver.exec(sql),
    close: () => driver.close(),
  };
  await using f = await fixture(flaky);
  const { eventId } = await f.outbox.enqueue({});
  const outbox = await Outbox.open(flaky, {
    now: f.wall.now,
    busyTimeoutMs: 0,
  });
  const gate = Promise.withResolvers<void>();
  let signal: AbortSignal | undefined;
  await using _processor = processEvents(outbox, async (_, context) => {
    signal = context.signal;
    await gate.promise;
  }, f.options());
  await f.time.advance(0, f.wall);
  busy = 1;
  await f.time.advance(500, f.wall);
  assert.equal(f.errors.length, 1);
  assert.ok(f.errors[0] instanceof BusyError);
  assert.equal(signal?.aborted, false);
  const renewals = (await f.outbox.explain(eventId))!.history
    .filter((entry) => entry.kind === "renewed")
    .map((entry) => entry.at - 1_000_000);
  // 333 ms failed; 333 + floor(333 / 4) = 416 ms succeeded.
  assert.deepEqual(renewals, [416]);
  gate.resolve();
  await f.time.advance(0, f.wall);
});

Deno.test("context.transaction() commits the handler's row with its acknowledgement, counted once", async () => {
  await using f = await fixture();
  await f.outbox.transaction((tx) =>
    tx.run("CREATE TABLE mails (event INTEGER PRIMARY KEY, address TEXT)")
  );
  const { eventId } = await f.outbox.enqueue({ to: "ada@example.com" });
  const processor = processEvents<{ to: string }>(
    f.outbox as Outbox<{ to: string }>,
    async (lease, context) => {
      const rows = await context.transaction(async (tx) => {
        await tx.run("INSERT INTO mails VALUES (?, ?)", [
          lease.eventId,
          lease.payload.to,
        ]);
        return await tx.query("SELECT count(*) AS n FROM mails");
      });
      assert.deepEqual(rows, [{ n: 1 }]);
    },
    f.options(),
  );
  await f.time.advance(0, f.wall);
  await processor.stop();
  assert.deepEqual(processor.counters, {
    claimed: 1,
    acknowledged: 1,
    staleAcknowledgements: 0,
    leasesLost: 0,
    released: 0,
    dead: 0,
    failed: 0,
  });
  assert.deepEqual(
    await f.outbox.transaction((tx) => tx.query("SELECT * FROM mails")),
    [{ event: eventId, address: "ada@example.com" }],
  );
  assert.deepEqual(
    (await f.outbox.explain(eventId))!.history.map((entry) => entry.kind),
    ["claimed", "acknowledged"],
  );
  assert.deepEqual(f.errors, []);
});

Deno.test("context.transaction() on a lost lease writes nothing, throws LeaseLostError, and the event is neither acknowledged nor released", async () => {
  await using f = await fixture();
  await f.outbox.transaction((tx) =>
    tx.run("CREATE TABLE mails (event INTEGER PRIMARY KEY)")
  );
  const { eventId } = await f.outbox.enqueue({});
  const gate = Promise.withResolvers<void>();
  let signal: AbortSignal | undefined;
  let thrown: unknown;
  const processor = processEvents(f.outbox, async (lease, context) => {
    signal = context.signal;
    await gate.promise;
    try {
      await context.transaction((tx) =>
        tx.run("INSERT INTO mails VALUES (?)", [lease.eventId])
      );
    } catch (error) {
      thrown = error;
      throw error;
    }
  }, {
    ...f.options(),
    // The processor's clocks stand still: only the database sees the loss.
    now: () => 0,
  });
  await f.time.advance(0, f.wall);
  f.wall.advance(1_500);
  const taken = await f.outbox.claim();
  assert.equal(taken?.fence, 2);
  gate.resolve();
  await f.time.advance(0, f.wall);
  await processor.stop();
  assert.ok(thrown instanceof LeaseLostError);
  assert.equal(signal?.reason, thrown);
  assert.deepEqual(processor.counters, {
    claimed: 1,
    acknowledged: 0,
    staleAcknowledgements: 1,
    leasesLost: 1,
    released: 0,
    dead: 0,
    failed: 1,
  });
  assert.deepEqual(
    await f.outbox.transaction((tx) => tx.query("SELECT * FROM mails")),
    [],
  );
  assert.deepEqual(
    (await f.outbox.explain(eventId))!.history.map((entry) =>
      `${entry.kind}@${entry.fence}`
    ),
    ["claimed@1", "expired@1", "claimed@2"],
  );
  assert.deepEqual(f.errors, []);
});

Deno.test("a handler that throws after its context.transaction() committed leaves its event done, counted acknowledged and not failed, its error still reported", async () => {
  await using f = await fixture();
  await f.outbox.transaction((tx) =>
    tx.run("CREATE TABLE mails (event INTEGER PRIMARY KEY)")
  );
  const { eventId } = await f.outbox.enqueue({});
  const handlerErrors: unknown[] = [];
  const after = new Error("after the commit");
  const processor = processEvents(f.outbox, async (lease, context) => {
    await context.transaction((tx) =>
      tx.run("INSERT INTO mails VALUES (?)", [lease.eventId])
    );
    throw after;
  }, f.options({ onHandlerError: (error) => handlerErrors.push(error) }));
  await f.time.advance(0, f.wall);
  await processor.stop();
  assert.deepEqual(processor.counters, {
    claimed: 1,
    acknowledged: 1,
    staleAcknowledgements: 0,
    leasesLost: 0,
    released: 0,
    dead: 0,
    failed: 0,
  });
  assert.deepEqual(handlerErrors, [after]);
  assert.deepEqual(
    (await f.outbox.explain(eventId))!.history.map((entry) => entry.kind),
    ["claimed", "acknowledged"],
  );
  assert.deepEqual(f.errors, []);
});

Deno.test("a second context.transaction() in one handler throws saying the first acknowledged the lease, writes nothing, and counts no lost lease or stale acknowledgement", async () => {
  await using f = await fixture();
  await f.outbox.transaction((tx) =>
    tx.run("CREATE TABLE mails (event INTEGER)")
  );
  const { eventId } = await f.outbox.enqueue({});
  let thrown: unknown;
  let signal: AbortSignal | undefined;
  const processor = processEvents(f.outbox, async (lease, context) => {
    signal = context.signal;
    await context.transaction((tx) =>
      tx.run("INSERT INTO mails VALUES (?)", [lease.eventId])
    );
    try {
      await context.transaction((tx) =>
        tx.run("INSERT INTO mails VALUES (?)", [-lease.eventId])
      );
    } catch (error) {
      thrown = error;
    }
  }, f.options());
  await f.time.advance(0, f.wall);
  await processor.stop();
  assert.ok(thrown instanceof Error && !(thrown instanceof LeaseLostError));
  assert.equal(
    thrown.message,
    `Cannot run context.transaction as this handler's first transaction acknowledged its lease already (event ${eventId}, fence 1): its writes committed with it; make all of a handler's writes in one transaction`,
  );
  assert.equal(signal?.aborted, false);
  assert.deepEqual(processor.counters, {
    claimed: 1,
    acknowledged: 1,
    staleAcknowledgements: 0,
    leasesLost: 0,
    released: 0,
    dead: 0,
    failed: 0,
  });
  assert.deepEqual(
    await f.outbox.transaction((tx) => tx.query("SELECT * FROM mails")),
    [{ event: eventId }],
  );
  assert.deepEqual(
    (await f.outbox.explain(eventId))!.history.map((entry) => entry.kind),
    ["claimed", "acknowledged"],
  );
  assert.deepEqual(f.errors, []);
});

Deno.test("processEvents() leases and renews for the outbox's leaseMs unless told otherwise", async () => {
  await using f = await fixture();
  await using outbox = await Outbox.open(await openSqliteWasm(":memory:"), {
    now: f.wall.now,
    leaseMs: 600,
  });
  const { eventId } = await outbox.enqueue({});
  const gate = Promise.withResolvers<void>();
  const { leaseMs: _, ...options } = f.options();
  let leaseUntil: number | undefined;
  const processor = processEvents(outbox, async (lease) => {
    leaseUntil = lease.leaseUntil;
    await gate.promise;
  }, options);
  await f.time.advance(250, f.wall);
  assert.equal(leaseUntil, 1_000_000 + 600);
  // Renewed every 600 / 3 ms, each time for 600 ms.
  assert.deepEqual(
    (await outbox.explain(eventId))!.history.map((entry) =>
      `${entry.kind}@${entry.at - 1_000_000}..${entry.leaseUntil! - 1_000_000}`
    ),
    ["claimed@0..600", "renewed@200..800"],
  );
  gate.resolve();
  await f.time.advance(0, f.wall);
  await processor.stop();
  assert.equal(processor.counters.acknowledged, 1);
});

/**
 * A driver that counts its statements, to see a loop go quiet, its
 * transactions (BEGIN statements), and its reads of the next due time run
 * outside a transaction.
 */
function counting(
  driver: Driver,
): Driver & { calls: number; begins: number; reads: number } {
  const counted = {
    calls: 0,
    begins: 0,
    reads: 0,
    query: (sql: string, params?: readonly SqlValue[]) => {
      counted.calls++;
      if (sql === SQLITE.nextDue && !driver.inTransaction?.()) counted.reads++;
      return driver.query(sql, params);
    },
    run: (sql: string, params?: readonly SqlValue[]) => {
      counted.calls++;
      if (sql.startsWith("BEGIN")) counted.begins++;
      return driver.run(sql, params);
    },
    exec: (sql: string) => driver.exec(sql),
    close: () => driver.close(),
  };
  return counted;
}

Deno.test("an idle processor whose outbox is closed stops claiming on its own and reports nothing", async () => {
  const driver = counting(await openSqliteWasm(":memory:"));
  await using f = await fixture(driver);
  const processor = processEvents(f.outbox, () => {}, f.options());
  await f.time.advance(0, f.wall);
  await f.outbox.close();
  const before = driver.calls;
  await f.time.advance(10, f.wall);
  // The closed outbox refuses the claim before the driver sees it; silence.
  assert.equal(driver.calls, before);
  await f.time.advance(5_000, f.wall);
  assert.equal(driver.calls, before);
  await processor.stop();
  assert.deepEqual(f.errors, []);
  assert.equal(processor.inFlight, 0);
});

Deno.test("a processor whose database file is renamed away reports DatabaseMovedError once and stops, as for a closed outbox", async () => {
  const dir = await Deno.makeTempDir({ prefix: "worker_moved_" });
  try {
    const path = join(dir, "outbox.db");
    const driver = counting(await openDenoFile(path));
    await using f = await fixture(driver);
    const processor = processEvents(f.outbox, () => {}, f.options());
    await f.time.advance(0, f.wall);
    await Deno.rename(path, join(dir, "renamed.db"));
    // An event committed at the new path: claiming it is a write, which the
    // connection that opened the old path must refuse.
    {
      await using other = await Outbox.open(
        await openDenoFile(join(dir, "renamed.db")),
        { now: f.wall.now },
      );
      await other.enqueue({});
    }
    await f.time.advance(100, f.wall);
    const before = driver.calls;
    await f.time.advance(5_000, f.wall);
    // Every claim would fail the same way: the loop stopped polling.
    assert.equal(driver.calls, before);
    assert.equal(f.errors.length, 1);
    assert.ok(f.errors[0] instanceof DatabaseMovedError, String(f.errors[0]));
    await processor.stop();
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a running handler's outbox closing aborts its signal at the next renewal, stops the processor and releases nothing", async () => {
  const driver = counting(await openSqliteWasm(":memory:"));
  await using f = await fixture(driver);
  await f.outbox.enqueue({});
  const gate = Promise.withResolvers<void>();
  let signal: AbortSignal | undefined;
  const processor = processEvents(f.outbox, async (_, context) => {
    signal = context.signal;
    await gate.promise;
  }, f.options());
  await f.time.advance(0, f.wall);
  await f.outbox.close();
  const before = driver.calls;
  await f.time.advance(333, f.wall);
  assert.equal(signal?.aborted, true);
  assert.equal((signal?.reason as DOMException).name, "AbortError");
  assert.equal(processor.inFlight, 0);
  await processor.stop();
  gate.resolve();
  await f.time.advance(5_000, f.wall);
  // The closed outbox refuses the renewal before the driver sees it, and no
  // claim, acknowledgement or release follows.
  assert.equal(driver.calls, before);
  assert.deepEqual(processor.counters, {
    claimed: 1,
    acknowledged: 0,
    staleAcknowledgements: 0,
    leasesLost: 1,
    released: 0,
    dead: 0,
    failed: 0,
  });
  assert.deepEqual(f.errors, []);
});

Deno.test("an aborted signal option stops the processor like stop()", async () => {
  await using f = await fixture();
  const controller = new AbortController();
  const processor = processEvents(
    f.outbox,
    () => {},
    f.options({ signal: controller.signal }),
  );
  controller.abort();
  await processor.stop();
  await f.outbox.enqueue({});
  await f.time.advance(100, f.wall);
  assert.equal(processor.counters.claimed, 0);
  assert.equal((await f.outbox.stats()).pending, 1);
});

Deno.test("invalid options throw TypeError or RangeError naming the field", async () => {
  await using f = await fixture();
  const start = (options: unknown, handler: unknown = () => {}) => () =>
    processEvents(
      f.outbox,
      handler as Handler<unknown>,
      options as ProcessOptions,
    );
  assert.throws(start({ concurrency: 0 }), {
    name: "RangeError",
    message:
      "Cannot process events as 'concurrency' must be a positive integer at most 10000: current value is 0",
  });
  assert.throws(start({ leaseMs: NaN }), {
    name: "RangeError",
    message:
      "Cannot process events as 'leaseMs' must be an integer of at least 3 at most 31536000000: current value is NaN",
  });
  assert.throws(start({ pollMinMs: "10" }), {
    name: "TypeError",
    message:
      "Cannot process events as 'pollMinMs' must be a positive integer: current value is \"10\"",
  });
  assert.throws(start({ backoffJitter: 1.5 }), {
    name: "RangeError",
    message:
      "Cannot process events as 'backoffJitter' must be a number from 0 to 1: current value is 1.5",
  });
  assert.throws(start({ backoffMultiplier: Infinity }), {
    name: "RangeError",
    message:
      "Cannot process events as 'backoffMultiplier' must be a finite number of at least 1: current value is Infinity",
  });
  assert.throws(start({ leaseMs: 1_000, renewIntervalMs: 900 }), {
    name: "RangeError",
    message:
      "Cannot process events as 'renewIntervalMs' + 'marginMs' must be below 'leaseMs' (1000): current value is 1100",
  });
  assert.throws(start({}, "handler"), {
    name: "TypeError",
    message:
      "Cannot process events as 'handler' must be a function: current value is \"handler\"",
  });
  await f.outbox.enqueue({});
  await settle();
  assert.equal((await f.outbox.stats()).pending, 1);
});

Deno.test("processEvents() refuses a signal that is not an AbortSignal, timers without their functions, a null leaseMs and an outbox missing a method or its leaseMs, naming them, before it subscribes to the outbox", async () => {
  await using f = await fixture();
  let subscribed = 0;
  const watched = (without?: string) =>
    new Proxy(f.outbox, {
      get(target, key) {
        if (key === without) return undefined;
        const value = Reflect.get(target, key, target);
        if (typeof value !== "function") return value;
        return (...args: unknown[]) => {
          if (key === "onEnqueue") subscribed++;
          return value.apply(target, args);
        };
      },
    });
  const start = (options: unknown, outbox = watched()) => () =>
    processEvents(outbox, () => {}, options as ProcessOptions);
  for (
    const [signal, shown] of [
      [5, "5"],
      [{ aborted: false }, "an object"],
      ["x", '"x"'],
      [null, "null"],
    ] as const
  ) {
    assert.throws(start({ signal }), {
      name: "TypeError",
      message:
        `Cannot process events as 'signal' must be an AbortSignal: current value is ${shown}`,
    });
  }
  assert.throws(start({ timers: 5 }), {
    name: "TypeError",
    message:
      "Cannot process events as 'timers' must be an object of setTimeout and clearTimeout: current value is 5",
  });
  assert.throws(start({ timers: { setTimeout } }), {
    name: "TypeError",
    message:
      "Cannot process events as 'timers.clearTimeout' must be a function: current value is undefined",
  });
  assert.throws(
    start({ timers: { setTimeout, clearTimeout, setImmediate: 1 } }),
    {
      name: "TypeError",
      message:
        "Cannot process events as 'timers.setImmediate' must be a function: current value is 1",
    },
  );
  assert.throws(start({}, watched("renew")), {
    name: "TypeError",
    message:
      "Cannot process events as 'outbox' must be an outbox: its 'renew' is not a function",
  });
  assert.throws(start({ leaseMs: null }), {
    name: "TypeError",
    message:
      "Cannot process events as 'leaseMs' must be an integer of at least 3: current value is null",
  });
  assert.throws(start({}, watched("leaseMs")), {
    name: "TypeError",
    message:
      "Cannot process events as 'outbox.leaseMs' is required: current value is undefined",
  });
  assert.equal(subscribed, 0);
  // A real signal still works, and then the loop subscribes once.
  const controller = new AbortController();
  const processor = processEvents(watched(), () => {}, {
    signal: controller.signal,
  });
  assert.equal(subscribed, 1);
  controller.abort();
  await processor.stop();
});
