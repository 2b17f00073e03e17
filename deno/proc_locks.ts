/**
 * This process's byte-range locks as Linux lists them in
 * `/proc/self/fdinfo/<fd>`: for the lock audit (`deno/lock_audit.ts`), and
 * for the descriptors the VFS must not close while the process holds
 * classic POSIX locks on their file that are not the VFS's
 * (`deno/inodes.ts`).
 *
 * Not `/proc/locks`: it lists every process's locks, a page per read, each
 * read under the kernel's lock list lock, and other processes' locks coming
 * and going between two reads shift the list, so that a read misses a lock
 * held all along, or lists it twice, near a page's end (the lock audit
 * missed one a few times in a hundred reads while other processes locked
 * and unlocked hundreds of times a second; CI saw the VFS's RESERVED lock
 * twice in a majority of eight). A descriptor's `fdinfo` lists, after its
 * `lock:` tag, the locks set through its open file description: that
 * description's own (open file description and `flock` locks), and the
 * classic POSIX locks of the process reading it set through it (Linux's
 * show_fd_locks, all in one read under the file's lock list lock, whatever
 * other files' locks do). A classic lock lives only while every descriptor
 * of its file in the process stays open (a close lets all the process's go),
 * so the one it was set through is open and lists it: the `fdinfo` of this
 * process's descriptors on a file lists exactly the locks it holds there,
 * and no other process's.
 *
 * @module
 */
import { type FileId, type Libc, LibcError } from "./libc.ts";

/** A byte-range lock the kernel lists: on `file`, bytes `first`–`last`. */
export interface KernelLock {
  /** The file as the kernel names it (see {@linkcode procLocksFile}). */
  readonly file: string;
  /** A classic POSIX lock (the process's), else an open file description's. */
  readonly classic: boolean;
  readonly write: boolean;
  readonly first: number;
  readonly last: number;
}

/**
 * How `/proc/locks` and `fdinfo` name a file: `major:minor:inode`, the
 * device numbers in hex, from Linux's encoding of `st_dev` (new_encode_dev).
 */
export function procLocksFile(id: { dev: bigint; ino: bigint }): string {
  const dev = Number(id.dev);
  const hex = (n: number) => n.toString(16).padStart(2, "0");
  const major = Math.floor(dev / 256) & 0xfff;
  const minor = (dev & 0xff) | (Math.floor(dev / 4096) & 0xfff00);
  return `${hex(major)}:${hex(minor)}:${id.ino}`;
}

/**
 * One look at this process's locks: its descriptors as they are now, by
 * file, and each file's locks read from their `fdinfo` when first asked.
 */
export interface OwnLocks {
  /** This process's byte-range locks on `file`, read once per look. */
  on(file: FileId): readonly KernelLock[];
}

/**
 * A look at this process's locks: lists `/proc/self/fd` and asks each
 * descriptor's file (fstat), one system call each (see
 * {@linkcode OwnLocks.on} for the locks).
 *
 * @throws {LibcError} When `/proc/self/fd` cannot be read: ENOENT without
 *   `/proc` (or off Linux), EMFILE with no descriptor left for it.
 */
export function ownLocks(libc: Libc): OwnLocks {
  const fds: number[] = [];
  const ids: FileId[] = [];
  for (const fd of openDescriptors(libc)) {
    const id = libc.openFileId(fd);
    if (id === undefined) continue; // Closed since (another thread).
    fds.push(fd);
    ids.push(id);
  }
  const read = new Map<string, KernelLock[]>();
  return {
    on(id) {
      const file = procLocksFile(id);
      let locks = read.get(file);
      if (locks === undefined) {
        locks = [];
        for (let i = 0; i < fds.length; i++) {
          if (ids[i]!.ino !== id.ino || ids[i]!.dev !== id.dev) continue;
          locks.push(...descriptorLocks(libc, fds[i]!, file));
        }
        read.set(file, locks);
      }
      return locks;
    },
  };
}

/**
 * Whether this process holds classic POSIX locks on a file, one look for
 * all the files asked about; `undefined` where there is no `/proc/self/fd`
 * (not Linux, or no `/proc`).
 *
 * @throws {LibcError} When `/proc/self/fd` is there but cannot be read (no
 *   descriptor left, EMFILE); the function it returns, when a descriptor's
 *   `fdinfo` cannot be.
 */
export function classicLocks(
  libc: Libc,
): ((file: FileId) => boolean) | undefined {
  if (Deno.build.os !== "linux") return undefined;
  let own: OwnLocks;
  try {
    own = ownLocks(libc);
  } catch (error) {
    if (error instanceof LibcError && error.code === "ENOENT") {
      return undefined;
    }
    throw error;
  }
  return (file) => own.on(file).some((lock) => lock.classic);
}

/**
 * The fields of an `fdinfo` `lock:` line after the lock's number, as a
 * `/proc/locks` line has them: kind (`POSIX`, `OFDLCK`, `FLOCK`), `ADVISORY`,
 * `READ` or `WRITE`, the process (-1 for an open file description's), the
 * file ({@linkcode procLocksFile}), the first byte and the last (or `EOF`);
 * `undefined` for any other line. The line
 * `lock:\t1: POSIX  ADVISORY  WRITE 1234 fe:00:5678 120 120` gives
 * `POSIX ADVISORY WRITE 1234 fe:00:5678 120 120`.
 */
export function lockFields(line: string): string[] | undefined {
  if (!line.startsWith("lock:")) return undefined;
  return line.slice("lock:".length).trim().split(/\s+/).slice(1);
}

/** Directory records read at once: a 32-byte record per descriptor. */
const directory = new Uint8Array(32_768);
/** One descriptor's `fdinfo`: a line per lock, a few lines else. */
const info = new Uint8Array(65_536);
const decoder = new TextDecoder();

/**
 * This process's descriptors, listed from `/proc/self/fd` (getdents64): a
 * descriptor open throughout is listed once whatever others open and
 * close, as the kernel lists them by number, from where the last read of
 * the directory ended.
 */
function openDescriptors(libc: Libc): number[] {
  const dir = libc.open("/proc/self/fd", {
    write: false,
    create: false,
    createNew: false,
  });
  const fds: number[] = [];
  try {
    for (;;) {
      const n = libc.readDirectory(dir, directory);
      if (n === 0) break;
      // struct linux_dirent64: d_ino (8 bytes), d_off (8), d_reclen (2),
      // d_type (1), d_name (NUL-terminated): here a number, "." or "..".
      const view = new DataView(directory.buffer, 0, n);
      for (let at = 0; at < n; at += view.getUint16(at + 16, true)) {
        let fd = 0;
        let digits = 0;
        for (let i = at + 19; directory[i] !== 0; i++, digits++) {
          fd = fd * 10 + directory[i]! - 48;
        }
        if (digits > 0 && directory[at + 19] !== 46 && fd !== dir) {
          fds.push(fd);
        }
      }
    }
  } finally {
    libc.close(dir);
  }
  return fds;
}

/**
 * The byte-range locks `/proc/self/fdinfo/<fd>` lists on `file` (`flock`
 * locks left out): none when `fd` was closed since it was listed.
 */
function descriptorLocks(libc: Libc, fd: number, file: string): KernelLock[] {
  let handle: number;
  try {
    handle = libc.open(`/proc/self/fdinfo/${fd}`, {
      write: false,
      create: false,
      createNew: false,
    });
  } catch (error) {
    if (error instanceof LibcError && error.code === "ENOENT") return [];
    throw error;
  }
  let text: string;
  try {
    // The whole text is made at the first read (a single_open seq_file):
    // later reads of one opening go on in the same text.
    const chunks: string[] = [];
    for (let offset = 0;;) {
      const n = libc.read(handle, info, offset);
      chunks.push(decoder.decode(info.subarray(0, n), { stream: true }));
      offset += n;
      if (n < info.length) break;
    }
    text = chunks.join("") + decoder.decode();
  } finally {
    libc.close(handle);
  }
  const locks: KernelLock[] = [];
  for (const line of text.split("\n")) {
    const fields = lockFields(line);
    if (fields === undefined) continue;
    const kind = fields[0];
    if ((kind !== "POSIX" && kind !== "OFDLCK") || fields[4] !== file) {
      continue;
    }
    locks.push({
      file,
      classic: kind === "POSIX",
      write: fields[2] === "WRITE",
      first: Number(fields[5]),
      last: fields[6] === "EOF" ? Infinity : Number(fields[6]),
    });
  }
  return locks;
}
