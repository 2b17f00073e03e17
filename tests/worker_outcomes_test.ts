import assert from "node:assert/strict";
import {
  type Lease,
  PermanentError,
  type ProcessOptions,
  RetryAfterError,
} from "../mod.ts";
import { processEvents, type Timers } from "../worker.ts";
import { fixture, type ManualTimers } from "./worker_fixture.ts";

const MAX_TIMER_MS = 2 ** 31 - 1;

Deno.test("a handler that throws PermanentError makes its event a dead letter at once, with its reason", async () => {
  await using f = await fixture();
  const { eventId } = await f.outbox.enqueue({ to: "ada@example.com" });
  const processor = processEvents(f.outbox, () => {
    throw new PermanentError("receiver answered 422", { status: 422 });
  }, f.options());
  await f.time.advance(0, f.wall);
  await processor.stop();
  const [letter] = await f.outbox.deadLetters();
  assert.equal(letter?.eventId, eventId);
  assert.equal(letter?.attempts, 1);
  assert.equal(letter?.lastError, "PermanentError: receiver answered 422");
  assert.equal(processor.counters.dead, 1);
  assert.equal(processor.counters.released, 0);
  assert.equal(processor.counters.failed, 1);
});

Deno.test("a handler that throws RetryAfterError releases its event for exactly that delay, not the backoff", async () => {
  await using f = await fixture();
  const { eventId } = await f.outbox.enqueue({ to: "ada@example.com" });
  const attempts: number[] = [];
  const processor = processEvents(f.outbox, (lease) => {
    attempts.push(f.time.ms);
    if (lease.attempt === 1) {
      throw new RetryAfterError(5_000, "receiver answered 429");
    }
  }, f.options({ backoffMinMs: 100 }));
  await f.time.advance(0, f.wall);
  const [event] = await f.outbox.list({ state: "pending" });
  assert.equal(event?.id, eventId);
  assert.equal(event?.dueAt, f.wall.ms + 5_000);
  assert.equal(event?.lastError, "RetryAfterError: receiver answered 429");
  await f.time.advance(4_999, f.wall);
  assert.deepEqual(attempts, [0]);
  await f.time.advance(1, f.wall);
  await processor.stop();
  assert.deepEqual(attempts, [0, 5_000]);
  assert.equal(processor.counters.acknowledged, 1);
});

Deno.test("RetryAfterError refuses a delay that is not an integer from 0 to 365 days", () => {
  assert.throws(() => new RetryAfterError(-1), {
    name: "RangeError",
    message:
      "Cannot make RetryAfterError as 'delayMs' must be a non-negative integer at most 31536000000: current value is -1",
  });
  assert.throws(() => new RetryAfterError("5" as never), RangeError);
});

Deno.test("onHandlerError receives every handler error with its lease; what the hook throws goes to onError and the event is still released", async () => {
  await using f = await fixture();
  const { eventId } = await f.outbox.enqueue({ to: "ada@example.com" });
  const failure = new Error("receiver answered 503");
  const seen: [unknown, Lease<unknown>][] = [];
  const processor = processEvents(
    f.outbox,
    () => {
      throw failure;
    },
    f.options({
      onHandlerError: (error, lease) => {
        seen.push([error, lease]);
        throw new Error("the hook itself failed");
      },
    }),
  );
  await f.time.advance(0, f.wall);
  await processor.stop();
  assert.equal(seen.length, 1);
  assert.equal(seen[0]![0], failure);
  assert.equal(seen[0]![1].eventId, eventId);
  assert.equal(f.errors.length, 1);
  assert.equal((f.errors[0] as Error).message, "the hook itself failed");
  assert.equal(processor.counters.released, 1);
  const explanation = await f.outbox.explain(eventId);
  assert.equal(explanation?.state, "pending");
  assert.equal(explanation?.lastError, "Error: receiver answered 503");
});

Deno.test("defect 1: a handler throwing Object.create(null) or an error whose message getter throws is released with a placeholder text, and nothing crashes", async () => {
  await using f = await fixture();
  await f.outbox.enqueue({ n: 1 });
  await f.outbox.enqueue({ n: 2 });
  const hostile = new Error("x");
  Object.defineProperty(hostile, "message", {
    get() {
      throw new Error("no message for you");
    },
  });
  const processor = processEvents(f.outbox, (lease) => {
    throw (lease.payload as { n: number }).n === 1
      ? Object.create(null)
      : hostile;
  }, f.options({ concurrency: 2 }));
  await f.time.advance(0, f.wall);
  await processor.stop();
  assert.deepEqual(f.errors, []);
  assert.equal(processor.counters.released, 2);
  const [first, second] = await f.outbox.list({ state: "pending" });
  assert.equal(first?.lastError, "an unprintable [object Object]");
  assert.equal(second?.lastError, "an unprintable [object Error]");
});

Deno.test("defect 2: handler error text with NUL, or a surrogate pair split at 65,536 characters, is stored sanitized and the event released", async () => {
  await using f = await fixture();
  await f.outbox.enqueue({ n: 1 });
  await f.outbox.enqueue({ n: 2 });
  // "Error: " is 7 characters: the cut at 65,536 falls inside the emoji.
  const long = "x".repeat(65_536 - 7 - 1) + "\u{1F600}";
  const processor = processEvents(f.outbox, (lease) => {
    throw new Error((lease.payload as { n: number }).n === 1 ? "a\0b" : long);
  }, f.options({ concurrency: 2 }));
  await f.time.advance(0, f.wall);
  await processor.stop();
  assert.deepEqual(f.errors, []);
  assert.equal(processor.counters.released, 2);
  const [first, second] = await f.outbox.list({ state: "pending" });
  assert.equal(first?.lastError, "Error: a\uFFFDb");
  assert.equal(second?.lastError?.length, 65_536);
  assert.equal(second?.lastError?.at(-1), "\uFFFD");
  assert.ok(second?.lastError?.isWellFormed());
});

Deno.test("defect 3: processEvents() refuses at start a concurrency above 10,000, a queue that is empty or not a string, and leaseMs or delays above 365 days", async () => {
  await using f = await fixture();
  await f.outbox.enqueue({ n: 1 });
  const start = (options: Record<string, unknown>) => () =>
    processEvents(f.outbox, () => {}, f.options(options as ProcessOptions));
  const cases: [Record<string, unknown>, string, string][] = [
    [
      { concurrency: 10_001 },
      "RangeError",
      "Cannot process events as 'concurrency' must be a positive integer at most 10000: current value is 10001",
    ],
    [
      { queue: "" },
      "TypeError",
      `Cannot process events as 'queue' must be a string of 1 to 1024 characters, no NUL or lone surrogate: current value is ""`,
    ],
    [
      { queue: 42 },
      "TypeError",
      "Cannot process events as 'queue' must be a string of 1 to 1024 characters, no NUL or lone surrogate: current value is 42",
    ],
    [
      { leaseMs: 31_536_000_001 },
      "RangeError",
      "Cannot process events as 'leaseMs' must be an integer of at least 3 at most 31536000000: current value is 31536000001",
    ],
    [
      { backoffMinMs: 31_536_000_001 },
      "RangeError",
      "Cannot process events as 'backoffMinMs' must be a non-negative integer at most 31536000000: current value is 31536000001",
    ],
    [
      { backoffMaxMs: 31_536_000_001 },
      "RangeError",
      "Cannot process events as 'backoffMaxMs' must be an integer of at least 100 at most 31536000000: current value is 31536000001",
    ],
    [
      { pollMaxMs: 31_536_000_001 },
      "RangeError",
      "Cannot process events as 'pollMaxMs' must be an integer of at least 10 at most 31536000000: current value is 31536000001",
    ],
    [
      { stopTimeoutMs: 31_536_000_001 },
      "RangeError",
      "Cannot process events as 'stopTimeoutMs' must be a non-negative integer at most 31536000000: current value is 31536000001",
    ],
    [
      { handlerTimeoutMs: 0 },
      "RangeError",
      "Cannot process events as 'handlerTimeoutMs' must be a positive integer at most 31536000000: current value is 0",
    ],
  ];
  for (const [options, name, message] of cases) {
    assert.throws(start(options), { name, message });
  }
  await f.time.advance(100, f.wall);
  assert.equal((await f.outbox.stats()).pending, 1);
});

/** Timers that record every delay asked of them, over manual time. */
class RecordingTimers implements Timers {
  readonly delays: number[] = [];
  constructor(readonly inner: ManualTimers) {}
  setTimeout(callback: () => void, delayMs: number): unknown {
    this.delays.push(delayMs);
    return this.inner.setTimeout(callback, delayMs);
  }
  clearTimeout(handle: unknown): void {
    this.inner.clearTimeout(handle);
  }
}

Deno.test("defect 4: timers past 2^31 - 1 ms are chained, never clamped: a 100-day lease renews after a third of it", async () => {
  await using f = await fixture();
  const { eventId } = await f.outbox.enqueue({ n: 1 });
  const timers = new RecordingTimers(f.time);
  const leaseMs = 100 * 86_400_000;
  const finish = Promise.withResolvers<void>();
  const processor = processEvents(
    f.outbox,
    () => finish.promise,
    f.options({ leaseMs, timers }),
  );
  await f.time.advance(0, f.wall);
  await f.time.advance(Math.floor(leaseMs / 3) - 1, f.wall);
  const renewals = async () =>
    (await f.outbox.explain(eventId))!.history.filter((e) =>
      e.kind === "renewed"
    ).length;
  assert.equal(await renewals(), 0);
  await f.time.advance(1, f.wall);
  assert.equal(await renewals(), 1);
  finish.resolve();
  await processor.stop();
  assert.ok(timers.delays.length > 0);
  assert.ok(
    timers.delays.every((ms) => ms <= MAX_TIMER_MS),
    `a delay above 2^31 - 1: ${Math.max(...timers.delays)}`,
  );
});

Deno.test("defect 4: stop() waits the whole of a 30-day stopTimeoutMs for a running handler", async () => {
  await using f = await fixture();
  await f.outbox.enqueue({ n: 1 });
  const timers = new RecordingTimers(f.time);
  const stopTimeoutMs = 30 * 86_400_000;
  const processor = processEvents(
    f.outbox,
    () => new Promise(() => {}),
    f.options({ stopTimeoutMs, timers, leaseMs: 60 * 86_400_000 }),
  );
  await f.time.advance(0, f.wall);
  let stopped = false;
  void processor.stop().then(() => stopped = true);
  await f.time.advance(MAX_TIMER_MS + 1, f.wall);
  assert.equal(stopped, false);
  await f.time.advance(stopTimeoutMs - MAX_TIMER_MS - 1, f.wall);
  assert.equal(stopped, true);
  assert.ok(timers.delays.every((ms) => ms <= MAX_TIMER_MS));
  assert.equal(processor.counters.released, 1);
});

Deno.test("defect 9: a handler that acknowledges its own lease counts as acknowledged, not as a stale acknowledgement", async () => {
  await using f = await fixture();
  await f.outbox.enqueue({ n: 1 });
  const processor = processEvents(f.outbox, async (lease) => {
    assert.equal(await f.outbox.acknowledge(lease), true);
  }, f.options());
  await f.time.advance(0, f.wall);
  await processor.stop();
  assert.equal(processor.counters.acknowledged, 1);
  assert.equal(processor.counters.staleAcknowledgements, 0);
  assert.equal((await f.outbox.stats()).done, 1);
});

Deno.test("a handler throwing a revoked Proxy, or one whose getPrototypeOf trap throws, has its event released with a placeholder text, and nothing crashes", async () => {
  await using f = await fixture();
  await f.outbox.enqueue({ n: 1 });
  await f.outbox.enqueue({ n: 2 });
  const revocable = Proxy.revocable({}, {});
  revocable.revoke();
  const trapping = new Proxy({}, {
    getPrototypeOf() {
      throw new Error("no prototype for you");
    },
  });
  const processor = processEvents(f.outbox, (lease) => {
    throw (lease.payload as { n: number }).n === 1 ? revocable.proxy : trapping;
  }, f.options({ concurrency: 2 }));
  await f.time.advance(0, f.wall);
  await processor.stop();
  assert.deepEqual(f.errors, []);
  assert.equal(processor.counters.failed, 2);
  assert.equal(processor.counters.released, 2);
  const [first, second] = await f.outbox.list({ state: "pending" });
  assert.equal(first?.attempt, 1);
  assert.equal(first?.lastError, "an error that cannot be printed");
  assert.equal(second?.lastError, "[object Object]");
});
