/**
 * OpenTelemetry for the processing loop, through `@opentelemetry/api` only:
 * whatever SDK the application registers (or Deno's built-in exporter, with
 * `OTEL_DENO=true`) receives a span per handled event and the loop's
 * metrics. Without one, the API's no-op implementations make every call a
 * few empty function calls.
 *
 * Names follow OpenTelemetry's messaging semantic conventions where they
 * fit (a `process {queue}` consumer span, `messaging.system`,
 * `messaging.destination.name`, `messaging.operation.type`,
 * `messaging.message.id`, `error.type`); what they have no name for is under
 * `outbox.` (the fence, the attempt, the outcome, the counters). Durations
 * are in milliseconds, as everywhere in this module, not the conventions'
 * seconds.
 *
 * | instrument | kind | unit |
 * |---|---|---|
 * | `outbox.events.claimed` | counter | `{event}` |
 * | `outbox.events.acknowledged` | counter | `{event}` |
 * | `outbox.acknowledgements.stale` | counter | `{event}` |
 * | `outbox.leases.lost` | counter | `{lease}` |
 * | `outbox.events.released` | counter | `{event}` |
 * | `outbox.events.dead` | counter | `{event}` |
 * | `outbox.handler.duration` | histogram | `ms` |
 * | `outbox.queue.depth` (per `outbox.state`) | observable gauge | `{event}` |
 * | `outbox.queue.oldest_pending_age` | observable gauge | `ms` |
 * | `outbox.wal.size` (SQLite in WAL mode) | observable gauge | `By` |
 * | `outbox.wal.checkpoint_held_back` (1 while a reader holds it back) | observable gauge | `1` |
 *
 * @module
 */
import {
  type Attributes,
  type BatchObservableResult,
  context,
  type Counter,
  createNoopMeter,
  type Histogram,
  type Meter,
  metrics,
  type ObservableGauge,
  type Span,
  SpanKind,
  SpanStatusCode,
  trace,
} from "@opentelemetry/api";
import type { Lease, Stats } from "./lease.ts";
import { describeError, isInstance } from "./validate.ts";
import {
  type GuardedSpan,
  type GuardedTracer,
  TelemetryGuard,
} from "./telemetry_guard.ts";

/** The instrumentation scope's name: the package's. */
export const INSTRUMENTATION_SCOPE = "@leased/outbox";
const VERSION = "0.1.0";
const SYSTEM = "leased-outbox";
// The API's one no-op meter: what getMeter returns while no SDK is registered.
const NOOP_METER = createNoopMeter();

/** What happened to a handled event, the span's `outbox.outcome`. */
export type Outcome =
  | "acknowledged"
  | "stale"
  | "released"
  | "dead"
  | "unfinished";

/** The loop's counters, as the processor's `counters` names them. */
export type CounterName =
  | "claimed"
  | "acknowledged"
  | "staleAcknowledgements"
  | "leasesLost"
  | "released"
  | "dead";

const OUTCOMES: Partial<Record<CounterName, Outcome>> = {
  acknowledged: "acknowledged",
  staleAcknowledgements: "stale",
  released: "released",
  dead: "dead",
};

/** What the gauges read of a processor's outbox. */
export interface ObservedOutbox {
  /** Whether the outbox was closed: a closed one is not read. */
  readonly closed: boolean;
  /** The queue of calls that name none, when the outbox says. */
  readonly queue?: string;
  /** Counts a queue's events per state. */
  stats(options?: { readonly queue?: string }): Promise<Stats>;
}

interface Handling {
  readonly span: GuardedSpan;
  readonly attributes: Attributes;
  outcome: Outcome;
}

/**
 * The telemetry of one processor: its spans, counters and the gauges of its
 * queue. Created by the processor; every method is cheap without an SDK.
 *
 * Nothing here may affect delivery: every call into the OpenTelemetry API
 * (and so into the registered SDK: span processors, views, exporters) goes
 * through a {@linkcode TelemetryGuard}, which skips a call that throws and
 * writes the first fault of each kind to `console.error`; only what the
 * handler itself throws or returns comes out of
 * {@linkcode ProcessorTelemetry.handle}.
 *
 * @ignore
 */
export class ProcessorTelemetry {
  readonly #meter: Meter;
  readonly #guard = new TelemetryGuard();
  // A proxy: it finds a tracer provider registered after it was made.
  readonly #tracer: GuardedTracer;
  readonly #counters: Record<CounterName, Counter>;
  readonly #duration: Histogram;
  readonly #depth: ObservableGauge;
  readonly #oldest: ObservableGauge;
  readonly #wal: readonly [size: ObservableGauge, heldBack: ObservableGauge];
  // Every entry is deleted by end(), which the processor calls for each
  // handled event.
  readonly #handling = new Map<object, Handling>();
  readonly #attributes = new Map<string, Attributes>();
  readonly #observe: (result: BatchObservableResult) => Promise<void>;

  /**
   * Creates the instruments from the global meter provider (the API has no
   * proxy for meters, so a processor started before the SDK was registered
   * keeps no-op ones) and observes the queue's depth through `outbox`.
   *
   * @param outbox The processor's outbox, read by the gauges.
   * @param queue The processor's queue; the outbox's when `undefined`
   * (the browser's shared outbox does not name it: its gauges then carry
   * no queue name).
   */
  constructor(outbox: ObservedOutbox, queue: string | undefined) {
    this.#meter = this.#guard.meter(() =>
      metrics.getMeter(INSTRUMENTATION_SCOPE, VERSION)
    );
    this.#tracer = this.#guard.tracer(() =>
      trace.getTracer(INSTRUMENTATION_SCOPE, VERSION)
    );
    const counter = (name: string, unit: string, description: string) =>
      this.#meter.createCounter(name, { unit, description });
    this.#counters = {
      claimed: counter("outbox.events.claimed", "{event}", "Events claimed"),
      acknowledged: counter(
        "outbox.events.acknowledged",
        "{event}",
        "Events acknowledged",
      ),
      staleAcknowledgements: counter(
        "outbox.acknowledgements.stale",
        "{event}",
        "Acknowledgements refused because another claim holds the event",
      ),
      leasesLost: counter(
        "outbox.leases.lost",
        "{lease}",
        "Handlers whose lease was lost or overdue for renewal",
      ),
      released: counter(
        "outbox.events.released",
        "{event}",
        "Events given back for a retry",
      ),
      dead: counter(
        "outbox.events.dead",
        "{event}",
        "Events that became dead letters on release",
      ),
    };
    this.#duration = this.#meter.createHistogram("outbox.handler.duration", {
      unit: "ms",
      description: "Time from the handler's start until it settled",
    });
    this.#depth = this.#meter.createObservableGauge("outbox.queue.depth", {
      unit: "{event}",
      description: "Events of the queue per state",
    });
    this.#oldest = this.#meter.createObservableGauge(
      "outbox.queue.oldest_pending_age",
      { unit: "ms", description: "Age of the queue's oldest pending event" },
    );
    this.#wal = [
      this.#meter.createObservableGauge("outbox.wal.size", {
        unit: "By",
        description: "Bytes in the SQLite database's write-ahead log",
      }),
      this.#meter.createObservableGauge("outbox.wal.checkpoint_held_back", {
        unit: "1",
        description: "1 while a reader holds the WAL's checkpoints back",
      }),
    ];
    const name = queue ?? outbox.queue;
    const attributes = name === undefined
      ? { "messaging.system": SYSTEM }
      : this.#attributesOf(name);
    this.#observe = async (result) => {
      // A closed outbox (the processor stopping) has nothing to report.
      if (outbox.closed) return;
      const stats = await outbox.stats(
        name === undefined ? {} : { queue: name },
      );
      for (const state of ["pending", "leased", "done", "dead"] as const) {
        result.observe(this.#depth, stats[state], {
          ...attributes,
          "outbox.state": state,
        });
      }
      result.observe(this.#oldest, stats.oldestPendingAgeMs, attributes);
      if (stats.wal !== undefined) {
        result.observe(this.#wal[0], stats.wal.sizeBytes, attributes);
        result.observe(
          this.#wal[1],
          stats.wal.checkpointHeldBack ? 1 : 0,
          attributes,
        );
      }
    };
    this.#meter.addBatchObservableCallback(this.#observe, [
      this.#depth,
      this.#oldest,
      ...this.#wal,
    ]);
  }

  /**
   * Runs a handler inside a new `process {queue}` span, which stays open
   * until {@linkcode ProcessorTelemetry.end}, and records its duration once
   * it settles.
   *
   * @param key The slot the lease is held in, for the later calls.
   * @param lease The lease being handled.
   * @param handler Calls the handler.
   * @returns What `handler` returned.
   */
  handle<T>(key: object, lease: Lease<unknown>, handler: () => T): T {
    const attributes = this.#attributesOf(lease.queue);
    this.#counters.claimed.add(1, attributes);
    const span = this.#tracer.startSpan(
      `process ${lease.queue}`,
      {
        kind: SpanKind.CONSUMER,
        attributes: {
          ...attributes,
          "messaging.operation.type": "process",
          "messaging.operation.name": "process",
          "messaging.message.id": lease.identity,
          "outbox.event.identity": lease.identity,
          "outbox.event.id": lease.eventId,
          "outbox.lease.fence": lease.fence,
          "outbox.event.attempt": lease.attempt,
        },
      },
    );
    const recording = span.isRecording();
    // Without an SDK nothing below would be seen: its clock reads, promise
    // callbacks and map entries were most of the cost per event (1.6 µs of
    // it, bench/telemetry_overhead.ts).
    if (!recording && this.#meter === NOOP_METER) return handler();
    this.#handling.set(key, { span, attributes, outcome: "unfinished" });
    const startedAt = performance.now();
    const settled = (error?: unknown) => {
      this.#duration.record(performance.now() - startedAt, attributes);
      if (error === undefined) return;
      span.recordException(
        isInstance(error, Error) ? error : new Error(describeError(error)),
      );
      span.setStatus({
        code: SpanStatusCode.ERROR,
        message: describeError(error),
      });
      span.setAttribute(
        "error.type",
        isInstance(error, Error) ? error.name : typeof error,
      );
    };
    let result: T;
    try {
      // A span that records nothing needs no context to be found in.
      result = recording ? this.#inContext(span.span, handler) : handler();
    } catch (error) {
      settled(error ?? new Error(describeError(error)));
      throw error;
    }
    Promise.resolve(result).then(
      () => settled(),
      (error) => settled(error ?? new Error(describeError(error))),
    );
    return result;
  }

  /**
   * Adds one to a counter; the last outcome counted for a slot becomes its
   * span's `outbox.outcome`.
   *
   * @param key The slot, as given to {@linkcode ProcessorTelemetry.handle}.
   * @param name The counter.
   */
  count(key: object, name: Exclude<CounterName, "claimed">): void {
    const handling = this.#handling.get(key);
    if (handling === undefined) return;
    this.#counters[name].add(1, handling.attributes);
    const outcome = OUTCOMES[name];
    if (outcome !== undefined) handling.outcome = outcome;
    else handling.span.setAttribute("outbox.lease.lost", true);
  }

  /**
   * Ends a slot's span, once its acknowledgement or release is done.
   *
   * @param key The slot, as given to {@linkcode ProcessorTelemetry.handle}.
   */
  end(key: object): void {
    const handling = this.#handling.get(key);
    if (handling === undefined) return;
    this.#handling.delete(key);
    handling.span.setAttribute("outbox.outcome", handling.outcome);
    handling.span.end();
  }

  /** Stops observing the queue's gauges. */
  close(): void {
    this.#meter.removeBatchObservableCallback(this.#observe, [
      this.#depth,
      this.#oldest,
      ...this.#wal,
    ]);
  }

  /**
   * Runs the handler with `span` as the active span; a context manager
   * that throws before or after it changes nothing the handler did.
   */
  #inContext<T>(span: Span, handler: () => T): T {
    let ran = false;
    let outcome: { value: T } | { error: unknown } | undefined;
    try {
      context.with(trace.setSpan(context.active(), span), () => {
        // Once only, and only now: a context manager that calls back twice,
        // or after with() returned (when the handler has run without it),
        // must not deliver the event again.
        if (ran) return;
        ran = true;
        try {
          outcome = { value: handler() };
        } catch (error) {
          outcome = { error };
        }
      });
    } catch (error) {
      this.#guard.fault("context", error);
    }
    if (!ran) {
      ran = true;
      return handler();
    }
    if (outcome === undefined || "error" in outcome) throw outcome?.error;
    return outcome.value;
  }

  #attributesOf(queue: string): Attributes {
    let attributes = this.#attributes.get(queue);
    if (attributes === undefined) {
      attributes = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": queue,
      };
      this.#attributes.set(queue, attributes);
    }
    return attributes;
  }
}
