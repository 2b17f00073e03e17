/**
 * The payload check's cost against another build's, in alternating blocks
 * of one process (`bench/blocks.ts`): `encodePayload` (the check and the
 * JSON text) and `checkPayload` (the check alone) of a 20-line order and of
 * a 100,000-number array, this tree's `core/payload.ts` against the module
 * given.
 *
 * ```sh
 * git -C /work/main show 5064578:core/payload.ts > core/payload_before.ts
 * deno run -A bench/payload_ab.ts core/payload_before.ts
 * ```
 *
 * The module given must sit in `core/` (its imports are relative). Prints,
 * per payload and function, both sides' µs per call over all blocks and
 * the median of the per-block ratios of this tree's time to the other's,
 * with the load average before and after. Not part of `deno task bench`.
 *
 * @module
 */
import { alternateAll } from "./blocks.ts";
import * as ours from "../core/payload.ts";

type Payloads = typeof ours;

const other = Deno.args[0];
if (other === undefined) {
  console.error("Usage: deno run -A bench/payload_ab.ts <core/payload_*.ts>");
} else {
  const theirs: Payloads = await import(
    new URL(other, `file://${Deno.cwd()}/`).href
  );
  const order = {
    id: 7,
    customer: { name: "Ada", email: "ada@example.com" },
    lines: Array.from({ length: 20 }, (_, i) => ({
      sku: `s${i}`,
      qty: i,
      price: 9.5 + i,
      tags: ["a", "b"],
    })),
  };
  const numbers = { items: Array.from({ length: 100_000 }, (_, i) => i) };
  const maxBytes = 16 << 20;
  const load = () => Deno.loadavg().map((l) => l.toFixed(1)).join(" ");
  console.log(`load average before: ${load()}`);
  const cases = [
    ["a 20-line order", order, 2_000, 2],
    ["a 100,000-number array", numbers, 4, 0],
  ] as const;
  for (const [name, payload, calls, digits] of cases) {
    for (const fn of ["encodePayload", "checkPayload"] as const) {
      const side = (module: Payloads) => ({
        block() {
          for (let i = 0; i < calls; i++) {
            if (fn === "encodePayload") {
              module.encodePayload("enqueue", "payload", payload, maxBytes);
            } else {
              module.checkPayload("enqueue", "payload", payload);
            }
          }
          return Promise.resolve(calls);
        },
      });
      const { values, ratios } = await alternateAll(
        [side(ours), side(theirs)],
        5,
        30,
      );
      const us = (rate: number) => (1e6 / rate).toFixed(digits);
      console.log(
        `${name}, ${fn}: this tree ${us(values[0]!)} µs, the other ${
          us(values[1]!)
        } µs, time ratio (median of 30 blocks) ${(1 / ratios[0]!).toFixed(2)}`,
      );
    }
  }
  console.log(`load average after: ${load()}`);
}
