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
  INVALID_SPAN_CONTEXT,
  type Meter,
  metrics,
  type ObservableGauge,
  type Span,
  SpanKind,
  SpanStatusCode,
  trace,
  type Tracer,
} from "@opentelemetry/api";
import type { Lease, Stats } from "./lease.ts";

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

/**
 * The kinds of telemetry fault, each reported once per processor:
 * creating the instruments, starting a span, setting its attributes or
 * status, ending it, running the handler in its context, a counter, the
 * histogram, and the gauges' read.
 */
type Fault =
  | "instruments"
  | "span start"
  | "span attributes"
  | "span end"
  | "context"
  | "counter"
  | "histogram"
  | "gauge";

// What a span that could not be started is replaced with: records nothing.
const NO_SPAN: Span = trace.wrapSpanContext(INVALID_SPAN_CONTEXT);

/** `String(value)`, or its tag when that throws (a null-prototype object). */
function describe(value: unknown): string {
  try {
    return String(value);
  } catch {
    return Object.prototype.toString.call(value);
  }
}

interface Handling {
  readonly span: Span;
  readonly attributes: Attributes;
  outcome: Outcome;
}

/**
 * The telemetry of one processor: its spans, counters and the gauges of its
 * queue. Created by the processor; every method is cheap without an SDK.
 *
 * Nothing here may affect delivery: every call into the OpenTelemetry API
 * (and so into the registered SDK: span processors, views, exporters) is
 * guarded. A call that throws is skipped, the first fault of each kind is
 * written to `console.error`, and the processor goes on; only what the
 * handler itself throws or returns comes out of
 * {@linkcode ProcessorTelemetry.handle}.
 *
 * @ignore
 */
export class ProcessorTelemetry {
  #meter: Meter = NOOP_METER;
  // A proxy: it finds a tracer provider registered after it was made.
  readonly #tracer: Tracer | undefined;
  #counters!: Record<CounterName, Counter>;
  #duration!: Histogram;
  #depth!: ObservableGauge;
  #oldest!: ObservableGauge;
  readonly #faults = new Set<Fault>();
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
    try {
      this.#tracer = trace.getTracer(INSTRUMENTATION_SCOPE, VERSION);
    } catch (error) {
      this.#fault("span start", error);
    }
    try {
      this.#createInstruments(metrics.getMeter(INSTRUMENTATION_SCOPE, VERSION));
    } catch (error) {
      this.#fault("instruments", error);
      this.#createInstruments(NOOP_METER);
    }
    const name = queue ?? outbox.queue;
    const attributes = name === undefined
      ? { "messaging.system": SYSTEM }
      : this.#attributesOf(name);
    this.#observe = async (result) => {
      // A closed outbox (the processor stopping) has nothing to report.
      if (outbox.closed) return;
      try {
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
      } catch (error) {
        this.#fault("gauge", error);
      }
    };
    try {
      this.#meter.addBatchObservableCallback(this.#observe, [
        this.#depth,
        this.#oldest,
      ]);
    } catch (error) {
      this.#fault("instruments", error);
    }
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
    this.#add("claimed", attributes);
    const span = this.#start(lease, attributes);
    let recording = false;
    try {
      recording = span.isRecording();
    } catch (error) {
      this.#fault("span attributes", error);
    }
    // Without an SDK nothing below would be seen: its clock reads, promise
    // callbacks and map entries were most of the cost per event (1.6 µs of
    // it, bench/telemetry_overhead.ts).
    if (!recording && this.#meter === NOOP_METER) return handler();
    this.#handling.set(key, { span, attributes, outcome: "unfinished" });
    const startedAt = performance.now();
    const settled = (failed: boolean, error?: unknown) => {
      try {
        this.#duration.record(performance.now() - startedAt, attributes);
      } catch (fault) {
        this.#fault("histogram", fault);
      }
      if (failed) this.#failed(span, error);
    };
    let result: T;
    try {
      // A span that records nothing needs no context to be found in.
      result = recording ? this.#inContext(span, handler) : handler();
    } catch (error) {
      settled(true, error);
      throw error;
    }
    Promise.resolve(result).then(
      () => settled(false),
      (error) => settled(true, error),
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
    this.#add(name, handling.attributes);
    const outcome = OUTCOMES[name];
    if (outcome !== undefined) handling.outcome = outcome;
    else {
      try {
        handling.span.setAttribute("outbox.lease.lost", true);
      } catch (error) {
        this.#fault("span attributes", error);
      }
    }
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
    try {
      handling.span.setAttribute("outbox.outcome", handling.outcome);
    } catch (error) {
      this.#fault("span attributes", error);
    }
    try {
      handling.span.end();
    } catch (error) {
      this.#fault("span end", error);
    }
  }

  /** Stops observing the queue's gauges. */
  close(): void {
    try {
      this.#meter.removeBatchObservableCallback(this.#observe, [
        this.#depth,
        this.#oldest,
      ]);
    } catch (error) {
      this.#fault("instruments", error);
    }
  }

  #createInstruments(meter: Meter): void {
    const counter = (name: string, unit: string, description: string) =>
      meter.createCounter(name, { unit, description });
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
    this.#duration = meter.createHistogram("outbox.handler.duration", {
      unit: "ms",
      description: "Time from the handler's start until it settled",
    });
    this.#depth = meter.createObservableGauge("outbox.queue.depth", {
      unit: "{event}",
      description: "Events of the queue per state",
    });
    this.#oldest = meter.createObservableGauge(
      "outbox.queue.oldest_pending_age",
      { unit: "ms", description: "Age of the queue's oldest pending event" },
    );
    // Set last: a meter that failed part way is replaced as a whole.
    this.#meter = meter;
  }

  #add(name: CounterName, attributes: Attributes): void {
    try {
      this.#counters[name].add(1, attributes);
    } catch (error) {
      this.#fault("counter", error);
    }
  }

  #start(lease: Lease<unknown>, attributes: Attributes): Span {
    if (this.#tracer === undefined) return NO_SPAN;
    try {
      return this.#tracer.startSpan(
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
    } catch (error) {
      this.#fault("span start", error);
      return NO_SPAN;
    }
  }

  /**
   * Runs the handler with `span` as the active one; a context manager that
   * throws before or after it does not change what the handler did.
   */
  #inContext<T>(span: Span, handler: () => T): T {
    let ran = false;
    let result: { value: T } | { error: unknown } | undefined;
    try {
      context.with(trace.setSpan(context.active(), span), () => {
        ran = true;
        try {
          result = { value: handler() };
        } catch (error) {
          result = { error };
        }
      });
    } catch (error) {
      this.#fault("context", error);
    }
    if (!ran) return handler();
    if (result === undefined || "error" in result) {
      throw result?.error;
    }
    return result.value;
  }

  /** Marks a span failed with the handler's error. */
  #failed(span: Span, error: unknown): void {
    try {
      span.recordException(
        error instanceof Error ? error : new Error(describe(error)),
      );
      span.setStatus({ code: SpanStatusCode.ERROR, message: describe(error) });
      span.setAttribute(
        "error.type",
        error instanceof Error ? error.name : typeof error,
      );
    } catch (fault) {
      this.#fault("span attributes", fault);
    }
  }

  /** Reports the first fault of each kind; telemetry then goes on. */
  #fault(kind: Fault, error: unknown): void {
    if (this.#faults.has(kind)) return;
    this.#faults.add(kind);
    try {
      console.error(
        `leased-outbox: telemetry's ${kind} failed; delivery goes on, and further ${kind} faults of this processor are not reported:`,
        error,
      );
    } catch {
      // A console that throws has nowhere left to report to.
    }
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
