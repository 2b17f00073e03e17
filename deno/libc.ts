/**
 * The libc calls the Deno file VFS makes through `Deno.dlopen`: `open(2)`
 * and I/O on the database file's own descriptors, and byte-range locks
 * that native SQLite's POSIX locks conflict with: Linux's open file
 * description locks (`F_OFD_SETLK`, `F_OFD_SETLKW`, `F_OFD_GETLK`), or
 * classic POSIX locks (`F_SETLK`, `F_GETLK`) on macOS and the BSDs. The
 * numbers and layouts of each system are in `deno/platform.ts`.
 *
 * Deno exposes neither a file's descriptor nor byte-range locks, so the
 * database file is opened here, and so are its journals and WAL files (never
 * through a symbolic link, and created with the database's mode). The WAL
 * index (`<db>-shm`) is opened here too, locked, and mapped with `mmap` into
 * WASM memory.
 *
 * @module
 */

import {
  encodeFlock,
  type ErrnoName,
  LOCKS_VARIABLE,
  locksFor,
  type LockStyle,
  type Platform,
  platformFor,
  syncCall,
} from "./platform.ts";

/** The libc functions the VFS binds, under `platform`'s symbol names. */
export function symbolsOf(platform: Platform) {
  const names = platform.symbols;
  // Fills the argument registers before a variadic argument (see
  // Platform.variadicPadding); typed as fixed arguments of `open` and
  // `fcntl` either way, the padding is passed by Libc's #open and #fcntl.
  const pad = Array<"i64">(platform.variadicPadding).fill("i64");
  return {
    open: {
      // The mode as 64 bits: a stack slot on Apple's arm64 is 8 bytes.
      parameters: ["buffer", "i32", ...pad, "i64"] as ["buffer", "i32", "i64"],
      result: "i32",
    },
    close: { parameters: ["i32"], result: "i32" },
    pread: {
      name: names.pread,
      parameters: ["i32", "buffer", "usize", "i64"],
      result: "isize",
    },
    pwrite: {
      name: names.pwrite,
      parameters: ["i32", "buffer", "usize", "i64"],
      result: "isize",
    },
    sync: { name: names.sync, parameters: ["i32"], result: "i32" },
    ftruncate: {
      name: names.ftruncate,
      parameters: ["i32", "i64"],
      result: "i32",
    },
    lseek: {
      name: names.lseek,
      parameters: ["i32", "i64", "i32"],
      result: "i64",
    },
    fstat: { name: names.fstat, parameters: ["i32", "buffer"], result: "i32" },
    stat: { name: names.stat, parameters: ["buffer", "buffer"], result: "i32" },
    access: { parameters: ["buffer", "i32"], result: "i32" },
    unlink: { parameters: ["buffer"], result: "i32" },
    fcntl: {
      parameters: ["i32", "i32", ...pad, "buffer"] as ["i32", "i32", "buffer"],
      result: "i32",
    },
    fchmod: { parameters: ["i32", "u32"], result: "i32" },
    fchown: { parameters: ["i32", "u32", "u32"], result: "i32" },
    geteuid: { parameters: [], result: "u32" },
    // Linux's directory read (glibc 2.30 and later), for /proc/self/fd
    // (deno/proc_locks.ts); absent elsewhere.
    getdents64: {
      parameters: ["i32", "buffer", "usize"],
      result: "isize",
      optional: true,
    },
    // The same fcntl on a thread of Deno's blocking pool: F_OFD_SETLKW
    // sleeps in the kernel until the lock is granted, and the event loop
    // goes on meanwhile.
    fcntlBlocking: {
      name: "fcntl",
      parameters: ["i32", "i32", ...pad, "buffer"] as [
        "i32",
        "i32",
        "buffer",
      ],
      result: "i32",
      nonblocking: true,
    },
    mmap: {
      parameters: ["pointer", "usize", "i32", "i32", "i32", "i64"],
      result: "pointer",
    },
    errnoLocation: { name: names.errno, parameters: [], result: "pointer" },
    strerror: { parameters: ["i32"], result: "pointer" },
  } as const;
}

type Symbols = Deno.DynamicLibrary<ReturnType<typeof symbolsOf>>["symbols"];

// The VFS's own lock types, which Libc turns into the platform's l_type
// values (Linux's numbers; the BSDs' differ).
/** A read (shared) byte-range lock. */
export const F_RDLCK = 0;
/** A write (exclusive) byte-range lock. */
export const F_WRLCK = 1;
/** No lock: unlocks the range. */
export const F_UNLCK = 2;

const SEEK_END = 2;
const S_IFMT = 0o170000;
const S_IFREG = 0o100000;
const R_OK = 4;
const W_OK = 2;

/**
 * The `fcntl` lock commands this process's VFS has made, by name
 * (`F_OFD_SETLK`, `F_SETLK`, `F_GETLK`, ...): for tests, which check that
 * `LEASED_OUTBOX_VFS_LOCKS=posix` takes effect. Syncs count too, by what
 * they called (`fdatasync`, `fsync`, `F_FULLFSYNC`), and `full` syncs asked for.
 */
export const libcCalls: Record<string, number> = {};

function count(name: string): void {
  libcCalls[name] = (libcCalls[name] ?? 0) + 1;
}

/** A failed libc call: `code` is the errno's name, as in Deno's own errors. */
export class LibcError extends Error {
  readonly errno: number;
  readonly code: string;
  constructor(message: string, errno: number, code = `errno ${errno}`) {
    super(message);
    this.errno = errno;
    this.code = code;
  }
}

/** What `open` is asked for. */
export interface OpenMode {
  readonly write: boolean;
  readonly create: boolean;
  readonly createNew: boolean;
  /** Fail (ELOOP) rather than follow a symbolic link at the path's end. */
  readonly noFollow?: boolean;
  /** The permission bits of a file this creates, before the umask (0o644). */
  readonly permissions?: number | undefined;
}

/** What `stat(2)` tells of a path, as far as the VFS asks. */
export interface PathInfo {
  /** Whether it is a regular file (not a directory, device, ...). */
  readonly regular: boolean;
  /** Its size, in bytes. */
  readonly size: number;
}

/** A file's identity: device and inode numbers. */
export interface FileId {
  readonly dev: bigint;
  readonly ino: bigint;
}

const encoder = new TextEncoder();

/**
 * The libc functions, bound once per process, speaking `platform`'s numbers,
 * with byte-range locks of `style`: open file description locks (`"ofd"`,
 * owned by the description: F_OFD_SETLK, F_OFD_GETLK, F_OFD_SETLKW), or
 * classic POSIX locks (`"posix"`, owned by the process: F_SETLK, F_GETLK).
 */
export class Libc {
  /** The system's facts (see `deno/platform.ts`). */
  readonly platform: Platform;
  /** Which locks `setLock`, `conflictingLock` and `waitLock` take. */
  readonly lockStyle: LockStyle;
  readonly #c: Symbols;
  readonly #flock: Uint8Array;
  readonly #flockView: DataView;
  readonly #stat: Uint8Array;
  readonly #statView: DataView;
  readonly #setLk: number;
  readonly #getLk: number;
  readonly #setLkName: string;
  readonly #getLkName: string;
  /** The platform's l_type for each of the VFS's lock types (by index). */
  readonly #types: readonly number[];
  readonly #errnoNames: ReadonlyMap<number, ErrnoName>;
  readonly #errno: Readonly<Record<ErrnoName, number>>;
  /** Zeros for the argument registers before a variadic argument. */
  readonly #pad: readonly bigint[];
  /**
   * The path `#statPath` was last given, NUL-terminated: a write
   * transaction in WAL mode stats its database's path (whether the file
   * moved), the same one every time.
   */
  #statted: { readonly path: string; readonly bytes: Uint8Array } = {
    path: "",
    bytes: new Uint8Array(1),
  };

  constructor(c: Symbols, platform: Platform, style: LockStyle) {
    this.#c = c;
    this.#pad = Array<bigint>(platform.variadicPadding).fill(0n);
    this.platform = platform;
    this.lockStyle = style;
    this.#flock = new Uint8Array(platform.flock.size);
    this.#flockView = new DataView(this.#flock.buffer);
    this.#stat = new Uint8Array(platform.stat.size);
    this.#statView = new DataView(this.#stat.buffer);
    const { fcntl, lockTypes } = platform;
    const ofd = style === "ofd";
    this.#setLk = ofd ? fcntl.F_OFD_SETLK! : fcntl.F_SETLK;
    this.#getLk = ofd ? fcntl.F_OFD_GETLK! : fcntl.F_GETLK;
    this.#setLkName = ofd ? "F_OFD_SETLK" : "F_SETLK";
    this.#getLkName = ofd ? "F_OFD_GETLK" : "F_GETLK";
    this.#types = [lockTypes.F_RDLCK, lockTypes.F_WRLCK, lockTypes.F_UNLCK];
    this.#errno = platform.errno;
    this.#errnoNames = new Map(
      Object.entries(platform.errno).map(([name, value]) =>
        [value, name as ErrnoName] as const
      ),
    );
  }

  #lastErrno(): number {
    const pointer = this.#c.errnoLocation();
    return pointer === null
      ? 0
      : new Deno.UnsafePointerView(pointer).getInt32();
  }

  #fail(what: string, errno = this.#lastErrno()): LibcError {
    const pointer = this.#c.strerror(errno);
    const text = pointer === null
      ? `errno ${errno}`
      : Deno.UnsafePointerView.getCString(pointer);
    return new LibcError(
      `${text} (os error ${errno}): ${what}`,
      errno,
      this.#errnoNames.get(errno),
    );
  }

  /** Opens `path` close-on-exec and returns its descriptor. */
  open(path: string, mode: OpenMode): number {
    const o = this.platform.open;
    const flags = (mode.write ? o.O_RDWR : o.O_RDONLY) | o.O_CLOEXEC |
      (mode.create ? o.O_CREAT : 0) | (mode.createNew ? o.O_EXCL : 0) |
      (mode.noFollow ? o.O_NOFOLLOW : 0);
    const fd = (this.#c.open as (...args: unknown[]) => number)(
      encoder.encode(`${path}\0`),
      flags,
      ...this.#pad,
      BigInt(mode.permissions ?? 0o644),
    );
    if (fd < 0) throw this.#fail(`open '${path}'`);
    return fd;
  }

  close(fd: number): void {
    if (this.#c.close(fd) !== 0) throw this.#fail("close");
  }

  /** Reads at `offset` until `into` is full or the file ends; returns bytes read. */
  read(fd: number, into: Uint8Array, offset: number): number {
    let done = 0;
    while (done < into.length) {
      const n = Number(
        this.#c.pread(
          fd,
          into.subarray(done),
          BigInt(into.length - done),
          BigInt(offset + done),
        ),
      );
      if (n === 0) break;
      if (n < 0) {
        const errno = this.#lastErrno();
        if (errno === this.#errno.EINTR) continue;
        throw this.#fail("pread", errno);
      }
      done += n;
    }
    return done;
  }

  write(fd: number, from: Uint8Array, offset: number): void {
    let done = 0;
    while (done < from.length) {
      const n = Number(
        this.#c.pwrite(
          fd,
          from.subarray(done),
          BigInt(from.length - done),
          BigInt(offset + done),
        ),
      );
      if (n < 0) {
        const errno = this.#lastErrno();
        if (errno === this.#errno.EINTR) continue;
        throw this.#fail("pwrite", errno);
      }
      done += n;
    }
  }

  truncate(fd: number, size: number): void {
    if (this.#c.ftruncate(fd, BigInt(size)) !== 0) {
      throw this.#fail("ftruncate");
    }
  }

  /**
   * Flushes `fd` to the disk: with `full` (SQLite's SQLITE_SYNC_FULL, from
   * `PRAGMA fullfsync`), through the drive's cache with `F_FULLFSYNC` where
   * the system has it (macOS), falling back to a plain sync if it fails, as
   * os_unix.c's full_fsync does; else `fdatasync` on Linux (which also
   * flushes the file's size, all SQLite needs) and `fsync` elsewhere.
   */
  sync(fd: number, full = false): void {
    const call = syncCall(this.platform, full);
    if (full) count("full");
    count(call);
    if (
      call === "F_FULLFSYNC" &&
      this.#fcntl(fd, this.platform.fcntl.F_FULLFSYNC!, null) === 0
    ) {
      return;
    }
    if (this.#c.sync(fd) !== 0) throw this.#fail(this.platform.symbols.sync);
  }

  size(fd: number): number {
    const size = Number(this.#c.lseek(fd, 0n, SEEK_END));
    if (size < 0) throw this.#fail("lseek");
    return size;
  }

  /** Sets the permission bits of an open file; whether that worked. */
  chmod(fd: number, mode: number): boolean {
    return this.#c.fchmod(fd, mode) === 0;
  }

  /** Sets the owner and group of an open file; whether that worked. */
  chown(fd: number, uid: number, gid: number): boolean {
    return this.#c.fchown(fd, uid, gid) === 0;
  }

  /** Whether the process runs as root (its effective user id is 0). */
  isRoot(): boolean {
    return this.#c.geteuid() === 0;
  }

  /** The device and inode of an open descriptor. */
  fileId(fd: number): FileId {
    if (this.#c.fstat(fd, this.#stat) !== 0) throw this.#fail("fstat");
    return this.#statId();
  }

  /**
   * The device and inode of `fd`, or `undefined` when it is not open
   * (EBADF): for descriptors listed a moment ago, which another thread may
   * have closed since.
   *
   * @throws {LibcError} When `fstat` fails otherwise.
   */
  openFileId(fd: number): FileId | undefined {
    if (this.#c.fstat(fd, this.#stat) === 0) return this.#statId();
    const errno = this.#lastErrno();
    if (errno === this.#errno.EBADF) return undefined;
    throw this.#fail("fstat", errno);
  }

  /**
   * Reads the directory open at `fd` on from where the last read ended,
   * into `into` as Linux's `struct linux_dirent64` records (getdents64(2));
   * returns the bytes read, 0 at its end.
   *
   * @throws {LibcError} When the call fails, or is not there (not Linux).
   */
  readDirectory(fd: number, into: Uint8Array): number {
    const getdents = this.#c.getdents64;
    if (getdents === null) throw this.#fail("getdents64: not in this libc", 0);
    for (;;) {
      const n = Number(getdents(fd, into, BigInt(into.length)));
      if (n >= 0) return n;
      const errno = this.#lastErrno();
      if (errno !== this.#errno.EINTR) throw this.#fail("getdents64", errno);
    }
  }

  /** stat(2) of `path` into the stat buffer: 0, or the errno it failed with. */
  #statPath(path: string): number {
    if (this.#statted.path !== path) {
      this.#statted = { path, bytes: encoder.encode(`${path}\0`) };
    }
    return this.#c.stat(this.#statted.bytes, this.#stat) === 0
      ? 0
      : this.#lastErrno();
  }

  /** The device and inode in the stat buffer. */
  #statId(): FileId {
    const view = this.#statView;
    const { dev: [at, bytes], ino } = this.platform.stat;
    return {
      dev: bytes === 8
        ? view.getBigUint64(at, true)
        : BigInt(view.getUint32(at, true)),
      ino: view.getBigUint64(ino, true),
    };
  }

  /** Whether this process may read (and write) `path` (access(2)). */
  accessible(path: string, write: boolean): boolean {
    return this.#c.access(
      encoder.encode(`${path}\0`),
      write ? R_OK | W_OK : R_OK,
    ) === 0;
  }

  /**
   * What `path` names now (following links, as os_unix's xAccess does), or
   * `undefined` when it names nothing and cannot (ENOENT, ENOTDIR,
   * ENAMETOOLONG: a sidecar name longer than the file system allows): one
   * system call, and no exception for an absent file, which SQLite asks
   * about on every transaction.
   *
   * @throws {LibcError} When `stat` fails otherwise (e.g. EACCES, ELOOP):
   *   the file may be there.
   */
  stat(path: string): PathInfo | undefined {
    const errno = this.#statPath(path);
    const { ENOENT, ENOTDIR, ENAMETOOLONG } = this.#errno;
    if (errno === ENOENT || errno === ENOTDIR || errno === ENAMETOOLONG) {
      return undefined;
    }
    if (errno !== 0) return this.#statAgain(path, errno);
    const view = this.#statView;
    const { mode: [at, bytes], fileSize } = this.platform.stat;
    const mode = bytes === 2
      ? view.getUint16(at, true)
      : view.getUint32(at, true);
    return {
      regular: (mode & S_IFMT) === S_IFREG,
      size: Number(view.getBigInt64(fileSize, true)),
    };
  }

  /**
   * `stat` after a failure whose errno is not one that means no file: read
   * by a second FFI call after stat's, errno may have been set in between
   * by the runtime itself (a futex wait leaves EAGAIN, which stat(2) never
   * returns: a full test run saw "Resource temporarily unavailable (os
   * error 11): stat '...-wal'" for a WAL file that did not exist). Asked
   * again through `Deno.statSync`, which reads errno inside its own call.
   */
  #statAgain(path: string, errno: number): PathInfo | undefined {
    let info: Deno.FileInfo;
    try {
      info = Deno.statSync(path);
    } catch (error) {
      if (
        error instanceof Deno.errors.NotFound ||
        error instanceof Deno.errors.NotADirectory ||
        (error as { code?: unknown }).code === "ENAMETOOLONG"
      ) return undefined;
      throw this.#fail(`stat '${path}'`, errno);
    }
    return { regular: info.isFile, size: info.size };
  }

  /**
   * Removes `path` (unlink(2)); `false` when it names nothing (ENOENT).
   *
   * @throws {LibcError} When unlink fails otherwise.
   */
  unlink(path: string): boolean {
    if (this.#c.unlink(encoder.encode(`${path}\0`)) === 0) return true;
    const errno = this.#lastErrno();
    if (errno === this.#errno.ENOENT) return false;
    throw this.#fail(`unlink '${path}'`, errno);
  }

  /** The device and inode `path` names now; `undefined` when it names none. */
  pathId(path: string): FileId | undefined {
    return this.#statPath(path) === 0 ? this.#statId() : undefined;
  }

  /**
   * Tries to set (or with `F_UNLCK`, clear) a lock of this Libc's style on
   * `length` bytes from `start`; `false` when another owner's lock
   * conflicts (another description's, or with classic locks another
   * process's: a process never conflicts with itself).
   */
  setLock(fd: number, type: number, start: number, length: number): boolean {
    this.#fillFlock(type, start, length);
    count(this.#setLkName);
    if (this.#fcntl(fd, this.#setLk, this.#flock) === 0) return true;
    const errno = this.#lastErrno();
    if (errno === this.#errno.EAGAIN || errno === this.#errno.EACCES) {
      return false;
    }
    throw this.#lockError(errno);
  }

  /**
   * Whether another owner holds a lock that would conflict with a `type`
   * lock on `length` bytes from `start` (F_OFD_GETLK, or F_GETLK).
   */
  conflicts(fd: number, type: number, start: number, length: number): boolean {
    return this.conflictingLock(fd, type, start, length) !== F_UNLCK;
  }

  /**
   * The type of a lock another owner holds that would conflict with a
   * `type` lock on `length` bytes from `start` (`F_RDLCK` or `F_WRLCK`), or
   * `F_UNLCK` when none would (F_OFD_GETLK, or F_GETLK).
   */
  conflictingLock(
    fd: number,
    type: number,
    start: number,
    length: number,
  ): number {
    this.#fillFlock(type, start, length);
    count(this.#getLkName);
    if (this.#fcntl(fd, this.#getLk, this.#flock) !== 0) {
      throw this.#lockError(this.#lastErrno());
    }
    const found = this.#flockView.getInt16(this.platform.flock.type, true);
    // The kernel wrote the holder's l_pid (and FreeBSD's l_sysid).
    this.#flock.fill(0);
    const ours = this.#types.indexOf(found);
    if (ours < 0) throw this.#fail(`fcntl: lock type ${found}`, 0);
    return ours;
  }

  /**
   * Who holds a lock on the file of `fd` that a write lock on all of it
   * would conflict with, as F_OFD_GETLK answers (an open file description's
   * test, so this process's own classic locks conflict with it too, which
   * F_GETLK never reports): `undefined` when none does, else the holder's
   * process id as the kernel gives it (-1 for an open file description
   * lock); `null` with classic locks, which make no open file description
   * call (macOS and the BSDs have none).
   */
  lockHolder(fd: number): number | null | undefined {
    const command = this.platform.fcntl.F_OFD_GETLK;
    if (this.lockStyle !== "ofd" || command === undefined) return null;
    this.#fillFlock(F_WRLCK, 0, 0);
    count("F_OFD_GETLK");
    if (this.#fcntl(fd, command, this.#flock) !== 0) {
      throw this.#lockError(this.#lastErrno());
    }
    const layout = this.platform.flock;
    const found = this.#flockView.getInt16(layout.type, true);
    const pid = this.#flockView.getInt32(layout.pid, true);
    this.#flock.fill(0);
    return found === this.#types[F_UNLCK] ? undefined : pid;
  }

  /**
   * Maps `length` bytes of `fd` from `offset` at `address`, shared and
   * writable, in place of what was mapped there (MAP_FIXED): every
   * process that maps the file sees each write at once.
   */
  mapShared(address: bigint, length: number, fd: number, offset: number): void {
    const { MAP_SHARED } = this.platform.mmap;
    this.#map(address, length, MAP_SHARED, fd, offset, "mmap of the file");
  }

  /** Puts zeroed private memory at `address` in place of a file's mapping. */
  mapPrivate(address: bigint, length: number): void {
    const { MAP_PRIVATE, MAP_ANONYMOUS } = this.platform.mmap;
    this.#map(
      address,
      length,
      MAP_PRIVATE | MAP_ANONYMOUS,
      -1,
      0,
      "mmap of private memory",
    );
  }

  #map(
    address: bigint,
    length: number,
    flags: number,
    fd: number,
    offset: number,
    what: string,
  ): void {
    const { PROT_READ_WRITE, MAP_FIXED } = this.platform.mmap;
    const mapped = this.#c.mmap(
      Deno.UnsafePointer.create(address),
      BigInt(length),
      PROT_READ_WRITE,
      flags | MAP_FIXED,
      fd,
      BigInt(offset),
    );
    if (Deno.UnsafePointer.value(mapped) !== address) throw this.#fail(what);
  }

  /**
   * Sets an open file description lock, waiting in the kernel on a pool
   * thread until no other owner conflicts (F_OFD_SETLKW; the classic locks'
   * wait would never see this process's own locks, so it is not offered);
   * resolves `true` once it is held, `false` when the wait failed (e.g.
   * interrupted) and nothing is held. The call cannot be cancelled.
   */
  async waitLock(
    fd: number,
    type: number,
    start: number,
    length: number,
  ): Promise<boolean> {
    const command = this.platform.fcntl.F_OFD_SETLKW;
    if (this.lockStyle !== "ofd" || command === undefined) {
      throw new Error("waitLock takes open file description locks only");
    }
    const flock = new Uint8Array(this.platform.flock.size);
    this.#encode(new DataView(flock.buffer), type, start, length);
    count("F_OFD_SETLKW");
    const call = (this.#c.fcntlBlocking as (
      ...args: unknown[]
    ) => Promise<number>)(fd, command, ...this.#pad, flock);
    // The caller's timer keeps the process alive while it waits; a wait it
    // gave up on must not (the lock may never be let go). Deno has no public
    // way to unref an FFI call, so its core's is used when it is there;
    // without it, such a process exits once the lock is granted.
    unrefOpPromise?.(call);
    return await call === 0;
  }

  /** fcntl(2) with one pointer argument (see Platform.variadicPadding). */
  #fcntl(fd: number, command: number, arg: Uint8Array | null): number {
    // Without padding, a plain call: it keeps FFI's fast path (a spread
    // call took twice as long per lock).
    if (this.#pad.length === 0) return this.#c.fcntl(fd, command, arg);
    return (this.#c.fcntl as (...args: unknown[]) => number)(
      fd,
      command,
      ...this.#pad,
      arg,
    );
  }

  /**
   * Fills the process's struct flock in place (the hot path of every lock
   * call): its other bytes stay zero, but after F_GETLK, which may fill
   * them (see conflictingLock).
   */
  #fillFlock(type: number, start: number, length: number): void {
    const view = this.#flockView;
    const layout = this.platform.flock;
    view.setInt16(layout.type, this.#types[type]!, true);
    view.setInt16(layout.whence, 0, true);
    view.setBigInt64(layout.start, BigInt(start), true);
    view.setBigInt64(layout.len, BigInt(length), true);
    view.setInt32(layout.pid, 0, true);
  }

  /** l_whence SEEK_SET; l_pid 0, as open file description locks require. */
  #encode(view: DataView, type: number, start: number, length: number): void {
    encodeFlock(this.platform.flock, view, {
      type: this.#types[type]!,
      whence: 0,
      start,
      len: length,
      pid: 0,
    });
  }

  #lockError(errno: number): LibcError {
    if (errno === this.#errno.EINVAL && this.lockStyle === "ofd") {
      return this.#fail(
        "fcntl: this kernel has no open file description locks (F_OFD_SETLK, Linux 3.15 and later), which the Deno file VFS needs",
        errno,
      );
    }
    return this.#fail("fcntl", errno);
  }
}

const unrefOpPromise = (Deno as unknown as {
  [key: symbol]: { core?: { unrefOpPromise?: (p: Promise<unknown>) => void } };
})[(Deno as unknown as { internal: symbol }).internal]?.core?.unrefOpPromise;

let libc: Libc | undefined;

/**
 * The process's libc binding, loaded on first use: `Deno.build`'s system's
 * C library (see `deno/platform.ts`), with open file description locks on
 * Linux and classic POSIX locks on macOS and the BSDs, or on Linux too when
 * `LEASED_OUTBOX_VFS_LOCKS=posix` (for tests; read only where
 * `--allow-env` grants it).
 *
 * @param path The database that needs it, for the error message.
 * @throws {Deno.errors.NotCapable} Without `--allow-ffi`.
 * @throws {Error} On Windows (naming `openNodeSqlite`), on a system without
 *   a row in the platform table, or when libc cannot be loaded.
 */
export function loadLibc(path: string): Libc {
  if (libc !== undefined) return libc;
  let platform: Platform;
  try {
    platform = platformFor(Deno.build.os, Deno.build.arch);
  } catch (error) {
    throw new Error(`Cannot open ${path}: ${(error as Error).message}`);
  }
  if (Deno.permissions.querySync({ name: "ffi" }).state !== "granted") {
    throw new Deno.errors.NotCapable(
      `Cannot open ${path}: the Deno file VFS takes SQLite's POSIX locks on the database file through libc, which requires --allow-ffi`,
    );
  }
  libc = bindLibc(platform, locksFor(platform, forcedLocks()));
  return libc;
}

/**
 * Binds `platform`'s C library with locks of `style`: `loadLibc`'s one for
 * the process, or another (the classic lock tests on Linux).
 */
export function bindLibc(platform: Platform, style: LockStyle): Libc {
  return new Libc(
    Deno.dlopen(platform.library, symbolsOf(platform)).symbols,
    platform,
    style,
  );
}

/** `LEASED_OUTBOX_VFS_LOCKS`, when the process may read it. */
function forcedLocks(): string | undefined {
  const permission = Deno.permissions.querySync({
    name: "env",
    variable: LOCKS_VARIABLE,
  });
  return permission.state === "granted"
    ? Deno.env.get(LOCKS_VARIABLE)
    : undefined;
}
