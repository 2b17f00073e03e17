/**
 * Delivery to a recipient across real processes: a stopped worker's
 * redelivery is applied once by the inbox, and three processes delivering
 * the same identities at once to one inbox file apply each effect once.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Inbox, Outbox } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";

const child = fileURLToPath(
  new URL("./fixtures/delivery_child.ts", import.meta.url),
);
const config = fileURLToPath(new URL("../deno.json", import.meta.url));
const LEASE_MS = 1_000;

/** A child process whose stdout is read one JSON line at a time. */
class Child implements AsyncDisposable {
  readonly process: Deno.ChildProcess;
  readonly #lines: AsyncIterator<string>;
  readonly #stderr: Promise<string>;

  constructor(args: string[]) {
    this.process = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", "--config", config, child, ...args],
      stdin: "piped",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    this.#lines = lines(this.process.stdout)[Symbol.asyncIterator]();
    this.#stderr = new Response(this.process.stderr).text();
  }

  async json(): Promise<Record<string, unknown>> {
    const { value, done } = await this.#lines.next();
    if (done) {
      throw new Error(`child ended early:\n${await this.#stderr}`);
    }
    return JSON.parse(value);
  }

  /** Lets a holding worker go on. */
  async resume(): Promise<void> {
    const writer = this.process.stdin.getWriter();
    await writer.write(new TextEncoder().encode("go\n"));
    writer.releaseLock();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    try {
      this.process.kill("SIGCONT");
      this.process.kill("SIGKILL");
    } catch {
      // It ended already.
    }
    await this.process.stdin.close().catch(() => {});
    await this.process.status;
    await this.#stderr;
  }
}

async function* lines(stream: ReadableStream<Uint8Array>) {
  let buffer = "";
  for await (const chunk of stream.pipeThrough(new TextDecoderStream())) {
    buffer += chunk;
    let end;
    while ((end = buffer.indexOf("\n")) >= 0) {
      yield buffer.slice(0, end);
      buffer = buffer.slice(end + 1);
    }
  }
}

/**
 * An outbox file with one event, and a recipient on 127.0.0.1 that applies
 * deliveries through an inbox in a second database file, counting each
 * identity's effect in its `effects` table.
 */
async function withRecipient(
  fn: (setup: {
    outboxPath: string;
    url: string;
    outbox: Outbox;
    received: { identity: string; fence: number; status: number }[];
    applied: (identity: string) => Promise<number>;
  }) => Promise<void>,
): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "delivery_process_" });
  try {
    const outboxPath = join(dir, "outbox.db");
    await using outbox = await Outbox.open(await openSqliteWasm(outboxPath));
    const recipientDb = await openSqliteWasm(join(dir, "recipient.db"));
    await recipientDb.exec(
      "CREATE TABLE effects (identity TEXT PRIMARY KEY, applied INTEGER NOT NULL) STRICT",
    );
    await using inbox = await Inbox.open(recipientDb);
    const received: { identity: string; fence: number; status: number }[] = [];
    await using server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      async (request) => {
        const response = await inbox.acceptRequest(request, async (tx) => {
          await tx.run(
            "INSERT INTO effects VALUES (?, 1) ON CONFLICT (identity) DO UPDATE SET applied = applied + 1",
            [request.headers.get("idempotency-key")],
          );
        });
        received.push({
          identity: request.headers.get("idempotency-key")!,
          fence: Number(request.headers.get("idempotency-fence")),
          status: response.status,
        });
        return response;
      },
    );
    const applied = async (identity: string) => {
      const [row] = await recipientDb.query(
        "SELECT applied FROM effects WHERE identity = ?",
        [identity],
      );
      return Number(row?.["applied"] ?? 0);
    };
    await fn({
      outboxPath,
      url: `http://127.0.0.1:${server.addr.port}/`,
      outbox,
      received,
      applied,
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("a worker stopped between delivering and acknowledging: the redelivery under fence 2 is a duplicate to the inbox and the effect is applied once", async () => {
  await withRecipient(
    async ({ outboxPath, url, outbox, received, applied }) => {
      const { eventId, identity } = await outbox.enqueue({ order: 1 });
      await using a = new Child([
        "worker",
        outboxPath,
        url,
        String(LEASE_MS),
        "acknowledge",
      ]);
      assert.deepEqual(await a.json(), {
        claimed: identity,
        eventId,
        fence: 1,
      });
      assert.deepEqual(await a.json(), { delivered: 200, answer: "accepted" });
      assert.deepEqual(await a.json(), { holding: "acknowledge" });
      a.process.kill("SIGSTOP");

      // The stopped worker's lease lapses; another worker claims and delivers.
      await using b = new Child([
        "worker",
        outboxPath,
        url,
        String(LEASE_MS),
        "none",
      ]);
      assert.deepEqual(await b.json(), {
        claimed: identity,
        eventId,
        fence: 2,
      });
      assert.deepEqual(await b.json(), { delivered: 200, answer: "duplicate" });
      assert.deepEqual(await b.json(), { acknowledged: true });

      a.process.kill("SIGCONT");
      await a.resume();
      assert.deepEqual(await a.json(), { acknowledged: false });
      assert.equal((await a.process.status).code, 0);

      assert.equal(await applied(identity), 1);
      assert.deepEqual(received, [
        { identity, fence: 1, status: 200 },
        { identity, fence: 2, status: 200 },
      ]);
      // The old advice's keys differ between the two deliveries, so a
      // recipient deduping on them applied the effect twice.
      assert.equal(
        new Set(received.map(({ fence }) => `${eventId}:${fence}`)).size,
        2,
      );
      assert.equal((await outbox.explain(identity))?.state, "done");
    },
  );
});

Deno.test("a worker stopped before delivering: the newer claim's delivery is applied, the resumed worker's lower fence is refused as stale", async () => {
  await withRecipient(
    async ({ outboxPath, url, outbox, received, applied }) => {
      const { eventId, identity } = await outbox.enqueue({ order: 2 });
      await using a = new Child([
        "worker",
        outboxPath,
        url,
        String(LEASE_MS),
        "deliver",
      ]);
      assert.deepEqual(await a.json(), {
        claimed: identity,
        eventId,
        fence: 1,
      });
      assert.deepEqual(await a.json(), { holding: "deliver" });
      a.process.kill("SIGSTOP");

      await using b = new Child([
        "worker",
        outboxPath,
        url,
        String(LEASE_MS),
        "none",
      ]);
      assert.deepEqual(await b.json(), {
        claimed: identity,
        eventId,
        fence: 2,
      });
      assert.deepEqual(await b.json(), { delivered: 200, answer: "accepted" });
      assert.deepEqual(await b.json(), { acknowledged: true });

      a.process.kill("SIGCONT");
      await a.resume();
      assert.deepEqual(await a.json(), { delivered: 409, answer: "stale" });
      assert.deepEqual(await a.json(), { acknowledged: false });

      assert.equal(await applied(identity), 1);
      assert.deepEqual(received.map(({ fence, status }) => [fence, status]), [
        [2, 200],
        [1, 409],
      ]);
    },
  );
});

for (const driver of ["wasm", "node"]) {
  Deno.test(`three ${driver === "wasm" ? "WASM" : "node:sqlite"} processes deliver the same 500 identities to one inbox file at once, with random duplicates and fences: every effect is applied exactly once`, async () => {
    const dir = await Deno.makeTempDir({ prefix: "inbox_stress_" });
    try {
      const path = join(dir, "inbox.db");
      const identities = Array.from({ length: 500 }, () => crypto.randomUUID());
      {
        const driver = await openSqliteWasm(path);
        await driver.exec(
          "CREATE TABLE effects (identity TEXT PRIMARY KEY, applied INTEGER NOT NULL) STRICT",
        );
        await (await Inbox.open(driver)).close();
      }
      const drivers = [driver, driver, driver];
      let planned = 0;
      const plans = await Promise.all(drivers.map(async (_, i) => {
        const deliveries: [string, number][] = [];
        for (const identity of identities) {
          const copies = 1 + Math.floor(Math.random() * 2);
          for (let c = 0; c < copies; c++) {
            deliveries.push([identity, 1 + Math.floor(Math.random() * 4)]);
          }
        }
        // Fisher–Yates: each process meets the identities in its own order.
        for (let j = deliveries.length - 1; j > 0; j--) {
          const k = Math.floor(Math.random() * (j + 1));
          [deliveries[j], deliveries[k]] = [deliveries[k]!, deliveries[j]!];
        }
        planned += deliveries.length;
        const plan = join(dir, `plan${i}.json`);
        await Deno.writeTextFile(plan, JSON.stringify(deliveries));
        return plan;
      }));
      const children = drivers.map((driver, i) =>
        new Child(["deliverer", path, driver, plans[i]!])
      );
      // All open before any delivers: an open racing two processes'
      // deliveries was refused past its busy timeout on a loaded machine.
      for (const c of children) {
        assert.deepEqual(await c.json(), { ready: true });
      }
      await Promise.all(children.map((c) => c.resume()));
      const counts: Record<string, unknown>[] = [];
      for (const c of children) {
        counts.push(await c.json());
        assert.equal((await c.process.status).code, 0);
        await c[Symbol.asyncDispose]();
      }
      const total = (status: string) =>
        counts.reduce((sum, c) => sum + Number(c[status]), 0);
      assert.equal(total("accepted"), 500);
      assert.equal(
        total("accepted") + total("duplicate") + total("stale"),
        planned,
      );

      await using db = await openSqliteWasm(path);
      const effects = await db.query(
        "SELECT applied, count(*) AS n FROM effects GROUP BY applied",
      );
      assert.deepEqual(effects, [{ applied: 1, n: 500 }]);
      const [missing] = await db.query(
        `SELECT count(*) AS n FROM json_each(?) AS i
       WHERE NOT EXISTS (SELECT 1 FROM effects WHERE identity = i.value)
         OR NOT EXISTS (SELECT 1 FROM inbox_accepted WHERE identity = i.value)`,
        [JSON.stringify(identities)],
      );
      assert.equal(missing?.["n"], 0);
      assert.deepEqual(await db.query("PRAGMA integrity_check"), [{
        integrity_check: "ok",
      }]);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
}
