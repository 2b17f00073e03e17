/**
 * What Linux's `/proc/locks` says of this process's byte-range locks: for
 * the lock audit (`deno/lock_audit.ts`), and for the descriptors the VFS
 * must not close while the process holds classic POSIX locks on their file
 * that are not the VFS's (`deno/inodes.ts`).
 *
 * @module
 */
import { type Libc, LibcError } from "./libc.ts";

/** A byte-range lock the kernel lists: on `file`, bytes `first`–`last`. */
export interface KernelLock {
  /** The file as `/proc/locks` names it (see {@linkcode procLocksFile}). */
  readonly file: string;
  readonly write: boolean;
  readonly first: number;
  readonly last: number;
}

/**
 * How `/proc/locks` names a file: `major:minor:inode`, the device numbers
 * in hex, from Linux's encoding of `st_dev` (new_encode_dev).
 */
export function procLocksFile(id: { dev: bigint; ino: bigint }): string {
  const dev = Number(id.dev);
  const hex = (n: number) => n.toString(16).padStart(2, "0");
  const major = Math.floor(dev / 256) & 0xfff;
  const minor = (dev & 0xff) | (Math.floor(dev / 4096) & 0xfff00);
  return `${hex(major)}:${hex(minor)}:${id.ino}`;
}

/**
 * This process's byte-range locks as `/proc/locks` lists them: classic
 * ones of this process id, and every open file description lock (they
 * carry no process id). Blocked requests (`->`) are not locks.
 */
export function ownLocks(libc: Libc): KernelLock[] {
  const pid = String(Deno.pid);
  const locks: KernelLock[] = [];
  for (const line of readProcLocks(libc).text.split("\n")) {
    const lock = parseLine(line);
    if (lock === undefined) continue;
    if (lock.kind === "POSIX" && lock.pid !== pid) continue;
    locks.push(lock);
  }
  return locks;
}

/**
 * The files on which this process holds classic POSIX locks now, as
 * {@linkcode procLocksFile} names them; `undefined` where there is no
 * `/proc/locks` (not Linux, or no `/proc`).
 *
 * One read of `/proc/locks` (a page of it) lists the locks as they are at
 * that moment; a list longer than a page takes several, and locks of other
 * processes coming and going in between shift it, so that a lock held all
 * along can fall between two. Such a list is read again, up to
 * {@linkcode LISTING_READS} times, and what any read lists counts.
 *
 * @throws {LibcError} When `/proc/locks` is there but cannot be read (no
 *   descriptor left, EMFILE).
 */
export function classicLockedFiles(libc: Libc): Set<string> | undefined {
  if (Deno.build.os !== "linux") return undefined;
  const pid = String(Deno.pid);
  const files = new Set<string>();
  for (let read = 0; read < LISTING_READS; read++) {
    let listing: Listing;
    try {
      listing = readProcLocks(libc);
    } catch (error) {
      if (error instanceof LibcError && error.code === "ENOENT") {
        return undefined;
      }
      throw error;
    }
    for (const line of listing.text.split("\n")) {
      const lock = parseLine(line);
      if (lock?.kind === "POSIX" && lock.pid === pid) files.add(lock.file);
    }
    if (listing.snapshot) break;
  }
  return files;
}

/**
 * How many times a list of more than a page is read: a read misses a held
 * lock a few times in a hundred when other processes lock and unlock
 * hundreds of times a second (the lock audit's measure).
 */
export const LISTING_READS = 8;

interface Listing {
  readonly text: string;
  /** Whether it came in one read, a snapshot (at most a page long). */
  readonly snapshot: boolean;
}

/** The seq_file's buffer, what one read of it returns at most (x86-64). */
const PAGE = 4096;

/** One line's lock: "1: POSIX  ADVISORY  WRITE 1234 fe:00:5678 120 120". */
function parseLine(
  line: string,
): (KernelLock & { kind: string; pid: string }) | undefined {
  if (line.includes("->")) return undefined;
  const fields = line.trim().split(/\s+/);
  const kind = fields[1];
  if (kind !== "POSIX" && kind !== "OFDLCK") return undefined;
  return {
    kind,
    pid: fields[4]!,
    file: fields[5]!,
    write: fields[3] === "WRITE",
    first: Number(fields[6]),
    last: fields[7] === "EOF" ? Infinity : Number(fields[7]),
  };
}

/** `/proc/locks` through libc: Deno's own read asks for `--allow-all`. */
function readProcLocks(libc: Libc): Listing {
  const fd = libc.open("/proc/locks", {
    write: false,
    create: false,
    createNew: false,
  });
  try {
    const decoder = new TextDecoder();
    const chunk = new Uint8Array(65_536);
    let text = "";
    for (let offset = 0;;) {
      // A seq_file gives at most a page per read, whatever was asked, each
      // under the kernel's lock list lock: only a read of nothing is the
      // end, and a list of a page or less came in one.
      const n = libc.read(fd, chunk, offset);
      if (n === 0) {
        return { text: text + decoder.decode(), snapshot: offset <= PAGE };
      }
      offset += n;
      text += decoder.decode(chunk.subarray(0, n), { stream: true });
    }
  } finally {
    libc.close(fd);
  }
}
