/** The inbox on every driver, SQLite and PostgreSQL: accept once, refuse duplicates and stale fences, purge by age. */
import assert from "node:assert/strict";
import {
  BusyError,
  deliveryHeaders,
  type Driver,
  FENCE_HEADER,
  IDENTITY_HEADER,
  Inbox,
  type InboxOptions,
  isRetryStatus,
  Outbox,
  readDeliveryHeaders,
  uuidv7,
} from "../mod.ts";
import { DRIVERS } from "./drivers.ts";
import { ManualClock } from "./helpers.ts";

interface InboxHarness {
  readonly clock: ManualClock;
  /** Opens an inbox on each connection, on the manual clock. */
  open(options?: InboxOptions): Promise<Inbox[]>;
  /** The first connection, for reading rows as stored. */
  readonly raw: Driver;
  /** Every connection, in the order `open` opens inboxes on them. */
  readonly drivers: readonly Driver[];
}

/** The effects table and its insert, in each engine's SQL. */
const EFFECTS = {
  sqlite: {
    create:
      "CREATE TABLE IF NOT EXISTS effects (seq INTEGER PRIMARY KEY, identity TEXT NOT NULL, fence INTEGER NOT NULL) STRICT",
    insert: "INSERT INTO effects (identity, fence) VALUES (?, ?)",
  },
  postgres: {
    create:
      "CREATE TABLE IF NOT EXISTS effects (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, identity text NOT NULL, fence bigint NOT NULL)",
    insert: "INSERT INTO effects (identity, fence) VALUES ($1, $2)",
  },
} as const;

/** Gives calls started before it every chance to run, a few timer turns. */
async function turns(): Promise<void> {
  for (let i = 0; i < 20; i++) {
    await new Promise((resolve) => setTimeout(resolve, 1));
  }
}

for (const driver of DRIVERS) {
  const sql = EFFECTS[driver.engine];
  const test = (name: string, fn: (t: InboxHarness) => Promise<void>) =>
    Deno.test(`${driver.name}: ${name}`, async () => {
      const connections = await driver.open();
      const clock = new ManualClock();
      await connections.drivers[0]!.exec(sql.create);
      try {
        await fn({
          clock,
          raw: connections.drivers[0]!,
          drivers: connections.drivers,
          open: async (options = {}) => {
            const inboxes = [];
            for (const d of connections.drivers) {
              inboxes.push(await Inbox.open(d, { now: clock.now, ...options }));
            }
            return inboxes;
          },
        });
      } finally {
        await connections.close();
      }
    });

  const effect =
    (identity: string, fence: number) =>
    async (tx: { run(sql: string, params: string[] | number[]): unknown }) => {
      await tx.run(sql.insert, [identity, fence] as never);
      return fence;
    };
  const effects = async (raw: Driver) =>
    (await raw.query("SELECT identity, fence FROM effects ORDER BY seq")).map(
      (row) => `${row["identity"]}@${row["fence"]}`,
    );

  test("accept() called inside an effect throws at once, the outer acceptance rolls back, and the inbox goes on accepting", async ({ open, raw }) => {
    const [a] = await open();
    const outer = uuidv7();
    const inner = uuidv7();
    await assert.rejects(
      a!.accept(outer, 1, async (tx) => {
        await effect(outer, 1)(tx);
        return await a!.accept(inner, 1, effect(inner, 1));
      }),
      {
        name: "Error",
        message:
          "Cannot accept inside an acceptance's fn on the same connection: use its handle (tx.run, tx.query), or the call would wait for the transaction that waits for it",
      },
    );
    assert.deepEqual(await effects(raw), []);
    assert.deepEqual(await a!.accept(outer, 1, effect(outer, 1)), {
      status: "accepted",
      value: 1,
    });
    assert.deepEqual(await effects(raw), [`${outer}@1`]);
  });

  test("an effect's tx.run() and tx.query() refuse transaction-control statements before running them, so the acceptance stays one transaction", async ({ open, raw }) => {
    const [a] = await open();
    const identity = uuidv7();
    const result = await a!.accept(identity, 1, async (tx) => {
      await effect(identity, 1)(tx);
      for (
        const [sql, keyword] of [
          ["COMMIT", "COMMIT"],
          ["end transaction", "END"],
          ["-- undo\nrollback", "ROLLBACK"],
          ["begin immediate", "BEGIN"],
          ["SAVEPOINT s", "SAVEPOINT"],
          ["release s", "RELEASE"],
        ]
      ) {
        for (const method of ["run", "query"] as const) {
          await assert.rejects(() => tx[method](sql!), {
            name: "RangeError",
            message: new RegExp(
              `^Cannot ${method} as 'sql' must not control the transaction: found ${keyword};`,
            ),
          });
        }
      }
      return (await tx.query("SELECT count(*) AS n FROM effects"))[0]?.["n"];
    });
    assert.deepEqual(result, { status: "accepted", value: 1 });
    assert.deepEqual(await effects(raw), [`${identity}@1`]);
  });

  test("accept() runs the effect once: a redelivery at the same or a higher fence is a duplicate, at a lower one stale", async ({ open, raw }) => {
    const [a, b] = await open();
    const identity = uuidv7();
    assert.deepEqual(await a!.accept(identity, 2, effect(identity, 2)), {
      status: "accepted",
      value: 2,
    });
    assert.deepEqual(await b!.accept(identity, 2, effect(identity, 2)), {
      status: "duplicate",
      acceptedFence: 2,
    });
    assert.deepEqual(await b!.accept(identity, 3, effect(identity, 3)), {
      status: "duplicate",
      acceptedFence: 2,
    });
    assert.deepEqual(await a!.accept(identity, 1, effect(identity, 1)), {
      status: "stale",
      acceptedFence: 2,
    });
    assert.deepEqual(await effects(raw), [`${identity}@2`]);
  });

  test("accept() records the identity with the effect's writes: an effect that throws leaves neither, and the next delivery runs it", async ({ open, raw }) => {
    const [a] = await open();
    const identity = uuidv7();
    await assert.rejects(
      () =>
        a!.accept(identity, 1, async (tx) => {
          await effect(identity, 1)(tx);
          throw new Error("recipient down");
        }),
      /recipient down/,
    );
    assert.deepEqual(await effects(raw), []);
    assert.deepEqual(
      await raw.query("SELECT count(*) AS n FROM inbox_accepted"),
      [{ n: 0 }],
    );
    assert.equal(
      (await a!.accept(identity, 2, effect(identity, 2))).status,
      "accepted",
    );
    assert.deepEqual(await effects(raw), [`${identity}@2`]);
  });

  test("accept() records the identity before it runs the effect: a second connection's accept waits for the first to commit, then is a duplicate", async ({ open, raw }) => {
    const [a, b] = await open();
    const identity = uuidv7();
    const entered = Promise.withResolvers<void>();
    const finish = Promise.withResolvers<void>();
    const first = a!.accept(identity, 1, async (tx) => {
      entered.resolve();
      await finish.promise;
      return await effect(identity, 1)(tx);
    });
    await entered.promise;
    let secondRan = false;
    const second = b!.accept(identity, 1, async (tx) => {
      secondRan = true;
      return await effect(identity, 1)(tx);
    });
    finish.resolve();
    assert.equal((await first).status, "accepted");
    assert.deepEqual(await second, { status: "duplicate", acceptedFence: 1 });
    assert.equal(secondRan, false);
    assert.deepEqual(await effects(raw), [`${identity}@1`]);
  });

  test("two connections delivering one identity at once: the second waits while the first's effect runs, and the effect commits once", async ({ open, raw }) => {
    const [a, b] = await open();
    for (const firstFails of [false, true]) {
      const identity = uuidv7();
      const entered = Promise.withResolvers<void>();
      const finish = Promise.withResolvers<void>();
      const first = a!.accept(identity, 1, async (tx) => {
        await effect(identity, 1)(tx);
        entered.resolve();
        await finish.promise;
        if (firstFails) throw new Error("recipient down");
        return 1;
      });
      await entered.promise;
      let settled = false;
      const second = b!.accept(identity, 2, effect(identity, 2)).finally(() => {
        settled = true;
      });
      await turns();
      // Waiting on the first's lock (SQLite's write lock, PostgreSQL's
      // index entry), not past it.
      assert.equal(settled, false);
      finish.resolve();
      if (firstFails) {
        await assert.rejects(first, /recipient down/);
        assert.deepEqual(await second, { status: "accepted", value: 2 });
        assert.deepEqual(
          (await effects(raw)).filter((e) => e.startsWith(identity)),
          [`${identity}@2`],
        );
      } else {
        assert.deepEqual(await first, { status: "accepted", value: 1 });
        assert.deepEqual(await second, {
          status: "duplicate",
          acceptedFence: 1,
        });
        assert.deepEqual(
          (await effects(raw)).filter((e) => e.startsWith(identity)),
          [`${identity}@1`],
        );
      }
    }
  });

  test("a delivery that waits for another acceptance of its identity past the wait limit throws BusyError and records nothing; the first's effect commits once", async ({ open, raw, drivers }) => {
    if (driver.engine === "postgres") {
      // PostgreSQL's lock waits end at the connection's lock_timeout
      // (connectPostgres's lockTimeoutMs).
      await drivers[1]!.exec("SET lock_timeout = 50");
    }
    const [a, b] = await open({ busyTimeoutMs: 50 });
    const identity = uuidv7();
    const entered = Promise.withResolvers<void>();
    const finish = Promise.withResolvers<void>();
    const first = a!.accept(identity, 1, async (tx) => {
      await effect(identity, 1)(tx);
      entered.resolve();
      await finish.promise;
      return 1;
    });
    await entered.promise;
    let secondRan = false;
    await assert.rejects(
      b!.accept(identity, 2, async (tx) => {
        secondRan = true;
        return await effect(identity, 2)(tx);
      }),
      BusyError,
    );
    finish.resolve();
    assert.deepEqual(await first, { status: "accepted", value: 1 });
    assert.equal(secondRan, false);
    assert.deepEqual(await effects(raw), [`${identity}@1`]);
    assert.deepEqual(await b!.accept(identity, 2, effect(identity, 2)), {
      status: "duplicate",
      acceptedFence: 1,
    });
  });

  test("many deliveries of each identity at once on two connections apply each effect exactly once", async ({ open, raw }) => {
    const [a, b] = await open({ busyTimeoutMs: 30_000 });
    const identities = Array.from({ length: 8 }, () => uuidv7());
    const results = await Promise.all(
      identities.flatMap((identity) =>
        [a, b, a, b].map((inbox, i) =>
          inbox!.accept(identity, i + 1, effect(identity, i + 1))
        )
      ),
    );
    assert.equal(
      results.filter((r) => r.status === "accepted").length,
      identities.length,
    );
    const applied = (await effects(raw)).map((e) => e.split("@")[0]);
    assert.deepEqual(applied.toSorted(), identities.toSorted());
  });

  test("acceptRequest() answers an accepted delivery with the effect's response, a duplicate with 200, a stale fence with 409 and a bad header with 400", async ({ open, raw }) => {
    const [inbox] = await open();
    let applied = 0;
    const handler = (request: Request) =>
      inbox!.acceptRequest(request, async (tx, request) => {
        const { identity, fence } = readDeliveryHeaders(request.headers);
        await effect(identity, fence)(tx);
        applied++;
        return new Response(await request.text(), { status: 201 });
      });
    const identity = uuidv7();
    const deliver = async (headers: Record<string, string>) => {
      const response = await handler(
        new Request("http://recipient/", {
          method: "POST",
          headers,
          body: "sent",
        }),
      );
      return [response.status, await response.text()];
    };
    assert.deepEqual(await deliver(deliveryHeaders({ identity, fence: 2 })), [
      201,
      "sent",
    ]);
    assert.deepEqual(await deliver(deliveryHeaders({ identity, fence: 2 })), [
      200,
      "duplicate",
    ]);
    assert.deepEqual(await deliver(deliveryHeaders({ identity, fence: 1 })), [
      409,
      "stale",
    ]);
    const [status, text] = await deliver({ "Idempotency-Key": `1:2` });
    assert.equal(status, 400);
    assert.match(String(text), /'Idempotency-Key' must be a UUID/);
    assert.equal(applied, 1);
    assert.deepEqual(await effects(raw), [`${identity}@2`]);
  });

  test("accept() refuses a malformed identity, fence or effect before any SQL", async ({ open, raw }) => {
    const [a] = await open();
    const identity = uuidv7();
    const cases: [unknown, unknown, unknown, RegExp][] = [
      [
        "not-a-uuid",
        1,
        effect(identity, 1),
        /^Cannot accept as 'identity' must be a UUID in canonical lowercase text \(8-4-4-4-12 hex digits\): current value is "not-a-uuid"$/,
      ],
      [
        identity.toUpperCase(),
        1,
        effect(identity, 1),
        /'identity' must be a UUID/,
      ],
      [
        identity,
        0,
        effect(identity, 1),
        /^Cannot accept as 'fence' must be a positive integer at most 9007199254740991: current value is 0$/,
      ],
      [
        identity,
        1.5,
        effect(identity, 1),
        /'fence' must be a positive integer/,
      ],
      [
        identity,
        "1",
        effect(identity, 1),
        /^Cannot accept as 'fence' must be a positive integer: current value is "1"$/,
      ],
      [
        identity,
        undefined,
        effect(identity, 1),
        /^Cannot accept as 'fence' is required: current value is undefined$/,
      ],
      [
        identity,
        1,
        "effect",
        /^Cannot accept as 'fn' must be a function: current value is "effect"$/,
      ],
    ];
    for (const [id, fence, fn, message] of cases) {
      await assert.rejects(
        () => a!.accept(id as string, fence as number, fn as never),
        (error: Error) =>
          (error instanceof TypeError || error instanceof RangeError) &&
          message.test(error.message),
      );
    }
    assert.deepEqual(
      await raw.query("SELECT count(*) AS n FROM inbox_accepted"),
      [{ n: 0 }],
    );
  });

  test("purge() deletes records accepted more than olderThanMs ago by the inbox's clock, and a purged identity is accepted again", async ({ clock, open, raw }) => {
    const [a] = await open();
    const old = uuidv7();
    const recent = uuidv7();
    clock.set(1_000);
    await a!.accept(old, 1, effect(old, 1));
    clock.set(5_000);
    await a!.accept(recent, 1, effect(recent, 1));
    clock.set(6_000);
    assert.equal(await a!.purge({ olderThanMs: 1_000 }), 1);
    assert.equal(await a!.purge({ olderThanMs: 1_000 }), 0);
    assert.equal(
      (await a!.accept(recent, 1, effect(recent, 1))).status,
      "duplicate",
    );
    assert.equal((await a!.accept(old, 2, effect(old, 2))).status, "accepted");
    assert.deepEqual(await effects(raw), [
      `${old}@1`,
      `${recent}@1`,
      `${old}@2`,
    ]);
    await assert.rejects(
      () => a!.purge({ olderThanMs: -1 }),
      /^RangeError: Cannot purge inbox as 'olderThanMs' must be a non-negative integer at most 9007199254740991: current value is -1$/,
    );
    await assert.rejects(
      () => a!.purge({} as never),
      /^TypeError: Cannot purge inbox as 'olderThanMs' is required: current value is undefined$/,
    );
  });

  test("an inbox and an outbox share one connection, and each open leaves the other's tables alone", async ({ open, raw }) => {
    const outbox = await Outbox.open(raw);
    const [inbox] = await open();
    const { identity } = await outbox.enqueue("x");
    const lease = (await outbox.claim())!;
    assert.equal(
      (await inbox!.accept(lease.identity, lease.fence, effect(identity, 1)))
        .status,
      "accepted",
    );
    assert.equal(await outbox.acknowledge(lease), true);
    await Inbox.open(raw);
    await Outbox.open(raw);
    assert.deepEqual(await effects(raw), [`${identity}@1`]);
  });
}

Deno.test("deliveryHeaders() puts a lease's identity in Idempotency-Key and its fence in Idempotency-Fence, which readDeliveryHeaders() reads back", () => {
  const lease = { identity: uuidv7(), fence: 7 };
  const headers = deliveryHeaders(lease);
  assert.deepEqual(headers, {
    "Idempotency-Key": lease.identity,
    "Idempotency-Fence": "7",
  });
  assert.deepEqual([IDENTITY_HEADER, FENCE_HEADER], [
    "Idempotency-Key",
    "Idempotency-Fence",
  ]);
  assert.deepEqual(readDeliveryHeaders(new Headers(headers)), lease);
});

Deno.test("deliveryHeaders() refuses a lease without a valid identity or fence, naming the field", () => {
  assert.throws(
    () => deliveryHeaders({ identity: "1:2", fence: 2 }),
    new TypeError(
      `Cannot build delivery headers as 'lease.identity' must be a UUID in canonical lowercase text (8-4-4-4-12 hex digits): current value is "1:2"`,
    ),
  );
  assert.throws(
    () => deliveryHeaders({ identity: uuidv7(), fence: 0 }),
    /^RangeError: Cannot build delivery headers as 'lease.fence' must be a positive integer/,
  );
  assert.throws(
    () => deliveryHeaders(null as never),
    /'lease' must be a Lease/,
  );
});

Deno.test("readDeliveryHeaders() refuses a missing or malformed header, naming it", () => {
  const identity = uuidv7();
  const read = (init: Record<string, string>) => () =>
    readDeliveryHeaders(new Headers(init));
  assert.throws(
    read({ "idempotency-fence": "1" }),
    new TypeError(
      "Cannot read delivery as 'Idempotency-Key' must be a UUID in canonical lowercase text (8-4-4-4-12 hex digits): current value is undefined",
    ),
  );
  for (
    const fence of [
      "0",
      "-1",
      "1.0",
      "0x10",
      "1e3",

      "",
      "9007199254740992",
    ]
  ) {
    assert.throws(
      read({ "idempotency-key": identity, "idempotency-fence": fence }),
      new TypeError(
        `Cannot read delivery as 'Idempotency-Fence' must be a positive decimal integer: current value is ${
          JSON.stringify(fence)
        }`,
      ),
      fence,
    );
  }
  assert.throws(
    read({ "idempotency-key": identity }),
    /'Idempotency-Fence' must be a positive decimal integer: current value is undefined$/,
  );
});

Deno.test("Inbox.open() refuses a driver whose dialect has no inbox statements, naming the driver, before any SQL", async () => {
  const { openSqliteWasm } = await import("../deno/sqlite_wasm.ts");
  const { SQLITE } = await import("../dialects/sqlite.ts");
  await using db = await openSqliteWasm(":memory:");
  const { inbox: _, ...dialect } = SQLITE;
  const sent: string[] = [];
  const driver: Driver = {
    query: (sql, params) => (sent.push(sql), db.query(sql, params)),
    run: (sql, params) => (sent.push(sql), db.run(sql, params)),
    exec: (sql) => (sent.push(sql), db.exec(sql)),
    close: () => Promise.resolve(),
    dialect,
  };
  await assert.rejects(
    Inbox.open(driver),
    new TypeError(
      "Cannot open inbox as 'driver' must speak a dialect with the inbox's statements (SQLite's or PostgreSQL's)",
    ),
  );
  assert.deepEqual(sent, []);
});

Deno.test("acceptRequest() refuses a request that is not a Request, or an fn that is not a function, with a TypeError naming it, before any SQL", async () => {
  const { openSqliteWasm } = await import("../deno/sqlite_wasm.ts");
  const { SQLITE } = await import("../dialects/sqlite.ts");
  await using db = await openSqliteWasm(":memory:");
  const sent: string[] = [];
  const driver: Driver = {
    query: (sql, params) => (sent.push(sql), db.query(sql, params)),
    run: (sql, params) => (sent.push(sql), db.run(sql, params)),
    exec: (sql) => (sent.push(sql), db.exec(sql)),
    close: () => Promise.resolve(),
    dialect: SQLITE,
  };
  await using inbox = await Inbox.open(driver);
  sent.length = 0;
  const request = new Request("http://x/", {
    method: "POST",
    headers: deliveryHeaders({ identity: uuidv7(), fence: 1 }),
  });
  const cases: [unknown, unknown, string][] = [
    [
      5,
      () => {},
      "Cannot accept request as 'request' must be a Request: current value is 5",
    ],
    [
      { headers: new Headers() },
      () => {},
      "Cannot accept request as 'request' must be a Request: current value is an object",
    ],
    [
      request,
      5,
      "Cannot accept request as 'fn' must be a function: current value is 5",
    ],
    [
      request,
      undefined,
      "Cannot accept request as 'fn' must be a function: current value is undefined",
    ],
  ];
  for (const [given, fn, message] of cases) {
    await assert.rejects(
      () => inbox.acceptRequest(given as Request, fn as never),
      new TypeError(message),
    );
  }
  assert.deepEqual(sent, []);
  assert.equal(
    (await inbox.acceptRequest(request, async () => {})).status,
    200,
  );
});

Deno.test("readDeliveryHeaders() refuses what is not a Headers, naming 'headers', and isRetryStatus() answers false for what is not a number", () => {
  for (
    const [headers, shown] of [[5, "5"], [null, "null"], [{}, "an object"]]
  ) {
    assert.throws(
      () => readDeliveryHeaders(headers as never),
      new TypeError(
        `Cannot read delivery as 'headers' must be a Headers: current value is ${shown}`,
      ),
    );
  }
  assert.equal(isRetryStatus(503), true);
  for (const status of ["503", [503], null, undefined, true]) {
    assert.equal(isRetryStatus(status as never), false, String(status));
  }
});
