/**
 * Telemetry that fails never touches delivery: a span processor, an
 * instrument or a gauge's read that throws, with the real SDK, leaves every
 * event delivered and acknowledged, rejects nothing unhandled, and is
 * reported once per kind of fault.
 */
import assert from "node:assert/strict";
import {
  type Attributes,
  context,
  type ContextManager,
  type Meter,
  metrics,
  ROOT_CONTEXT,
  trace,
} from "@opentelemetry/api";
import {
  AggregationTemporality,
  InMemoryMetricExporter,
  MeterProvider,
  PeriodicExportingMetricReader,
  type ViewOptions,
} from "npm:@opentelemetry/sdk-metrics@2.12.1";
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
  type SpanProcessor,
} from "npm:@opentelemetry/sdk-trace-base@2.12.1";
import type { Outbox } from "../lease.ts";
import { type ProcessableOutbox, processEvents } from "../worker.ts";
import { fixture } from "./worker_fixture.ts";

const EVENTS = 12;

/** A span processor that throws in the named hook and passes the rest on. */
function throwingIn(hook: "onStart" | "onEnd"): SpanProcessor {
  const inner = new SimpleSpanProcessor(new InMemorySpanExporter());
  return {
    onStart: (span, context) => {
      if (hook === "onStart") throw new Error("onStart refused");
      inner.onStart(span, context);
    },
    onEnd: (span) => {
      if (hook === "onEnd") throw new Error("onEnd refused");
      inner.onEnd(span);
    },
    forceFlush: () => inner.forceFlush(),
    shutdown: () => inner.shutdown(),
  };
}

/** An SDK view that makes every measurement of `instrumentName` throw. */
function throwingView(instrumentName: string): ViewOptions {
  return {
    instrumentName,
    attributesProcessors: [{
      process(): Attributes {
        throw new Error(`${instrumentName} refused`);
      },
    }],
  };
}

interface Setup {
  spanProcessors?: SpanProcessor[];
  views?: ViewOptions[];
  /** Wraps the outbox the processor (and its gauges) sees. */
  wrap?: (outbox: Outbox) => ProcessableOutbox<unknown>;
  /** Wraps the SDK's meter. */
  meter?: (meter: Meter) => Meter;
  /** What each event's first attempt rejects with, if anything. */
  firstAttemptRejects?: unknown;
  /** Collects the metrics once while the handlers run. */
  collectWhileHandling?: boolean;
  /** Registered as the global context manager. */
  contextManager?: ContextManager;
}

/**
 * Registers the real SDK as the global providers, delivers twelve events
 * through processEvents with three at a time, and returns what happened:
 * the handler's calls, the outbox's counts, the processor's counters, what
 * was written to console.error and the unhandled rejections seen.
 */
async function deliver(setup: Setup) {
  const spanExporter = new InMemorySpanExporter();
  const tracerProvider = new BasicTracerProvider({
    spanProcessors: setup.spanProcessors ??
      [new SimpleSpanProcessor(spanExporter)],
  });
  const reader = new PeriodicExportingMetricReader({
    exporter: new InMemoryMetricExporter(AggregationTemporality.DELTA),
    exportIntervalMillis: 3_600_000,
  });
  const meterProvider = new MeterProvider({
    readers: [reader],
    views: setup.views ?? [],
  });
  trace.setGlobalTracerProvider(tracerProvider);
  if (setup.contextManager !== undefined) {
    context.setGlobalContextManager(setup.contextManager);
  }
  const wrapMeter = setup.meter;
  metrics.setGlobalMeterProvider(
    wrapMeter === undefined ? meterProvider : {
      getMeter: (...args) => wrapMeter(meterProvider.getMeter(...args)),
    },
  );
  const reported: unknown[][] = [];
  const consoleError = console.error;
  console.error = (...data: unknown[]) => reported.push(data);
  const unhandled: unknown[] = [];
  const onUnhandled = (event: PromiseRejectionEvent) => {
    event.preventDefault();
    unhandled.push(event.reason);
  };
  globalThis.addEventListener("unhandledrejection", onUnhandled);
  const f = await fixture();
  const { outbox, wall, time } = f;
  try {
    for (let i = 0; i < EVENTS; i++) await outbox.enqueue({ i });
    const handled: number[] = [];
    const processor = processEvents(
      setup.wrap?.(outbox) ?? outbox,
      async (lease) => {
        await Promise.resolve();
        if ("firstAttemptRejects" in setup && lease.attempt === 1) {
          throw setup.firstAttemptRejects;
        }
        handled.push((lease.payload as { i: number }).i);
      },
      f.options({ concurrency: 3 }),
    );
    if (setup.collectWhileHandling) {
      await reader.forceFlush().catch(() => {});
    }
    await time.advance(1_000, wall);
    await processor.stop();
    // A rejection left unhandled is reported on a later turn.
    await new Promise((resolve) => setTimeout(resolve, 0));
    return {
      handled: handled.sort((a, b) => a - b),
      stats: await outbox.stats(),
      counters: processor.counters,
      spans: spanExporter.getFinishedSpans(),
      errors: f.errors,
      reported,
      unhandled,
    };
  } finally {
    console.error = consoleError;
    globalThis.removeEventListener("unhandledrejection", onUnhandled);
    await f[Symbol.asyncDispose]();
    await meterProvider.shutdown().catch(() => {});
    await tracerProvider.shutdown().catch(() => {});
    trace.disable();
    metrics.disable();
    context.disable();
  }
}

/** Asserts every event was handled once and acknowledged, nothing else. */
function assertDelivered(result: Awaited<ReturnType<typeof deliver>>): void {
  assert.deepEqual(result.handled, [...Array(EVENTS).keys()]);
  assert.equal(result.stats.done, EVENTS);
  assert.equal(result.stats.dead, 0);
  assert.equal(result.stats.pending, 0);
  assert.equal(result.stats.leased, 0);
  assert.equal(result.counters.acknowledged, EVENTS);
  assert.equal(result.counters.failed, 0);
  assert.equal(result.counters.released, 0);
  assert.deepEqual(result.errors, []);
  assert.deepEqual(result.unhandled, []);
}

/** The one console.error report, naming the fault's kind and its error. */
function assertReportedOnce(
  result: Awaited<ReturnType<typeof deliver>>,
  kind: string,
  message: string,
): void {
  assert.equal(result.reported.length, 1, String(result.reported));
  const [text, error] = result.reported[0]!;
  assert.match(String(text), new RegExp(`telemetry's ${kind} failed`));
  assert.equal((error as Error).message, message);
}

Deno.test("a span processor that throws in onStart leaves all 12 events delivered and acknowledged, and is reported once", async () => {
  const result = await deliver({ spanProcessors: [throwingIn("onStart")] });
  assertDelivered(result);
  assertReportedOnce(result, "span start", "onStart refused");
});

Deno.test("a span processor that throws in onEnd leaves all 12 events delivered and acknowledged, with no unhandled rejection, and is reported once", async () => {
  const result = await deliver({ spanProcessors: [throwingIn("onEnd")] });
  assertDelivered(result);
  assertReportedOnce(result, "span end", "onEnd refused");
});

Deno.test("a counter that throws on add leaves all 12 events delivered and acknowledged, and is reported once", async () => {
  const result = await deliver({
    views: [
      throwingView("outbox.events.claimed"),
      throwingView("outbox.events.acknowledged"),
    ],
  });
  assertDelivered(result);
  assertReportedOnce(result, "counter", "outbox.events.claimed refused");
});

Deno.test("a histogram that throws on record leaves all 12 events delivered and acknowledged, and is reported once", async () => {
  const result = await deliver({
    views: [throwingView("outbox.handler.duration")],
  });
  assertDelivered(result);
  assertReportedOnce(result, "histogram", "outbox.handler.duration refused");
});

Deno.test("a gauge callback whose read throws while events are handled leaves all 12 delivered and acknowledged, and is reported once", async () => {
  const result = await deliver({
    collectWhileHandling: true,
    wrap: (outbox) =>
      new Proxy(outbox, {
        get(target, key) {
          if (key === "stats") {
            return () => Promise.reject(new Error("stats refused"));
          }
          const value = Reflect.get(target, key, target);
          return typeof value === "function" ? value.bind(target) : value;
        },
      }) as unknown as ProcessableOutbox<unknown>,
  });
  assertDelivered(result);
  assertReportedOnce(result, "gauge", "stats refused");
});

Deno.test("a meter whose instruments cannot be created leaves all 12 events delivered and acknowledged, and is reported once", async () => {
  const result = await deliver({
    // The SDK's meter, but its histograms cannot be made.
    meter: (meter) =>
      new Proxy(meter, {
        get(target, key) {
          if (key === "createHistogram") {
            return () => {
              throw new Error("no histograms");
            };
          }
          const value = Reflect.get(target, key, target);
          return typeof value === "function" ? value.bind(target) : value;
        },
      }),
  });
  assertDelivered(result);
  assertReportedOnce(result, "instruments", "no histograms");
});

Deno.test("a handler that rejects with an unprintable value (a null-prototype object) has its span marked failed, with no unhandled rejection, and its event delivered on the next attempt", async () => {
  const result = await deliver({
    firstAttemptRejects: Object.create(null),
  });
  assert.deepEqual(result.handled, [...Array(EVENTS).keys()]);
  assert.equal(result.stats.done, EVENTS);
  assert.equal(result.counters.acknowledged, EVENTS);
  assert.equal(result.counters.released, EVENTS);
  assert.deepEqual(result.unhandled, []);
  assert.deepEqual(result.reported, []);
  const failed = result.spans.filter((span) => span.status.code === 2);
  assert.equal(failed.length, EVENTS);
  // The text the event keeps as its last error (describeError).
  assert.equal(failed[0]!.status.message, "an unprintable [object Object]");
  assert.equal(failed[0]!.attributes["error.type"], "object");
});

Deno.test("a process whose span processor throws in onEnd lives: it delivers all 12 events and exits 0", async () => {
  const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      new URL("./fixtures/otel_faulty_child.ts", import.meta.url).pathname,
    ],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const err = new TextDecoder().decode(stderr);
  assert.equal(code, 0, err);
  assert.equal(new TextDecoder().decode(stdout), "12 acknowledged\n");
  assert.equal(err.match(/telemetry's span end failed/g)?.length, 1, err);
});

/** A context manager whose `with` runs its callback as `run` says. */
function contextManager(
  run: (fn: () => unknown) => unknown,
): ContextManager {
  return {
    active: () => ROOT_CONTEXT,
    with:
      ((_context: unknown, fn: () => unknown) =>
        run(fn)) as unknown as ContextManager["with"],
    bind: <T>(_context: unknown, target: T) => target,
    enable() {
      return this;
    },
    disable() {
      return this;
    },
  };
}

Deno.test("a context manager that runs its callback twice, or later instead of now, leaves each of the 12 events handled once", async () => {
  for (
    const [name, run] of [
      ["twice", (fn: () => unknown) => {
        fn();
        return fn();
      }],
      ["later", (fn: () => unknown) => {
        queueMicrotask(() => fn());
        return undefined;
      }],
    ] as const
  ) {
    const result = await deliver({ contextManager: contextManager(run) });
    assert.deepEqual(result.handled, [...Array(EVENTS).keys()], name);
    assert.equal(result.stats.done, EVENTS, name);
    assert.deepEqual(result.unhandled, [], name);
  }
});

Deno.test("a meter whose instruments lack their add or record leaves all 12 events delivered and acknowledged, and is reported once", async () => {
  const result = await deliver({
    meter: (meter) =>
      new Proxy(meter, {
        get(target, key) {
          if (key === "createCounter" || key === "createHistogram") {
            return () => ({});
          }
          const value = Reflect.get(target, key, target);
          return typeof value === "function" ? value.bind(target) : value;
        },
      }),
  });
  assertDelivered(result);
  assert.equal(result.reported.length, 1, String(result.reported));
  assert.match(
    String(result.reported[0]![0]),
    /telemetry's instruments failed/,
  );
  assert.ok(result.reported[0]![1] instanceof TypeError);
});
