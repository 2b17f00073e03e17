/**
 * Guards between the processing loop's telemetry and the OpenTelemetry SDK
 * the application registered: telemetry must never affect delivery. The
 * wrappers here (a meter, its instruments, a tracer, its spans) forward
 * every call and catch what it throws; a fault is reported once per kind
 * to `console.error`, and the call is skipped.
 *
 * @module
 */
import {
  type Attributes,
  type BatchObservableCallback,
  type Context,
  type Counter,
  createNoopMeter,
  type Exception,
  type Gauge,
  type Histogram,
  INVALID_SPAN_CONTEXT,
  type Link,
  type Meter,
  type MetricOptions,
  type Observable,
  type ObservableCounter,
  type ObservableGauge,
  type ObservableUpDownCounter,
  type Span,
  type SpanAttributes,
  type SpanAttributeValue,
  type SpanContext,
  type SpanOptions,
  type SpanStatus,
  type TimeInput,
  trace,
  type Tracer,
  type UpDownCounter,
} from "@opentelemetry/api";

/**
 * The kinds of telemetry fault, each reported once: getting a meter or a
 * tracer, creating an instrument or (un)registering the gauges' callback,
 * starting a span, a span's other calls, ending it, making it the active
 * span, a counter, a histogram, a gauge (its record, or the read of the
 * gauges' callback).
 */
export type Fault =
  | "instruments"
  | "span start"
  | "span"
  | "span end"
  | "context"
  | "counter"
  | "histogram"
  | "gauge";

// The API's one no-op meter (what getMeter returns while no SDK is
// registered): also the stand-in for an instrument that cannot be made.
const NOOP_METER = createNoopMeter();
// A span that could not be started: records nothing.
const NO_SPAN = trace.wrapSpanContext(INVALID_SPAN_CONTEXT);

/**
 * Reports faults, the first of each kind only, and wraps SDK objects so
 * that their faults are reported rather than thrown.
 */
export class TelemetryGuard {
  readonly #reported = new Set<Fault>();

  /**
   * Reports a fault, unless one of its kind was reported already.
   *
   * @param kind What failed.
   * @param error What it threw.
   */
  fault(kind: Fault, error: unknown): void {
    if (this.#reported.has(kind)) return;
    this.#reported.add(kind);
    try {
      console.error(
        `leased-outbox: telemetry's ${kind} failed; delivery goes on, and further ${kind} faults of this processor are not reported:`,
        error,
      );
    } catch {
      // A console that throws leaves nowhere to report to.
    }
  }

  /**
   * The meter `get` returns, each call and each instrument it makes
   * guarded; the API's no-op meter as it is (so that it can be recognised),
   * also when `get` throws.
   */
  meter(get: () => Meter): Meter {
    let meter: Meter;
    try {
      meter = get();
    } catch (error) {
      this.fault("instruments", error);
      return NOOP_METER;
    }
    return meter === NOOP_METER ? meter : new GuardedMeter(meter, this);
  }

  /**
   * The tracer `get` returns, its `startSpan` and its spans guarded; one
   * whose spans record nothing when `get` throws.
   */
  tracer(get: () => Tracer): GuardedTracer {
    let tracer: Tracer | undefined;
    try {
      tracer = get();
    } catch (error) {
      this.fault("span start", error);
    }
    return {
      startSpan: (name, options, context) => {
        let span = NO_SPAN;
        try {
          if (tracer !== undefined) {
            span = tracer.startSpan(name, options, context);
          }
        } catch (error) {
          this.fault("span start", error);
        }
        return new GuardedSpan(span, this);
      },
    };
  }
}

/** A tracer's `startSpan`, whose spans are guarded. */
export interface GuardedTracer {
  /** Starts a span; a span that cannot be started records nothing. */
  startSpan(
    name: string,
    options?: SpanOptions,
    context?: Context,
  ): GuardedSpan;
}

/** A span whose calls report what they throw rather than throw it. */
export class GuardedSpan implements Span {
  /** The SDK's span, for the context (where an SDK looks for its own). */
  readonly span: Span;
  readonly #guard: TelemetryGuard;

  /**
   * @param span The SDK's span.
   * @param guard Where faults are reported.
   */
  constructor(span: Span, guard: TelemetryGuard) {
    this.span = span;
    this.#guard = guard;
  }

  /** The span's context, or the invalid one when it cannot say. */
  spanContext(): SpanContext {
    try {
      return this.span.spanContext();
    } catch (error) {
      this.#guard.fault("span", error);
      return INVALID_SPAN_CONTEXT;
    }
  }

  /** Sets an attribute. */
  setAttribute(key: string, value: SpanAttributeValue): this {
    return this.#call(() => this.span.setAttribute(key, value));
  }

  /** Sets attributes. */
  setAttributes(attributes: SpanAttributes): this {
    return this.#call(() => this.span.setAttributes(attributes));
  }

  /** Adds an event. */
  addEvent(
    name: string,
    attributesOrStartTime?: SpanAttributes | TimeInput,
    startTime?: TimeInput,
  ): this {
    return this.#call(() =>
      this.span.addEvent(name, attributesOrStartTime, startTime)
    );
  }

  /** Adds a link. */
  addLink(link: Link): this {
    return this.#call(() => this.span.addLink(link));
  }

  /** Adds links. */
  addLinks(links: Link[]): this {
    return this.#call(() => this.span.addLinks(links));
  }

  /** Sets the status. */
  setStatus(status: SpanStatus): this {
    return this.#call(() => this.span.setStatus(status));
  }

  /** Renames the span. */
  updateName(name: string): this {
    return this.#call(() => this.span.updateName(name));
  }

  /** Ends the span (the SDK's span processors' `onEnd` run here). */
  end(endTime?: TimeInput): void {
    try {
      this.span.end(endTime);
    } catch (error) {
      this.#guard.fault("span end", error);
    }
  }

  /** Whether the span records; `false` when it cannot say. */
  isRecording(): boolean {
    try {
      return this.span.isRecording();
    } catch (error) {
      this.#guard.fault("span", error);
      return false;
    }
  }

  /** Records an exception. */
  recordException(exception: Exception, time?: TimeInput): void {
    this.#call(() => this.span.recordException(exception, time));
  }

  #call(fn: () => unknown): this {
    try {
      fn();
    } catch (error) {
      this.#guard.fault("span", error);
    }
    return this;
  }
}

/**
 * A meter whose instruments report what they throw; an instrument that
 * cannot be made is a no-op one, and a gauges' callback that throws or
 * rejects is reported (the SDK would only log it).
 */
class GuardedMeter implements Meter {
  readonly #meter: Meter;
  readonly #guard: TelemetryGuard;
  readonly #callbacks = new Map<
    BatchObservableCallback<Attributes>,
    BatchObservableCallback<Attributes>
  >();

  constructor(meter: Meter, guard: TelemetryGuard) {
    this.#meter = meter;
    this.#guard = guard;
  }

  createCounter(name: string, options?: MetricOptions): Counter {
    const add = this.#create(
      () => method(this.#meter.createCounter(name, options), "add"),
      () => method(NOOP_METER.createCounter(name, options), "add"),
    );
    return { add: (...args) => this.#record("counter", add, args) };
  }

  createUpDownCounter(name: string, options?: MetricOptions): UpDownCounter {
    const add = this.#create(
      () => method(this.#meter.createUpDownCounter(name, options), "add"),
      () => method(NOOP_METER.createUpDownCounter(name, options), "add"),
    );
    return { add: (...args) => this.#record("counter", add, args) };
  }

  createHistogram(name: string, options?: MetricOptions): Histogram {
    const record = this.#create(
      () => method(this.#meter.createHistogram(name, options), "record"),
      () => method(NOOP_METER.createHistogram(name, options), "record"),
    );
    return { record: (...args) => this.#record("histogram", record, args) };
  }

  createGauge(name: string, options?: MetricOptions): Gauge {
    const record = this.#create(
      () => method(this.#meter.createGauge(name, options), "record"),
      () => method(NOOP_METER.createGauge(name, options), "record"),
    );
    return { record: (...args) => this.#record("gauge", record, args) };
  }

  createObservableGauge(
    name: string,
    options?: MetricOptions,
  ): ObservableGauge {
    return this.#create(
      () => this.#meter.createObservableGauge(name, options),
      () => NOOP_METER.createObservableGauge(name, options),
    );
  }

  createObservableCounter(
    name: string,
    options?: MetricOptions,
  ): ObservableCounter {
    return this.#create(
      () => this.#meter.createObservableCounter(name, options),
      () => NOOP_METER.createObservableCounter(name, options),
    );
  }

  createObservableUpDownCounter(
    name: string,
    options?: MetricOptions,
  ): ObservableUpDownCounter {
    return this.#create(
      () => this.#meter.createObservableUpDownCounter(name, options),
      () => NOOP_METER.createObservableUpDownCounter(name, options),
    );
  }

  addBatchObservableCallback(
    callback: BatchObservableCallback<Attributes>,
    observables: Observable<Attributes>[],
  ): void {
    const guarded: BatchObservableCallback<Attributes> = async (result) => {
      try {
        await callback(result);
      } catch (error) {
        this.#guard.fault("gauge", error);
      }
    };
    try {
      this.#meter.addBatchObservableCallback(guarded, observables);
      this.#callbacks.set(callback, guarded);
    } catch (error) {
      this.#guard.fault("instruments", error);
    }
  }

  removeBatchObservableCallback(
    callback: BatchObservableCallback<Attributes>,
    observables: Observable<Attributes>[],
  ): void {
    const guarded = this.#callbacks.get(callback);
    if (guarded === undefined) return;
    this.#callbacks.delete(callback);
    try {
      this.#meter.removeBatchObservableCallback(guarded, observables);
    } catch (error) {
      this.#guard.fault("instruments", error);
    }
  }

  #create<T>(create: () => T, noop: () => T): T {
    try {
      return create();
    } catch (error) {
      this.#guard.fault("instruments", error);
      return noop();
    }
  }

  #record<A extends unknown[]>(
    kind: Fault,
    record: (...args: A) => void,
    args: A,
  ): void {
    try {
      record(...args);
    } catch (error) {
      this.#guard.fault(kind, error);
    }
  }
}

/**
 * An instrument's `add` or `record`, bound to it; what an SDK returned is
 * checked here, where its creation is guarded, so that an instrument
 * without the method (or not an object) counts as one that cannot be made.
 */
function method<I extends object, K extends keyof I>(
  instrument: I,
  name: K,
): I[K] {
  const fn = instrument[name];
  if (typeof fn !== "function") {
    throw new TypeError(
      `The SDK's instrument has no ${String(name)}(): it is ${
        instrument === null ? "null" : typeof instrument
      }`,
    );
  }
  return fn.bind(instrument);
}
