/**
 * A SQLite VFS that gives the official SQLite WASM build real files under
 * Deno: the database, its journals, WAL and WAL index through descriptors of
 * its own (libc via `Deno.dlopen`).
 *
 * The package's node build (which Deno loads) only has a transient in-memory
 * filesystem; {@linkcode installDenoFileVfs} registers this VFS so that file
 * paths and `file:` URIs open real files on disk.
 *
 * Locking is SQLite's own (https://sqlite.org/lockingv3.html): byte-range
 * locks on the database file at os_unix.c's offsets (PENDING_BYTE
 * 0x40000000, RESERVED +1, the 510-byte SHARED range from +2), taken in the
 * order and with the conversions of `unixLock`/`unixUnlock`, so that the
 * `sqlite3` CLI, `node:sqlite` and any other SQLite process exclude WASM
 * connections and are excluded by them; the kernel drops a dead process's
 * locks. Locks follow the inode, so hard links and renames share them;
 * paths are canonicalised (symlinks resolved) so that two names of one file
 * also share the journal. Which locks depends on the system
 * (`deno/platform.ts`):
 *
 * - On Linux, open file description locks (`F_OFD_SETLK`, see
 *   `deno/ofd_locks.ts`): each open file description owns its locks, so two
 *   connections in one process exclude each other like two processes. A
 *   connection refused a lock waits in the kernel (`F_OFD_SETLKW`) on a
 *   second open file description, for a read lock or for the writers' turn
 *   (a byte native SQLite never locks), never for SQLite's own write locks.
 * - On macOS and the BSDs, classic POSIX locks (`F_SETLK`, see
 *   `deno/posix_locks.ts`), which belong to the process: as in os_unix.c,
 *   the process's lock on each file is kept once, per inode, and its
 *   connections are judged against it; descriptors are never closed while
 *   the process holds locks on the file (see `deno/inodes.ts`, which also
 *   keeps them for native SQLite's classic locks on Linux); a refused
 *   connection polls.
 *   `LEASED_OUTBOX_VFS_LOCKS=posix` chooses them on Linux too (for tests).
 * - On Windows, opening a file fails, naming `openNodeSqlite`.
 *
 * WAL's shared memory is the `<db>-shm` file mapped into the WASM memory,
 * with os_unix.c's locks on it (see `deno/shared_memory.ts`), so WAL is
 * shared across connections and processes, native SQLite's included.
 *
 * `PRAGMA fullfsync` is honoured as os_unix.c honours it: the syncs it makes
 * full use `F_FULLFSYNC` on macOS, which flushes the drive's cache too.
 *
 * What this does not do: lock reliably on network filesystems, share WAL
 * off x86-64, or (with classic locks) share a file with `node:sqlite` in the
 * same process, whose locks a process's own do not exclude.
 *
 * @module
 */
import type { loadSqlite3 } from "../drivers/sqlite_wasm.ts";
import type { Sqlite3Static, WasmPointer } from "@sqlite.org/sqlite-wasm";
import { createVfs, MAX_PATHNAME } from "./vfs_table.ts";
import { OK, pause } from "./vfs_codes.ts";
import { describe } from "../validate.ts";

/** Options for {@linkcode installDenoFileVfs}. */
export interface DenoFileVfsOptions {
  /**
   * The name the VFS is registered under (`?vfs=` in URIs, `vfs` in oo1).
   *
   * @default {"deno-file"}
   */
  readonly name?: string;
  /**
   * Whether the VFS becomes SQLite's default, so plain paths use it.
   *
   * @default {true}
   */
  readonly asDefault?: boolean;
}

/**
 * Registers the Deno file VFS with a SQLite WASM module, once per module and
 * name (later calls return the name without registering again).
 *
 * Opening a database file needs `--allow-ffi` (its locks and I/O go through
 * libc; without it the open fails with an error naming the flag), and
 * `--allow-read` and `--allow-write` for the database's directory, where the
 * VFS creates the journal.
 *
 * @param sqlite3 The initialised module (from `loadSqlite3()`).
 * @param options See {@linkcode DenoFileVfsOptions}.
 * @returns The name the VFS is registered under.
 * @throws {Error} When SQLite refuses the registration.
 *
 * @example Open a database file through the VFS
 * ```ts
 * import { installDenoFileVfs } from "@leased/outbox/sqlite-wasm";
 * import sqlite3InitModule from "@sqlite.org/sqlite-wasm";
 * import assert from "node:assert/strict";
 *
 * const sqlite3 = await sqlite3InitModule();
 * const vfs = installDenoFileVfs(sqlite3, { name: "deno-file-example", asDefault: false });
 * const dir = Deno.makeTempDirSync();
 * const db = new sqlite3.oo1.DB({ filename: `${dir}/example.db`, flags: "c", vfs });
 * db.exec("CREATE TABLE t(x); INSERT INTO t VALUES (42)");
 * db.close();
 * assert.equal(Deno.statSync(`${dir}/example.db`).size > 0, true);
 * Deno.removeSync(dir, { recursive: true });
 * ```
 */
export function installDenoFileVfs(
  sqlite3: Awaited<ReturnType<typeof loadSqlite3>>,
  options: DenoFileVfsOptions = {},
): string {
  const name = options.name ?? "deno-file";
  if (typeof name !== "string" || name.length === 0) {
    throw new TypeError(
      `Cannot install the VFS as 'name' must be a non-empty string: current value is ${
        describe(name)
      }`,
    );
  }
  const asDefault = options.asDefault ?? true;
  const capi = sqlite3.capi;
  if (capi.sqlite3_vfs_find(name)) {
    if (asDefault) capi.sqlite3_vfs_register(capi.sqlite3_vfs_find(name), 1);
    return name;
  }
  const { io, vfs, takeLastError, busyWait } = createVfs(
    sqlite3,
    () => ioMethodsPointer.get(sqlite3)!,
  );
  lastErrors.set(sqlite3, takeLastError);
  busyWaits.set(sqlite3, busyWait);
  const ioStruct = new capi.sqlite3_io_methods();
  // The typings name it `iVersion`; the struct binder's member is `$iVersion`.
  // Version 2 adds the xShm methods: WAL shared across connections.
  (ioStruct as unknown as { $iVersion: number }).$iVersion = 2;
  const vfsStruct = new capi.sqlite3_vfs();
  vfsStruct.$iVersion = 2;
  // The typings put structInfo on instances; the binder puts it on the class.
  vfsStruct.$szOsFile = (capi.sqlite3_file as unknown as {
    structInfo: { sizeof: number };
  }).structInfo.sizeof;
  vfsStruct.$mxPathname = MAX_PATHNAME;
  ioMethodsPointer.set(sqlite3, ioStruct.pointer);
  sqlite3.vfs.installVfs({
    io: { struct: ioStruct, methods: io as never },
    vfs: { struct: vfsStruct, methods: vfs as never, name, asDefault },
  });
  return name;
}

/**
 * Returns and clears the message of the Deno file VFS's last failure in this
 * module. SQLite reports a failed open only as "unable to open database
 * file"; this says why (a missing directory, a missing `--allow-write`, ...).
 *
 * @param sqlite3 The module the VFS was installed in.
 * @returns The message, or `undefined` when nothing failed since the last call.
 *
 * @example Why an open failed
 * ```ts
 * import { installDenoFileVfs, takeDenoFileVfsError } from "@leased/outbox/sqlite-wasm";
 * import sqlite3InitModule from "@sqlite.org/sqlite-wasm";
 * import assert from "node:assert/strict";
 *
 * const sqlite3 = await sqlite3InitModule();
 * const vfs = installDenoFileVfs(sqlite3, { name: "deno-file-errors", asDefault: false });
 * assert.throws(() => new sqlite3.oo1.DB({ filename: "/no/such/dir/x.db", flags: "c", vfs }));
 * assert.match(takeDenoFileVfsError(sqlite3) ?? "", /No such file or directory/);
 * assert.equal(takeDenoFileVfsError(sqlite3), undefined);
 * ```
 */
export function takeDenoFileVfsError(
  sqlite3: Awaited<ReturnType<typeof loadSqlite3>>,
): string | undefined {
  return lastErrors.get(sqlite3)?.();
}

/**
 * The VFS's message for its last failure if that failure's extended result
 * code is `code`, taken (cleared) then: a statement's `SQLITE_IOERR_*` or
 * `SQLITE_CANTOPEN` says why (the file, the call, the errno).
 *
 * @ignore
 */
export function takeDenoFileVfsReason(
  sqlite3: Awaited<ReturnType<typeof loadSqlite3>>,
  code: number,
): string | undefined {
  return lastErrors.get(sqlite3)?.(code);
}

const lastErrors = new WeakMap<
  Sqlite3Static,
  (code?: number) => string | undefined
>();

/**
 * Waits after the connection `db` got `SQLITE_BUSY` until the lock that
 * refused it is free, or `timeoutMs` milliseconds at most: in the kernel
 * (see `LockSet.wait`), or on a short timer when readers are in a writer's
 * way or the lock is unknown. `SQLITE_FCNTL_FILE_POINTER` finds the
 * connection's main database file.
 *
 * @ignore
 * @param sqlite3 The module the VFS was installed in.
 * @param db The connection's `sqlite3*`.
 * @param timeoutMs The longest wait, in milliseconds.
 */
export function denoFileBusyWait(
  sqlite3: Awaited<ReturnType<typeof loadSqlite3>>,
  db: number,
  timeoutMs: number,
): Promise<void> {
  const busyWait = busyWaits.get(sqlite3);
  if (busyWait === undefined) return pause(timeoutMs);
  const { wasm, capi } = sqlite3;
  const stack = wasm.pstack.pointer;
  try {
    const slot = wasm.pstack.allocPtr() as WasmPointer;
    const rc = capi.sqlite3_file_control(
      db as unknown as WasmPointer,
      "main",
      capi.SQLITE_FCNTL_FILE_POINTER,
      slot,
    );
    return rc === OK
      ? busyWait(Number(wasm.peekPtr(slot)), timeoutMs)
      : pause(timeoutMs);
  } finally {
    wasm.pstack.restore(stack);
  }
}

const busyWaits = new WeakMap<
  Sqlite3Static,
  (pFile: number, timeoutMs: number) => Promise<void>
>();

const ioMethodsPointer = new WeakMap<Sqlite3Static, WasmPointer>();
