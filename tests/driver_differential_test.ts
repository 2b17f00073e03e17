/**
 * Differential test of the driver layer: random values go through every
 * driver of the table and must come back identical from all of them, since
 * node:sqlite is the oracle the WASM drivers are held to.
 */
import assert from "node:assert/strict";
import fc from "npm:fast-check@4.11.0";
import type { Row, SqlValue } from "../driver.ts";
import { SQLITE_DRIVERS as DRIVERS } from "./drivers.ts";

const INT64_MIN = -(2n ** 63n);
const INT64_MAX = 2n ** 63n - 1n;

function withoutNul(text: string): string {
  return text.replaceAll("\0", "");
}

const value: fc.Arbitrary<SqlValue> = fc.oneof(
  fc.constant(null),
  fc.integer(),
  fc.maxSafeInteger(),
  fc.constantFrom(
    0,
    -0,
    2 ** 31,
    -(2 ** 31) - 1,
    Number.MAX_SAFE_INTEGER,
    Number.MIN_SAFE_INTEGER,
  ),
  fc.double({ noNaN: true }),
  fc.bigInt({ min: INT64_MIN, max: INT64_MAX }),
  fc.constantFrom(2n ** 53n, -(2n ** 53n), INT64_MIN, INT64_MAX),
  // Deno's node:sqlite cuts text read back at its first NUL (documented in
  // drivers/node_sqlite.ts), so NUL is left out here and checked on its own below.
  fc.string({ unit: "binary", maxLength: 80 }).map(withoutNul),
  fc.string({ maxLength: 300 }).map(withoutNul),
  fc.uint8Array({ maxLength: 64 }),
);

Deno.test("random values round-trip identically through every driver", async () => {
  const opened = await Promise.all(DRIVERS.map((row) => row.open()));
  try {
    const drivers = opened.map((connections) => connections.drivers[0]!);
    for (const driver of drivers) {
      await driver.exec(
        "CREATE TABLE v(id INTEGER PRIMARY KEY, a ANY, b ANY) STRICT",
      );
    }
    await fc.assert(
      fc.asyncProperty(value, value, async (a, b) => {
        const results: Row[][] = [];
        for (const driver of drivers) {
          await driver.run("DELETE FROM v");
          const { changes } = await driver.run(
            "INSERT INTO v(a, b) VALUES (?, ?)",
            [a, b],
          );
          assert.equal(changes, 1);
          results.push(
            await driver.query(
              "SELECT a, b, typeof(a) AS ta, typeof(b) AS tb, ?1 = a AS same FROM v",
              [a],
            ),
          );
        }
        for (const result of results.slice(1)) {
          assert.deepEqual(result, results[0]);
        }
      }),
      { numRuns: 300 },
    );
  } finally {
    await Promise.all(opened.map((connections) => connections.close()));
  }
});

Deno.test("text with a NUL is stored whole by every driver (node:sqlite reads it cut)", async () => {
  for (const row of DRIVERS) {
    const connections = await row.open();
    try {
      const [driver] = connections.drivers;
      const [stored] = await driver!.query(
        "SELECT hex(?) AS h, length(CAST(? AS BLOB)) AS n",
        [
          "a\0b",
          "a\0b",
        ],
      );
      assert.deepEqual(stored, { h: "610062", n: 3 }, row.name);
      const [read] = await driver!.query("SELECT ? AS v", ["a\0b"]);
      assert.equal(
        read!["v"],
        row.name.startsWith("node:sqlite") ? "a" : "a\0b",
      );
    } finally {
      await connections.close();
    }
  }
});
