/**
 * The demo's producer process: writes `--events N` orders, each order row
 * and its `order.placed` event committed in one transaction.
 *
 * Usage: `deno run -A demo/producer.ts --db PATH|URL [--schema S] --events N
 * --poison K`
 *
 * @module
 */
import { engineFromArgs, intFlag, type OrderPlaced } from "./db.ts";

const args = Deno.args;
const engine = await engineFromArgs(args);
const events = intFlag(args, "events", 2_000);
const poison = intFlag(args, "poison", 5);
// Poison orders are spread evenly through the run.
const poisonEvery = poison === 0 ? 0 : Math.floor(events / poison);

await using outbox = await engine.openOutbox(
  { busyTimeoutMs: 60_000 },
  "producer",
);
for (let n = 1; n <= events; n++) {
  const isPoison = poisonEvery > 0 && n % poisonEvery === 0 &&
    n / poisonEvery <= poison;
  const totalCents = 500 + (n * 7919) % 20_000;
  await outbox.transaction(async (tx) => {
    const [order] = await tx.query(engine.insertOrderSql, [
      `customer-${n % 97}`,
      totalCents,
      isPoison ? 1 : 0,
    ]);
    const orderId = Number(order?.["id"]);
    const payload: OrderPlaced = {
      type: "order.placed",
      orderId,
      totalCents,
      poison: isPoison,
    };
    await tx.enqueue(payload, {
      dedupKey: `order-${orderId}`,
      ...(isPoison ? { maxAttempts: 3 } : {}),
    });
  });
  // Orders arrive like request traffic, in bursts, not as one bulk import:
  // a writer committing back to back would keep the write lock from the
  // workers, since SQLite's locks queue nobody and waiters retry later.
  if (n % 10 === 0) await new Promise((resolve) => setTimeout(resolve, 20));
}
console.log(JSON.stringify({ produced: events }));
