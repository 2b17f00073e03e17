import assert from "node:assert/strict";
import { metrics, SpanKind, SpanStatusCode, trace } from "@opentelemetry/api";
import {
  AggregationTemporality,
  DataPointType,
  InMemoryMetricExporter,
  MeterProvider,
  type MetricData,
  PeriodicExportingMetricReader,
} from "npm:@opentelemetry/sdk-metrics@2.12.1";
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  type ReadableSpan,
  SimpleSpanProcessor,
} from "npm:@opentelemetry/sdk-trace-base@2.12.1";
import { Outbox } from "../lease.ts";
import { openSqliteWasm } from "../drivers/sqlite_wasm.ts";
import { type Handler, processEvents, type ProcessOptions } from "../worker.ts";
import { ManualClock } from "./helpers.ts";
import { ManualTimers, settle } from "./worker_fixture.ts";

/**
 * An SDK registered as the global providers for one test: spans and metrics
 * land in memory, read with `spans()` and `metrics()`.
 */
async function sdk() {
  const spanExporter = new InMemorySpanExporter();
  const tracerProvider = new BasicTracerProvider({
    spanProcessors: [new SimpleSpanProcessor(spanExporter)],
  });
  const metricExporter = new InMemoryMetricExporter(
    AggregationTemporality.DELTA,
  );
  const reader = new PeriodicExportingMetricReader({
    exporter: metricExporter,
    exportIntervalMillis: 3_600_000,
  });
  const meterProvider = new MeterProvider({ readers: [reader] });
  trace.setGlobalTracerProvider(tracerProvider);
  metrics.setGlobalMeterProvider(meterProvider);
  const wall = new ManualClock(1_000_000);
  const time = new ManualTimers();
  const outbox = await Outbox.open(await openSqliteWasm(":memory:"), {
    now: wall.now,
    leaseMs: 1_000,
  });
  return {
    outbox,
    wall,
    time,
    options: (extra: ProcessOptions = {}): ProcessOptions => ({
      leaseMs: 1_000,
      pollMinMs: 10,
      pollMaxMs: 10,
      backoffMinMs: 100,
      backoffJitter: 0,
      now: wall.now,
      monotonicNow: time.monotonicNow,
      timers: time,
      onError: (error) => {
        throw error;
      },
      ...extra,
    }),
    spans: (): ReadableSpan[] => spanExporter.getFinishedSpans(),
    /** Collects now and returns each metric by name. */
    metrics: async (): Promise<Map<string, MetricData>> => {
      metricExporter.reset();
      await reader.forceFlush();
      const exported = metricExporter.getMetrics().flatMap((resource) =>
        resource.scopeMetrics.flatMap((scope) => scope.metrics)
      );
      return new Map(exported.map((m) => [m.descriptor.name, m]));
    },
    async [Symbol.asyncDispose]() {
      await outbox.close();
      await meterProvider.shutdown();
      await tracerProvider.shutdown();
      trace.disable();
      metrics.disable();
    },
  };
}

/** The one data point's value of a counter (`undefined` when never added to). */
function sum(found: Map<string, MetricData>, name: string): number | undefined {
  const metric = found.get(name);
  if (metric === undefined) return undefined;
  assert.equal(metric.dataPointType, DataPointType.SUM);
  assert.equal(metric.dataPoints.length, 1);
  const [point] = metric.dataPoints;
  assert.deepEqual(point!.attributes, {
    "messaging.system": "leased-outbox",
    "messaging.destination.name": "default",
  });
  return point!.value as number;
}

Deno.test("each handled event is one 'process {queue}' consumer span with its queue, event, fence, attempt and outcome", async () => {
  await using t = await sdk();
  const ok = await t.outbox.enqueue({ ok: true });
  const poison = await t.outbox.enqueue({ ok: false }, { maxAttempts: 2 });
  const handler: Handler<unknown> = (lease) => {
    if (!(lease.payload as { ok: boolean }).ok) {
      throw new TypeError(`refused on attempt ${lease.attempt}`);
    }
  };
  const processor = processEvents(t.outbox, handler, t.options());
  await t.time.advance(1_000, t.wall);
  await processor.stop();

  // By event, then attempt: the poison event's first handler runs on a
  // lease claimed ahead, so its span can end before the first one's, which
  // ends when its acknowledgement commits.
  const order = (span: ReturnType<typeof t.spans>[number]) =>
    Number(span.attributes["outbox.event.id"]) * 100 +
    Number(span.attributes["outbox.event.attempt"]);
  const ended = t.spans().sort((a, b) => order(a) - order(b));
  const spans = ended.map((span) => ({
    name: span.name,
    kind: span.kind,
    status: span.status.code,
    attributes: span.attributes,
  }));
  const common = {
    "messaging.system": "leased-outbox",
    "messaging.destination.name": "default",
    "messaging.operation.type": "process",
    "messaging.operation.name": "process",
  };
  const span = (
    { eventId, identity }: { eventId: number; identity: string },
    attempt: number,
    outcome: string,
    error?: string,
  ) => ({
    name: "process default",
    kind: SpanKind.CONSUMER,
    status: error === undefined ? SpanStatusCode.UNSET : SpanStatusCode.ERROR,
    attributes: {
      ...common,
      "messaging.message.id": identity,
      "outbox.event.identity": identity,
      "outbox.event.id": eventId,
      "outbox.lease.fence": attempt,
      "outbox.event.attempt": attempt,
      ...(error === undefined ? {} : { "error.type": error }),
      "outbox.outcome": outcome,
    },
  });
  assert.deepEqual(spans, [
    span(ok, 1, "acknowledged"),
    span(poison, 1, "released", "TypeError"),
    span(poison, 2, "dead", "TypeError"),
  ]);
  const [, failed] = ended;
  assert.equal(failed!.status.message, "TypeError: refused on attempt 1");
  assert.equal(failed!.events[0]?.name, "exception");
});

Deno.test("the counters and the handler-duration histogram add up to the processor's counters", async () => {
  await using t = await sdk();
  await t.outbox.enqueue({ ok: true });
  await t.outbox.enqueue({ ok: false }, { maxAttempts: 2 });
  const processor = processEvents(t.outbox, async (lease) => {
    await Promise.resolve();
    if (!(lease.payload as { ok: boolean }).ok) throw new Error("refused");
  }, t.options());
  await t.time.advance(1_000, t.wall);
  await processor.stop();
  const found = await t.metrics();
  // Handler failures are the spans' error status, not a counter.
  const { failed, ...counted } = processor.counters;
  assert.equal(failed, 2);
  assert.deepEqual({
    claimed: sum(found, "outbox.events.claimed"),
    acknowledged: sum(found, "outbox.events.acknowledged"),
    staleAcknowledgements: sum(found, "outbox.acknowledgements.stale"),
    leasesLost: sum(found, "outbox.leases.lost"),
    released: sum(found, "outbox.events.released"),
    dead: sum(found, "outbox.events.dead"),
  }, {
    ...counted,
    // Never added to: an SDK exports no point for them.
    staleAcknowledgements: undefined,
    leasesLost: undefined,
  });
  assert.deepEqual(counted, {
    claimed: 3,
    acknowledged: 1,
    staleAcknowledgements: 0,
    leasesLost: 0,
    released: 1,
    dead: 1,
  });
  const duration = found.get("outbox.handler.duration")!;
  assert.equal(duration.descriptor.unit, "ms");
  assert.equal(duration.dataPointType, DataPointType.HISTOGRAM);
  const histogram = duration.dataPoints[0]!.value as {
    count: number;
    min?: number;
  };
  assert.equal(histogram.count, 3);
  assert.ok(histogram.min! >= 0);
});

Deno.test("a stalled worker's lost lease and stale acknowledgement are counted, and its span ends as 'stale' with the loss marked", async () => {
  await using t = await sdk();
  const { eventId } = await t.outbox.enqueue({ to: "ada@example.com" });
  const gate = Promise.withResolvers<void>();
  const handler: Handler<unknown> = async (lease) => {
    if (lease.fence === 1) await gate.promise;
  };
  await using stalled = processEvents(t.outbox, handler, t.options());
  await t.time.advance(0, t.wall);
  // Its timers do not run while both clocks pass its lease.
  t.time.jump(1_500, t.wall);
  await using healthy = processEvents(t.outbox, handler, t.options());
  await settle();
  await t.time.advance(0, t.wall);
  gate.resolve();
  await t.time.advance(0, t.wall);
  await stalled.stop();
  await healthy.stop();

  const found = await t.metrics();
  assert.equal(sum(found, "outbox.leases.lost"), 1);
  assert.equal(sum(found, "outbox.acknowledgements.stale"), 1);
  assert.equal(sum(found, "outbox.events.acknowledged"), 1);
  const byFence = new Map(
    t.spans().map((span) => [span.attributes["outbox.lease.fence"], span]),
  );
  assert.equal(byFence.get(1)!.attributes["outbox.event.id"], eventId);
  assert.equal(byFence.get(1)!.attributes["outbox.outcome"], "stale");
  assert.equal(byFence.get(1)!.attributes["outbox.lease.lost"], true);
  assert.equal(byFence.get(2)!.attributes["outbox.outcome"], "acknowledged");
  assert.equal(byFence.get(2)!.attributes["outbox.lease.lost"], undefined);
});

Deno.test("the queue-depth and oldest-pending-age gauges read the processor's queue while it runs, and stop when it stops", async () => {
  await using t = await sdk();
  for (const n of [1, 2, 3]) {
    await t.outbox.enqueue({ n }, { queue: "mail" });
    t.wall.advance(100);
  }
  await t.outbox.enqueue({ other: true }, { queue: "webhooks" });
  const gate = Promise.withResolvers<void>();
  const processor = processEvents(
    t.outbox,
    () => gate.promise,
    t.options({ queue: "mail", concurrency: 1 }),
  );
  await t.time.advance(0, t.wall);
  t.wall.advance(700);
  const found = await t.metrics();
  const depth = found.get("outbox.queue.depth")!;
  assert.equal(depth.dataPointType, DataPointType.GAUGE);
  assert.deepEqual(
    Object.fromEntries(
      depth.dataPoints.map((p) => [p.attributes["outbox.state"], p.value]),
    ),
    // One running, one claimed ahead (prefetch).
    { pending: 1, leased: 2, done: 0, dead: 0 },
  );
  assert.ok(
    depth.dataPoints.every((p) =>
      p.attributes["messaging.destination.name"] === "mail"
    ),
  );
  // The oldest pending one is the third, enqueued 800 ms before "now".
  const oldest = found.get("outbox.queue.oldest_pending_age")!;
  assert.equal(oldest.descriptor.unit, "ms");
  assert.deepEqual(oldest.dataPoints.map((p) => p.value), [800]);

  gate.resolve();
  await t.time.advance(0, t.wall);
  await processor.stop();
  const after = await t.metrics();
  assert.equal(after.get("outbox.queue.depth"), undefined);
});

Deno.test("Deno's built-in exporter (OTEL_DENO=true) sends the spans and the metrics over OTLP without any SDK in the code", async () => {
  const received = new Map<string, string>();
  await using server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen: () => {} },
    async (request) => {
      // OTLP protobuf keeps names as plain UTF-8 bytes.
      const body = new TextDecoder().decode(await request.arrayBuffer());
      const path = new URL(request.url).pathname;
      received.set(path, (received.get(path) ?? "") + body);
      return new Response(null, { status: 200 });
    },
  );
  const { code, stderr } = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      new URL("./fixtures/otel_child.ts", import.meta.url).pathname,
    ],
    env: {
      OTEL_DENO: "true",
      OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${server.addr.port}`,
      OTEL_EXPORTER_OTLP_PROTOCOL: "http/protobuf",
      OTEL_METRIC_EXPORT_INTERVAL: "200",
    },
    stdout: "null",
    stderr: "piped",
  }).output();
  assert.equal(code, 0, new TextDecoder().decode(stderr));
  const traces = received.get("/v1/traces") ?? "";
  const metrics = received.get("/v1/metrics") ?? "";
  assert.ok(traces.includes("process default"), "a process span");
  for (const attribute of ["outbox.event.identity", "outbox.lease.fence"]) {
    assert.ok(traces.includes(attribute), attribute);
  }
  for (
    const name of [
      "outbox.events.claimed",
      "outbox.events.acknowledged",
      "outbox.handler.duration",
      "outbox.queue.depth",
    ]
  ) {
    assert.ok(metrics.includes(name), name);
  }
});

Deno.test("a handler throwing a revoked Proxy, sync or async, ends its span as an error with a placeholder text, and nothing crashes", async () => {
  await using t = await sdk();
  await t.outbox.enqueue({ sync: true });
  await t.outbox.enqueue({ sync: false });
  const revocable = Proxy.revocable({}, {});
  revocable.revoke();
  const processor = processEvents(t.outbox, (lease) => {
    if ((lease.payload as { sync: boolean }).sync) throw revocable.proxy;
    return Promise.reject(revocable.proxy);
  }, t.options({ concurrency: 2 }));
  await t.time.advance(0, t.wall);
  await processor.stop();
  assert.equal(processor.counters.released, 2);
  const spans = t.spans();
  assert.equal(spans.length, 2);
  for (const span of spans) {
    assert.equal(span.status.code, SpanStatusCode.ERROR);
    assert.equal(span.status.message, "an error that cannot be printed");
    assert.equal(span.attributes["error.type"], "object");
    assert.equal(span.attributes["outbox.outcome"], "released");
  }
});
