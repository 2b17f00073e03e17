/**
 * pg-boss as the PostgreSQL rows start it (`bench/postgres_bench.ts`,
 * `bench/loop_bench.ts`): no scheduler, no supervisor (neither writes
 * while a block is timed), its errors kept off the console.
 *
 * @module
 */
import { PgBoss } from "npm:pg-boss@12.38.0";

/**
 * Starts pg-boss on the server at `url`.
 *
 * @param url The server.
 * @param max Its pool's size; pg-boss's default (10) when left out.
 * @returns The started instance; `stop({ graceful: false, close: true })` ends it.
 */
export async function startBoss(url: string, max?: number): Promise<PgBoss> {
  const boss = new PgBoss({
    connectionString: url,
    ...max === undefined ? {} : { max },
    schedule: false,
    supervise: false,
  });
  boss.on("error", () => {});
  await boss.start();
  return boss;
}
