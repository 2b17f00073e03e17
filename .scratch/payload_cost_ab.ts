// Alternating blocks, main's checkPayload against this branch's, one process.
import { checkPayload as branch } from "../core/payload.ts";
import { checkPayload as main } from "/work/main/core/payload.ts";
const big = { items: Array.from({ length: 100_000 }, (_, i) => i) };
const order = { id: 7, lines: Array.from({ length: 20 }, (_, i) => ({ sku: `s${i}`, qty: i, tags: ["a", "b"] })) };
for (const [name, p, n] of [["100k-number array", big, 20], ["order, 20 lines", order, 20_000]] as const) {
  const t = { main: [] as number[], branch: [] as number[] };
  for (let block = 0; block < 10; block++) {
    for (const [side, f] of [["main", main], ["branch", branch]] as const) {
      const t0 = performance.now();
      for (let i = 0; i < n; i++) f("enqueue", "payload", p);
      t[side].push((performance.now() - t0) / n * 1000);
    }
  }
  const med = (xs: number[]) => xs.sort((a, b) => a - b)[xs.length >> 1]!;
  console.log(`${name}: main ${med(t.main).toFixed(2)} us, branch ${med(t.branch).toFixed(2)} us (medians of 10 alternating blocks)`);
}
