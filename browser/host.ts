/**
 * The database side of the browser outbox: runs inside a dedicated worker,
 * opens SQLite on OPFS through the official WASM build and answers the calls
 * of the tab that started it. Kept apart from `browser/worker.ts` (the entry)
 * so tests can host it with their own outbox factory.
 *
 * @module
 */
import type { Database, Sqlite3Static } from "@sqlite.org/sqlite-wasm";
import type { Driver } from "../driver.ts";
import {
  type CallMessage,
  claimedLeases,
  leaseKey,
  OpfsBusyError,
  OpfsUnavailableError,
  type ReplyMessage,
  type StorageEstimate,
  TAB_CLOSED,
  toWireError,
} from "./protocol.ts";
import { SqliteError, StorageFullError } from "../errors.ts";
import {
  loadSqlite3,
  NEW_FILE_PAGE_SIZE,
  SqliteWasmDriver,
} from "../drivers/sqlite_wasm.ts";
import { JOURNAL_SIZE_LIMIT_BYTES } from "../wal.ts";
import {
  type SequencedFile,
  WriteSequences,
} from "../drivers/write_sequences.ts";

/**
 * Which OPFS VFS to open through. `"auto"` picks `"opfs"` when the worker is
 * cross-origin isolated (it needs `SharedArrayBuffer` and lets several
 * connections share a file) and `"opfs-sahpool"` otherwise (no special
 * headers, one connection per origin). `"opfs-wl"` is never offered: it lost
 * updates under `BEGIN IMMEDIATE` contention in headless Chromium.
 */
export type OpfsVfs = "auto" | "opfs-sahpool" | "opfs";

/**
 * When SQLite waits for OPFS to reach the disk
 * (https://sqlite.org/pragma.html#pragma_synchronous). `"full"` makes every
 * commit durable; `"normal"` (WAL only, so `opfs-sahpool`) survives a
 * crash of the tab or browser but may lose the last commits on power loss,
 * for a multiple of the commit rate.
 */
export type Synchronous = "full" | "normal";

/** What the tab asks the worker to open. */
export interface OpenConfig {
  /** The outbox name: one database (and one sahpool directory) per name. */
  readonly name: string;
  /** See {@linkcode OpfsVfs}. */
  readonly vfs: OpfsVfs;
  /** How long to keep retrying while another holder has the database, in ms. */
  readonly openTimeoutMs: number;
  /** `PRAGMA synchronous`; see {@linkcode Synchronous}. */
  readonly synchronous: Synchronous;
  /** Options handed to the outbox factory as they are. */
  readonly outbox: Readonly<Record<string, unknown>>;
}

/** The outbox the worker serves: every method takes and returns clonable data. */
export interface HostedOutbox {
  release(lease: unknown, options: { error: string }): Promise<boolean>;
  close(): Promise<void>;
}

/**
 * Builds the outbox over the opened driver (in production `Outbox.open`).
 *
 * @param driver The connection, owned by the outbox from now on.
 * @param options {@linkcode OpenConfig.outbox}.
 */
export type OutboxFactory = (
  driver: Driver,
  options: Readonly<Record<string, unknown>>,
) => Promise<HostedOutbox>;

/** The slice of `DedicatedWorkerGlobalScope` the host uses. */
export interface WorkerScope {
  postMessage(message: unknown): void;
  addEventListener(
    type: "message",
    listener: (event: MessageEvent) => void,
  ): void;
}

/** The name of the SQLite VFS that must never be chosen. */
export const LOSSY_VFS = "opfs-wl";

// Must be set before the module initialises: a VFS that is never registered
// cannot be chosen by anybody in this worker, by name or as a default.
(globalThis as { sqlite3ApiConfig?: unknown }).sqlite3ApiConfig = {
  disable: { vfs: { [LOSSY_VFS]: true } },
};

interface Opened {
  readonly outbox: HostedOutbox;
  readonly driver: SqliteWasmDriver;
  readonly vfs: string;
  readonly release: () => void;
}

// OPFS enforces the origin's quota by throwing QuotaExceededError from a
// sync access handle's write or truncate; the sahpool VFS turns that into a
// bare SQLITE_IOERR and keeps the reason to itself. Counting those errors as
// they pass lets a failed call say that the storage is full.
let quotaErrors = 0;
const HANDLES_WATCHED = Symbol.for("leased-outbox.handles-watched");

/** The slice of `FileSystemSyncAccessHandle` the VFS calls. */
type AccessHandleMethod = (
  this: object,
  buffer?: unknown,
  options?: { at?: number },
) => number;

// In Chromium each write of an access handle is a round of system calls
// and a message to the browser process (about 25-55 µs here, against 3 µs
// for a pwrite from Deno), so a WAL frame's header and page, two writes of
// the VFS, are written as one, as the Deno VFS writes them, and at
// synchronous=FULL a commit's frames are one write (see WriteSequences).
// The pool's files are the database, written in whole pages, and its WAL:
// only a WAL frame's header is a 24-byte write.
const sequences = new WriteSequences();
const sequenced = new WeakMap<object, SequencedFile>();

/**
 * Wraps `FileSystemSyncAccessHandle`'s methods once per realm: quota errors
 * are counted, and writes go through {@linkcode WriteSequences} (every other
 * method writes what is held first, so a held write fails the call that
 * follows it, in the same SQLite step).
 */
function watchHandles(): void {
  const handle = (globalThis as {
    FileSystemSyncAccessHandle?: { prototype: Record<PropertyKey, unknown> };
  }).FileSystemSyncAccessHandle;
  if (handle === undefined || handle.prototype[HANDLES_WATCHED]) return;
  const proto = handle.prototype;
  proto[HANDLES_WATCHED] = true;
  const original = (name: string) => {
    const method = proto[name] as AccessHandleMethod;
    return function (this: object, ...args: Parameters<AccessHandleMethod>) {
      try {
        return method.apply(this, args);
      } catch (error) {
        if (
          error instanceof DOMException && error.name === "QuotaExceededError"
        ) {
          quotaErrors++;
        }
        throw error;
      }
    };
  };
  const write = original("write");
  const fileOf = (sah: object): SequencedFile => {
    let file = sequenced.get(sah);
    if (file === undefined) {
      file = {
        wal: true,
        write(from, at) {
          const written = write.call(sah, from, { at });
          if (written !== from.length) {
            throw new DOMException(
              `Wrote ${written} of ${from.length} bytes`,
              "InvalidStateError",
            );
          }
        },
      };
      sequenced.set(sah, file);
    }
    return file;
  };
  proto["write"] = function (
    this: object,
    buffer: unknown,
    options?: { at?: number },
  ): number {
    const at = options?.at;
    if (!(buffer instanceof Uint8Array) || at === undefined) {
      sequences.flush();
      return write.call(this, buffer, options);
    }
    sequences.write(fileOf(this), buffer, at);
    return buffer.length;
  };
  const read = original("read");
  proto["read"] = function (
    this: object,
    buffer: unknown,
    options?: { at?: number },
  ): number {
    sequences.flush();
    if (options?.at !== undefined) sequences.read(fileOf(this), options.at);
    return read.call(this, buffer, options);
  };
  for (const name of ["truncate", "flush", "getSize", "close"]) {
    const method = original(name);
    proto[name] = function (this: object, ...args: unknown[]): number {
      sequences.flush();
      return method.apply(this, args as Parameters<AccessHandleMethod>);
    };
  }
}
watchHandles();

/** SQLite's primary result codes a refused OPFS write comes back as. */
const SQLITE_IOERR = 10;
const SQLITE_FULL = 13;

/**
 * The typed error for a call that failed because the origin's storage is
 * full, or `error` itself when it failed otherwise.
 */
function storageError(error: unknown, quotaRefused: boolean): unknown {
  if (
    !(error instanceof SqliteError) || error instanceof StorageFullError ||
    !(error.primaryCode === SQLITE_FULL ||
      (quotaRefused && error.primaryCode === SQLITE_IOERR))
  ) {
    return error;
  }
  return new StorageFullError(
    "The origin's storage quota is full: the browser refused to write the outbox's database, so nothing of this call was stored (the data stored before is intact). Free space and call again, no reload needed: purge done events and dead letters, then maintain(); or clear other data of this origin (in Firefox, persistent storage, navigator.storage.persist(), also raises the limit)",
    SQLITE_FULL,
    { cause: error },
  );
}

/**
 * Gives the write-ahead log's bytes back to the origin's quota: a truncating
 * checkpoint, when no transaction is open (best effort: a failure leaves the
 * log as it was).
 */
async function truncateWal(driver: SqliteWasmDriver): Promise<void> {
  if (driver.inTransaction()) return;
  try {
    await driver.query("PRAGMA wal_checkpoint(TRUNCATE)");
  } catch {
    // Still full, or busy: the next maintain() tries again.
  }
}

/** The origin's storage estimate, where the worker can read it. */
async function estimate(): Promise<StorageEstimate | null> {
  const storage = (globalThis as {
    navigator?: { storage?: { estimate?(): Promise<StorageEstimate> } };
  }).navigator?.storage;
  if (typeof storage?.estimate !== "function") return null;
  try {
    const { usage = 0, quota = 0 } = await storage.estimate();
    return { usage, quota };
  } catch {
    return null;
  }
}

/**
 * Answers {@linkcode CallMessage}s posted to the worker: `open` (once, with
 * an {@linkcode OpenConfig}), `close`, `hide`/`show` (the hosting tab went
 * away or came back), `hasVfs` (is a VFS of that name registered), and every
 * method of the outbox the factory built, by name.
 *
 * @param scope The worker's global scope.
 * @param openOutbox Builds the outbox over the opened driver.
 */
export function serveOutbox(scope: WorkerScope, openOutbox: OutboxFactory) {
  let opened: Promise<Opened> | undefined;
  // Leases the hosting tab holds through its own calls. When the tab goes
  // away ("hide") the worker hands them back itself: the tab cannot wait for
  // replies during pagehide, and a claim still in flight then would have
  // nobody to return to.
  const own = new Map<string, unknown>();
  let hidden = false;

  async function handBack(outbox: HostedOutbox, leases: unknown[]) {
    await Promise.all(
      leases.map((lease) =>
        outbox.release(lease, { error: TAB_CLOSED }).catch(() => false)
      ),
    );
  }

  async function track(
    outbox: HostedOutbox,
    method: string,
    args: readonly unknown[],
    result: unknown,
  ): Promise<void> {
    if (["acknowledge", "release", "acknowledgeAndClaim"].includes(method)) {
      const leases = Array.isArray(args[0]) ? args[0] : [args[0]];
      for (const lease of leases) own.delete(leaseKey(lease));
    }
    const claimed = claimedLeases(method, result);
    if (hidden) await handBack(outbox, claimed);
    else for (const lease of claimed) own.set(leaseKey(lease), lease);
  }

  async function handle(message: CallMessage): Promise<unknown> {
    switch (message.method) {
      case "open": {
        opened ??= open(message.args[0] as OpenConfig, openOutbox);
        return { vfs: (await opened).vfs };
      }
      case "hasVfs":
        return (await loadSqlite3()).capi.sqlite3_vfs_find(
          String(message.args[0]),
        ) !== 0;
    }
    if (opened === undefined) throw new Error("The outbox is not open");
    const { outbox, driver, release } = await opened;
    switch (message.method) {
      case "close":
        await outbox.close();
        release();
        return undefined;
      case "hide": {
        // The tab leaves the leases it knows of (args[0], their keys) to
        // the next leader; those of calls still in flight are ours to give.
        hidden = true;
        const left = new Set(
          Array.isArray(message.args[0]) ? message.args[0].map(String) : [],
        );
        const leases = [...own.entries()].filter(([key]) => !left.has(key))
          .map(([, lease]) => lease);
        own.clear();
        await handBack(outbox, leases);
        return undefined;
      }
      case "show":
        hidden = false;
        return undefined;
    }
    const method = (outbox as unknown as Record<string, unknown>)[
      message.method
    ];
    if (
      typeof method !== "function" || message.method.startsWith("_") ||
      message.method === "transaction" || message.method === "constructor"
    ) {
      throw new TypeError(
        `Cannot call '${message.method}' as it is not an outbox method`,
      );
    }
    const refusedBefore = quotaErrors;
    let result: unknown;
    try {
      result = await method.apply(outbox, message.args);
    } catch (error) {
      const typed = storageError(error, quotaErrors !== refusedBefore);
      // The log holds the bytes the refused write could not extend: hand
      // them back, so that a purge (or the call again) has room to write.
      if (typed instanceof StorageFullError) await truncateWal(driver);
      throw typed;
    }
    if (message.method === "maintain") await truncateWal(driver);
    if (message.method === "stats") {
      result = { ...result as object, storage: await estimate() };
    }
    if (message.own) {
      await track(outbox, message.method, message.args, result);
    }
    return result;
  }

  scope.addEventListener("message", (event) => {
    const message = event.data as CallMessage;
    if (message?.type !== "call") return;
    handle(message).then(
      (value) =>
        reply(scope, { type: "reply", id: message.id, ok: true, value }),
      (error) =>
        reply(scope, {
          type: "reply",
          id: message.id,
          ok: false,
          error: toWireError(error),
        }),
    );
  });
}

function reply(scope: WorkerScope, message: ReplyMessage): void {
  scope.postMessage(message);
}

async function open(
  config: OpenConfig,
  openOutbox: OutboxFactory,
): Promise<Opened> {
  const sqlite3 = await loadSqlite3();
  const vfs = config.vfs === "auto"
    ? ((globalThis as { crossOriginIsolated?: boolean }).crossOriginIsolated
      ? "opfs"
      : "opfs-sahpool")
    : config.vfs;
  if (vfs !== "opfs" && vfs !== "opfs-sahpool") {
    throw new RangeError(
      `Cannot open outbox as 'vfs' must be "auto", "opfs-sahpool" or "opfs": current value is ${
        String(config.vfs)
      }`,
    );
  }
  const { db, vfsName, release } = vfs === "opfs"
    ? openOpfs(sqlite3, config.name)
    : await openSahPool(sqlite3, config.name, config.openTimeoutMs);
  let driver: SqliteWasmDriver | undefined;
  try {
    const chosen = db.dbVfsName();
    if (chosen !== vfsName) {
      throw new OpfsUnavailableError(
        `Opened through VFS '${chosen}' instead of '${vfsName}'`,
      );
    }
    if (config.synchronous !== "full" && config.synchronous !== "normal") {
      throw new RangeError(
        `Cannot open outbox as 'synchronous' must be "full" or "normal": current value is ${
          String(config.synchronous)
        }`,
      );
    }
    if (vfs === "opfs-sahpool") {
      // The pool admits one connection per origin anyway, so holding the
      // lock for good costs nothing and allows WAL: one flush per commit and
      // no journal growing and shrinking (OPFS resizes are slow), which made
      // commits several times faster in headless Chromium here.
      db.exec("PRAGMA locking_mode=EXCLUSIVE");
      // A new file's pages, as the Deno and native drivers make them:
      // before auto_vacuum and WAL write the first page; an existing file
      // keeps its own.
      db.exec(`PRAGMA page_size=${NEW_FILE_PAGE_SIZE}`);
      // Before WAL, whose switch writes the header of a new file: after
      // that auto_vacuum no longer changes without a VACUUM, and maintain()
      // could give nothing back.
      db.exec("PRAGMA auto_vacuum=INCREMENTAL");
      db.exec("PRAGMA journal_mode=WAL");
      // As the other drivers: above the log's usual cycle (1,000 pages of
      // 4 KiB between automatic checkpoints), so a log reset after a
      // checkpoint is rewritten in place, and one that grew further shrinks
      // back. Below it, every reset truncated the log and every commit until
      // the next checkpoint grew the file again, each flush then also
      // writing its new size (an fdatasync of twice the time).
      db.exec(`PRAGMA journal_size_limit=${JOURNAL_SIZE_LIMIT_BYTES}`);
    }
    db.exec(`PRAGMA synchronous=${config.synchronous}`);
    // Held alone and syncing every commit, a commit's frames are one OPFS
    // write, made by the commit's flush (see WriteSequences.frameRuns).
    sequences.frameRuns = vfs === "opfs-sahpool" &&
      config.synchronous === "full";
    driver = new SqliteWasmDriver(sqlite3, db);
    const outbox = await openOutbox(driver, config.outbox);
    return { outbox, driver, vfs, release };
  } catch (error) {
    if (driver === undefined) db.close();
    else await driver.close();
    release();
    throw error;
  }
}

function openOpfs(
  sqlite3: Sqlite3Static,
  name: string,
): { db: Database; vfsName: string; release: () => void } {
  if (!sqlite3.capi.sqlite3_vfs_find("opfs")) {
    throw new OpfsUnavailableError(
      "The 'opfs' VFS is not available: it needs a cross-origin isolated dedicated worker",
    );
  }
  const db = new sqlite3.oo1.DB({
    filename: `/leased-outbox/${name}.sqlite3`,
    flags: "c",
    vfs: "opfs",
  });
  return { db, vfsName: "opfs", release: () => {} };
}

async function openSahPool(
  sqlite3: Sqlite3Static,
  name: string,
  openTimeoutMs: number,
): Promise<{ db: Database; vfsName: string; release: () => void }> {
  const poolOptions = {
    // One pool per outbox name, so outboxes of one origin never contend.
    name: `leased-outbox-${name}`,
    directory: `.leased-outbox/${name}`,
    // The default on a failed init is removeVfs(), which deletes the pool's
    // directory: a lock held by another tab must never cost data.
    preserveOnInitFailure: true,
    // Otherwise the first failure is cached and every retry repeats it.
    forceReinitIfPreviouslyFailed: true,
  };
  const deadline = Date.now() + openTimeoutMs;
  for (let delayMs = 20;; delayMs = Math.min(delayMs * 2, 250)) {
    try {
      const pool = await sqlite3.installOpfsSAHPoolVfs(poolOptions);
      const db = new pool.OpfsSAHPoolDb(`/${name}.sqlite3`);
      try {
        claimPowersafeOverwrite(sqlite3, db);
      } catch (error) {
        db.close();
        pool.pauseVfs();
        throw error;
      }
      return { db, vfsName: pool.vfsName, release: () => pool.pauseVfs() };
    } catch (error) {
      if (!isLockedError(error)) {
        throw new OpfsUnavailableError(
          `Cannot open OPFS database '${name}': ${errorMessage(error)}`,
          { cause: error },
        );
      }
      if (Date.now() + delayMs > deadline) {
        throw new OpfsBusyError(name, { cause: error });
      }
      await new Promise((resolve) => setTimeout(resolve, delayMs));
    }
  }
}

/**
 * Makes the `opfs-sahpool` VFS's files report
 * `SQLITE_IOCAP_POWERSAFE_OVERWRITE` beside what they report
 * (`SQLITE_IOCAP_UNDELETABLE_WHEN_OPEN`), as SQLite's unix VFS does by
 * default and the Deno VFS does: a write changes no byte outside its range,
 * even on power loss. An OPFS file in Chromium is a file on the host's file
 * system, written with `pwrite`. Without it, SQLite pads each WAL commit to
 * the VFS's 4,096-byte sector with a copy of its last frame, and syncs
 * inside that copy: three more OPFS writes per commit, each a round of
 * system calls and a message to the browser process. Every commit is still
 * synced (`synchronous=FULL`) before it returns.
 *
 * The VFS shares one `sqlite3_io_methods` among its files; its
 * `xDeviceCharacteristics` slot is replaced once per realm, before the
 * write-ahead log is opened (which reads it).
 */
function claimPowersafeOverwrite(sqlite3: Sqlite3Static, db: Database): void {
  const { capi, wasm } = sqlite3;
  const stack = wasm.pstack.pointer;
  let methods: number;
  try {
    const pFile = wasm.pstack.allocPtr();
    const rc = capi.sqlite3_file_control(
      db,
      "main",
      capi.SQLITE_FCNTL_FILE_POINTER,
      pFile,
    );
    if (rc !== 0) {
      throw new OpfsUnavailableError(
        `Cannot read the database file's methods: SQLite result code ${rc}`,
      );
    }
    // sqlite3_file's first member is its pMethods.
    methods = Number(wasm.peekPtr(Number(wasm.peekPtr(pFile))));
  } finally {
    wasm.pstack.restore(stack);
  }
  const { members } = (capi.sqlite3_io_methods as unknown as {
    structInfo: { members: Record<string, { offset: number }> };
  }).structInfo;
  const slot = methods + members["xDeviceCharacteristics"]!.offset;
  deviceCharacteristics ??= wasm.installFunction(
    "i(p)",
    () =>
      capi.SQLITE_IOCAP_UNDELETABLE_WHEN_OPEN |
      capi.SQLITE_IOCAP_POWERSAFE_OVERWRITE,
  ) as number;
  wasm.pokePtr(slot, deviceCharacteristics);
}
let deviceCharacteristics: number | undefined;

function isLockedError(error: unknown): boolean {
  return error instanceof DOMException &&
    (error.name === "NoModificationAllowedError" ||
      error.name === "InvalidStateError");
}

function errorMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
