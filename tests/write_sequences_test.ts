import assert from "node:assert/strict";
import {
  FRAME_RUN_BYTES,
  type SequencedFile,
  WriteSequences,
} from "../drivers/write_sequences.ts";

const PAGE = 4096;
const HEADER = 24;
const FRAME = HEADER + PAGE;

/** A WAL that records its writes as [offset, bytes], or fails them. */
function wal(fail = false): SequencedFile & { writes: [number, number][] } {
  const writes: [number, number][] = [];
  return {
    wal: true,
    writes,
    write(from, at) {
      if (fail) throw new Error("EIO");
      writes.push([at, from.length]);
    },
  };
}

/** Writes `count` frames back to back from `start`, as wal.c does. */
function frames(
  sequences: WriteSequences,
  file: SequencedFile,
  start: number,
  count: number,
) {
  for (let i = 0; i < count; i++) {
    sequences.write(file, new Uint8Array(HEADER), start + i * FRAME);
    sequences.write(file, new Uint8Array(PAGE), start + i * FRAME + HEADER);
  }
}

Deno.test("WriteSequences writes each WAL frame's header and page as one write, by the page", () => {
  const sequences = new WriteSequences();
  const file = wal();
  frames(sequences, file, 32, 3);
  assert.deepEqual(file.writes, [
    [32, FRAME],
    [32 + FRAME, FRAME],
    [32 + 2 * FRAME, FRAME],
  ]);
});

Deno.test("WriteSequences with frameRuns holds frames written back to back until the next other call, which writes them as one", () => {
  const sequences = new WriteSequences();
  sequences.frameRuns = true;
  const file = wal();
  frames(sequences, file, 32, 3);
  assert.deepEqual(file.writes, []);
  sequences.flush(); // the commit's sync
  assert.deepEqual(file.writes, [[32, 3 * FRAME]]);
  // A header rewritten after a read of its frame is written at once.
  sequences.flush();
  sequences.read(file, 32);
  sequences.write(file, new Uint8Array(HEADER), 32);
  assert.deepEqual(file.writes, [[32, 3 * FRAME], [32, HEADER]]);
});

Deno.test("WriteSequences with frameRuns fails the call after the frames (the commit's sync) when their write fails, never a frame's write", () => {
  const sequences = new WriteSequences();
  sequences.frameRuns = true;
  const file = wal(true);
  frames(sequences, file, 32, 2);
  assert.throws(() => sequences.flush(), /EIO/);
  // Nothing is held after the failure: the next flush writes nothing.
  sequences.flush();
});

Deno.test("WriteSequences with frameRuns starts a new write after FRAME_RUN_BYTES of frames", () => {
  const sequences = new WriteSequences();
  sequences.frameRuns = true;
  const file = wal();
  const perRun = FRAME_RUN_BYTES / FRAME;
  frames(sequences, file, 32, perRun + 1);
  assert.deepEqual(file.writes, [[32, FRAME_RUN_BYTES]]);
  sequences.flush();
  assert.deepEqual(file.writes, [
    [32, FRAME_RUN_BYTES],
    [32 + FRAME_RUN_BYTES, FRAME],
  ]);
});
