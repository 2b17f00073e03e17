/**
 * SQLite's locks on the database file as open file description locks
 * (Linux's `F_OFD_SETLK`): one connection's {@linkcode LockSet}, over two
 * descriptions of the file, and the writers' turn among this VFS's
 * connections that a kernel wait hands over.
 *
 * @module
 */
import { F_RDLCK, F_UNLCK, F_WRLCK, type Libc } from "./libc.ts";
import { monotonicMs, TurnWatchdog } from "./turn_watchdog.ts";
import {
  BUSY,
  EXCLUSIVE,
  IOERR_RDLOCK,
  NONE,
  OK,
  pause,
  PENDING,
  PENDING_BYTE,
  QUEUE_BYTE,
  READERS_SPIN_MS,
  RESERVED,
  RESERVED_BYTE,
  SHARED,
  SHARED_FIRST,
  SHARED_SIZE,
  TURN_BYTE,
  VfsError,
} from "./vfs_codes.ts";

// How long the writer's turn, granted to a waiting connection, is kept for
// its retry before it is given back. The retry follows the wait's end at
// once (see LockSet.wait), so this only bounds a caller that never retries.
const GRANT_KEPT_MS = 100;
// A writer refused the turn this long by a wait in flight, while RESERVED is
// free, takes RESERVED without the turn: the turn's holder is then a grant
// its process has not taken up (its event loop blocked, or a wait its
// caller gave up on), and RESERVED, not the turn, is what excludes writers.
const STALE_TURN_MS = 2 * GRANT_KEPT_MS;
// Kept turns: while another writer of this VFS waits for the turn, a writer
// keeps the turn (not RESERVED: SQLite's own locks are let go between
// transactions, also for a process stopped there) after its commit for its
// own next transaction, four transactions a turn (a worker's two claims and
// acknowledgements), so the lock changes process once a turn rather than
// once a transaction (each change costs the next writer a wake-up, cold
// caches and an emptied page cache; see bench/README.md: two a turn left
// four busy processes at 0.69× of one, four at 0.82×, and cost a paced
// producer among them a tenth of its commits). A kept turn not
// taken up by the event loop's next timers is given back then, and one not
// taken up within `keptTurn.ms` is given back by the watchdog thread
// (deno/turn_watchdog.ts), also while the event loop is blocked (a
// handler's synchronous work after a claim).
const TURN_TRANSACTIONS = 4;

/**
 * How long a kept turn waits to be taken up before the watchdog thread
 * gives it back, in milliseconds (10). Internal: a test whose subject is
 * what a kept turn does, not when it ends, holds it longer here, since a
 * loaded machine can pass 10 ms between a commit and the test's next look
 * at the locks (`tests/vfs_wait_test.ts` tests the 10 ms end on its own).
 */
export const keptTurn: { ms: number } = { ms: 10 };
// Kernel waits in flight in this process at most: each holds a thread of
// Deno's blocking pool until the kernel answers, and a full pool would
// also hold up the async file operations of the writer they wait for.
const MAX_KERNEL_WAITS = 8;

/** The process's turn watchdog, started by the first turn kept. */
let watchdog: TurnWatchdog | null | undefined;
/** Kernel waits in flight in this process (see MAX_KERNEL_WAITS). */
let kernelWaits = 0;

/** The watchdog, started on first use; undefined when it cannot start. */
function turnWatchdog(libc: Libc): TurnWatchdog | undefined {
  if (watchdog === undefined) {
    try {
      watchdog = new TurnWatchdog(libc.platform, TURN_BYTE, 1);
    } catch {
      // No thread for it: no turn is kept, which only costs speed.
      watchdog = null;
    }
  }
  return watchdog ?? undefined;
}

/**
 * SQLite's lock levels as os_unix.c takes them, one connection's view, over
 * two open file descriptions of the database file, each the owner of its
 * locks: the main one holds PENDING and the SHARED range (and does the
 * I/O), the second holds RESERVED and the turn (TURN_BYTE) and waits in the
 * kernel for a lock that refused the connection. Native SQLite's classic
 * POSIX locks on the same bytes conflict with them, and so do other
 * connections' in this process.
 *
 * SQLite's own locks are taken only as os_unix.c takes them, never handed
 * out by a kernel wait: RESERVED held tells a reader checking for a hot
 * journal (xCheckReservedLock) that the journal is live, so a connection
 * that had not itself looked for one first (under SHARED) would let readers
 * read a crashed writer's pages. A kernel wait only ever gets a read lock on
 * PENDING or the SHARED range (what a reader holds), or the turn.
 *
 * The turn is what makes a wait fair among this VFS's connections: a writer
 * takes it with RESERVED, and when it lets both go the kernel grants the
 * turn to the waiting description; the connection keeps it for its retry,
 * and the writer's next transaction, refused the turn, waits in its place.
 * A native writer takes no turn, so a connection refused RESERVED by one
 * polls, as native connections do.
 */
export class LockSet {
  #level = NONE;
  /**
   * The turn: held with RESERVED, granted to a wait for the retry, or kept
   * with RESERVED after a commit for the next transaction.
   */
  #turn: "none" | "held" | "granted" | "kept" | "bypassed" = "none";
  /** Transactions in the current turn. */
  #turnTransactions = 0;
  /** The watchdog's slot for this connection's kept turns. */
  #slot: number | undefined;
  #grantTimer: ReturnType<typeof setTimeout> | undefined;
  /** Whether the last refused lock was the turn (else a pause follows). */
  #refusedTurn = false;
  /** The kernel wait for the turn in flight: it cannot be cancelled. */
  #call: Promise<void> | undefined;
  /** When it began (performance.now() ms). */
  #callStarted = 0;
  /** When this connection's current run of turn refusals began, and the last. */
  #refusedSince = 0;
  #lastRefused = -Infinity;
  /** Callers of wait() still waiting. */
  #waiters = 0;
  #closed = false;
  /** Resolved on close: a closed connection has nothing left to wait for. */
  readonly #closing = Promise.withResolvers<void>();
  readonly #libc: Libc;
  readonly #fd: number;
  readonly #waitFd: number;
  /** Gives the second descriptor back once no wait uses it. */
  readonly #release: (fd: number) => void;
  /** Whether the descriptors may take write locks (not a read-only open). */
  readonly #writable: boolean;

  constructor(
    libc: Libc,
    fds: readonly [number, number],
    writable: boolean,
    release: (fd: number) => void,
  ) {
    this.#libc = libc;
    [this.#fd, this.#waitFd] = fds;
    this.#writable = writable;
    this.#release = release;
  }

  get level(): number {
    return this.#level;
  }

  get waitFd(): number {
    return this.#waitFd;
  }

  /**
   * Waits until the turn that refused this connection last is let go (the
   * kernel grants it to the second description, which keeps it for the
   * retry), or `timeoutMs` at most; refused anything else, it pauses, as
   * native SQLite's busy handler does. A wait that timed out stays in
   * flight; the turn it is granted later is given back when it returns.
   */
  async wait(timeoutMs: number): Promise<void> {
    if (
      !this.#refusedTurn || this.#closed ||
      this.#call === undefined && kernelWaits >= MAX_KERNEL_WAITS
    ) {
      return await pause(timeoutMs);
    }
    if (this.#turn === "granted") return;
    this.#call ??= this.#startWait();
    // Queued while someone waits: writers keep their turns for waiters.
    if (this.#waiters++ === 0) {
      this.#libc.setLock(this.#waitFd, F_RDLCK, QUEUE_BYTE, 1);
    }
    let timer: ReturnType<typeof setTimeout> | undefined;
    try {
      // At most STALE_TURN_MS at a time, so that the retry can take
      // RESERVED past a stale turn (see lock).
      await Promise.race([
        this.#call,
        this.#closing.promise,
        new Promise<void>((resolve) => {
          timer = setTimeout(resolve, Math.min(timeoutMs, STALE_TURN_MS));
        }),
      ]);
    } finally {
      clearTimeout(timer);
      if (--this.#waiters === 0 && !this.#closed) {
        this.#libc.setLock(this.#waitFd, F_UNLCK, QUEUE_BYTE, 1);
      }
    }
  }

  #startWait(): Promise<void> {
    this.#callStarted = performance.now();
    kernelWaits++;
    const returned = (held: boolean) => {
      this.#call = undefined;
      kernelWaits--;
      if (held) this.#granted();
      // A closed connection's descriptor is parked, never closed here: a
      // close at the moment the kernel grants would drop the classic POSIX
      // locks node:sqlite holds in this process (see Inode).
      if (this.#closed) this.#release(this.#waitFd);
    };
    return this.#libc.waitLock(this.#waitFd, F_WRLCK, TURN_BYTE, 1).then(
      returned,
      () => returned(false),
    );
  }

  /**
   * The kernel granted the turn to the second description. It is kept for
   * the retry while a caller waits for it. The connection takes the turn
   * itself only while no wait for it is in flight (see lock), so the grant
   * never merges into a turn the connection holds; it may hold RESERVED
   * without the turn meanwhile ("bypassed"), and then needs no grant.
   */
  #granted(): void {
    if (!this.#closed && this.#waiters > 0 && this.#turn === "none") {
      this.#turn = "granted";
      const timer = setTimeout(() => this.#dropGrant(), GRANT_KEPT_MS);
      Deno.unrefTimer(timer as unknown as number);
      this.#grantTimer = timer;
      return;
    }
    this.#libc.setLock(this.#waitFd, F_UNLCK, TURN_BYTE, 1);
  }

  /**
   * Whether to keep the turn after this transaction for the next one, and
   * if so hands it to the watchdog: only while another writer of this VFS
   * waits for it (a read lock on QUEUE_BYTE), and only for the rest of the
   * turn. RESERVED goes in any case: native writers, which poll, find it
   * free between transactions, and a reader deciding whether a journal is
   * hot sees what it would without this VFS.
   */
  #keepsTurn(): boolean {
    if (++this.#turnTransactions >= TURN_TRANSACTIONS) return false;
    if (!this.#libc.conflicts(this.#waitFd, F_WRLCK, QUEUE_BYTE, 1)) {
      return false;
    }
    const dog = turnWatchdog(this.#libc);
    if (dog === undefined) return false;
    this.#slot ??= dog.slot();
    return this.#slot !== undefined &&
      dog.keep(this.#slot, this.#waitFd, monotonicMs() + keptTurn.ms);
  }

  /** Ends a kept turn not taken up: it goes, unless already gone. */
  #endKeptTurn(): void {
    if (this.#turn !== "kept") return;
    if (watchdog!.end(this.#slot!)) this.#releaseTurn();
    this.#turn = "none";
    this.#turnTransactions = 0;
  }

  /**
   * Lets RESERVED and the turn go, and nothing else the second description
   * holds between them (no wait's lock: only the turn is waited for).
   */
  #releaseTurn(): void {
    this.#libc.setLock(
      this.#waitFd,
      F_UNLCK,
      RESERVED_BYTE,
      TURN_BYTE - RESERVED_BYTE + 1,
    );
    this.#turn = "none";
    this.#turnTransactions = 0;
  }

  #dropGrant(): void {
    if (this.#turn !== "granted") return;
    clearTimeout(this.#grantTimer);
    this.#turn = "none";
    this.#libc.setLock(this.#waitFd, F_UNLCK, TURN_BYTE, 1);
  }

  lock(target: number): number {
    this.#refusedTurn = false;
    if (this.#level >= target) return OK;
    const libc = this.#libc;
    if (target === SHARED) {
      // As unixLock: a read lock on PENDING first, so no reader slips in
      // while a writer holds PENDING to wait for readers to leave.
      if (!libc.setLock(this.#fd, F_RDLCK, PENDING_BYTE, 1)) {
        // A writer of this VFS committing holds the turn too, until its
        // transaction ends: a writer waits for the turn. Anyone else polls:
        // a read lock on PENDING granted by the kernel would hold up the
        // next commit until this process's event loop let it go (the same
        // goes for the SHARED range below), a node:sqlite commit on the
        // same thread for its whole busy timeout.
        return this.#refuse(false);
      }
      const shared = libc.setLock(
        this.#fd,
        F_RDLCK,
        SHARED_FIRST,
        SHARED_SIZE,
      );
      libc.setLock(this.#fd, F_UNLCK, PENDING_BYTE, 1);
      if (!shared) return this.#refuse(false);
      this.#level = SHARED;
      return OK;
    }
    if (target === RESERVED) {
      // The turn first: kept from this connection's last transaction,
      // granted to its wait, or taken now.
      let turn = this.#turn === "granted";
      if (this.#turn === "kept") {
        turn = watchdog!.end(this.#slot!);
        if (!turn) this.#turnTransactions = 0;
      }
      clearTimeout(this.#grantTimer);
      this.#turn = "none";
      if (
        !turn && (
          // A wait for the turn in flight takes it first (see #granted).
          this.#call !== undefined ||
          !libc.setLock(this.#waitFd, F_WRLCK, TURN_BYTE, 1)
        )
      ) {
        const now = performance.now();
        // Refused the turn continuously (retries at most STALE_TURN_MS
        // apart) since #refusedSince, whether or not a kernel wait is in
        // flight: a connection that polls (MAX_KERNEL_WAITS) has none.
        if (now - this.#lastRefused > STALE_TURN_MS) this.#refusedSince = now;
        this.#lastRefused = now;
        const since = this.#call !== undefined
          ? this.#callStarted
          : this.#refusedSince;
        if (
          now - since >= STALE_TURN_MS &&
          libc.setLock(this.#waitFd, F_WRLCK, RESERVED_BYTE, 1)
        ) {
          this.#lastRefused = -Infinity;
          this.#turn = "bypassed";
          this.#level = RESERVED;
          return OK;
        }
        return this.#refuse(true);
      }
      this.#turn = "held";
      if (!libc.setLock(this.#waitFd, F_WRLCK, RESERVED_BYTE, 1)) {
        // A native writer holds it (writers of this VFS hold the turn), or
        // one that went past a stale turn: give the turn to the next writer
        // of this VFS, and poll.
        this.#releaseTurn();
        return this.#refuse(false);
      }
      this.#level = RESERVED;
      return OK;
    }
    // EXCLUSIVE: a write lock on PENDING (kept when the next step fails, as
    // unixLock does, so no new reader gets in), then the SHARED range turned
    // from read to write in one fcntl, which keeps the read lock if it fails.
    // Only readers can be in the way (a writer would hold RESERVED, or
    // PENDING while it recovers a hot journal), and they leave within a
    // statement, so this tries again for a moment rather than refuse.
    const until = performance.now() + READERS_SPIN_MS;
    for (;;) {
      if (
        this.#level < PENDING &&
        libc.setLock(this.#fd, F_WRLCK, PENDING_BYTE, 1)
      ) {
        this.#level = PENDING;
      }
      if (
        this.#level === PENDING &&
        libc.setLock(this.#fd, F_WRLCK, SHARED_FIRST, SHARED_SIZE)
      ) {
        this.#level = EXCLUSIVE;
        return OK;
      }
      if (performance.now() >= until) return this.#refuse(false);
    }
  }

  /** Refuses a lock; `turn`: the caller waits for the turn, else pauses. */
  #refuse(turn: boolean): number {
    this.#refusedTurn = turn;
    return BUSY;
  }

  unlock(target: number): number {
    if (this.#level <= target) {
      if (target === NONE) this.#dropGrant();
      return OK;
    }
    const libc = this.#libc;
    if (target === SHARED) {
      if (
        this.#level === EXCLUSIVE &&
        !libc.setLock(this.#fd, F_RDLCK, SHARED_FIRST, SHARED_SIZE)
      ) {
        throw new VfsError(
          "Could not downgrade the EXCLUSIVE lock to SHARED",
          IOERR_RDLOCK,
        );
      }
      libc.setLock(this.#fd, F_UNLCK, PENDING_BYTE, 1);
    } else {
      libc.setLock(this.#fd, F_UNLCK, 0, 0);
    }
    if (this.#turn === "bypassed") {
      libc.setLock(this.#waitFd, F_UNLCK, RESERVED_BYTE, 1);
      this.#turn = "none";
    } else if (this.#turn === "held") {
      if (this.#keepsTurn()) {
        libc.setLock(this.#waitFd, F_UNLCK, RESERVED_BYTE, 1);
        this.#turn = "kept";
        const timer = setTimeout(() => this.#endKeptTurn(), 0);
        Deno.unrefTimer(timer as unknown as number);
        this.#grantTimer = timer;
      } else {
        this.#releaseTurn();
      }
    } else {
      this.#dropGrant();
    }
    this.#level = target;
    return OK;
  }

  /**
   * Whether some connection or process holds RESERVED or more, as
   * unixCheckReservedLock asks: this connection's own level, else the
   * kernel whether any other owner holds a lock on RESERVED (the second
   * description holds this connection's). After a crash the kernel has
   * dropped the dead writer's lock, so its hot journal is seen.
   */
  checkReserved(): boolean {
    if (this.#level > SHARED) return true;
    return this.#libc.conflicts(this.#waitFd, F_WRLCK, RESERVED_BYTE, 1);
  }

  /**
   * Lets every lock go; returns whether the second descriptor is free to be
   * given back now (otherwise a wait in flight gives it back on return).
   */
  close(): boolean {
    this.#closed = true;
    this.#closing.resolve();
    clearTimeout(this.#grantTimer);
    if (this.#turn === "kept") watchdog!.end(this.#slot!);
    if (this.#slot !== undefined) watchdog!.freeSlot(this.#slot);
    this.#turn = "none";
    this.#level = NONE;
    this.#libc.setLock(this.#fd, F_UNLCK, 0, 0);
    this.#libc.setLock(this.#waitFd, F_UNLCK, 0, 0);
    return this.#call === undefined;
  }
}
