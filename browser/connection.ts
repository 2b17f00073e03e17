/**
 * Opening an outbox's dedicated worker from a tab: the options a tab
 * accepts, their checks, and the connection that posts calls to the worker
 * and routes its replies.
 *
 * @module
 */
import type { OutboxOptions } from "../lease.ts";
import { OUTBOX_OPTIONS } from "../lease.ts";
import { checkOptions } from "../validate.ts";
import type { OpenConfig, OpfsVfs, Synchronous } from "./host.ts";
import {
  type CallMessage,
  fromWireError,
  type ReplyMessage,
} from "./protocol.ts";

/** Options for {@linkcode openWorkerOutbox} and {@linkcode openSharedOutbox}. */
export interface BrowserOutboxOptions extends Omit<OutboxOptions, "now"> {
  /**
   * The OPFS VFS; see {@linkcode OpfsVfs}. Changing it later does not move
   * data: each VFS keeps its own files.
   *
   * @default {"auto"}
   */
  readonly vfs?: OpfsVfs;
  /**
   * How long opening keeps retrying while another worker or tab holds the
   * database (a closing tab's worker lets go a moment after the tab), in ms.
   * `0` fails at once with {@linkcode OpfsBusyError}.
   *
   * @default {5000}
   */
  readonly openTimeoutMs?: number;
  /**
   * `PRAGMA synchronous`; see {@linkcode Synchronous}.
   *
   * @default {"full"}
   */
  readonly synchronous?: Synchronous;
  /**
   * Where the worker bundle is served.
   *
   * @default {new URL("./browser_worker.js", import.meta.url)}
   */
  readonly workerUrl?: string | URL;
}

const NAME = /^[A-Za-z0-9_-]{1,64}$/;

export function leaseMsOf(setup: WorkerSetup): number | undefined {
  const leaseMs = setup.config.outbox["leaseMs"];
  return typeof leaseMs === "number" ? leaseMs : undefined;
}

function checkName(op: string, name: unknown): string {
  if (typeof name !== "string" || !NAME.test(name)) {
    throw new TypeError(
      `Cannot ${op} as 'name' must be 1-64 letters, digits, '_' or '-': current value is ${
        typeof name === "string" ? JSON.stringify(name) : String(name)
      }`,
    );
  }
  return name;
}

function checkOpenTimeout(op: string, value: unknown): number {
  if (value === undefined) return 5_000;
  if (typeof value !== "number" || !Number.isInteger(value) || value < 0) {
    throw new RangeError(
      `Cannot ${op} as 'openTimeoutMs' must be a non-negative integer: current value is ${
        String(value)
      }`,
    );
  }
  return value;
}

export interface WorkerSetup {
  readonly config: OpenConfig;
  readonly workerUrl: string | URL;
}

export function setup(
  op: string,
  name: unknown,
  options: BrowserOutboxOptions,
): WorkerSetup {
  checkOptions(op, options, [
    ...OUTBOX_OPTIONS.filter((key) => key !== "now"),
    "vfs",
    "synchronous",
    "openTimeoutMs",
    "workerUrl",
  ]);
  const {
    vfs = "auto",
    synchronous = "full",
    openTimeoutMs,
    workerUrl,
    ...outbox
  } = options;
  return {
    config: {
      name: checkName(op, name),
      vfs,
      synchronous,
      openTimeoutMs: checkOpenTimeout(op, openTimeoutMs),
      outbox: { ...outbox },
    },
    workerUrl: workerUrl ?? new URL("./browser_worker.js", import.meta.url),
  };
}

/** A call sent to a worker (or another tab) and waiting for its reply. */
export interface PendingCall {
  readonly method: string;
  readonly args: readonly unknown[];
  /** Made by the tab hosting the worker for itself (see `CallMessage`). */
  readonly own?: boolean;
  resolve(value: unknown): void;
  reject(error: Error): void;
}

/** One dedicated worker and the calls waiting for its replies. */
export class WorkerConnection {
  readonly #worker: Worker;
  readonly #pending = new Map<string, PendingCall>();
  #next = 0;
  #broken: Error | undefined;
  vfs = "";

  constructor(workerUrl: string | URL, onFail: (error: Error) => void) {
    this.#worker = new Worker(workerUrl, { type: "module" });
    this.#worker.addEventListener("message", (event) => {
      const reply = event.data as ReplyMessage;
      const call = this.#pending.get(reply.id);
      if (reply.type !== "reply" || call === undefined) return;
      this.#pending.delete(reply.id);
      if (reply.ok) call.resolve(reply.value);
      else call.reject(fromWireError(reply.error));
    });
    this.#worker.addEventListener("error", (event) => {
      event.preventDefault();
      const error = new Error(
        `Outbox worker ${String(workerUrl)} failed: ${
          event.message || "it could not be loaded"
        }`,
      );
      // An uncaught error leaves the connection in an unknown state: end the
      // worker, which also lets go of its OPFS handles for the next opener.
      this.terminate(error);
      onFail(error);
    });
  }

  static async open(
    setup: WorkerSetup,
    onFail: (error: Error) => void = () => {},
  ): Promise<WorkerConnection> {
    const connection = new WorkerConnection(setup.workerUrl, onFail);
    try {
      const { vfs } = await connection.call("open", [setup.config]) as {
        vfs: string;
      };
      connection.vfs = vfs;
      return connection;
    } catch (error) {
      connection.terminate();
      throw error;
    }
  }

  call(
    method: string,
    args: readonly unknown[],
    own = true,
  ): Promise<unknown> {
    if (this.#broken) return Promise.reject(this.#broken);
    const id = String(this.#next++);
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { method, args, own, resolve, reject });
      this.#worker.postMessage(
        { type: "call", id, method, args, own } satisfies CallMessage,
      );
    });
  }

  async close(): Promise<void> {
    if (this.#broken) return;
    try {
      await this.call("close", []);
    } finally {
      this.terminate();
    }
  }

  /**
   * Ends the worker at once and returns the calls still waiting for it,
   * unsettled, for the caller to send elsewhere. Whether the worker ran
   * them is unknown.
   */
  handOver(): PendingCall[] {
    const calls = [...this.#pending.values()];
    this.#pending.clear();
    this.terminate();
    return calls;
  }

  terminate(error = new Error("The outbox is closed")): void {
    this.#worker.terminate();
    this.#broken ??= error;
    for (const call of this.#pending.values()) call.reject(error);
    this.#pending.clear();
  }
}

/**
 * Calls `hide` on `pagehide` and `show` on a `pageshow` from the back-forward
 * cache, where there is a page (not in workers).
 *
 * @returns A function that stops watching.
 */
export function watchVisibility(
  hide: () => void,
  show: () => void,
): () => void {
  return watchLifecycle({
    pagehide: hide,
    pageshow: (event) => {
      if ((event as PageTransitionEvent).persisted) show();
    },
  });
}

/** `pagehide` and `pageshow` events say whether the page is in the bfcache. */
export interface PageTransitionEvent extends Event {
  readonly persisted?: boolean;
}

/**
 * Listens for the page lifecycle's events
 * (https://developer.chrome.com/docs/web-platform/page-lifecycle-api), where
 * there is a page (not in workers).
 *
 * @param listeners One listener per event type.
 * @returns A function that stops listening.
 */
export function watchLifecycle(
  listeners: Partial<
    Record<
      "pagehide" | "pageshow" | "freeze" | "resume",
      (event: Event) => void
    >
  >,
): () => void {
  if (typeof globalThis.addEventListener !== "function") return () => {};
  // freeze and resume are fired at the document, and do not bubble to the
  // window; pagehide and pageshow at the window.
  const document = (globalThis as { document?: EventTarget }).document;
  const entries = Object.entries(listeners).map(([type, listener]) =>
    [
      type === "freeze" || type === "resume" ? document : globalThis,
      type,
      listener,
    ] as const
  );
  for (const [target, type, listener] of entries) {
    target?.addEventListener(type, listener);
  }
  return () => {
    for (const [target, type, listener] of entries) {
      target?.removeEventListener(type, listener);
    }
  };
}
