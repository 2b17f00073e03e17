/**
 * bench/postgres_bloat_soak.ts: its verdict judges synthetic samples as
 * stated, and a short soak runs, samples every outbox table at each moment
 * and prints a verdict that follows from its samples.
 */
import assert from "node:assert/strict";
import {
  type Sample,
  sampleTable,
  verdict,
} from "../bench/postgres_bloat_soak.ts";

const MIB = 1_048_576;

/** Samples of `table` every 30 s over 10 minutes, from `figures(t)`. */
function series(
  figures: (minute: number) => { heap: number; dead: number },
  table = "outbox_events",
): Sample[] {
  const samples: Sample[] = [];
  for (let atMs = 0; atMs <= 600_000; atMs += 30_000) {
    const { heap, dead } = figures(atMs / 60_000);
    samples.push({
      atMs,
      table,
      heapBytes: heap,
      totalBytes: 2 * heap,
      live: 5_000,
      dead,
      updates: atMs,
      hotUpdates: atMs / 2,
      autovacuums: Math.floor(atMs / 60_000),
    });
  }
  return samples;
}

const TEN_MINUTES = { durationMs: 600_000 };

Deno.test("verdict: a hot table whose size levels off and whose dead tuples autovacuum cuts back each minute is bounded", () => {
  const samples = series((minute) => ({
    heap: Math.min(minute, 2) * 10 * MIB,
    dead: 20_000 * (minute % 1) + 500,
  }));
  const judged = verdict(samples, TEN_MINUTES);
  assert.equal(judged.bounded, true);
  assert.deepEqual(judged.heapBytes, {
    firstMax: 20 * MIB,
    secondMax: 20 * MIB,
    bound: 30 * MIB,
    bounded: true,
  });
  assert.equal(judged.totalBytes.secondMax, 40 * MIB);
  assert.deepEqual(judged.dead, {
    firstMax: 10_500,
    secondMax: 10_500,
    bound: 15_750,
    bounded: true,
  });
  assert.deepEqual(judged.live, {
    firstMax: 5_000,
    secondMax: 5_000,
    bound: 7_500,
    bounded: true,
  });
  assert.match(
    judged.text,
    /^outbox_events: bounded over the second half.*; live tuples 5000 in the first half, 5000 in the second$/,
  );
});

Deno.test("verdict: a hot table that keeps growing is not bounded, naming the size past its bound", () => {
  const judged = verdict(
    series((minute) => ({ heap: minute * 10 * MIB, dead: 500 })),
    TEN_MINUTES,
  );
  assert.equal(judged.bounded, false);
  // The first half ends at 5 minutes (50 MiB); the second reaches 100.
  assert.deepEqual(judged.heapBytes, {
    firstMax: 50 * MIB,
    secondMax: 100 * MIB,
    bound: 75 * MIB,
    bounded: false,
  });
  assert.equal(judged.totalBytes.bounded, false);
  assert.equal(judged.dead.bounded, true);
  assert.match(
    judged.text,
    /NOT bounded.*heap 100\.00 MiB \(bound 75\.00 MiB: past\)/,
  );
});

Deno.test("verdict: live tuples that grow are reported beside the verdict, not judged", () => {
  const judged = verdict(
    series(() => ({ heap: MIB, dead: 0 })).map((s) => ({
      ...s,
      live: s.atMs,
    })),
    TEN_MINUTES,
  );
  assert.deepEqual([judged.bounded, judged.live.bounded], [true, false]);
  assert.match(
    judged.text,
    /live tuples 300000 in the first half, 600000 in the second$/,
  );
});

Deno.test("verdict: dead tuples that pile up while the size holds are not bounded", () => {
  const judged = verdict(
    series((minute) => ({ heap: 10 * MIB, dead: minute * 10_000 })),
    TEN_MINUTES,
  );
  assert.deepEqual(
    [judged.bounded, judged.heapBytes.bounded, judged.dead.bounded],
    [false, true, false],
  );
  assert.equal(judged.dead.secondMax, 100_000);
  assert.equal(judged.dead.bound, 75_000);
});

Deno.test("verdict: dead tuples within the floor are bounded however few the first half had; a value at the bound is within it", () => {
  const few = verdict(
    series((minute) => ({ heap: MIB, dead: minute <= 5 ? 10 : 900 })),
    TEN_MINUTES,
  );
  assert.deepEqual(few.dead, {
    firstMax: 10,
    secondMax: 900,
    bound: 1_000,
    bounded: true,
  });
  const strict = verdict(
    series((minute) => ({ heap: MIB, dead: minute <= 5 ? 10 : 900 })),
    { ...TEN_MINUTES, deadFloor: 0, factor: 90 },
  );
  assert.deepEqual(
    [strict.dead.bound, strict.dead.bounded, strict.bounded],
    [900, true, true],
  );
  const past = verdict(
    series((minute) => ({ heap: MIB, dead: minute <= 5 ? 10 : 901 })),
    { ...TEN_MINUTES, deadFloor: 0, factor: 90 },
  );
  assert.equal(past.dead.bounded, false);
});

Deno.test("verdict judges the table it is given and no other; without a sample in each half it throws RangeError", () => {
  const samples = [
    ...series((minute) => ({ heap: minute * MIB, dead: 0 }), "outbox_done"),
    ...series(() => ({ heap: MIB, dead: 0 })),
  ];
  assert.equal(verdict(samples, TEN_MINUTES).bounded, true);
  assert.equal(
    verdict(samples, { ...TEN_MINUTES, table: "outbox_done" }).bounded,
    false,
  );
  assert.throws(
    () => verdict(samples, { ...TEN_MINUTES, table: "outbox_keys" }),
    new RangeError(
      "Cannot judge outbox_keys as each half of the soak needs a sample of it: 0 in the first, 0 in the second",
    ),
  );
  assert.throws(
    () => verdict(samples, { durationMs: 1_200_000 }),
    /0 in the second/,
  );
});

Deno.test("sampleTable prints one markdown row per table and moment, with the HOT share of updates", () => {
  const lines = sampleTable(series(() => ({ heap: MIB, dead: 7 })).slice(1, 2))
    .split("\n");
  assert.equal(lines.length, 3);
  assert.match(lines[0]!, /^\| t \(s\) \| table +\| +heap \| +total \|/);
  assert.deepEqual(
    lines[2]!.split("|").slice(1, -1).map((cell) => cell.trim()),
    [
      "30",
      "outbox_events",
      "1.00 MiB",
      "2.00 MiB",
      "5,000",
      "7",
      "30,000",
      "50.0%",
      "0",
    ],
  );
});

Deno.test("bench/postgres_bloat_soak.ts runs a short soak and prints its samples of every outbox table at every moment, and the verdict they give", async () => {
  const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      "--config",
      new URL("../deno.json", import.meta.url).pathname,
      new URL("../bench/postgres_bloat_soak.ts", import.meta.url).pathname,
      "--minutes",
      "0.3",
      "--interval-seconds",
      "3",
      "--workers",
      "3",
      "--backlog",
      "500",
      "--purge-seconds",
      "5",
    ],
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(code, 0, new TextDecoder().decode(stderr).slice(-3000));
  const out = new TextDecoder().decode(stdout).trimEnd();
  const result = JSON.parse(out.split("\n").at(-1)!);
  assert.equal(result.durationMs, 18_000);
  assert.ok(result.acknowledged > 0);
  const samples: Sample[] = result.samples;
  const moments = [...new Set(samples.map((s) => s.atMs))];
  assert.deepEqual(moments, [0, 3, 6, 9, 12, 15, 18].map((s) => s * 1000));
  const tables = [...new Set(samples.map((s) => s.table))];
  assert.ok(tables.includes("outbox_events"));
  assert.ok(tables.every((table) => table.startsWith("outbox_")));
  for (const atMs of moments) {
    assert.deepEqual(
      samples.filter((s) => s.atMs === atMs).map((s) => s.table),
      tables,
    );
  }
  const last = samples.findLast((s) => s.table === "outbox_events")!;
  assert.ok(last.updates > 0 && last.totalBytes > 0);
  const judged = verdict(samples, { durationMs: 18_000 });
  assert.deepEqual(result.verdict, judged);
  assert.ok(out.includes(`\n${judged.text}\n`));
  assert.ok(out.startsWith(sampleTable(samples)));
});
