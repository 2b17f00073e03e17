/**
 * The messages a tab, the tab's database worker and the other tabs of the
 * origin exchange, and the typed errors of opening a database in OPFS.
 * Everything here crosses `postMessage`/`BroadcastChannel`, so it is plain
 * structured-clonable data; errors travel as {@linkcode WireError} and are
 * rebuilt as their own classes on the receiving side.
 *
 * @module
 */
import {
  BusyError,
  ConstraintError,
  LeaseLostError,
  SchemaVersionError,
  SqliteError,
  StorageFullError,
} from "../errors.ts";
import type { Stats } from "../lease.ts";

/**
 * Another worker or tab holds the OPFS database (its sync access handles are
 * exclusive, `NoModificationAllowedError`), and it stayed held for longer
 * than `openTimeoutMs`. Nothing was opened and nothing stays locked: opening
 * again once the holder is gone succeeds. This is never a silent fallback to
 * an in-memory database.
 *
 * @example Usage
 * ```ts
 * import { OpfsBusyError } from "@leased/outbox/browser";
 * import { BusyError } from "@leased/outbox";
 * import assert from "node:assert/strict";
 *
 * const error = new OpfsBusyError("outbox");
 * assert.ok(error instanceof BusyError);
 * assert.equal(error.database, "outbox");
 * ```
 */
export class OpfsBusyError extends BusyError {
  /** The outbox name whose database is held elsewhere. */
  readonly database: string;

  /**
   * Makes the error for one outbox name.
   *
   * @param database The outbox name whose database is held elsewhere.
   * @param options `cause`: the `DOMException` OPFS raised.
   */
  constructor(database: string, options?: ErrorOptions) {
    super(
      `OPFS database '${database}' is held by another worker or tab`,
      5,
      options,
    );
    this.name = "OpfsBusyError";
    this.database = database;
  }
}

/**
 * This context cannot persist to OPFS at all (no `navigator.storage`, no
 * sync access handles, not a secure context, or not a dedicated worker).
 *
 * @example Usage
 * ```ts
 * import { OpfsUnavailableError } from "@leased/outbox/browser";
 * import assert from "node:assert/strict";
 *
 * assert.equal(new OpfsUnavailableError("no OPFS").name, "OpfsUnavailableError");
 * ```
 */
export class OpfsUnavailableError extends Error {
  /**
   * Makes the error with a message saying what is missing.
   *
   * @param message What is missing.
   * @param options `cause`: the underlying error.
   */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "OpfsUnavailableError";
  }
}

/**
 * The origin's storage as `navigator.storage.estimate()` reports it
 * (https://storage.spec.whatwg.org/#dom-storagemanager-estimate), in bytes:
 * what the origin uses (this database and anything else it stores: caches,
 * IndexedDB) and the most it may use. Both are estimates the browser may
 * round or pad; `quota` is what a write is checked against.
 */
export interface StorageEstimate {
  /** Bytes the origin uses. */
  readonly usage: number;
  /** Bytes the origin may use. */
  readonly quota: number;
}

/**
 * {@linkcode Stats} of the browser outbox, with the origin's storage.
 */
export interface BrowserStats extends Stats {
  /**
   * `navigator.storage.estimate()` read in the database's worker, or `null`
   * where the browser does not offer it.
   */
  readonly storage: StorageEstimate | null;
}

/** An error flattened for `postMessage`. */
export interface WireError {
  readonly name: string;
  readonly message: string;
  readonly code?: number;
  readonly eventId?: number;
  readonly fence?: number;
  readonly database?: string;
  readonly version?: number;
  readonly supported?: number;
}

/** A request to the database worker (or, forwarded, to the leader tab). */
export interface CallMessage {
  readonly type: "call";
  readonly id: string;
  readonly method: string;
  readonly args: readonly unknown[];
  /** The tab that waits for the reply (forwarded calls only). */
  readonly from?: string;
  /**
   * Made by the tab hosting the worker for itself (not forwarded): the
   * worker hands the leases of such calls back when that tab goes away.
   */
  readonly own?: boolean;
  /**
   * Forwarded calls only: the sender's clock (epoch ms) past which it has
   * given the call up with a `BusyError`; a leader that receives the call
   * too late to acknowledge it in time does not run it.
   */
  readonly expiresAt?: number;
}

/**
 * Sent by the leader as it takes a forwarded call on: the sender stops
 * waiting for the leader to answer (the call's own run is bounded by the
 * outbox's `busyTimeoutMs`), and waits for the reply.
 */
export interface ReceivedMessage {
  readonly type: "received";
  readonly id: string;
  readonly to: string;
}

/** The answer to one {@linkcode CallMessage}. */
export type ReplyMessage =
  & { readonly type: "reply"; readonly id: string; readonly to?: string }
  & (
    | { readonly ok: true; readonly value: unknown }
    | { readonly ok: false; readonly error: WireError }
  );

/** Announced on the tabs' channel by a tab whose worker opened the database. */
export interface LeaderMessage {
  readonly type: "leader";
  readonly tab: string;
}

/** Sent by a tab that joins, so the leader announces itself again. */
export interface HelloMessage {
  readonly type: "hello";
}

/**
 * Sent by a tab on `pagehide` (`"hidden"`) and on `pageshow` after the
 * back-forward cache (`"shown"`): while a tab is hidden, the leader releases
 * the leases of its claims that complete, since nobody would finish them.
 */
export interface VisibilityMessage {
  readonly type: "hidden" | "shown";
  readonly tab: string;
}

/** What travels on the tabs' `BroadcastChannel`. */
export type ChannelMessage =
  | CallMessage
  | ReceivedMessage
  | ReplyMessage
  | LeaderMessage
  | HelloMessage
  | VisibilityMessage;

/** The error recorded on leases handed back because their tab went away. */
export const TAB_CLOSED = "tab closed";

/**
 * The leases an outbox call's result took: a claim's (one, possibly
 * `null`, or a batch) or the new ones of `acknowledgeAndClaim`; none for
 * any other call. Whoever answers a tab that went away hands them back.
 */
export function claimedLeases(method: string, result: unknown): unknown[] {
  if (method === "claim") {
    return (Array.isArray(result) ? result : [result]).filter((lease) =>
      lease !== null
    );
  }
  if (method === "acknowledgeAndClaim") {
    return (result as { leases: unknown[] }).leases;
  }
  return [];
}

/**
 * A lease's key in the tab's and the worker's records of held leases: its
 * event and token, which name one claim.
 *
 * @param lease A lease (or anything with `eventId` and `token`).
 * @returns `"<eventId>:<token>"`.
 */
export function leaseKey(lease: unknown): string {
  const { eventId, token } = lease as { eventId?: unknown; token?: unknown };
  return `${String(eventId)}:${String(token)}`;
}

/**
 * Flattens an error for `postMessage`, keeping what the typed classes carry.
 *
 * @param error Anything thrown.
 * @returns Its structured-clonable form.
 */
export function toWireError(error: unknown): WireError {
  if (!(error instanceof Error)) {
    return { name: "Error", message: String(error) };
  }
  const wire: {
    name: string;
    message: string;
    code?: number;
    eventId?: number;
    fence?: number;
    database?: string;
    version?: number;
    supported?: number;
  } = { name: error.name, message: error.message };
  if (error instanceof SqliteError) wire.code = error.code;
  if (error instanceof LeaseLostError) {
    wire.eventId = error.eventId;
    wire.fence = error.fence;
  }
  if (error instanceof OpfsBusyError) wire.database = error.database;
  if (error instanceof SchemaVersionError) {
    wire.version = error.version;
    wire.supported = error.supported;
  }
  return wire;
}

/**
 * Rebuilds the typed error a {@linkcode WireError} came from, so callers in
 * any tab can `instanceof` it as if the database were local.
 *
 * @param wire The flattened error.
 * @returns An instance of the matching class.
 */
export function fromWireError(wire: WireError): Error {
  switch (wire.name) {
    case "OpfsBusyError":
      return new OpfsBusyError(wire.database ?? "");
    case "OpfsUnavailableError":
      return new OpfsUnavailableError(wire.message);
    case "BusyError":
      return new BusyError(wire.message, wire.code);
    case "ConstraintError":
      return new ConstraintError(wire.message, wire.code ?? 19);
    case "SqliteError":
      return new SqliteError(wire.message, wire.code ?? 1);
    case "StorageFullError":
      return new StorageFullError(wire.message, wire.code ?? 13);
    case "LeaseLostError":
      return new LeaseLostError(wire.eventId ?? 0, wire.fence ?? 0);
    case "SchemaVersionError":
      return new SchemaVersionError(wire.version ?? 0, wire.supported ?? 0);
    case "TypeError":
      return new TypeError(wire.message);
    case "RangeError":
      return new RangeError(wire.message);
    default: {
      const error = new Error(wire.message);
      error.name = wire.name;
      return error;
    }
  }
}
