/**
 * A call on an outbox whose own `transaction(fn)` does not end: as a call
 * on another connection waits for that transaction's write lock at most
 * `busyTimeoutMs` and throws `BusyError`, a call on the same outbox must
 * not wait for ever. (Real time is the subject: `busyTimeoutMs` is.)
 */
import assert from "node:assert/strict";
import { BusyError, Outbox } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";

Deno.test("an enqueue() waiting behind the same outbox's transaction(fn) that does not end throws BusyError after busyTimeoutMs instead of waiting for ever", async () => {
  const outbox = await Outbox.open(await openSqliteWasm(":memory:"), {
    busyTimeoutMs: 100,
  });
  let release!: () => void;
  const gate = new Promise<void>((resolve) => release = resolve);
  const transaction = outbox.transaction(async (tx) => {
    await tx.enqueue({ in: "transaction" });
    await gate;
  });
  let timer: ReturnType<typeof setTimeout> | undefined;
  const outcome = await Promise.race([
    outbox.enqueue({ out: "side" }).then(
      () => "resolved",
      (error) => error instanceof BusyError ? "BusyError" : String(error),
    ),
    new Promise<string>((resolve) => {
      timer = setTimeout(() => resolve("still waiting after 5 s"), 5_000);
    }),
  ]);
  clearTimeout(timer);
  release();
  await transaction;
  await outbox.close();
  assert.equal(outcome, "BusyError");
});
