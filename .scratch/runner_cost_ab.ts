// Alternating blocks, main's Outbox against this branch's, one process, :memory:
// (WASM): enqueue, claim, acknowledge, one at a time (every call waits in
// the line and the mutex: the timers the bounded wait sets).
import { Outbox as BranchOutbox } from "../mod.ts";
import { openSqliteWasm as branchOpen } from "../deno/sqlite_wasm.ts";
import { Outbox as MainOutbox } from "/work/main/mod.ts";
import { openSqliteWasm as mainOpen } from "/work/main/deno/sqlite_wasm.ts";
const sides = {
  main: await MainOutbox.open(await mainOpen(":memory:")),
  branch: await BranchOutbox.open(await branchOpen(":memory:")),
} as const;
const N = 300;
const t: Record<string, number[]> = { main: [], branch: [] };
for (let block = 0; block < 12; block++) {
  for (const side of block % 2 ? ["main", "branch"] as const : ["branch", "main"] as const) {
    const o = sides[side] as InstanceType<typeof BranchOutbox>;
    const t0 = performance.now();
    for (let i = 0; i < N; i++) {
      await o.enqueue({ i });
      const l = await o.claim({ leaseMs: 10_000 });
      await o.acknowledge(l!);
    }
    t[side]!.push((performance.now() - t0) / N * 1000);
  }
}
const med = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1]!;
console.log(`enqueue+claim+ack: main ${med(t.main!).toFixed(1)} us, branch ${med(t.branch!).toFixed(1)} us per cycle (medians of 12 alternating blocks of ${N})`);
