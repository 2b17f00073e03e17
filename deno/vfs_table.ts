/**
 * The Deno file VFS's method tables, `sqlite3_io_methods` and
 * `sqlite3_vfs`, as SQLite calls them: each method turns the files' work
 * into a result code, and no exception crosses into WASM.
 *
 * @module
 */
import { dirname } from "node:path";
import type { Sqlite3Static, WasmPointer } from "@sqlite.org/sqlite-wasm";
import { loadLibc } from "./libc.ts";
import { SidecarFiles } from "./sidecar_files.ts";
import { WriteSequences } from "../drivers/write_sequences.ts";
import {
  DatabaseFile,
  DiskFile,
  MemoryFile,
  openDatabaseDescriptors,
  type OpenFile,
  refuseSidecarLocks,
} from "./vfs_files.ts";
import {
  canonicalPath,
  permitted,
  requirePermission,
  syncDirectory,
} from "./file_access.ts";
import {
  ACCESS_EXISTS,
  ACCESS_READWRITE,
  CANTOPEN,
  errorCode,
  FCNTL_HAS_MOVED,
  IOCAP_POWERSAFE_OVERWRITE,
  IOERR,
  IOERR_ACCESS,
  IOERR_CHECKRESERVEDLOCK,
  IOERR_CLOSE,
  IOERR_DELETE,
  IOERR_DELETE_NOENT,
  IOERR_DIR_FSYNC,
  IOERR_FSTAT,
  IOERR_FSYNC,
  IOERR_LOCK,
  IOERR_READ,
  IOERR_SHMLOCK,
  IOERR_SHMMAP,
  IOERR_SHORT_READ,
  IOERR_TRUNCATE,
  IOERR_UNLOCK,
  IOERR_WRITE,
  NOTFOUND,
  OK,
  OPEN_CREATE,
  OPEN_DELETEONCLOSE,
  OPEN_EXCLUSIVE,
  OPEN_MAIN_DB,
  OPEN_MAIN_JOURNAL,
  OPEN_READONLY,
  OPEN_READWRITE,
  OPEN_SUPER_JOURNAL,
  OPEN_WAL,
  pause,
  READONLY_DBMOVED,
  SHM_EXCLUSIVE,
  SHM_UNLOCK,
  SHM_WRITE_LOCK,
  SYNC_FULL,
  VfsError,
} from "./vfs_codes.ts";

export const MAX_PATHNAME = 1024;
const SECTOR_SIZE = 4096;
const encoder = new TextEncoder();

/**
 * The VFS's two method tables over `sqlite3`'s memory; `ioMethods` gives the
 * address of the registered `sqlite3_io_methods` that each opened file
 * points to. Also returns the last failure's message (cleared when read) and
 * the busy wait of the connection whose main database is at `pFile`.
 */
export function createVfs(
  sqlite3: Sqlite3Static,
  ioMethods: () => WasmPointer,
) {
  const wasm = sqlite3.wasm;
  const files = new Map<number, OpenFile>();
  const sidecars = new SidecarFiles();
  const sequences = new WriteSequences();
  let lastError: { message: string; code: number } | undefined;

  // Exceptions must never cross into WASM: every method reports a result
  // code and keeps the message for xGetLastError.
  const fail = (error: unknown, fallback: number): number => {
    const code = errorCode(error, fallback);
    lastError = {
      message: error instanceof Error ? error.message : String(error),
      code,
    };
    return code;
  };
  const fileOf = (pFile: WasmPointer): OpenFile => {
    const file = files.get(Number(pFile));
    if (file === undefined) {
      throw new VfsError(`No open file at pointer ${pFile}`, IOERR);
    }
    return file;
  };
  const databaseOf = (pFile: WasmPointer): DatabaseFile => {
    const file = fileOf(pFile);
    if (!(file instanceof DatabaseFile)) {
      throw new VfsError(`${file.path} has no WAL index`, IOERR);
    }
    return file;
  };
  // Heap views detach when memory grows, so take a fresh one on every call.
  const heap = (pointer: WasmPointer, length: number): Uint8Array =>
    wasm.heap8u().subarray(Number(pointer), Number(pointer) + length);

  // For the first line of every method that touches files.
  const flushed = (): number => {
    try {
      sequences.flush();
      return OK;
    } catch (error) {
      return fail(error, IOERR_WRITE);
    }
  };

  const io = {
    xClose(pFile: WasmPointer): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      const file = files.get(Number(pFile));
      files.delete(Number(pFile));
      if (file instanceof DatabaseFile) sidecars.closed(file);
      try {
        file?.close();
        return OK;
      } catch (error) {
        return fail(error, IOERR_CLOSE);
      }
    },
    xRead(
      pFile: WasmPointer,
      pDest: WasmPointer,
      amount: number,
      offset: bigint,
    ): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        const into = heap(pDest, amount);
        const file = fileOf(pFile);
        sequences.read(file, Number(offset));
        const done = file.read(into, Number(offset));
        if (done < amount) {
          // SQLite requires the unread tail zero-filled on a short read.
          into.fill(0, done);
          return IOERR_SHORT_READ;
        }
        return OK;
      } catch (error) {
        return fail(error, IOERR_READ);
      }
    },
    xWrite(
      pFile: WasmPointer,
      pSource: WasmPointer,
      amount: number,
      offset: bigint,
    ): number {
      try {
        sequences.write(
          fileOf(pFile),
          heap(pSource, amount),
          Number(offset),
        );
        return OK;
      } catch (error) {
        return fail(error, IOERR_WRITE);
      }
    },
    xTruncate(pFile: WasmPointer, size: bigint): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        fileOf(pFile).truncate(Number(size));
        return OK;
      } catch (error) {
        return fail(error, IOERR_TRUNCATE);
      }
    },
    xSync(pFile: WasmPointer, flags: number): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        // PRAGMA fullfsync (and checkpoint_fullfsync) make it SYNC_FULL,
        // which is F_FULLFSYNC where the system has it (macOS).
        fileOf(pFile).sync((flags & 0x0f) === SYNC_FULL);
        return OK;
      } catch (error) {
        return fail(error, IOERR_FSYNC);
      }
    },
    xFileSize(pFile: WasmPointer, pSize: WasmPointer): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        wasm.poke64(pSize, BigInt(fileOf(pFile).size()));
        return OK;
      } catch (error) {
        return fail(error, IOERR_FSTAT);
      }
    },
    xLock(pFile: WasmPointer, level: number): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        return fileOf(pFile).lock(level);
      } catch (error) {
        return fail(error, IOERR_LOCK);
      }
    },
    xUnlock(pFile: WasmPointer, level: number): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        return fileOf(pFile).unlock(level);
      } catch (error) {
        return fail(error, IOERR_UNLOCK);
      }
    },
    xCheckReservedLock(pFile: WasmPointer, pOut: WasmPointer): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        wasm.poke32(pOut, fileOf(pFile).checkReserved() ? 1 : 0);
        return OK;
      } catch (error) {
        wasm.poke32(pOut, 0);
        return fail(error, IOERR_CHECKRESERVEDLOCK);
      }
    },
    xFileControl(pFile: WasmPointer, op: number, pArg: WasmPointer): number {
      if (op !== FCNTL_HAS_MOVED) return NOTFOUND;
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        const file = fileOf(pFile);
        wasm.poke32(
          pArg,
          file instanceof DatabaseFile && file.hasMoved() ? 1 : 0,
        );
        return OK;
      } catch (error) {
        return fail(error, IOERR_FSTAT);
      }
    },
    xShmMap(
      pFile: WasmPointer,
      region: number,
      size: number,
      extend: number,
      pp: WasmPointer,
    ): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        const shm = databaseOf(pFile).sharedMemory(wasm);
        wasm.pokePtr(pp, shm.map(region, size, extend !== 0));
        return OK;
      } catch (error) {
        wasm.pokePtr(pp, 0);
        return fail(error, IOERR_SHMMAP);
      }
    },
    xShmLock(
      pFile: WasmPointer,
      offset: number,
      n: number,
      flags: number,
    ): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        const database = databaseOf(pFile);
        // The pager asks SQLITE_FCNTL_HAS_MOVED only before a rollback
        // journal: in WAL mode a write transaction begins here, and fails,
        // as it would there, rather than commit to a file nobody will open.
        if (
          offset === SHM_WRITE_LOCK && (flags & SHM_EXCLUSIVE) !== 0 &&
          (flags & SHM_UNLOCK) === 0 && database.hasMoved()
        ) {
          return READONLY_DBMOVED;
        }
        return database.sharedMemory(wasm).lock(offset, n, flags);
      } catch (error) {
        return fail(error, IOERR_SHMLOCK);
      }
    },
    xShmBarrier(): void {
      // The call itself orders memory (see SharedMemory); no I/O waits here,
      // between whose two copies of the index header readers wait. Nothing
      // held reaches here (a sequence ends with its last write); were
      // anything held, it would still reach the file before what this orders.
      flushed();
    },
    xShmUnmap(pFile: WasmPointer, deleteFile: number): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        databaseOf(pFile).closeSharedMemory(deleteFile !== 0);
        return OK;
      } catch (error) {
        return fail(error, IOERR_SHMMAP);
      }
    },
    xSectorSize(): number {
      return SECTOR_SIZE;
    },
    xDeviceCharacteristics(): number {
      // What os_unix reports on Linux by default (SQLITE_POWERSAFE_OVERWRITE=1).
      return IOCAP_POWERSAFE_OVERWRITE;
    },
  };

  const vfs = {
    xOpen(
      _pVfs: WasmPointer,
      zName: WasmPointer,
      pFile: WasmPointer,
      flags: number,
      pOutFlags: WasmPointer,
    ): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        const name = zName ? wasm.cstrToJs(zName) : null;
        let outFlags = flags;
        let file: OpenFile;
        if (name === null || name === "") {
          file = new MemoryFile();
        } else {
          const writable = (flags & OPEN_READWRITE) !== 0;
          const create = writable && (flags & OPEN_CREATE) !== 0;
          const isJournal =
            (flags & (OPEN_MAIN_JOURNAL | OPEN_SUPER_JOURNAL | OPEN_WAL)) !== 0;
          if ((flags & OPEN_MAIN_DB) !== 0) {
            const libc = loadLibc(name);
            requirePermission(name, writable);
            refuseSidecarLocks(libc, name);
            const [fds, opened] = openDatabaseDescriptors(
              libc,
              name,
              writable,
              create,
              create && (flags & OPEN_EXCLUSIVE) !== 0,
            );
            if (writable && !opened) {
              outFlags = (flags & ~(OPEN_READWRITE | OPEN_CREATE)) |
                OPEN_READONLY;
            }
            const database = new DatabaseFile(libc, name, fds, opened);
            sidecars.opened(
              database,
              opened &&
                [`${name}-journal`, `${name}-wal`].every((path) =>
                  permitted(path, false) && permitted(path, true)
                ),
            );
            file = database;
          } else {
            const libc = loadLibc(name);
            // libc's open asks Deno for nothing: ask as for the database.
            if (!sidecars.granted(name)) requirePermission(name, writable);
            let fd: number;
            let created = false;
            if (create && isJournal && (flags & OPEN_EXCLUSIVE) === 0) {
              // A WAL file or rollback journal takes its database's mode.
              const suffix = (flags & OPEN_WAL) !== 0
                ? "-wal"
                : (flags & OPEN_MAIN_JOURNAL) !== 0
                ? "-journal"
                : undefined;
              [fd, created] = sidecars.openJournal(
                libc,
                name,
                suffix !== undefined && name.endsWith(suffix)
                  ? name.slice(0, -suffix.length)
                  : undefined,
              );
            } else {
              const createNew = create && (flags & OPEN_EXCLUSIVE) !== 0;
              fd = libc.open(name, {
                write: writable,
                create,
                createNew,
                noFollow: true,
              });
              // A super-journal, created here (O_EXCL), must reach the
              // directory before the journals that name it are relied on.
              created = createNew && isJournal;
            }
            file = new DiskFile(
              libc,
              name,
              fd,
              (flags & OPEN_DELETEONCLOSE) !== 0,
              created,
              (flags & OPEN_WAL) !== 0,
              (flags & OPEN_MAIN_JOURNAL) !== 0,
            );
          }
        }
        files.set(Number(pFile), file);
        wasm.pokePtr(pFile, ioMethods());
        if (pOutFlags) wasm.poke32(pOutFlags, outFlags);
        return OK;
      } catch (error) {
        return fail(error, CANTOPEN);
      }
    },
    xDelete(_pVfs: WasmPointer, zName: WasmPointer, syncDir: number): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      const path = wasm.cstrToJs(zName) ?? "";
      sidecars.seen(path, false);
      try {
        if (!sidecars.granted(path)) requirePermission(path, true);
        if (!loadLibc(path).unlink(path)) {
          return fail(
            new VfsError(`${path} is not there to delete`, IOERR_DELETE_NOENT),
            IOERR_DELETE_NOENT,
          );
        }
      } catch (error) {
        return fail(error, IOERR_DELETE);
      }
      if (syncDir) {
        try {
          syncDirectory(dirname(path));
        } catch (error) {
          return fail(error, IOERR_DIR_FSYNC);
        }
      }
      return OK;
    },
    xAccess(
      _pVfs: WasmPointer,
      zName: WasmPointer,
      flags: number,
      pOut: WasmPointer,
    ): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        const path = wasm.cstrToJs(zName) ?? "";
        let result = false;
        if (flags === ACCESS_EXISTS) {
          // As os_unix: an empty regular file (a TRUNCATE-mode journal
          // between transactions) counts as absent, so it is not probed
          // as a possible hot journal on every read. One stat(2) through
          // libc: Deno.statSync cost three times as much, a failing one an
          // exception besides.
          const info = loadLibc(path).stat(path);
          result = info !== undefined && (!info.regular || info.size > 0);
          sidecars.seen(path, info !== undefined);
        } else {
          // access(2), as os_unix: opening the path to find out, then
          // closing it, would drop this process's native SQLite locks on it.
          result = loadLibc(path).accessible(path, flags === ACCESS_READWRITE);
        }
        wasm.poke32(pOut, result ? 1 : 0);
        return OK;
      } catch (error) {
        wasm.poke32(pOut, 0);
        return fail(error, IOERR_ACCESS);
      }
    },
    xFullPathname(
      _pVfs: WasmPointer,
      zName: WasmPointer,
      nOut: number,
      pOut: WasmPointer,
    ): number {
      try {
        const bytes = encoder.encode(canonicalPath(wasm.cstrToJs(zName) ?? ""));
        if (bytes.length >= nOut) {
          throw new VfsError("Path is longer than mxPathname", CANTOPEN);
        }
        const out = heap(pOut, nOut);
        out.set(bytes);
        out[bytes.length] = 0;
        return OK;
      } catch (error) {
        return fail(error, CANTOPEN);
      }
    },
    xRandomness(_pVfs: WasmPointer, nOut: number, pOut: WasmPointer): number {
      // getRandomValues fills at most 65536 bytes per call.
      for (let done = 0; done < nOut; done += 65536) {
        crypto.getRandomValues(
          heap(Number(pOut) + done, Math.min(65536, nOut - done)),
        );
      }
      return nOut;
    },
    xSleep(_pVfs: WasmPointer, microseconds: number): number {
      // A real, synchronous sleep: SQLite calls this between busy retries
      // and expects the time to pass.
      Atomics.wait(sleepCell, 0, 0, microseconds / 1000);
      return microseconds;
    },
    xCurrentTime(_pVfs: WasmPointer, pOut: WasmPointer): number {
      wasm.poke64f(pOut, 2440587.5 + Date.now() / 86_400_000);
      return OK;
    },
    xCurrentTimeInt64(_pVfs: WasmPointer, pOut: WasmPointer): number {
      // Julian day number in milliseconds, as SQLite's own VFSes report it.
      wasm.poke64(pOut, 210866760000000n + BigInt(Date.now()));
      return OK;
    },
    xGetLastError(_pVfs: WasmPointer, nOut: number, pOut: WasmPointer): number {
      const error = lastError;
      if (error === undefined) return OK;
      if (nOut > 0) {
        const bytes = encoder.encode(error.message).subarray(0, nOut - 1);
        const out = heap(pOut, nOut);
        out.set(bytes);
        out[bytes.length] = 0;
      }
      return error.code;
    },
  };
  // `code`: only a failure with that result code (a statement's error
  // asks for the reason of its own code, never an older failure's).
  const takeLastError = (code?: number): string | undefined => {
    if (code !== undefined && lastError?.code !== code) return undefined;
    const message = lastError?.message;
    lastError = undefined;
    return message;
  };
  const busyWait = (pFile: number, timeoutMs: number): Promise<void> => {
    const file = files.get(pFile);
    return file instanceof DatabaseFile
      ? file.busyWait(timeoutMs)
      : pause(timeoutMs);
  };
  return { io, vfs, takeLastError, busyWait };
}

const sleepCell = new Int32Array(new SharedArrayBuffer(4));
