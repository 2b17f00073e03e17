/**
 * A bounded, visible WAL: a long reader beside claim+ack cycles grows the
 * WAL, which stats(), the reader, the CLI and OpenTelemetry report with the
 * "held back" flag; once the reader leaves, maintain() truncates it and
 * journal_size_limit bounds it; new files get incremental auto-vacuum in
 * every journal mode.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { Outbox } from "../mod.ts";
import type { Driver } from "../driver.ts";
import { OutboxReader } from "../reader.ts";
import { main } from "../cli.ts";
import { openNodeSqlite } from "../drivers/node_sqlite.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { JOURNAL_SIZE_LIMIT_BYTES } from "../wal.ts";
import { processEvents } from "../worker.ts";
import { tempDir } from "./helpers.ts";
import { metrics } from "@opentelemetry/api";
import {
  AggregationTemporality,
  InMemoryMetricExporter,
  MeterProvider,
  PeriodicExportingMetricReader,
} from "npm:@opentelemetry/sdk-metrics@2.12.1";

type Open = (path: string) => Promise<Driver>;

const DRIVERS: ReadonlyArray<readonly [string, Open]> = [
  [
    "the WASM file driver",
    (path) => openSqliteWasm(path, { journalMode: "wal" }),
  ],
  ["node:sqlite", (path) => openNodeSqlite(path, { journalMode: "wal" })],
];

/** A long reader: a native `sqlite3` process with a read transaction open. */
async function nativeReader(path: string): Promise<AsyncDisposable> {
  const child = new Deno.Command("sqlite3", {
    args: [path],
    stdin: "piped",
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const writer = child.stdin.getWriter();
  await writer.write(
    new TextEncoder().encode(
      "BEGIN; SELECT 'reading', count(*) FROM outbox_events;\n",
    ),
  );
  const reader = child.stdout.getReader();
  let seen = "";
  while (!seen.includes("reading")) {
    const { value, done } = await reader.read();
    assert.ok(!done, "sqlite3 ended before reading");
    seen += new TextDecoder().decode(value);
  }
  return {
    async [Symbol.asyncDispose]() {
      await writer.write(new TextEncoder().encode("ROLLBACK;\n.quit\n"));
      await writer.close();
      reader.releaseLock();
      await child.stdout.cancel();
      assert.equal((await child.status).code, 0);
    },
  };
}

async function cycles(outbox: Outbox, n: number): Promise<void> {
  for (let i = 0; i < n; i++) {
    await outbox.enqueue({ i, pad: "x".repeat(200) });
    const lease = await outbox.claim();
    assert.ok(lease !== null);
    assert.equal(await outbox.acknowledge(lease), true);
  }
}

async function walFileBytes(path: string): Promise<number> {
  return (await Deno.stat(`${path}-wal`)).size;
}

/** A long reader: a second connection of this process in a read transaction. */
function longReader(path: string): Disposable {
  const reader = new DatabaseSync(path);
  reader.exec("BEGIN");
  reader.prepare("SELECT count(*) FROM outbox_events").get();
  return {
    [Symbol.dispose]() {
      reader.exec("ROLLBACK");
      reader.close();
    },
  };
}

/** Claim+ack cycles until the WAL file is past journal_size_limit. */
async function growPastLimit(path: string, outbox: Outbox): Promise<void> {
  while (await walFileBytes(path) <= JOURNAL_SIZE_LIMIT_BYTES) {
    await cycles(outbox, 50);
  }
}

for (const [name, open] of DRIVERS) {
  Deno.test(`on ${name}, a long reader makes stats() report a growing WAL held back by a reader, and once it leaves maintain() truncates the WAL to zero bytes`, async () => {
    await using tmp = await tempDir("wal_growth_");
    const path = join(tmp.path, "outbox.db");
    await using outbox = await Outbox.open(await open(path));
    await cycles(outbox, 20);
    const quiet = (await outbox.stats()).wal;
    assert.ok(quiet !== undefined);
    assert.equal(quiet.checkpointHeldBack, false);
    let before: number;
    {
      using _ = longReader(path);
      await cycles(outbox, 50);
      const held = (await outbox.stats()).wal;
      assert.ok(held !== undefined);
      assert.equal(held.checkpointHeldBack, true);
      before = held.sizeBytes;
      await cycles(outbox, 50);
      const grown = (await outbox.stats()).wal!;
      assert.equal(grown.checkpointHeldBack, true);
      assert.ok(grown.sizeBytes > before, `${grown.sizeBytes} > ${before}`);
      before = grown.sizeBytes;
    }
    const left = (await outbox.stats()).wal!;
    assert.equal(left.checkpointHeldBack, false);
    assert.ok(await walFileBytes(path) >= before);
    const { wal } = await outbox.maintain();
    assert.deepEqual(wal, { sizeBytes: 0, checkpointHeldBack: false });
    assert.equal(await walFileBytes(path), 0);
    assert.equal((await outbox.stats()).done, 120);
  });

  Deno.test(`on ${name}, a native sqlite3 process holding a read transaction shows in the reader's and the CLI's WAL report, and the WAL is truncated after it leaves`, async () => {
    await using tmp = await tempDir("wal_growth_");
    const path = join(tmp.path, "outbox.db");
    await using outbox = await Outbox.open(await open(path));
    await cycles(outbox, 10);
    const cliWal = async () => {
      const lines: string[] = [];
      assert.equal(
        await main(["stats", path, "--json"], {
          stdout: (line) => lines.push(line),
        }),
        0,
      );
      return JSON.parse(lines[0]!).wal;
    };
    {
      await using _ = await nativeReader(path);
      await cycles(outbox, 60);
      await using reader = await OutboxReader.open(await open(path));
      const seen = await reader.wal();
      assert.equal(seen?.checkpointHeldBack, true);
      assert.ok(seen.sizeBytes > 60 * 4096, String(seen.sizeBytes));
      const fromCli = await cliWal();
      assert.equal(fromCli.checkpointHeldBack, true);
      assert.ok(fromCli.sizeBytes >= seen.sizeBytes);
      const text: string[] = [];
      await main(["stats", path], { stdout: (line) => text.push(line) });
      assert.match(
        text.join("\n"),
        /^WAL \d+ bytes, checkpoints held back by a reader$/m,
      );
    }
    assert.deepEqual((await outbox.maintain()).wal, {
      sizeBytes: 0,
      checkpointHeldBack: false,
    });
    assert.deepEqual(await cliWal(), {
      sizeBytes: 0,
      checkpointHeldBack: false,
    });
  });

  Deno.test(`on ${name}, once a long reader leaves, the next commits bring a WAL grown past journal_size_limit back under it without maintain()`, async () => {
    await using tmp = await tempDir("wal_growth_");
    const path = join(tmp.path, "outbox.db");
    await using outbox = await Outbox.open(await open(path));
    {
      using _ = longReader(path);
      await growPastLimit(path, outbox);
    }
    // The first commit's checkpoint copies the WAL; a later write starts
    // it over and truncates the file.
    await cycles(outbox, 5);
    const size = await walFileBytes(path);
    assert.ok(size <= JOURNAL_SIZE_LIMIT_BYTES, String(size));
  });

  Deno.test(`on ${name}, once a long reader leaves, the next stats() truncates a WAL grown past journal_size_limit, with no write in between`, async () => {
    await using tmp = await tempDir("wal_growth_");
    const path = join(tmp.path, "outbox.db");
    await using outbox = await Outbox.open(await open(path));
    {
      using _ = longReader(path);
      await growPastLimit(path, outbox);
      const held = (await outbox.stats()).wal!;
      assert.equal(held.checkpointHeldBack, true);
      assert.ok(held.sizeBytes > JOURNAL_SIZE_LIMIT_BYTES);
    }
    assert.deepEqual((await outbox.stats()).wal, {
      sizeBytes: 0,
      checkpointHeldBack: false,
    });
    assert.equal(await walFileBytes(path), 0);
  });

  Deno.test(`on ${name}, a new file gets incremental auto-vacuum before WAL mode writes its first page, so maintain() can shrink it`, async () => {
    await using tmp = await tempDir("wal_growth_");
    const path = join(tmp.path, "outbox.db");
    await using outbox = await Outbox.open(await open(path));
    assert.equal((await outbox.maintain()).autoVacuum, "incremental");
    const native = new DatabaseSync(path, { readOnly: true });
    try {
      assert.deepEqual(
        { ...native.prepare("PRAGMA auto_vacuum").get() },
        { auto_vacuum: 2 },
      );
    } finally {
      native.close();
    }
  });
}

Deno.test("the outbox.wal.size and outbox.wal.checkpoint_held_back gauges report the WAL a long reader holds back", async () => {
  await using tmp = await tempDir("wal_growth_");
  const path = join(tmp.path, "outbox.db");
  const exporter = new InMemoryMetricExporter(AggregationTemporality.DELTA);
  const metricReader = new PeriodicExportingMetricReader({
    exporter,
    exportIntervalMillis: 3_600_000,
  });
  const provider = new MeterProvider({ readers: [metricReader] });
  metrics.setGlobalMeterProvider(provider);
  try {
    await using outbox = await Outbox.open(
      await openSqliteWasm(path, { journalMode: "wal" }),
    );
    const gauges = async () => {
      exporter.reset();
      await metricReader.forceFlush();
      const found = exporter.getMetrics().flatMap((resource) =>
        resource.scopeMetrics.flatMap((scope) => scope.metrics)
      );
      const value = (name: string) =>
        found.find((m) => m.descriptor.name === name)?.dataPoints[0]?.value;
      return {
        size: value("outbox.wal.size"),
        heldBack: value("outbox.wal.checkpoint_held_back"),
      };
    };
    const reader = longReader(path);
    await cycles(outbox, 30);
    const processor = processEvents(outbox, () => {}, {
      pollMinMs: 3_600_000,
      pollMaxMs: 3_600_000,
    });
    try {
      const held = await gauges();
      assert.equal(held.heldBack, 1);
      assert.ok(Number(held.size) > 30 * 4096, String(held.size));
      reader[Symbol.dispose]();
      await outbox.maintain();
      assert.deepEqual(await gauges(), { size: 0, heldBack: 0 });
    } finally {
      await processor.stop();
    }
  } finally {
    await provider.shutdown();
    metrics.disable();
  }
});
