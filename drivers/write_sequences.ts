/**
 * How SQLite's writes reach a file, in the Deno file VFS (its xWrite) and
 * under the browser's `opfs-sahpool` VFS (its OPFS access handles' `write`):
 * each write before the call returns, but for two fixed sequences of
 * writes, held and written as one by their last write.
 *
 * @module
 */

/** A file as {@linkcode WriteSequences} sees it. */
export interface SequencedFile {
  /** A write-ahead log: a frame's header is held for its page. */
  readonly wal?: boolean;
  /** A rollback journal: a record's pieces are held for its last. */
  readonly journal?: boolean;
  /** Writes all of `from` at `at`, or throws. */
  write(from: Uint8Array, at: number): void;
}

/** SQLite's largest page size. */
const MAX_PAGE_SIZE = 65536;
/** The bytes of a WAL frame's header (wal.c's WAL_FRAME_HDRSIZE). */
const WAL_FRAME_HEADER = 24;
/**
 * The most bytes of frames {@linkcode WriteSequences.frameRuns} holds before
 * the next frame starts a new write: 64 pages of 4 KiB.
 */
export const FRAME_RUN_BYTES = 64 * (4096 + WAL_FRAME_HEADER);

/**
 * Each xWrite writes its bytes before it returns, so a failure fails the
 * call that made it, within the SQLite call (the step) that needs it, and
 * nothing is left for a later call to write: an earlier design held runs
 * of contiguous writes in JS, and their later failures reached another
 * connection's call, or a call whose error SQLite ignores (an unlock, a
 * close), after the transaction had gone on (or, in WAL mode, after the
 * index had told other processes the bytes were there).
 *
 * Two exceptions, each a fixed sequence of writes that SQLite makes from
 * one function with no other call between, so the last write of it
 * writes them all, and its error fails the whole as the first's would:
 * - a WAL frame: a 24-byte header, then its page (wal.c's
 *   walWriteOneFrame);
 * - a rollback journal record: the 4-byte page number, the page, the
 *   4-byte checksum (pager.c's pagerAddPageToRollbackJournal).
 *
 * A WAL sequence starts at any 24-byte write to the WAL but one that
 * follows a read of the same file at the same offset: the headers SQLite
 * rewrites at a commit (wal.c's walRewriteChecksums), each after a read of
 * its frame, with no page after them. The first frame of a commit follows
 * a lock call (or nothing), not a write, and is held like the others: its
 * header and page were two pwrites per commit. Every 4-byte write to a
 * rollback journal is followed by another write from the same function
 * (a record's page; in a super-journal pointer, the name, then the
 * checksum and the magic), so any starts one: the first record after a
 * lock change too. Should a sequence ever break off, the next call
 * writes what is held first, in the same step.
 *
 * With {@linkcode WriteSequences.frameRuns}, a WAL sequence goes on across
 * frames written back to back, up to {@linkcode FRAME_RUN_BYTES}: a
 * commit's frames are then one write, made by the call after its last
 * frame. Only for a connection whose every commit is followed by a sync
 * of the WAL, which then writes the run and fails the commit if it fails
 * (`synchronous=FULL`: wal.c's sqlite3WalFrames syncs after a commit's
 * frames and before its index entries), and whose WAL index no other
 * connection reads (`locking_mode=EXCLUSIVE`, as the browser's
 * `opfs-sahpool` database is held): the frames a transaction writes
 * before its commit (a cache spill) are written by its next call.
 */
export class WriteSequences {
  #held: { file: SequencedFile; offset: number; length: number } | undefined;
  #pieces = new Uint8Array(WAL_FRAME_HEADER + MAX_PAGE_SIZE + 4);
  /** Whether the held WAL sequence ends with a frame's header. */
  #headerLast = false;
  #frameRuns = false;
  /** Where the last call read when it was an xRead, else undefined. */
  #read: { file: SequencedFile; at: number } | undefined;

  /**
   * Whether a WAL sequence goes on across frames (see
   * {@linkcode WriteSequences}); set while nothing is held.
   */
  get frameRuns(): boolean {
    return this.#frameRuns;
  }

  set frameRuns(on: boolean) {
    this.flush();
    this.#frameRuns = on;
    this.#pieces = new Uint8Array(
      (on ? FRAME_RUN_BYTES : 0) + WAL_FRAME_HEADER + MAX_PAGE_SIZE + 4,
    );
  }

  /**
   * For the first line of every method but xWrite that touches files:
   * writes out what is held, if anything.
   *
   * @throws What the held write throws.
   */
  flush(): void {
    this.#read = undefined;
    this.#writeHeld();
  }

  /**
   * For xRead, after {@linkcode WriteSequences.flush}: the read of `file`
   * at `at`, which a rewritten WAL frame header follows.
   */
  read(file: SequencedFile, at: number): void {
    this.#read = { file, at };
  }

  /**
   * xWrite: `from` to `file` at `at`, now or (the start of a sequence) with
   * the sequence's last write.
   *
   * @throws What the write (or a held one it writes first) throws.
   */
  write(file: SequencedFile, from: Uint8Array, at: number): void {
    const read = this.#read;
    this.#read = undefined;
    const pieces = this.#pieces;
    const amount = from.length;
    const sequence = this.#held;
    if (
      sequence !== undefined && sequence.file === file &&
      at === sequence.offset + sequence.length &&
      sequence.length + amount <= pieces.length &&
      (sequence.file.wal
        ? this.#headerLast
          ? amount >= 512 // the page
          : this.#frameRuns && amount === WAL_FRAME_HEADER &&
            sequence.length < FRAME_RUN_BYTES // the next frame's header
        : sequence.length === 4
        ? amount >= 512 // the page
        : amount === 4) // the checksum
    ) {
      pieces.set(from, sequence.length);
      sequence.length += amount;
      this.#headerLast = amount === WAL_FRAME_HEADER;
      if (
        sequence.file.wal ? !this.#frameRuns : amount === 4
      ) {
        this.#writeHeld();
      }
    } else {
      this.#writeHeld();
      if (
        file.wal
          ? amount === WAL_FRAME_HEADER &&
            (read?.file !== file || read.at !== at)
          : file.journal === true && amount === 4
      ) {
        pieces.set(from, 0);
        this.#held = { file, offset: at, length: amount };
        this.#headerLast = true;
      } else {
        file.write(from, at);
      }
    }
  }

  #writeHeld(): void {
    const sequence = this.#held;
    if (sequence === undefined) return;
    this.#held = undefined;
    sequence.file.write(
      this.#pieces.subarray(0, sequence.length),
      sequence.offset,
    );
  }
}
