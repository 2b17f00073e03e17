/**
 * The libc calls the Deno file VFS makes through `Deno.dlopen`: `open(2)`
 * and I/O on the database file's own descriptors, and the open file
 * description byte-range locks (`F_OFD_SETLK`, `F_OFD_SETLKW`,
 * `F_OFD_GETLK`) that native SQLite's POSIX locks conflict with.
 *
 * Deno exposes neither a file's descriptor nor byte-range locks, so the
 * database file is opened here, and so are its journals and WAL files (never
 * through a symbolic link, and created with the database's mode). The WAL
 * index (`<db>-shm`) is opened here too, locked, and mapped with `mmap` into
 * WASM memory.
 *
 * @module
 */

const symbols = {
  open: { parameters: ["buffer", "i32", "u32"], result: "i32" },
  close: { parameters: ["i32"], result: "i32" },
  pread64: { parameters: ["i32", "buffer", "usize", "i64"], result: "isize" },
  pwrite64: { parameters: ["i32", "buffer", "usize", "i64"], result: "isize" },
  fdatasync: { parameters: ["i32"], result: "i32" },
  ftruncate64: { parameters: ["i32", "i64"], result: "i32" },
  lseek64: { parameters: ["i32", "i64", "i32"], result: "i64" },
  fstat: { parameters: ["i32", "buffer"], result: "i32" },
  stat: { parameters: ["buffer", "buffer"], result: "i32" },
  access: { parameters: ["buffer", "i32"], result: "i32" },
  unlink: { parameters: ["buffer"], result: "i32" },
  fcntl: { parameters: ["i32", "i32", "buffer"], result: "i32" },
  fchmod: { parameters: ["i32", "u32"], result: "i32" },
  fchown: { parameters: ["i32", "u32", "u32"], result: "i32" },
  geteuid: { parameters: [], result: "u32" },
  // The same fcntl on a thread of Deno's blocking pool: F_OFD_SETLKW
  // sleeps in the kernel until the lock is granted, and the event loop
  // goes on meanwhile.
  fcntlBlocking: {
    name: "fcntl",
    parameters: ["i32", "i32", "buffer"],
    result: "i32",
    nonblocking: true,
  },
  mmap: {
    parameters: ["pointer", "usize", "i32", "i32", "i32", "i64"],
    result: "pointer",
  },
  __errno_location: { parameters: [], result: "pointer" },
  strerror: { parameters: ["i32"], result: "pointer" },
} as const;

type Symbols = Deno.DynamicLibrary<typeof symbols>["symbols"];

// fcntl commands and lock types (Linux, asm-generic/fcntl.h).
const F_OFD_GETLK = 36;
const F_OFD_SETLK = 37;
const F_OFD_SETLKW = 38;
/** A read (shared) byte-range lock. */
export const F_RDLCK = 0;
/** A write (exclusive) byte-range lock. */
export const F_WRLCK = 1;
/** No lock: unlocks the range. */
export const F_UNLCK = 2;

// mmap's protection and flags (Linux).
const PROT_READ_WRITE = 0x3;
const MAP_SHARED = 0x01;
const MAP_PRIVATE = 0x02;
const MAP_FIXED = 0x10;
const MAP_ANONYMOUS = 0x20;

const O_RDONLY = 0;
const O_RDWR = 2;
const O_CREAT = 0o100;
const O_EXCL = 0o200;
const O_CLOEXEC = 0o2000000;
// Unlike O_RDWR, O_CREAT, O_EXCL and O_CLOEXEC, Linux gives this one
// other values on aarch64 than on x86-64.
const O_NOFOLLOW = Deno.build.arch === "aarch64" ? 0o100000 : 0o400000;
const SEEK_END = 2;
// Where struct stat keeps st_mode: the two ABIs order st_nlink and st_mode
// differently; st_size is at 48 in both.
const ST_MODE = Deno.build.arch === "aarch64" ? 16 : 24;
const ST_SIZE = 48;
const S_IFMT = 0o170000;
const S_IFREG = 0o100000;
const R_OK = 4;
const W_OK = 2;

// errno values (Linux) the VFS tells apart.
const ENOENT = 2;
const EINTR = 4;
const EAGAIN = 11;
const EACCES = 13;
const ENOTDIR = 20;
const ENAMETOOLONG = 36;
const EINVAL = 22;

const errnoNames: Record<number, string> = {
  1: "EPERM",
  2: "ENOENT",
  5: "EIO",
  9: "EBADF",
  13: "EACCES",
  17: "EEXIST",
  20: "ENOTDIR",
  21: "EISDIR",
  22: "EINVAL",
  28: "ENOSPC",
  30: "EROFS",
  122: "EDQUOT",
};

/** A failed libc call: `code` is the errno's name, as in Deno's own errors. */
export class LibcError extends Error {
  readonly errno: number;
  readonly code: string;
  constructor(message: string, errno: number) {
    super(message);
    this.errno = errno;
    this.code = errnoNames[errno] ?? `errno ${errno}`;
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

/** The libc functions, bound once per process. */
export class Libc {
  readonly #c: Symbols;
  readonly #flock = new Uint8Array(32);
  readonly #flockView = new DataView(this.#flock.buffer);
  readonly #stat = new Uint8Array(256);
  readonly #statView = new DataView(this.#stat.buffer);

  constructor(c: Symbols) {
    this.#c = c;
  }

  #errno(): number {
    const pointer = this.#c.__errno_location();
    return pointer === null
      ? 0
      : new Deno.UnsafePointerView(pointer).getInt32();
  }

  #fail(what: string, errno = this.#errno()): LibcError {
    const pointer = this.#c.strerror(errno);
    const text = pointer === null
      ? `errno ${errno}`
      : Deno.UnsafePointerView.getCString(pointer);
    return new LibcError(`${text} (os error ${errno}): ${what}`, errno);
  }

  /** Opens `path` close-on-exec and returns its descriptor. */
  open(path: string, mode: OpenMode): number {
    const flags = (mode.write ? O_RDWR : O_RDONLY) | O_CLOEXEC |
      (mode.create ? O_CREAT : 0) | (mode.createNew ? O_EXCL : 0) |
      (mode.noFollow ? O_NOFOLLOW : 0);
    const fd = this.#c.open(
      encoder.encode(`${path}\0`),
      flags,
      mode.permissions ?? 0o644,
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
        this.#c.pread64(
          fd,
          into.subarray(done),
          BigInt(into.length - done),
          BigInt(offset + done),
        ),
      );
      if (n === 0) break;
      if (n < 0) {
        const errno = this.#errno();
        if (errno === EINTR) continue;
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
        this.#c.pwrite64(
          fd,
          from.subarray(done),
          BigInt(from.length - done),
          BigInt(offset + done),
        ),
      );
      if (n < 0) {
        const errno = this.#errno();
        if (errno === EINTR) continue;
        throw this.#fail("pwrite", errno);
      }
      done += n;
    }
  }

  truncate(fd: number, size: number): void {
    if (this.#c.ftruncate64(fd, BigInt(size)) !== 0) {
      throw this.#fail("ftruncate");
    }
  }

  sync(fd: number): void {
    if (this.#c.fdatasync(fd) !== 0) throw this.#fail("fdatasync");
  }

  size(fd: number): number {
    const size = Number(this.#c.lseek64(fd, 0n, SEEK_END));
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

  /** stat(2) of `path` into the stat buffer: 0, or the errno it failed with. */
  #statPath(path: string): number {
    return this.#c.stat(encoder.encode(`${path}\0`), this.#stat) === 0
      ? 0
      : this.#errno();
  }

  /** The device and inode in the stat buffer. */
  #statId(): FileId {
    // st_dev and st_ino lead struct stat on x86_64 and aarch64 alike.
    const view = this.#statView;
    return { dev: view.getBigUint64(0, true), ino: view.getBigUint64(8, true) };
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
    if (errno === ENOENT || errno === ENOTDIR || errno === ENAMETOOLONG) {
      return undefined;
    }
    if (errno !== 0) throw this.#fail(`stat '${path}'`, errno);
    const view = this.#statView;
    return {
      regular: (view.getUint32(ST_MODE, true) & S_IFMT) === S_IFREG,
      size: Number(view.getBigInt64(ST_SIZE, true)),
    };
  }

  /**
   * Removes `path` (unlink(2)); `false` when it names nothing (ENOENT).
   *
   * @throws {LibcError} When unlink fails otherwise.
   */
  unlink(path: string): boolean {
    if (this.#c.unlink(encoder.encode(`${path}\0`)) === 0) return true;
    const errno = this.#errno();
    if (errno === ENOENT) return false;
    throw this.#fail(`unlink '${path}'`, errno);
  }

  /** The device and inode `path` names now; `undefined` when it names none. */
  pathId(path: string): FileId | undefined {
    return this.#statPath(path) === 0 ? this.#statId() : undefined;
  }

  /**
   * Tries to set (or with `F_UNLCK`, clear) an open file description lock
   * on `length` bytes from `start`; `false` when another owner's lock
   * conflicts.
   */
  setLock(fd: number, type: number, start: number, length: number): boolean {
    this.#fillFlock(type, start, length);
    if (this.#c.fcntl(fd, F_OFD_SETLK, this.#flock) === 0) return true;
    const errno = this.#errno();
    if (errno === EAGAIN || errno === EACCES) return false;
    throw this.#lockError(errno);
  }

  /**
   * Whether another owner holds a lock that would conflict with a `type`
   * lock on `length` bytes from `start` (F_OFD_GETLK).
   */
  conflicts(fd: number, type: number, start: number, length: number): boolean {
    return this.conflictingLock(fd, type, start, length) !== F_UNLCK;
  }

  /**
   * The type of a lock another owner holds that would conflict with a
   * `type` lock on `length` bytes from `start` (`F_RDLCK` or `F_WRLCK`), or
   * `F_UNLCK` when none would (F_OFD_GETLK).
   */
  conflictingLock(
    fd: number,
    type: number,
    start: number,
    length: number,
  ): number {
    this.#fillFlock(type, start, length);
    if (this.#c.fcntl(fd, F_OFD_GETLK, this.#flock) !== 0) {
      throw this.#lockError(this.#errno());
    }
    return this.#flockView.getInt16(0, true);
  }

  /**
   * Maps `length` bytes of `fd` from `offset` at `address`, shared and
   * writable, in place of what was mapped there (MAP_FIXED): every
   * process that maps the file sees each write at once.
   */
  mapShared(address: bigint, length: number, fd: number, offset: number): void {
    this.#map(address, length, MAP_SHARED, fd, offset, "mmap of the file");
  }

  /** Puts zeroed private memory at `address` in place of a file's mapping. */
  mapPrivate(address: bigint, length: number): void {
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
   * Sets a lock, waiting in the kernel on a pool thread until no other owner
   * conflicts; resolves `true` once it is held, `false` when the wait failed
   * (e.g. interrupted) and nothing is held. The call cannot be cancelled.
   */
  async waitLock(
    fd: number,
    type: number,
    start: number,
    length: number,
  ): Promise<boolean> {
    const flock = new Uint8Array(32);
    writeFlock(new DataView(flock.buffer), type, start, length);
    const call = this.#c.fcntlBlocking(fd, F_OFD_SETLKW, flock);
    // The caller's timer keeps the process alive while it waits; a wait it
    // gave up on must not (the lock may never be let go). Deno has no public
    // way to unref an FFI call, so its core's is used when it is there;
    // without it, such a process exits once the lock is granted.
    unrefOpPromise?.(call);
    return await call === 0;
  }

  #fillFlock(type: number, start: number, length: number): void {
    writeFlock(this.#flockView, type, start, length);
  }

  #lockError(errno: number): LibcError {
    if (errno === EINVAL) {
      return this.#fail(
        "fcntl: this kernel has no open file description locks (F_OFD_SETLK, Linux 3.15 and later), which the Deno file VFS needs",
        errno,
      );
    }
    return this.#fail("fcntl", errno);
  }
}

function writeFlock(
  view: DataView,
  type: number,
  start: number,
  length: number,
): void {
  // struct flock on Linux x86_64 and aarch64: l_type, l_whence (SEEK_SET),
  // l_start, l_len, l_pid (0, as open file description locks require).
  view.setInt16(0, type, true);
  view.setInt16(2, 0, true);
  view.setBigInt64(8, BigInt(start), true);
  view.setBigInt64(16, BigInt(length), true);
  view.setInt32(24, 0, true);
}

const unrefOpPromise = (Deno as unknown as {
  [key: symbol]: { core?: { unrefOpPromise?: (p: Promise<unknown>) => void } };
})[(Deno as unknown as { internal: symbol }).internal]?.core?.unrefOpPromise;

let libc: Libc | undefined;

/**
 * The process's libc binding, loaded on first use.
 *
 * @param path The database that needs it, for the error message.
 * @throws {Deno.errors.NotCapable} Without `--allow-ffi`.
 * @throws {Error} Off Linux (no open file description locks), or when libc
 *   cannot be loaded.
 */
export function loadLibc(path: string): Libc {
  if (libc !== undefined) return libc;
  if (Deno.build.os !== "linux") {
    throw new Error(
      `Cannot open ${path}: the Deno file VFS locks the database with Linux's open file description locks, which ${Deno.build.os} does not have`,
    );
  }
  if (Deno.permissions.querySync({ name: "ffi" }).state !== "granted") {
    throw new Deno.errors.NotCapable(
      `Cannot open ${path}: the Deno file VFS takes SQLite's POSIX locks on the database file through libc, which requires --allow-ffi`,
    );
  }
  libc = new Libc(Deno.dlopen("libc.so.6", symbols).symbols);
  return libc;
}
