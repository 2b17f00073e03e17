/**
 * R12 (../shared/cases/ROUND2.md): schema migrations under a race of first
 * opens, and workers of two schema versions on one database at once.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import {
  type Lease,
  Outbox,
  processEvents,
  SCHEMA_VERSION,
  SchemaVersionError,
} from "../mod.ts";
import { SQLITE_DRIVERS } from "./drivers.ts";
import { ManualClock, snapshot } from "./helpers.ts";
import { openNodeSqlite } from "../drivers/node_sqlite.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { fromWireError, toWireError } from "../browser/protocol.ts";

const child = fileURLToPath(
  new URL("./fixtures/open_child.ts", import.meta.url),
);
const config = fileURLToPath(new URL("../deno.json", import.meta.url));

for (const kind of ["wasm", "node"] as const) {
  const open = kind === "node" ? openNodeSqlite : openSqliteWasm;
  Deno.test(`R12: ${kind}: four processes opening one new file at once all return within 5 s, each schema version is recorded once, and a fifth open, allowed no wait, finds nothing locked`, async () => {
    const dir = await Deno.makeTempDir({ prefix: "outbox_r12_" });
    const path = join(dir, "outbox.db");
    try {
      // Far enough ahead for every child to have loaded SQLite first.
      const startAt = Date.now() + 3_000;
      const outputs = await Promise.all(
        Array.from({ length: 4 }, () =>
          new Deno.Command(Deno.execPath(), {
            args: [
              "run",
              "-A",
              "--config",
              config,
              child,
              kind,
              path,
              String(startAt),
            ],
            stdout: "piped",
            stderr: "piped",
          }).output()),
      );
      const openMs = outputs.map((output) => {
        const stderr = new TextDecoder().decode(output.stderr);
        assert.ok(output.success, stderr);
        return JSON.parse(new TextDecoder().decode(output.stdout)).openMs;
      });
      for (const ms of openMs) assert.ok(ms < 5_000, `an open took ${ms} ms`);

      // Allowed no wait at all: any lock left behind (a poisoned one) makes
      // it throw BusyError, whatever the time it took.
      await using outbox = await Outbox.open(
        await open(path, { busyTimeoutMs: 0 }),
        { busyTimeoutMs: 0 },
      );
      await using raw = await open(path);
      assert.deepEqual(
        await raw.query("SELECT version FROM outbox_schema ORDER BY version"),
        [{ version: SCHEMA_VERSION }],
      );
      // The outbox's version is not in user_version, the application's.
      assert.deepEqual(await raw.query("PRAGMA user_version"), [{
        user_version: 0,
      }]);
      assert.deepEqual(await raw.query("PRAGMA integrity_check"), [{
        integrity_check: "ok",
      }]);
      await outbox.enqueue("works");
      assert.equal((await outbox.claim())?.payload, "works");
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
}

for (const driver of SQLITE_DRIVERS.filter((d) => d.file)) {
  Deno.test(`R12: ${driver.name}: a newer release's additive upgrade runs beside a running worker, whose claims and acknowledgements go on; this release then refuses the newer file before its first claim`, async () => {
    const connections = await driver.open(3);
    const [workerDb, upgraderDb, laterDb] = connections.drivers;
    const clock = new ManualClock(1_000);
    try {
      const outbox = await Outbox.open(workerDb!, { now: clock.now });
      for (const n of [1, 2, 3]) await outbox.enqueue(`e${n}`);
      const seen: Lease[] = [];
      const firstStarted = Promise.withResolvers<void>();
      const upgraded = Promise.withResolvers<void>();
      const allDone = Promise.withResolvers<void>();
      const errors: unknown[] = [];
      const processor = processEvents(outbox, async (lease) => {
        seen.push(lease);
        if (lease.payload === "e1") {
          firstStarted.resolve();
          // e1 stays claimed by this worker while the upgrade runs.
          await upgraded.promise;
        }
        if (seen.length === 3) allDone.resolve();
      }, {
        concurrency: 1,
        pollMinMs: 1,
        pollMaxMs: 5,
        onError: (e) => errors.push(e),
      });
      await firstStarted.promise;

      // The next release's upgrade step, additive as every step must be,
      // on another connection while e1 is claimed.
      await upgraderDb!.exec(`BEGIN IMMEDIATE;
        ALTER TABLE outbox_events ADD COLUMN next_release_note TEXT;
        INSERT INTO outbox_schema (version, applied_at) VALUES (${
        SCHEMA_VERSION + 1
      }, 0);
        COMMIT`);
      upgraded.resolve();
      await allDone.promise;
      await processor.stop();
      assert.deepEqual(errors, []);
      assert.deepEqual(seen.map((l) => [l.payload, l.fence]), [["e1", 1], [
        "e2",
        1,
      ], ["e3", 1]]);
      assert.equal(processor.counters.acknowledged, 3);
      for (const lease of seen) {
        const kinds = (await outbox.explain(lease.eventId))?.history.map((e) =>
          e.kind
        );
        assert.deepEqual(kinds, ["claimed", "acknowledged"]);
      }
      await outbox.close();

      // This release opening the newer file: refused before any claim.
      const before = await snapshot(upgraderDb!);
      const error = await Outbox.open(laterDb!, { now: clock.now }).then(
        () => undefined,
        (e) => e,
      );
      assert.ok(error instanceof SchemaVersionError, String(error));
      assert.equal(error.version, SCHEMA_VERSION + 1);
      assert.equal(error.supported, SCHEMA_VERSION);
      assert.deepEqual(await snapshot(upgraderDb!), before);
    } finally {
      await connections.close();
    }
  });
}

Deno.test("R12: a SchemaVersionError crosses from the worker that hosts the database to the tab as itself", () => {
  const error = fromWireError(
    structuredClone(
      toWireError(new SchemaVersionError(SCHEMA_VERSION + 1, SCHEMA_VERSION)),
    ),
  );
  assert.ok(error instanceof SchemaVersionError);
  assert.equal(error.version, SCHEMA_VERSION + 1);
  assert.equal(error.supported, SCHEMA_VERSION);
  assert.match(error.message, /newer than this release's/);
});
