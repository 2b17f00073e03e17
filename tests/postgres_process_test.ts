/**
 * Many machines, simulated: four worker processes, their clocks skewed by
 * minutes, drain 5,000 events from one PostgreSQL server while one is
 * SIGKILLed and another SIGSTOPped past its leases. The ledger then shows
 * every event done exactly once or dead, fences only increasing, leases
 * taken over, and no stale acknowledgement accepted.
 */
import assert from "node:assert/strict";
import { connectPostgres } from "../drivers/postgres.ts";
import { openPostgres } from "../drivers/postgres.ts";
import { sharedPostgres } from "../scripts/postgres_server.ts";

const EVENTS = 5_000;
const POISON = 20;
const LEASE_MS = 2_000;
// Minutes apart: leases are judged by the server's clock, not theirs.
const SKEWS_MS = [0, -180_000, 120_000, 300_000];

interface WorkerProcess {
  readonly child: Deno.ChildProcess;
  readonly ready: Promise<void>;
  /** Resolves when the worker next starts a handler, so holds a lease. */
  nextHandler(): Promise<void>;
}

function spawnWorker(url: string, schema: string, skewMs: number) {
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      new URL("./fixtures/postgres_worker.ts", import.meta.url).pathname,
      url,
      schema,
      String(skewMs),
    ],
    stdin: "null",
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const ready = Promise.withResolvers<void>();
  let handler = Promise.withResolvers<void>();
  // Read to the end, so the child never blocks on a full pipe.
  (async () => {
    let text = "";
    for await (
      const chunk of child.stdout.pipeThrough(new TextDecoderStream())
    ) {
      text += chunk;
      if (text.startsWith("ready\n")) ready.resolve();
      const lines = text.split("\n");
      text = lines.pop()!;
      if (lines.some((line) => line.startsWith("H "))) {
        handler.resolve();
        handler = Promise.withResolvers<void>();
      }
    }
    ready.reject(new Error("worker exited before it was ready"));
  })();
  return {
    child,
    ready: ready.promise,
    nextHandler: () => handler.promise,
  } satisfies WorkerProcess;
}

Deno.test("postgres: 4 worker processes with skewed clocks drain 5,000 events through a SIGKILL and a SIGSTOP past their leases: each done once or dead, fences increasing, no stale acknowledgement accepted", async () => {
  const server = await sharedPostgres();
  const schema = await server.createSchema();
  const outbox = await openPostgres<{ n: number; poison?: boolean }>(
    server.url,
    { schema },
  );
  const workers: WorkerProcess[] = [];
  try {
    for (let start = 0; start < EVENTS; start += 500) {
      await outbox.transaction(async (tx) => {
        for (let n = start; n < start + 500; n++) {
          await tx.enqueue(
            n % (EVENTS / POISON) === 7 ? { n, poison: true } : {
              n,
            },
          );
        }
      });
    }
    for (const skewMs of SKEWS_MS) {
      workers.push(spawnWorker(server.url, schema, skewMs));
    }
    await Promise.all(workers.map((worker) => worker.ready));
    const [killed, stopped] = workers as [WorkerProcess, WorkerProcess];

    const finished = async () => {
      const stats = await outbox.stats();
      return stats.done + stats.dead;
    };
    const waitFor = async (count: number) => {
      const deadline = Date.now() + 120_000;
      while (await finished() < count) {
        if (Date.now() > deadline) {
          throw new Error(`only ${await finished()} of ${count} finished`);
        }
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    };
    // Each is stopped as it starts a handler (which takes 100 ms), so it
    // holds a lease then: on a busy machine a worker slow to start could
    // otherwise be killed holding none, and no lease would lapse.
    await waitFor(EVENTS * 0.2);
    await killed.nextHandler();
    killed.child.kill("SIGKILL");
    await waitFor(EVENTS * 0.4);
    await stopped.nextHandler();
    stopped.child.kill("SIGSTOP");
    await new Promise((resolve) => setTimeout(resolve, LEASE_MS * 2));
    stopped.child.kill("SIGCONT");
    await waitFor(EVENTS);

    const db = await connectPostgres(server.url, { schema });
    try {
      const [states] = await db.query(
        `SELECT count(*) FILTER (WHERE state = 'done') AS done,
           count(*) FILTER (WHERE state = 'dead') AS dead,
           count(*) AS total FROM outbox_all`,
      );
      assert.deepEqual(states, {
        done: EVENTS - POISON,
        dead: POISON,
        total: EVENTS,
      });
      const [poison] = await db.query(
        `SELECT count(*) AS n FROM outbox_all
         WHERE state = 'dead' AND payload::jsonb ? 'poison'`,
      );
      assert.equal(poison?.["n"], POISON);
      // Exactly one accepted acknowledgement per done event, none for a
      // dead one, and always the event's last claim: an older fence's
      // acknowledgement, had it been accepted, would have ended the event
      // before a newer claim could exist.
      const [acks] = await db.query(
        `SELECT count(*) AS n, count(DISTINCT l.event_id) AS events,
           count(*) FILTER (WHERE l.fence <> e.fence) AS not_last,
           count(*) FILTER (WHERE e.state <> 'done') AS on_dead
         FROM outbox_ledger AS l JOIN outbox_all AS e ON e.id = l.event_id
         WHERE l.kind = 'acknowledged'`,
      );
      assert.deepEqual(acks, {
        n: EVENTS - POISON,
        events: EVENTS - POISON,
        not_last: 0,
        on_dead: 0,
      });
      // Each event's claims carry fences 1, 2, 3, … in ledger order.
      const [fences] = await db.query(
        `SELECT count(*) AS bad FROM (
           SELECT fence, row_number() OVER (PARTITION BY event_id ORDER BY seq) AS nth
           FROM outbox_ledger WHERE kind = 'claimed') AS c
         WHERE fence <> nth`,
      );
      assert.equal(fences?.["bad"], 0);
      // The killed and the stopped worker's leases were taken over. The
      // stopped one's loop, resumed, finds its renewals overdue by its own
      // monotonic clock and drops those leases without a call; a late call
      // that does reach the server is refused, which the counts above show.
      const [taken] = await db.query(
        `SELECT count(DISTINCT event_id) AS expired FROM outbox_ledger
         WHERE kind = 'expired'`,
      );
      assert.ok(Number(taken?.["expired"]) > 0, "leases were taken over");
    } finally {
      await db.close();
    }
  } finally {
    for (const worker of workers) {
      try {
        worker.child.kill("SIGCONT");
        worker.child.kill("SIGTERM");
      } catch {
        // Already gone (the SIGKILLed one).
      }
      await worker.child.status;
    }
    await outbox.close();
  }
});
