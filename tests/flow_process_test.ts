/**
 * Two processes honour pause, the per-key limit, the rate limit and the
 * once-per-tick schedule, on a real file and on the real PostgreSQL server
 * (issue 40). Real time passes here (the children use their own clocks);
 * nothing is bounded by it: each check waits for a count of the children's
 * rounds and asserts an invariant.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { Outbox } from "../mod.ts";
import type { Driver } from "../driver.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { connectPostgres } from "../drivers/postgres.ts";
import { sharedPostgres } from "../scripts/postgres_server.ts";

interface Child {
  readonly leases: number[];
  attempts: number;
  scheduled: number;
  readonly child: Deno.ChildProcess;
  /** Resolves once `check` holds for the child's output so far. */
  until(check: () => boolean): Promise<void>;
}

function spawn(args: string[]): Child {
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      new URL("./fixtures/flow_child.ts", import.meta.url).pathname,
      ...args,
    ],
    stdin: "null",
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const waiters: { check: () => boolean; resolve: () => void }[] = [];
  const self: Child = {
    leases: [],
    attempts: 0,
    scheduled: 0,
    child,
    until(check) {
      if (check()) return Promise.resolve();
      const { promise, resolve } = Promise.withResolvers<void>();
      waiters.push({ check, resolve });
      return promise;
    },
  };
  (async () => {
    let text = "";
    for await (
      const chunk of child.stdout.pipeThrough(new TextDecoderStream())
    ) {
      text += chunk;
      const lines = text.split("\n");
      text = lines.pop()!;
      for (const line of lines) {
        if (line.startsWith("L ")) self.leases.push(Number(line.slice(2)));
        else if (line === "A") self.attempts++;
        else if (line.startsWith("S ")) self.scheduled += Number(line.slice(2));
      }
      for (const waiter of [...waiters]) {
        if (waiter.check()) {
          waiters.splice(waiters.indexOf(waiter), 1);
          waiter.resolve();
        }
      }
    }
  })();
  return self;
}

async function stop(children: readonly Child[]): Promise<void> {
  for (const c of children) {
    try {
      c.child.kill("SIGKILL");
    } catch { /* exited */ }
    await c.child.status;
  }
}

interface Engine {
  readonly name: string;
  open(): Promise<
    { driver: () => Promise<Driver>; args: string[]; close(): Promise<void> }
  >;
}

const ENGINES: Engine[] = [
  {
    name: "wasm file",
    async open() {
      const dir = await Deno.makeTempDir({ prefix: "flow_process_" });
      const path = join(dir, "outbox.db");
      return {
        driver: () => openSqliteWasm(path),
        args: ["sqlite", path, "-"],
        close: () => Deno.remove(dir, { recursive: true }),
      };
    },
  },
  {
    name: "postgres",
    async open() {
      const server = await sharedPostgres();
      const schema = await server.createSchema();
      return {
        driver: () => connectPostgres(server.url, { schema }),
        args: ["postgres", server.url, schema],
        close: () => Promise.resolve(),
      };
    },
  },
];

for (const engine of ENGINES) {
  Deno.test(`${engine.name}: two processes claim nothing from a paused queue, then every event once after resume`, async () => {
    const db = await engine.open();
    await using outbox = await Outbox.open(await db.driver());
    for (let n = 0; n < 20; n++) await outbox.enqueue({ n });
    await outbox.pause("default");
    const children = [
      spawn([...db.args, "claim"]),
      spawn([...db.args, "claim"]),
    ];
    try {
      await Promise.all(children.map((c) => c.until(() => c.attempts >= 20)));
      assert.deepEqual(children.flatMap((c) => c.leases), []);
      await outbox.resume("default");
      const total = () => children.reduce((s, c) => s + c.leases.length, 0);
      await Promise.all(children.map((c) => c.until(() => total() >= 20)));
      const ids = children.flatMap((c) => c.leases);
      assert.equal(new Set(ids).size, 20);
      assert.equal(ids.length, 20);
    } finally {
      await stop(children);
      await db.close();
    }
  });

  Deno.test(`${engine.name}: two processes never hold more than perKey leases of one key, and unkeyed events are not held back`, async () => {
    const db = await engine.open();
    await using outbox = await Outbox.open(await db.driver());
    await outbox.setLimits("default", { perKey: 3 });
    for (let n = 0; n < 30; n++) {
      await outbox.enqueue({ n }, { concurrencyKey: "k" });
    }
    for (let n = 0; n < 5; n++) await outbox.enqueue({ n });
    const children = [
      spawn([...db.args, "claim"]),
      spawn([...db.args, "claim"]),
    ];
    try {
      const total = () => children.reduce((s, c) => s + c.leases.length, 0);
      await Promise.all(children.map((c) => c.until(() => total() >= 8)));
      const after = children.map((c) => c.attempts);
      await Promise.all(
        children.map((c, i) => c.until(() => c.attempts >= after[i]! + 20)),
      );
      assert.equal(total(), 8);
      const counts = await outbox.queues();
      assert.equal(counts[0]?.leased, 8);
    } finally {
      await stop(children);
      await db.close();
    }
  });

  Deno.test(`${engine.name}: two processes together claim at most perSecond a second, as a token bucket allows`, async () => {
    const db = await engine.open();
    const driver = await db.driver();
    await using outbox = await Outbox.open(driver);
    const rate = 20;
    await outbox.setLimits("default", { perSecond: rate });
    await outbox.enqueueBatch(
      Array.from({ length: 200 }, (_, n) => ({ payload: { n } })),
    );
    const children = [
      spawn([...db.args, "drain"]),
      spawn([...db.args, "drain"]),
    ];
    try {
      const total = () => children.reduce((s, c) => s + c.leases.length, 0);
      await Promise.all(children.map((c) => c.until(() => total() >= 60)));
    } finally {
      await stop(children);
    }
    try {
      // PostgreSQL keeps acknowledged events in outbox_done (outbox_all
      // reads both).
      const events = engine.name === "postgres"
        ? "outbox_all"
        : "outbox_events";
      const times = (await driver.query(
        `SELECT claimed_at FROM ${events} WHERE claimed_at IS NOT NULL ORDER BY claimed_at`,
      )).map((row) => Number(row["claimed_at"]));
      assert.ok(times.length >= 60);
      // A bucket of `rate` tokens refilled at `rate` a second: any run of
      // claims from t_i to t_j holds at most rate + rate * (t_j - t_i) / 1000.
      for (let i = 0; i < times.length; i++) {
        for (let j = i; j < times.length; j++) {
          const allowed = rate + rate * (times[j]! - times[i]!) / 1000;
          assert.ok(
            j - i + 1 <= allowed + 1e-9,
            `${j - i + 1} claims in ${times[j]! - times[i]!} ms`,
          );
        }
      }
    } finally {
      await db.close();
    }
  });

  Deno.test(`${engine.name}: two processes running a schedule enqueue exactly one event per tick`, async () => {
    const db = await engine.open();
    const driver = await db.driver();
    await using outbox = await Outbox.open(driver);
    await outbox.schedule("second", "* * * * * *", "tick", { missed: "all" });
    const children = [
      spawn([...db.args, "schedule"]),
      spawn([...db.args, "schedule"]),
    ];
    try {
      const total = () => children.reduce((s, c) => s + c.scheduled, 0);
      await Promise.all(children.map((c) => c.until(() => total() >= 4)));
    } finally {
      await stop(children);
    }
    try {
      const ticks = (await driver.query(
        "SELECT dedup_key FROM outbox_events ORDER BY id",
      )).map((row) => Number(String(row["dedup_key"]).split(":")[2]));
      assert.equal(ticks.length, children.reduce((s, c) => s + c.scheduled, 0));
      // Every second from the first tick to the last, once each.
      assert.deepEqual(
        ticks,
        ticks.map((_, i) => ticks[0]! + i * 1_000),
      );
    } finally {
      await db.close();
    }
  });
}
