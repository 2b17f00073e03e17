/**
 * The lease core on a real database file through the Deno file VFS: the seed
 * scenario on two connections, busy claims, and case C08 with real waits.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { BusyError, Outbox, type OutboxOptions } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { ManualClock, snapshot } from "./helpers.ts";

async function withFile(
  fn: (
    open: (options?: OutboxOptions) => Promise<Outbox>,
    path: string,
  ) => Promise<void>,
): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "vfs_lease_" });
  const path = join(dir, "outbox.db");
  const opened: Outbox[] = [];
  try {
    await fn(async (options) => {
      const outbox = await Outbox.open(await openSqliteWasm(path), options);
      opened.push(outbox);
      return outbox;
    }, path);
  } finally {
    for (const outbox of opened) await outbox.close();
    await Deno.remove(dir, { recursive: true });
  }
}

/**
 * Starts `outbox.transaction()` and resolves once it holds the write lock,
 * which it keeps for `ms` milliseconds, or until `until` settles.
 */
async function hold(
  outbox: Outbox,
  ms: number,
  until?: Promise<void>,
): Promise<{ done: Promise<void> }> {
  let entered!: () => void;
  const inside = new Promise<void>((resolve) => entered = resolve);
  const done = outbox.transaction(async () => {
    entered();
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([
      new Promise((resolve) => timer = setTimeout(resolve, ms)),
      ...(until === undefined ? [] : [until]),
    ]);
    clearTimeout(timer);
  });
  await inside;
  return { done };
}

Deno.test("seed scenario on a real file with two connections: 41, null, 41, false, true, null", async () => {
  await withFile(async (open, path) => {
    const clock = new ManualClock();
    const first = await open({ now: clock.now, leaseMs: 10 });
    const second = await open({ now: clock.now, leaseMs: 10 });
    await first.transaction((tx) =>
      tx.run(
        "INSERT INTO outbox_events (id, identity, queue, state, payload, due_at, max_attempts, created_at, updated_at) VALUES (41, '00000000-0000-7000-8000-000000000041', 'default', 'pending', 'null', 0, 5, 0, 0)",
      )
    );
    const claim = async (outbox: Outbox, now: number, token: string) => {
      clock.set(now);
      return (await outbox.claim({ token }))?.eventId ?? null;
    };
    const acknowledge = (
      outbox: Outbox,
      eventId: number,
      token: string,
      fence: number,
    ) => outbox.acknowledge({ eventId, token, fence } as never);
    const results = [
      await claim(first, 100, "claimA"),
      await claim(second, 109, "claimB"),
      await claim(second, 110, "claimB"),
      await acknowledge(first, 41, "claimA", 1),
      await acknowledge(second, 41, "claimB", 2),
      await claim(first, 120, "claimC"),
    ];
    assert.deepEqual(results, [41, null, 41, false, true, null]);
    assert.ok((await Deno.stat(path)).size > 0, "the database is a real file");
  });
});

Deno.test("a claim with busyTimeoutMs 0 while the other connection is inside its transaction throws BusyError and changes nothing", async () => {
  await withFile(async (open, path) => {
    const first = await open();
    const second = await open({ busyTimeoutMs: 0 });
    await first.enqueue("x");
    await using raw = await openSqliteWasm(path);
    const before = await snapshot(raw);
    const { done } = await hold(first, 100);
    await assert.rejects(second.claim(), BusyError);
    await done;
    assert.deepEqual(await snapshot(raw), before);
    assert.equal((await second.claim())?.fence, 1);
  });
});

Deno.test("C08: claim, renew and release wait for a 300 ms writer, then a writer that holds on makes claim throw BusyError at its 2000 ms timeout, while the writer still holds", async () => {
  await withFile(async (open, path) => {
    const x = await open();
    const y = await open({ busyTimeoutMs: 2_000 });
    await x.enqueue("e1");
    const timed = async <T>(fn: () => Promise<T>): Promise<[T, number]> => {
      const started = performance.now();
      const result = await fn();
      return [result, performance.now() - started];
    };

    let writer = await hold(x, 300);
    const [lease, claimMs] = await timed(() => y.claim());
    await writer.done;
    assert.equal(lease?.attempt, 1);
    assert.ok(claimMs >= 290, `claim returned after ${claimMs} ms`);

    writer = await hold(x, 300);
    const [deadline, renewMs] = await timed(() => y.renew(lease!, 60_000));
    await writer.done;
    assert.equal(typeof deadline, "number");
    assert.ok(renewMs >= 290, `renew returned after ${renewMs} ms`);

    writer = await hold(x, 300);
    const [released, releaseMs] = await timed(() => y.release(lease!));
    await writer.done;
    assert.equal(released, true);
    assert.ok(releaseMs >= 290, `release returned after ${releaseMs} ms`);

    await using raw = await openSqliteWasm(path);
    const before = await snapshot(raw);
    // The writer holds on until the claim has given up (or 60 s at most):
    // the BusyError must come from the claim's own timeout, not the writer's
    // end. How late past 2000 ms the rejection comes is the scheduler's, so
    // its bound is far from anything a busy machine adds.
    const claimGaveUp = Promise.withResolvers<void>();
    writer = await hold(x, 60_000, claimGaveUp.promise);
    let writerEnded = false;
    void writer.done.then(() => writerEnded = true);
    const started = performance.now();
    await assert.rejects(y.claim(), BusyError);
    const busyMs = performance.now() - started;
    assert.equal(writerEnded, false, "the claim gave up before the writer");
    claimGaveUp.resolve();
    await writer.done;
    assert.ok(
      busyMs >= 1_990 && busyMs < 30_000,
      `BusyError after ${busyMs} ms`,
    );
    assert.deepEqual(
      await snapshot(raw),
      before,
      "the busy claim changed nothing",
    );
    assert.equal((await y.claim())?.attempt, 2);
  });
});
