/**
 * {@linkcode openWorkerOutbox}: an outbox in one dedicated worker of this
 * tab, holding its OPFS database alone.
 *
 * @module
 */
import {
  type BrowserOutboxOptions,
  leaseMsOf,
  setup,
  watchVisibility,
  WorkerConnection,
  type WorkerSetup,
} from "./connection.ts";
import { RemoteOutbox } from "./remote.ts";

/**
 * An outbox in one dedicated worker of this tab, holding the database alone.
 * Made by {@linkcode openWorkerOutbox}. Dispatches `"enqueue"` after each of
 * its enqueues.
 */
export class WorkerOutbox<P = unknown> extends RemoteOutbox<P> {
  readonly #connection: WorkerConnection;
  readonly #visibility: () => void;
  #closed = false;

  private constructor(
    name: string,
    connection: WorkerConnection,
    leaseMs: number | undefined,
  ) {
    super(name, leaseMs);
    this.#connection = connection;
    this.#visibility = watchVisibility(
      () => connection.call("hide", []).catch(() => {}),
      () => connection.call("show", []).catch(() => {}),
    );
  }

  /** @internal Use {@linkcode openWorkerOutbox}. */
  static async open<P>(
    name: string,
    setup: WorkerSetup,
  ): Promise<WorkerOutbox<P>> {
    return new WorkerOutbox<P>(
      name,
      await WorkerConnection.open(setup),
      leaseMsOf(setup),
    );
  }

  /** Whether {@linkcode WorkerOutbox.close} was called. */
  get closed(): boolean {
    return this.#closed;
  }

  /** The SQLite VFS the database was opened through. */
  get vfs(): string {
    return this.#connection.vfs;
  }

  /**
   * Sends one call to the worker; a stored event is announced with an
   * `"enqueue"` event, which wakes {@linkcode processEvents}.
   */
  protected async invoke(
    method: string,
    args: readonly unknown[],
  ): Promise<unknown> {
    const result = await this.#connection.call(method, args);
    if (method === "enqueue") this.dispatchEvent(new Event("enqueue"));
    return result;
  }

  /** Closes the database, releases its OPFS handles and ends the worker. */
  close(): Promise<void> {
    this.#closed = true;
    this.#visibility();
    return this.#connection.close();
  }
}

/**
 * Opens an outbox in a new dedicated worker of this tab, persisted in OPFS.
 * Only one worker per origin can hold an `opfs-sahpool` database; use
 * {@linkcode openSharedOutbox} when several tabs need the queue.
 *
 * @param name The outbox name: 1-64 letters, digits, `_` or `-`.
 * @param options See {@linkcode BrowserOutboxOptions}.
 * @returns The open outbox.
 * @throws {OpfsBusyError} When another worker or tab holds the database for
 * longer than `openTimeoutMs`; nothing stays locked by the failed attempt.
 * @throws {OpfsUnavailableError} When this context cannot use OPFS.
 * @throws {TypeError | RangeError} When an argument is invalid.
 *
 * @example Usage
 * ```ts ignore
 * import { openWorkerOutbox } from "@leased/outbox/browser";
 *
 * await using outbox = await openWorkerOutbox("uploads", { openTimeoutMs: 0 });
 * await outbox.enqueue({ file: "photo.jpg" });
 * ```
 */
export function openWorkerOutbox<P = unknown>(
  name: string,
  options: BrowserOutboxOptions = {},
): Promise<WorkerOutbox<P>> {
  try {
    return WorkerOutbox.open<P>(name, setup("open outbox", name, options));
  } catch (error) {
    return Promise.reject(error);
  }
}
