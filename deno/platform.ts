/**
 * What the Deno file VFS needs to know of each operating system's C library,
 * in one table: the library to `dlopen`, the names of the functions whose
 * symbols differ, the `fcntl` commands and lock types, `struct flock`'s and
 * `struct stat`'s layouts, the `open` and `mmap` flags, and the errno values
 * the VFS tells apart. Each value names the header it comes from:
 *
 * - Linux: the kernel's `include/uapi/asm-generic/fcntl.h`,
 *   `include/uapi/asm-generic/errno-base.h` and `errno.h`, `mman-common.h`,
 *   and glibc's `bits/struct_stat.h` for x86_64 and aarch64
 *   (`sysdeps/unix/sysv/linux/x86/bits/struct_stat.h`,
 *   `sysdeps/unix/sysv/linux/generic/bits/struct_stat.h`).
 * - macOS: xnu's `bsd/sys/fcntl.h`, `bsd/sys/errno.h`, `bsd/sys/mman.h` and
 *   `bsd/sys/stat.h` (`struct stat` with 64-bit inodes, whose functions
 *   are `stat$INODE64` and `fstat$INODE64` on x86_64).
 * - FreeBSD: `sys/sys/fcntl.h`, `sys/sys/errno.h`, `sys/sys/mman.h`,
 *   `sys/sys/stat.h` (FreeBSD 12 and later: 64-bit `ino_t` and `nlink_t`).
 * - OpenBSD and NetBSD: their `sys/sys/fcntl.h`, `sys/sys/errno.h`,
 *   `sys/sys/mman.h` and `sys/sys/stat.h` (NetBSD's `stat` is `__stat50`).
 *
 * Only the Linux rows run here (CI is Linux); the others are the headers'
 * values, checked by the layout tests in `tests/vfs_platform_test.ts`
 * against hand-encoded structs, not on those systems.
 *
 * @module
 */

/** Where each field of `struct flock` sits, in bytes (all little-endian). */
export interface FlockLayout {
  /** `sizeof(struct flock)`. */
  readonly size: number;
  /** `l_type` (a `short`). */
  readonly type: number;
  /** `l_whence` (a `short`). */
  readonly whence: number;
  /** `l_start` (an `off_t`, 64 bits). */
  readonly start: number;
  /** `l_len` (an `off_t`, 64 bits). */
  readonly len: number;
  /** `l_pid` (a `pid_t`, 32 bits). */
  readonly pid: number;
}

/** Where `struct stat`'s fields that the VFS reads sit, in bytes. */
export interface StatLayout {
  /** `sizeof(struct stat)`, or more. */
  readonly size: number;
  /** `st_dev`: its offset and width in bytes (4 or 8). */
  readonly dev: readonly [offset: number, bytes: 4 | 8];
  /** `st_ino` (64 bits). */
  readonly ino: number;
  /** `st_mode`: its offset and width in bytes (2 or 4). */
  readonly mode: readonly [offset: number, bytes: 2 | 4];
  /** `st_size` (64 bits). */
  readonly fileSize: number;
}

/** One operating system's facts (and one architecture's, where they differ). */
export interface Platform {
  /** What `Deno.build.os` says. */
  readonly os: string;
  /** The C library `Deno.dlopen` opens. */
  readonly library: string;
  /** The symbols of the functions whose names differ by system. */
  readonly symbols: {
    readonly pread: string;
    readonly pwrite: string;
    readonly ftruncate: string;
    readonly lseek: string;
    readonly stat: string;
    readonly fstat: string;
    /** The function that returns the thread's `errno` address. */
    readonly errno: string;
    /** What a plain sync calls: `fdatasync` on Linux, `fsync` elsewhere. */
    readonly sync: "fdatasync" | "fsync";
  };
  /**
   * Integer arguments to put before the variadic argument of `open` and
   * `fcntl` (whose declarations end in `...`), which `Deno.dlopen` calls as
   * fixed functions: 0 where variadic arguments are passed as fixed ones
   * (x86-64, Linux's aarch64), 6 on Apple's arm64, whose variadic arguments
   * go on the stack, where the eight argument registers are full (two named
   * arguments, six unused: Apple's "Writing ARM64 code for Apple platforms").
   */
  readonly variadicPadding: number;
  /** `fcntl` commands (`sys/fcntl.h`). */
  readonly fcntl: {
    readonly F_GETLK: number;
    readonly F_SETLK: number;
    readonly F_SETLKW: number;
    /** Linux's open file description locks, absent elsewhere. */
    readonly F_OFD_GETLK?: number;
    readonly F_OFD_SETLK?: number;
    readonly F_OFD_SETLKW?: number;
    /** macOS's flush through the drive's cache, absent elsewhere. */
    readonly F_FULLFSYNC?: number;
  };
  /** `l_type` values. */
  readonly lockTypes: {
    readonly F_RDLCK: number;
    readonly F_WRLCK: number;
    readonly F_UNLCK: number;
  };
  readonly flock: FlockLayout;
  readonly stat: StatLayout;
  /** `open` flags. */
  readonly open: {
    readonly O_RDONLY: number;
    readonly O_RDWR: number;
    readonly O_CREAT: number;
    readonly O_EXCL: number;
    readonly O_NOFOLLOW: number;
    readonly O_CLOEXEC: number;
  };
  /** `mmap` protection and flags. */
  readonly mmap: {
    readonly PROT_READ_WRITE: number;
    readonly MAP_SHARED: number;
    readonly MAP_PRIVATE: number;
    readonly MAP_FIXED: number;
    readonly MAP_ANONYMOUS: number;
  };
  /** The errno values the VFS tells apart, by name. */
  readonly errno: Readonly<Record<ErrnoName, number>>;
}

/** The errno names the VFS tells apart. */
export type ErrnoName =
  | "EPERM"
  | "ENOENT"
  | "EINTR"
  | "EIO"
  | "EBADF"
  | "EAGAIN"
  | "EACCES"
  | "EEXIST"
  | "ENOTDIR"
  | "EISDIR"
  | "EINVAL"
  | "ENOSPC"
  | "EROFS"
  | "ENAMETOOLONG"
  | "EDQUOT";

// The errno values every system here shares (the V7 Unix numbers below 35).
const V7_ERRNO = {
  EPERM: 1,
  ENOENT: 2,
  EINTR: 4,
  EIO: 5,
  EBADF: 9,
  EACCES: 13,
  EEXIST: 17,
  ENOTDIR: 20,
  EISDIR: 21,
  EINVAL: 22,
  ENOSPC: 28,
  EROFS: 30,
} as const;

// asm-generic/errno-base.h and errno.h.
const LINUX_ERRNO = {
  ...V7_ERRNO,
  EAGAIN: 11,
  ENAMETOOLONG: 36,
  EDQUOT: 122,
} as const;

// The BSDs' sys/errno.h (xnu's, FreeBSD's, OpenBSD's, NetBSD's alike).
const BSD_ERRNO = {
  ...V7_ERRNO,
  EAGAIN: 35,
  ENAMETOOLONG: 63,
  EDQUOT: 69,
} as const;

// struct flock in asm-generic/fcntl.h, on 64-bit Linux: l_type, l_whence,
// l_start, l_len, l_pid.
const LINUX_FLOCK: FlockLayout = {
  size: 32,
  type: 0,
  whence: 2,
  start: 8,
  len: 16,
  pid: 24,
};

// struct flock in the BSDs' sys/fcntl.h: l_start, l_len, l_pid, l_type,
// l_whence (FreeBSD then adds int l_sysid, making it 32 bytes).
const BSD_FLOCK: FlockLayout = {
  size: 24,
  start: 0,
  len: 8,
  pid: 16,
  type: 20,
  whence: 22,
};

// The BSDs' lock types (sys/fcntl.h): F_RDLCK 1, F_UNLCK 2, F_WRLCK 3.
const BSD_LOCK_TYPES = { F_RDLCK: 1, F_WRLCK: 3, F_UNLCK: 2 } as const;

const BSD_MMAP = {
  PROT_READ_WRITE: 0x3,
  MAP_SHARED: 0x1,
  MAP_PRIVATE: 0x2,
  MAP_FIXED: 0x10,
  MAP_ANONYMOUS: 0x1000, // MAP_ANON
} as const;

// The BSDs' open flags (sys/fcntl.h) but O_CLOEXEC, whose value differs.
const BSD_OPEN = {
  O_RDONLY: 0,
  O_RDWR: 2,
  O_CREAT: 0x200,
  O_EXCL: 0x800,
  O_NOFOLLOW: 0x100,
} as const;

const BSD_SYMBOLS = {
  pread: "pread",
  pwrite: "pwrite",
  ftruncate: "ftruncate",
  lseek: "lseek",
  stat: "stat",
  fstat: "fstat",
  errno: "__error",
  sync: "fsync",
} as const;

function linux(arch: string): Platform {
  return {
    os: "linux",
    library: "libc.so.6",
    symbols: {
      pread: "pread64",
      pwrite: "pwrite64",
      ftruncate: "ftruncate64",
      lseek: "lseek64",
      stat: "stat",
      fstat: "fstat",
      errno: "__errno_location",
      sync: "fdatasync",
    },
    fcntl: {
      F_GETLK: 5,
      F_SETLK: 6,
      F_SETLKW: 7,
      F_OFD_GETLK: 36,
      F_OFD_SETLK: 37,
      F_OFD_SETLKW: 38,
    },
    lockTypes: { F_RDLCK: 0, F_WRLCK: 1, F_UNLCK: 2 },
    flock: LINUX_FLOCK,
    // st_dev and st_ino lead on both; x86_64 puts st_nlink (8 bytes) before
    // st_mode, aarch64 (the generic layout) st_mode (4 bytes) before a
    // 4-byte st_nlink; st_size is at 48 on both.
    stat: {
      size: 256,
      dev: [0, 8],
      ino: 8,
      mode: [arch === "aarch64" ? 16 : 24, 4],
      fileSize: 48,
    },
    open: {
      O_RDONLY: 0,
      O_RDWR: 2,
      O_CREAT: 0o100,
      O_EXCL: 0o200,
      // arch/arm64/include/uapi/asm/fcntl.h moves it (and O_DIRECTORY).
      O_NOFOLLOW: arch === "aarch64" ? 0o100000 : 0o400000,
      O_CLOEXEC: 0o2000000,
    },
    mmap: {
      PROT_READ_WRITE: 0x3,
      MAP_SHARED: 0x01,
      MAP_PRIVATE: 0x02,
      MAP_FIXED: 0x10,
      MAP_ANONYMOUS: 0x20,
    },
    errno: LINUX_ERRNO,
    variadicPadding: 0,
  };
}

function darwin(arch: string): Platform {
  // x86_64 keeps the 32-bit-inode struct stat under the plain names.
  const suffix = arch === "x86_64" ? "$INODE64" : "";
  return {
    os: "darwin",
    library: "libSystem.B.dylib",
    symbols: {
      ...BSD_SYMBOLS,
      stat: `stat${suffix}`,
      fstat: `fstat${suffix}`,
    },
    fcntl: { F_GETLK: 7, F_SETLK: 8, F_SETLKW: 9, F_FULLFSYNC: 51 },
    lockTypes: BSD_LOCK_TYPES,
    flock: BSD_FLOCK,
    // dev_t st_dev (32 bits), mode_t st_mode (16), nlink_t st_nlink (16),
    // ino_t st_ino (64), uid, gid, rdev, four timespecs, off_t st_size.
    stat: { size: 256, dev: [0, 4], ino: 8, mode: [4, 2], fileSize: 96 },
    open: { ...BSD_OPEN, O_CLOEXEC: 0x1000000 },
    mmap: BSD_MMAP,
    errno: BSD_ERRNO,
    variadicPadding: arch === "aarch64" ? 6 : 0,
  };
}

const FREEBSD: Platform = {
  os: "freebsd",
  library: "libc.so.7",
  symbols: BSD_SYMBOLS,
  // 7 to 9 are the pre-l_sysid F_OGETLK, F_OSETLK, F_OSETLKW.
  fcntl: { F_GETLK: 11, F_SETLK: 12, F_SETLKW: 13 },
  lockTypes: BSD_LOCK_TYPES,
  flock: { ...BSD_FLOCK, size: 32 },
  // dev_t st_dev, ino_t st_ino, nlink_t st_nlink (64 bits each), mode_t
  // st_mode, st_bsdflags, uid, gid, padding, dev_t st_rdev, four
  // timespecs, off_t st_size.
  stat: { size: 256, dev: [0, 8], ino: 8, mode: [24, 2], fileSize: 112 },
  open: { ...BSD_OPEN, O_CLOEXEC: 0x100000 },
  mmap: BSD_MMAP,
  errno: BSD_ERRNO,
  variadicPadding: 0,
};

const OPENBSD: Platform = {
  os: "openbsd",
  library: "libc.so",
  symbols: { ...BSD_SYMBOLS, errno: "__errno" },
  fcntl: { F_GETLK: 7, F_SETLK: 8, F_SETLKW: 9 },
  lockTypes: BSD_LOCK_TYPES,
  flock: BSD_FLOCK,
  // mode_t st_mode (32 bits), dev_t st_dev (32), ino_t st_ino (64),
  // nlink, uid, gid, rdev (32 each), three timespecs, off_t st_size.
  stat: { size: 256, dev: [4, 4], ino: 8, mode: [0, 4], fileSize: 80 },
  open: { ...BSD_OPEN, O_CLOEXEC: 0x10000 },
  mmap: BSD_MMAP,
  errno: BSD_ERRNO,
  variadicPadding: 0,
};

const NETBSD: Platform = {
  os: "netbsd",
  library: "libc.so.12",
  symbols: {
    ...BSD_SYMBOLS,
    stat: "__stat50",
    fstat: "__fstat50",
    errno: "__errno",
  },
  fcntl: { F_GETLK: 7, F_SETLK: 8, F_SETLKW: 9 },
  lockTypes: BSD_LOCK_TYPES,
  flock: BSD_FLOCK,
  // dev_t st_dev (64 bits), mode_t st_mode (32), padding, ino_t st_ino
  // (64), nlink, uid, gid (32 each), dev_t st_rdev (64), four timespecs,
  // off_t st_size.
  stat: { size: 256, dev: [0, 8], ino: 16, mode: [8, 4], fileSize: 112 },
  open: { ...BSD_OPEN, O_CLOEXEC: 0x400000 },
  mmap: BSD_MMAP,
  errno: BSD_ERRNO,
  variadicPadding: 0,
};

/** How the VFS locks a database file: see `locksFor`. */
export type LockStyle = "ofd" | "posix";

/**
 * The facts of `os` on `arch` (`Deno.build.os` and `Deno.build.arch`).
 *
 * @throws {Error} On Windows, naming `openNodeSqlite`, and on any other
 *   system without a row here.
 */
export function platformFor(os: string, arch: string): Platform {
  switch (os) {
    case "linux":
      return linux(arch);
    case "darwin":
      return darwin(arch);
    case "freebsd":
      return FREEBSD;
    case "openbsd":
      return OPENBSD;
    case "netbsd":
      return NETBSD;
    case "windows":
      throw new Error(
        "The Deno file VFS locks database files with POSIX byte-range locks, which Windows does not have: on Windows, open the database with openNodeSqlite (the node:sqlite driver, @leased/outbox/node-sqlite)",
      );
    default:
      throw new Error(
        `The Deno file VFS does not know ${os}'s C library; open the database with openNodeSqlite (the node:sqlite driver, @leased/outbox/node-sqlite)`,
      );
  }
}

/** The environment variable that forces classic POSIX locks (tests only). */
export const LOCKS_VARIABLE = "LEASED_OUTBOX_VFS_LOCKS";

/**
 * The lock style for `platform`: Linux's open file description locks
 * (`"ofd"`), or classic process-owned POSIX locks (`"posix"`) where there
 * are none (macOS and the BSDs); `forced` (the value of
 * `LEASED_OUTBOX_VFS_LOCKS`, for tests) set to `"posix"` chooses the
 * classic locks on Linux too.
 *
 * @throws {Error} When `forced` is set to anything but `"posix"` or `""`.
 */
export function locksFor(
  platform: Platform,
  forced: string | undefined,
): LockStyle {
  if (forced !== undefined && forced !== "" && forced !== "posix") {
    throw new Error(
      `${LOCKS_VARIABLE} must be "posix" or unset: current value is ${
        JSON.stringify(forced)
      }`,
    );
  }
  return forced === "posix" || platform.fcntl.F_OFD_SETLK === undefined
    ? "posix"
    : "ofd";
}

/** The fields of a `struct flock`. */
export interface Flock {
  /** `l_type`, in the platform's values. */
  readonly type: number;
  /** `l_whence` (0: SEEK_SET). */
  readonly whence: number;
  readonly start: number;
  readonly len: number;
  readonly pid: number;
}

/** Writes `flock` into `view` as `layout` lays it out; zeroes the rest. */
export function encodeFlock(
  layout: FlockLayout,
  view: DataView,
  flock: Flock,
): void {
  new Uint8Array(view.buffer, view.byteOffset, layout.size).fill(0);
  view.setInt16(layout.type, flock.type, true);
  view.setInt16(layout.whence, flock.whence, true);
  view.setBigInt64(layout.start, BigInt(flock.start), true);
  view.setBigInt64(layout.len, BigInt(flock.len), true);
  view.setInt32(layout.pid, flock.pid, true);
}

/** Reads the `struct flock` in `view` as `layout` lays it out. */
export function decodeFlock(layout: FlockLayout, view: DataView): Flock {
  return {
    type: view.getInt16(layout.type, true),
    whence: view.getInt16(layout.whence, true),
    start: Number(view.getBigInt64(layout.start, true)),
    len: Number(view.getBigInt64(layout.len, true)),
    pid: view.getInt32(layout.pid, true),
  };
}

/**
 * What a sync of a file calls on `platform`: with `full` (SQLite's
 * `SQLITE_SYNC_FULL`, which `PRAGMA fullfsync` asks for), `fcntl(F_FULLFSYNC)`
 * where the system has it (macOS), as os_unix.c's full_fsync; otherwise the
 * platform's plain sync.
 */
export function syncCall(
  platform: Platform,
  full: boolean,
): "F_FULLFSYNC" | "fdatasync" | "fsync" {
  return full && platform.fcntl.F_FULLFSYNC !== undefined
    ? "F_FULLFSYNC"
    : platform.symbols.sync;
}
