/**
 * The cost of naming the conflict targets of SQLite's enqueue statements
 * (`ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
 * ON CONFLICT (identity) DO NOTHING`, and `(identity)` alone for
 * `insertAlike`) against the untargeted `ON CONFLICT DO NOTHING` they
 * replaced, in alternating blocks of one process (`bench/blocks.ts`): each
 * block one transaction inserting 500 events with `insertAlike` (no dedup
 * key) or `insertAll` (a dedup key each), on the WASM build and on
 * `node:sqlite`, each side on a database of its own in memory.
 *
 * ```sh
 * deno run -A bench/sqlite_conflict_ab.ts
 * ```
 *
 * Prints, per driver and statement, both sides' events per second over all
 * blocks and the median of the per-block ratios (targeted over
 * untargeted), with the load average before and after. Not part of
 * `deno task bench`.
 *
 * @module
 */
import { alternate, type Side } from "./blocks.ts";
import { SQLITE } from "../dialects/sqlite.ts";
import type { Driver, SqlValue } from "../driver.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { openNodeSqlite } from "../drivers/node_sqlite.ts";
import { Outbox, uuidv7 } from "../mod.ts";

const EVENTS = 500;
const WARMUP = 5;
const BLOCKS = 60;

/** `text` with its conflict targets taken out, as before they were named. */
function untargeted(text: string): string {
  const old = text
    .replace(
      /ON CONFLICT \(queue, dedup_key\) WHERE dedup_key IS NOT NULL DO NOTHING\s+ON CONFLICT \(identity\) DO NOTHING/,
      "ON CONFLICT DO NOTHING",
    )
    .replace("ON CONFLICT (identity) DO NOTHING", "ON CONFLICT DO NOTHING");
  if (old === text) throw new Error("the statement names no conflict target");
  return old;
}

/** One side: `text` run on a fresh outbox database, one transaction a block. */
async function side(
  open: () => Promise<Driver>,
  statement: "insertAlike" | "insertAll",
  text: string,
): Promise<Side & { close(): Promise<void> }> {
  const driver = await open();
  const outbox = await Outbox.open(driver);
  let key = 0;
  return {
    async block() {
      const rows = Array.from(
        { length: EVENTS },
        (_, i) =>
          statement === "insertAlike" ? [JSON.stringify({ i }), uuidv7(0)] : [
            "default",
            JSON.stringify({ i }),
            null,
            `k${key++}`,
            null,
            0,
            5,
            uuidv7(0),
            0,
            null,
          ],
      );
      const params: SqlValue[] = statement === "insertAlike"
        ? [0, JSON.stringify(rows), "default", 0, 5]
        : [0, JSON.stringify(rows)];
      await driver.run(SQLITE.begin);
      await driver.query(text, params);
      await driver.run(SQLITE.commit);
      return EVENTS;
    },
    close: () => outbox.close(),
  };
}

const uptime = async () =>
  (await Deno.readTextFile("/proc/loadavg")).split(" ").slice(0, 3).join(" ");
console.log(`load ${await uptime()}`);
const drivers: [string, () => Promise<Driver>][] = [
  ["wasm", () => openSqliteWasm(":memory:")],
  ["node:sqlite", () => openNodeSqlite(":memory:")],
];
for (const [name, open] of drivers) {
  for (const statement of ["insertAlike", "insertAll"] as const) {
    const ours = await side(open, statement, SQLITE[statement]);
    const theirs = await side(open, statement, untargeted(SQLITE[statement]));
    const { value, anchorValue, ratio } = await alternate(
      ours,
      theirs,
      WARMUP,
      BLOCKS,
    );
    console.log(
      `${name} ${statement} x${EVENTS}: targeted ${
        value.toFixed(0)
      }/s, untargeted ${anchorValue.toFixed(0)}/s, median block ratio ${
        ratio.toFixed(3)
      }`,
    );
    await ours.close();
    await theirs.close();
  }
}
console.log(`load ${await uptime()}`);
