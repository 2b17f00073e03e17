/**
 * The dashboard handler (dashboard/mod.ts) without a browser: its pages,
 * its escaping, its guards on writes, its options, and the plans of the
 * statements it reads with. tests/dashboard_browser_test.ts drives it in
 * Chromium.
 */
import assert from "node:assert/strict";
import { Outbox } from "../mod.ts";
import { OutboxReader } from "../reader.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { dashboard } from "../dashboard/mod.ts";
import { serveDashboard } from "../dashboard/serve.ts";
import { SQLITE } from "../dialects/sqlite.ts";
import { CSRF_COOKIE } from "../dashboard/csrf.ts";
import { connectPostgres, openPostgres } from "../drivers/postgres.ts";
import { sharedPostgres } from "../scripts/postgres_server.ts";

const XSS = `<img src=x onerror="globalThis.pwned=1">`;

async function withOutbox(
  fn: (outbox: Outbox, clock: { now: number }) => Promise<void>,
): Promise<void> {
  const clock = { now: 1_700_000_000_000 };
  await using outbox = await Outbox.open(await openSqliteWasm(":memory:"), {
    now: () => clock.now,
  });
  await fn(outbox, clock);
}

/** A dead letter in queue "mail" whose last error is `error`. */
async function deadLetter(outbox: Outbox, error: string): Promise<number> {
  const { eventId: id } = await outbox.enqueue({ n: 1 }, {
    queue: "mail",
    maxAttempts: 1,
  });
  const lease = await outbox.claim({ queue: "mail" });
  assert.equal(lease?.eventId, id);
  assert.equal(await outbox.release(lease!, { error }), true);
  return id;
}

/** GETs `path` and returns the response's cookie and the form's token. */
async function formOf(
  handler: (r: Request) => Promise<Response>,
  path: string,
): Promise<{ cookie: string; csrf: string }> {
  const response = await handler(new Request(`http://localhost${path}`));
  assert.equal(response.status, 200);
  const cookie = response.headers.get("set-cookie")?.split(";")[0];
  assert.ok(cookie !== undefined && cookie.startsWith(`${CSRF_COOKIE}=`));
  const csrf = /name="csrf" value="([0-9a-f]{64})"/.exec(
    await response.text(),
  )?.[1];
  assert.ok(csrf !== undefined);
  return { cookie, csrf };
}

/** The page's markup with whitespace between and inside tags collapsed. */
async function flat(response: Response): Promise<string> {
  return (await response.text()).replace(/\s+/g, " ").replace(/> </g, "><")
    .replace(/ >/g, ">").replace(/< /g, "<");
}

function post(
  path: string,
  fields: Record<string, string>,
  headers: Record<string, string>,
): Request {
  return new Request(`http://localhost${path}`, {
    method: "POST",
    body: new URLSearchParams(fields),
    headers: { origin: "http://localhost", ...headers },
  });
}

Deno.test("the dashboard's overview lists each queue's counts by state, with a strict CSP", async () => {
  await withOutbox(async (outbox) => {
    await deadLetter(outbox, "smtp down");
    await outbox.enqueue({ n: 1 }, { queue: "mail" });
    await outbox.enqueue({ n: 2 }, { queue: "mail" });
    const handler = dashboard(outbox, { basePath: "/admin" });
    const response = await handler(new Request("http://localhost/admin/"));
    assert.equal(response.status, 200);
    const csp = response.headers.get("content-security-policy") ?? "";
    assert.match(csp, /default-src 'none'/);
    assert.match(csp, /script-src 'self'/);
    assert.doesNotMatch(csp, /unsafe-inline/);
    const body = await flat(response);
    assert.match(
      body,
      /<td><a href="\/admin\/events\?queue=mail">mail<\/a><\/td><td class="num"><a class="state-pending"[^>]*>2<\/a><\/td><td class="num"><a class="state-leased"[^>]*>0<\/a><\/td><td class="num"><a class="state-done"[^>]*>0<\/a><\/td><td class="num"><a class="state-dead"[^>]*>1<\/a>/,
    );
    assert.doesNotMatch(body, /<script>|style=/);
    assert.equal(
      (await handler(new Request("http://localhost/elsewhere"))).status,
      404,
    );
  });
});

Deno.test("the dashboard shows stored markup as text: payloads, errors and queue names", async () => {
  await withOutbox(async (outbox) => {
    const { eventId: id } = await outbox.enqueue({ html: XSS }, { queue: XSS });
    const lease = await outbox.claim({ queue: XSS });
    await outbox.release(lease!, { error: `<script>alert(1)</script>` });
    const handler = dashboard(outbox);
    for (
      const path of [
        "/",
        `/events?state=pending&queue=${encodeURIComponent(XSS)}`,
        `/events/${id}`,
      ]
    ) {
      const body = await (await handler(
        new Request(`http://localhost${path}`),
      )).text();
      assert.doesNotMatch(body, /<img src=x/, path);
      assert.doesNotMatch(body, /<script>alert/, path);
      assert.match(body, /&lt;img src=x onerror=/, path);
    }
    const event = await (await handler(
      new Request(`http://localhost/events/${id}`),
    )).text();
    assert.match(event, /&lt;script&gt;alert\(1\)&lt;\/script&gt;/);
  });
});

Deno.test("the dashboard's event page shows the payload, identity, times and the ledger's timeline", async () => {
  await withOutbox(async (outbox, clock) => {
    const { eventId: id, identity } = await outbox.enqueue({ to: "ada" }, {
      dedupKey: "order-7",
    });
    clock.now += 1_000;
    const lease = await outbox.claim();
    await outbox.acknowledge(lease!);
    const handler = dashboard(outbox, { now: () => clock.now });
    const body = await (await handler(
      new Request(`http://localhost/events/${id}`),
    )).text();
    assert.match(body, new RegExp(identity));
    assert.match(body, /&quot;to&quot;: &quot;ada&quot;/);
    assert.match(body, /2023-11-14 22:13:20/);
    assert.match(body, /<td>claimed<\/td>/);
    assert.match(body, /<td>acknowledged<\/td>/);
    for (const q of [String(id), identity, "order-7"]) {
      const found = await handler(
        new Request(`http://localhost/events?q=${encodeURIComponent(q)}`),
      );
      assert.equal(found.status, 303, q);
      assert.equal(found.headers.get("location"), `/events/${id}`);
    }
    const missing = await (await handler(
      new Request("http://localhost/events?q=nothing"),
    )).text();
    assert.match(missing, /No event has the id, identity or dedup key nothing/);
    assert.equal(
      (await handler(new Request("http://localhost/events/999"))).status,
      404,
    );
  });
});

Deno.test("with actions off, a POST is refused and nothing changes", async () => {
  await withOutbox(async (outbox) => {
    const id = await deadLetter(outbox, "boom");
    const handler = dashboard(outbox);
    const response = await handler(
      post("/actions/redrive", { id: String(id) }, {}),
    );
    assert.equal(response.status, 405);
    assert.equal((await outbox.stats({ queue: "mail" })).dead, 1);
    const dead = await (await handler(new Request("http://localhost/dead")))
      .text();
    assert.doesNotMatch(dead, /Redrive/);
    assert.match(dead, /boom/);
  });
});

Deno.test("with actions on, a POST without the cookie's CSRF token or from another origin is refused and nothing changes", async () => {
  await withOutbox(async (outbox) => {
    const id = await deadLetter(outbox, "boom");
    const handler = dashboard(outbox, { actions: true });
    const { cookie, csrf } = await formOf(handler, `/confirm/redrive?id=${id}`);
    const other = await formOf(handler, "/confirm/purge");
    const refused = [
      post("/actions/redrive", { id: String(id) }, { cookie }),
      post("/actions/redrive", { id: String(id), csrf }, {}),
      post("/actions/redrive", { id: String(id), csrf: other.csrf }, {
        cookie,
      }),
      post("/actions/redrive", { id: String(id), csrf }, {
        cookie,
        origin: "http://evil.example",
      }),
    ];
    for (const request of refused) {
      assert.equal((await handler(request)).status, 403);
    }
    assert.equal((await outbox.stats({ queue: "mail" })).dead, 1);
    const done = await handler(
      post("/actions/redrive", { id: String(id), csrf }, { cookie }),
    );
    assert.equal(done.status, 200);
    assert.match(await flat(done), /Redrove event <a [^>]*>\d+<\/a>/);
    const stats = await outbox.stats({ queue: "mail" });
    assert.equal(stats.dead, 0);
    assert.equal(stats.pending, 1);
  });
});

Deno.test("the dashboard cancels a pending event and purges by age, each after a confirmation", async () => {
  await withOutbox(async (outbox, clock) => {
    const { eventId: id } = await outbox.enqueue({ n: 1 });
    const handler = dashboard(outbox, { actions: true });
    const { cookie, csrf } = await formOf(handler, `/confirm/cancel?id=${id}`);
    const cancel = await handler(
      post("/actions/cancel", { id: String(id), csrf }, { cookie }),
    );
    assert.match(await cancel.text(), /Cancelled event/);
    assert.equal((await outbox.stats()).dead, 1);
    clock.now += 2 * 86_400_000;
    const purge = await handler(
      post("/actions/purge", { olderThan: "86400000", csrf }, { cookie }),
    );
    assert.match(await purge.text(), /Purged 1 finished event\./);
    assert.equal((await outbox.stats()).dead, 0);
  });
});

Deno.test("authorize() sees every request: false answers 403, a Response is answered as is", async () => {
  await withOutbox(async (outbox) => {
    const challenge = new Response("who?", {
      status: 401,
      headers: { "www-authenticate": 'Basic realm="outbox"' },
    });
    const handler = dashboard(outbox, {
      authorize: (request) =>
        request.headers.get("authorization") === `Basic ${btoa("ada:pw")}`
          ? true
          : request.headers.has("authorization")
          ? false
          : challenge,
    });
    assert.equal((await handler(new Request("http://localhost/"))).status, 401);
    assert.equal(
      (await handler(
        new Request("http://localhost/", {
          headers: { authorization: "Basic eA==" },
        }),
      )).status,
      403,
    );
    assert.equal(
      (await handler(
        new Request("http://localhost/assets/live.js", {
          headers: { authorization: "Basic eA==" },
        }),
      )).status,
      403,
    );
    assert.equal(
      (await handler(
        new Request("http://localhost/", {
          headers: { authorization: `Basic ${btoa("ada:pw")}` },
        }),
      )).status,
      200,
    );
  });
});

Deno.test("dashboard() refuses bad options naming the field", async () => {
  await withOutbox(async (outbox) => {
    const dir = await Deno.makeTempDir();
    try {
      {
        await using _ = await Outbox.open(
          await openSqliteWasm(`${dir}/o.db`),
        );
      }
      await using reader = await OutboxReader.open(
        await openSqliteWasm(`${dir}/o.db`),
      );
      assert.throws(
        () => dashboard(reader, { actions: true }),
        /'actions' needs an Outbox as 'source'/,
      );
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
    assert.throws(
      () => dashboard(null as never),
      /'source' must be an Outbox or an OutboxReader/,
    );
    assert.throws(
      () => dashboard(outbox, { basePath: "admin" }),
      /'basePath' must be empty or a path starting with '\/'/,
    );
    assert.throws(
      () => dashboard(outbox, { refreshMs: -1 }),
      RangeError,
    );
    assert.throws(
      () => dashboard(outbox, { actions: "yes" as never }),
      /'actions' must be a boolean/,
    );
    assert.throws(
      () => dashboard(outbox, { colour: "red" } as never),
      /colour/,
    );
  });
});

Deno.test("dashboard({ origin }) compares as browsers send it, so a trailing slash, capitals or a default port still let the origin's POSTs through; a value that is not an origin is refused naming 'origin'", async () => {
  await withOutbox(async (outbox) => {
    for (
      const origin of [
        "https://admin.example.com",
        "https://admin.example.com/",
        "https://Admin.EXAMPLE.com",
        "HTTPS://admin.example.com:443/",
      ]
    ) {
      const id = await deadLetter(outbox, "boom");
      const handler = dashboard(outbox, { actions: true, origin });
      const { cookie, csrf } = await formOf(
        handler,
        `/confirm/redrive?id=${id}`,
      );
      const from = (sender: string) =>
        handler(
          post("/actions/redrive", { id: String(id), csrf }, {
            cookie,
            origin: sender,
          }),
        );
      assert.equal((await from("https://evil.example")).status, 403, origin);
      assert.equal((await from("http://admin.example.com")).status, 403);
      const done = await from("https://admin.example.com");
      assert.equal(done.status, 200, origin);
      assert.match(await flat(done), /Redrove event/);
      await outbox.acknowledge((await outbox.claim({ queue: "mail" }))!);
    }
    for (
      const origin of [
        "admin.example.com",
        "https://admin.example.com/ops",
        "https://admin.example.com/.",
        "https://admin.example.com?x=1",
        "https://admin.example.com#top",
        "https://ada:pw@admin.example.com",
        "ftp://admin.example.com",
        "localhost:8080",
        "",
        5,
      ]
    ) {
      assert.throws(
        () => dashboard(outbox, { actions: true, origin: origin as string }),
        (error) =>
          error instanceof TypeError &&
          error.message.startsWith(
            "Cannot create dashboard as 'origin' must be an origin, an http: or https: URL with no path, query or fragment",
          ),
        String(origin),
      );
    }
  });
});

Deno.test("serveDashboard() refuses a bad or unknown option with an error naming the field, before it listens", async () => {
  await withOutbox(async (outbox) => {
    const cases: [Record<string, unknown>, string][] = [
      [
        { hostname: 5 },
        "TypeError: Cannot serve dashboard as 'hostname' must be a host name or IP address: current value is 5",
      ],
      [
        { hostname: "a b" },
        `TypeError: Cannot serve dashboard as 'hostname' must be a host name or IP address: current value is "a b"`,
      ],
      [
        { hostname: "" },
        `TypeError: Cannot serve dashboard as 'hostname' must be a host name or IP address: current value is ""`,
      ],
      [
        { port: "8080" },
        `TypeError: Cannot serve dashboard as 'port' must be a non-negative integer: current value is "8080"`,
      ],
      [
        { port: 70_000 },
        "RangeError: Cannot serve dashboard as 'port' must be a non-negative integer at most 65535: current value is 70000",
      ],
      [
        { signal: 5 },
        "TypeError: Cannot serve dashboard as 'signal' must be an AbortSignal: current value is 5",
      ],
      [
        { allowedHosts: "x" },
        `TypeError: Cannot serve dashboard as 'allowedHosts' must be an array of host names: current value is "x"`,
      ],
      [
        { allowedHosts: ["ok.internal", 5] },
        "TypeError: Cannot serve dashboard as 'allowedHosts[1]' must be a host name or IP address: current value is 5",
      ],
      [
        { hostnme: "127.0.0.1" },
        "TypeError: Cannot serve dashboard as 'hostnme' is not an option: did you mean 'hostname'?",
      ],
      [
        { origin: "https://admin.example.com/ops" },
        `TypeError: Cannot create dashboard as 'origin' must be an origin, an http: or https: URL with no path, query or fragment (e.g. "https://admin.example.com"): current value is "https://admin.example.com/ops"`,
      ],
    ];
    for (const [options, message] of cases) {
      assert.throws(
        () => serveDashboard(outbox, { port: 0, ...options } as never),
        (error: Error) => `${error.name}: ${error.message}`.startsWith(message),
        message,
      );
    }
    // The outbox is as it was.
    assert.deepEqual(await outbox.queues(), []);
  });
});

Deno.test("the dashboard's error pages are titled by their status: 400 'Bad request' for a missing or malformed field, 404 'Not found' for a missing page or event", async () => {
  await withOutbox(async (outbox) => {
    const handler = dashboard(outbox, { actions: true });
    const { cookie, csrf } = await formOf(handler, "/confirm/purge");
    const cases: [Request, number, string][] = [
      [post("/actions/purge", { csrf }, { cookie }), 400, "Bad request"],
      [
        new Request("http://localhost/events?state=sleeping"),
        400,
        "Bad request",
      ],
      [new Request("http://localhost/confirm/cancel"), 400, "Bad request"],
      [new Request("http://localhost/events/7"), 404, "Not found"],
      [new Request("http://localhost/nowhere"), 404, "Not found"],
    ];
    for (const [request, status, title] of cases) {
      const response = await handler(request);
      assert.equal(response.status, status, request.url);
      assert.match(
        await response.text(),
        new RegExp(`<title>${title} · Outbox</title>`),
        request.url,
      );
    }
  });
});

Deno.test("the dashboard's chart counts the last hour's acknowledgements and failures per minute", async () => {
  await withOutbox(async (outbox, clock) => {
    await outbox.enqueue({ n: 1 });
    await outbox.enqueue({ n: 2 });
    const first = await outbox.claim();
    await outbox.acknowledge(first!);
    clock.now += 60_000;
    const second = await outbox.claim();
    await outbox.release(second!, { error: "nope" });
    const minute = Math.floor(clock.now / 60_000) * 60_000;
    assert.deepEqual(await outbox.activity(minute - 60_000, 60_000), [
      { at: minute - 60_000, done: 1, failed: 0 },
      { at: minute, done: 0, failed: 1 },
    ]);
    const body = await (await dashboard(outbox, { now: () => clock.now })(
      new Request("http://localhost/"),
    )).text();
    assert.match(body, /1 done, 1 failed in the last hour/);
    await assert.rejects(() => outbox.activity(0, 0), RangeError);
  });
});

Deno.test("every statement the dashboard reads with uses an index on SQLite", async () => {
  await withOutbox(async (outbox) => {
    await outbox.transaction(async (tx) => {
      const plans: Record<string, string> = {};
      for (
        const [name, params] of [
          ["queues", []],
          ["queuesUpTo", [10_000]],
          ["list", ["dead", "mail", 0, 50]],
          ["event", [1]],
          ["eventByIdentity", ["x"]],
          ["history", [1]],
          ["activity", [0, 60_000]],
          ["dedupKeyEvent", ["mail", "k"]],
        ] as const
      ) {
        const rows = await tx.query(
          `EXPLAIN QUERY PLAN ${SQLITE[name]!}`,
          [...params],
        );
        plans[name] = rows.map((row) => String(row["detail"])).join("; ");
      }
      for (const [name, plan] of Object.entries(plans)) {
        assert.doesNotMatch(
          plan,
          /SCAN outbox_(events|attempts)(?! USING)/,
          `${name}: ${plan}`,
        );
      }
    });
  });
});

Deno.test("queues({ countUpTo }) stops each count at the limit and keeps the oldest pending time; bad limits are refused before any SQL", async () => {
  await withOutbox(async (outbox, clock) => {
    for (let i = 0; i < 5; i++) {
      await outbox.enqueue({ i }, { queue: "mail" });
      clock.now += 1;
    }
    await outbox.enqueue({ i: 5 }, { queue: "sms" });
    assert.deepEqual(await outbox.queues({ countUpTo: 3 }), [
      {
        queue: "mail",
        pending: 3,
        leased: 0,
        done: 0,
        dead: 0,
        oldestPendingAt: 1_700_000_000_000,
      },
      {
        queue: "sms",
        pending: 1,
        leased: 0,
        done: 0,
        dead: 0,
        oldestPendingAt: 1_700_000_000_005,
      },
    ]);
    assert.equal((await outbox.queues())[0]?.pending, 5);
    for (const countUpTo of [0, 1.5, -1]) {
      await assert.rejects(
        () => outbox.queues({ countUpTo }),
        /'countUpTo'/,
      );
    }
    await assert.rejects(
      () => outbox.queues({ max: 3 } as never),
      /max/,
    );
  });
});

Deno.test("on PostgreSQL, the dashboard shows the overview, the chart, an event found by dedup key, and redrives with actions on", async () => {
  const server = await sharedPostgres();
  const url = server.url;
  const schema = await server.createSchema();
  await using outbox = await openPostgres(url, { schema });
  const { eventId } = await outbox.enqueue({ to: XSS }, {
    queue: "mail",
    dedupKey: "order-9",
    maxAttempts: 1,
  });
  const lease = await outbox.claim({ queue: "mail" });
  await outbox.release(lease!, { error: "smtp down" });
  const handler = dashboard(outbox, { actions: true });
  const overview = await flat(
    await handler(new Request("http://localhost/")),
  );
  assert.match(
    overview,
    /mail<\/a><\/td><td class="num"><a class="state-pending"[^>]*>0<\/a>/,
  );
  assert.match(overview, /0 done, 1 failed in the last hour/);
  const found = await handler(
    new Request("http://localhost/events?q=order-9"),
  );
  assert.equal(found.headers.get("location"), `/events/${eventId}`);
  const event = await (await handler(
    new Request(`http://localhost/events/${eventId}`),
  )).text();
  assert.match(event, /&lt;img src=x/);
  assert.match(event, /smtp down/);
  const { cookie, csrf } = await formOf(
    handler,
    `/confirm/redrive?id=${eventId}`,
  );
  const done = await handler(
    post("/actions/redrive", { id: String(eventId), csrf }, { cookie }),
  );
  assert.match(await flat(done), /Redrove event/);
  assert.equal((await outbox.stats({ queue: "mail" })).pending, 1);
  await using reader = await OutboxReader.open(
    await connectPostgres(url, { schema }),
  );
  const read = await flat(
    await dashboard(reader)(
      new Request("http://localhost/"),
    ),
  );
  assert.match(read, /state-pending[^>]*>1<\/a>/);
});

Deno.test("bench:dashboard prints the overview's row and its anchor, on a small database", async () => {
  const { success, stdout } = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      new URL("../bench/dashboard_bench.ts", import.meta.url).pathname,
      "--events",
      "2000",
      "--runs",
      "2",
    ],
    stdout: "piped",
    stderr: "inherit",
  }).output();
  assert.equal(success, true);
  const text = new TextDecoder().decode(stdout);
  assert.match(text, /dashboard on 2,000 events, 2 runs/);
  assert.match(
    text,
    /\| overview \(GET \/\), goal: median ≤ 200 ms \| \d+\.\d ms \|/,
  );
  assert.match(text, /\| anchor: exact queues\(\) .* \| \d+\.\d ms \|/);
  assert.match(
    text,
    /\| events page, state=dead, every queue \(GET \/events\?state=dead\) \| \d+\.\d ms \|/,
  );
});

Deno.test("an authorize hook that throws answers 500 without its message, so an unsigned-in client learns nothing of it", async () => {
  await withOutbox(async (outbox) => {
    const handler = dashboard(outbox, {
      authorize: () => {
        throw new Error(
          "cannot reach ldap://admin:hunter2@directory.internal",
        );
      },
    });
    for (const path of ["/", "/assets/live.js", "/events?q=1"]) {
      const response = await handler(new Request(`http://localhost${path}`));
      assert.equal(response.status, 500);
      assert.match(
        response.headers.get("content-security-policy") ?? "",
        /default-src 'none'/,
      );
      const body = await response.text();
      assert.doesNotMatch(body, /hunter2|ldap|directory\.internal/);
      assert.match(body, /authorize/);
    }
  });
});

Deno.test("dashboard() refuses a refreshMs past the browsers' timer limit, which they would run every millisecond", async () => {
  await withOutbox(async (outbox) => {
    assert.throws(
      () => dashboard(outbox, { refreshMs: 2 ** 31 }),
      (error: unknown) =>
        error instanceof RangeError && /'refreshMs'/.test(error.message),
    );
    const handler = dashboard(outbox, { refreshMs: 2 ** 31 - 1 });
    const page = await (await handler(new Request("http://localhost/")))
      .text();
    assert.match(page, /data-live="2147483647"/);
  });
});

Deno.test("the dashboard answers 404 for event 0 and finds no event for q=0, rather than failing with 500", async () => {
  await withOutbox(async (outbox) => {
    await outbox.enqueue({ n: 1 }, { queue: "mail" });
    const handler = dashboard(outbox);
    const zero = await handler(new Request("http://localhost/events/0"));
    assert.equal(zero.status, 404);
    assert.match(await zero.text(), /No event 0\./);
    const search = await handler(new Request("http://localhost/events?q=0"));
    assert.equal(search.status, 200);
    assert.match(
      await search.text(),
      /No event has the id, identity or dedup key 0\./,
    );
  });
});

Deno.test("the events page reads after as a plain decimal id only: hex, blanks and exponents answer 400", async () => {
  await withOutbox(async (outbox) => {
    await outbox.enqueue({ n: 1 }, { queue: "mail" });
    const handler = dashboard(outbox);
    for (const after of ["0x10", "%20", "1e3", "-1", "1e309", "1.5", "+1"]) {
      const response = await handler(
        new Request(`http://localhost/events?after=${after}`),
      );
      assert.equal(response.status, 400, after);
      await response.body?.cancel();
    }
    for (const after of ["", "0", "1"]) {
      const response = await handler(
        new Request(`http://localhost/events?after=${after}`),
      );
      assert.equal(response.status, 200, after);
      await response.body?.cancel();
    }
  });
});

Deno.test("the cancel confirmation without an event id answers 400 rather than asking to cancel event undefined", async () => {
  await withOutbox(async (outbox) => {
    const handler = dashboard(outbox, { actions: true });
    for (const query of ["", "?id=", "?id=0", "?id=abc"]) {
      const response = await handler(
        new Request(`http://localhost/confirm/cancel${query}`),
      );
      assert.equal(response.status, 400, query);
      const body = await response.text();
      assert.doesNotMatch(body, /undefined|null/, query);
      assert.doesNotMatch(body, /name="csrf"/, query);
    }
  });
});

Deno.test("a basePath with a space or a non-ASCII letter is served at its percent-encoded path, and one the browser would resolve away or that ends a cookie's Path is refused", async () => {
  await withOutbox(async (outbox) => {
    await outbox.enqueue({ n: 1 }, { queue: "mail" });
    for (const basePath of ["/ops team/outbox", "/ädmin/"]) {
      const handler = dashboard(outbox, { basePath, actions: true });
      const url = new URL(basePath, "http://localhost");
      const response = await handler(
        new Request(`${url.href.replace(/\/$/, "")}/`),
      );
      assert.equal(response.status, 200, basePath);
      const path = url.pathname.replace(/\/$/, "");
      assert.match(
        response.headers.get("set-cookie") ?? "",
        new RegExp(`; Path=${path.replace(/[.%]/g, "\\$&")};`),
      );
      assert.match(await response.text(), new RegExp(`href="${path}/events"`));
    }
    for (
      const basePath of [
        "/a/../b",
        "/a/./b",
        "/a/%2e%2e/b",
        "//evil.example",
        "/a//b",
        "/a;Domain=evil.example",
        "/a\\b",
        "/a\nb",
        42,
      ]
    ) {
      assert.throws(
        () => dashboard(outbox, { basePath: basePath as string }),
        (error: unknown) =>
          error instanceof TypeError && /'basePath'/.test(error.message),
        String(basePath),
      );
    }
  });
});

Deno.test("with actions on, a POST's body is read only up to 16 KiB, and not at all from another origin, so no client makes the dashboard buffer a body of any size", async () => {
  await withOutbox(async (outbox) => {
    const handler = dashboard(outbox, { actions: true });
    const { cookie, csrf } = await formOf(handler, "/confirm/purge");
    /** A form body of `bytes` bytes, counting what was read of it. */
    const body = (bytes: number) => {
      const read = { bytes: 0 };
      const chunk = new TextEncoder().encode("a".repeat(65_536));
      let sent = 0;
      const stream = new ReadableStream<Uint8Array>({
        pull(controller) {
          if (sent === 0) {
            controller.enqueue(new TextEncoder().encode(`csrf=${csrf}&x=`));
          }
          if (sent >= bytes) return controller.close();
          sent += chunk.byteLength;
          read.bytes = sent;
          controller.enqueue(chunk);
        },
      });
      return { stream, read };
    };
    const post = (stream: ReadableStream<Uint8Array>, origin: string) =>
      handler(
        new Request("http://localhost/actions/purge", {
          method: "POST",
          body: stream,
          headers: {
            cookie,
            origin,
            "content-type": "application/x-www-form-urlencoded",
          },
        }),
      );
    const big = body(64 * 1024 * 1024);
    const answer = await post(big.stream, "http://localhost");
    assert.equal(answer.status, 413);
    await answer.body?.cancel();
    assert.ok(big.read.bytes <= 2 * 65_536, String(big.read.bytes));
    const foreign = body(64 * 1024 * 1024);
    const refused = await post(foreign.stream, "https://evil.example");
    assert.equal(refused.status, 403);
    await refused.body?.cancel();
    assert.ok(foreign.read.bytes <= 65_536, String(foreign.read.bytes));
  });
});

Deno.test("an event whose times lie past what a Date holds (written by another program) shows them as stored, rather than failing its pages with 500", async () => {
  const driver = await openSqliteWasm(":memory:");
  await using outbox = await Outbox.open(driver);
  const { eventId } = await outbox.enqueue({ n: 1 }, { queue: "mail" });
  await driver.run(
    "UPDATE outbox_events SET due_at = ?1, created_at = ?1, updated_at = ?1",
    [9_000_000_000_000_000],
  );
  const handler = dashboard(outbox, { now: () => 1_700_000_000_000 });
  for (const path of ["/events", `/events/${eventId}`]) {
    const response = await handler(new Request(`http://localhost${path}`));
    assert.equal(response.status, 200, path);
    assert.match(
      await response.text(),
      /9000000000000000 ms since the epoch/,
      path,
    );
  }
});

Deno.test("the overview shows a paused queue and its limits, and with actions on pauses and resumes a queue after a confirmation", async () => {
  await withOutbox(async (outbox) => {
    await outbox.enqueue({ n: 1 }, { queue: "mail" });
    await outbox.setLimits("mail", { perKey: 2, perSecond: 50 });
    const readOnly = await flat(
      await dashboard(outbox)(new Request("http://localhost/")),
    );
    assert.match(readOnly, /2 per key, 50\/s/);
    assert.doesNotMatch(readOnly, /Pause…/);
    const handler = dashboard(outbox, { actions: true });
    const { cookie, csrf } = await formOf(
      handler,
      "/confirm/pause?queue=mail",
    );
    const paused = await handler(
      post("/actions/pause", { queue: "mail", csrf }, { cookie }),
    );
    assert.match(await flat(paused), /Paused queue mail/);
    assert.equal(await outbox.claim({ queue: "mail" }), null);
    const overview = await flat(
      await handler(new Request("http://localhost/")),
    );
    assert.match(overview, /paused, 2 per key, 50\/s/);
    assert.match(overview, /confirm\/resume\?queue=mail/);
    const resumed = await handler(
      post("/actions/resume", { queue: "mail", csrf }, { cookie }),
    );
    assert.match(await flat(resumed), /Resumed queue mail/);
    assert.deepEqual((await outbox.claim({ queue: "mail" }))?.payload, {
      n: 1,
    });
    const refused = await dashboard(outbox)(
      post("/actions/pause", { queue: "mail", csrf }, { cookie }),
    );
    assert.equal(refused.status, 405);
    assert.equal((await outbox.limits("mail")).paused, false);
  });
});

Deno.test("an event another program stored as done without its claim's time is explained without that entry, and its page answers", async () => {
  await withOutbox(async (outbox) => {
    await outbox.transaction((tx) =>
      tx.run(
        `INSERT INTO outbox_events (queue, state, payload, due_at, max_attempts,
          created_at, updated_at, done_at, attempt, fence)
        VALUES ('mail', 'done', '{"n":1}', 5, 5, 5, 5, 7, 1, 1)`,
      )
    );
    const explained = await outbox.explain(1);
    assert.deepEqual(
      explained?.history.map((entry) => [entry.kind, entry.at]),
      [["acknowledged", 7]],
    );
    const page = await dashboard(outbox)(
      new Request("http://localhost/events/1"),
    );
    assert.equal(page.status, 200);
    assert.match(await page.text(), /acknowledged/);
  });
});

Deno.test("a dashboard action whose field is missing, blank, not decimal or not a queue name answers 400 naming the field, and changes nothing", async () => {
  await withOutbox(async (outbox, clock) => {
    for (let i = 0; i < 2; i++) await deadLetter(outbox, "boom");
    await outbox.enqueue({ n: 2 });
    await outbox.acknowledge((await outbox.claim())!);
    const { eventId: pending } = await outbox.enqueue({ n: 3 });
    clock.now += 2 * 86_400_000;
    const handler = dashboard(outbox, { actions: true });
    const { cookie, csrf } = await formOf(handler, "/confirm/purge");
    const text = async (response: Response) =>
      (await flat(response)).replace(/<[^>]+>/g, " ").replace(/&quot;/g, '"')
        .replace(/&#39;/g, "'").replace(/\s+/g, " ");
    const before = JSON.stringify([
      await outbox.stats(),
      await outbox.queues(),
    ]);
    const cases: [string, Record<string, string>, RegExp][] = [
      ...[undefined, "", " ", "0x10", "1e3", "-1", "1.5"].map((
        olderThan,
      ): [string, Record<string, string>, RegExp] => [
        "/actions/purge",
        olderThan === undefined ? {} : { olderThan },
        new RegExp(
          `Purge events older than what\\? 'olderThan' must be milliseconds \\(decimal digits\\): got ${
            olderThan === undefined
              ? "nothing"
              : JSON.stringify(olderThan).replace(/[.+]/g, "\\$&")
          }\\. Nothing changed\\.`,
        ),
      ]),
      ...["abc", "0", "1.0", " 1", "", "-1"].map((
        id,
      ): [string, Record<string, string>, RegExp] => [
        "/actions/redrive",
        { id },
        new RegExp(
          `Redrive which event\\? 'id' must be an event id \\(decimal digits\\): got ${
            JSON.stringify(id).replace(/[.+]/g, "\\$&")
          }\\. Nothing changed\\.`,
        ),
      ]),
      [
        "/actions/cancel",
        { id: "x" },
        /Cancel which event\? 'id' must be an event id \(decimal digits\): got "x"\. Nothing changed\./,
      ],
      [
        "/actions/cancel",
        {},
        /Cancel which event\? 'id' is required\. Nothing changed\./,
      ],
      [
        "/actions/pause",
        {},
        /Pause which queue\? 'queue' must name one: got nothing\. Nothing changed\./,
      ],
      [
        "/actions/resume",
        { queue: "" },
        /Resume which queue\? 'queue' must name one: got ""\. Nothing changed\./,
      ],
      [
        "/actions/pause",
        { queue: "mail\0" },
        /Pause which queue\? Cannot pause as 'queue' must be a string of 1 to 1024 characters, no NUL or lone surrogate: current value is "mail\\u0000"\. Nothing changed\./,
      ],
      [
        "/actions/resume",
        { queue: "q".repeat(1025) },
        /Resume which queue\? Cannot resume as 'queue' must be a string of 1 to 1024 characters, no NUL or lone surrogate: current value is "q{40}…"\. Nothing changed\./,
      ],
    ];
    for (const [path, fields, message] of cases) {
      const response = await handler(
        post(path, { ...fields, csrf }, { cookie }),
      );
      assert.equal(response.status, 400, `${path} ${JSON.stringify(fields)}`);
      assert.match(await text(response), message);
    }
    for (
      const [path, message] of [
        [
          "/confirm/redrive?id=abc",
          /Redrive which event\? 'id' must be an event id \(decimal digits\): got "abc"\./,
        ],
        [
          "/confirm/pause",
          /Pause which queue\? 'queue' must name one: got nothing\./,
        ],
        [
          "/confirm/resume?queue=",
          /Resume which queue\? 'queue' must name one: got ""\./,
        ],
        [
          "/confirm/pause?queue=mail%00",
          /Pause which queue\? Cannot pause as 'queue' must be a string of 1 to 1024 characters, no NUL or lone surrogate: current value is "mail\\u0000"\./,
        ],
      ] as const
    ) {
      const confirm = await handler(new Request(`http://localhost${path}`));
      assert.equal(confirm.status, 400, path);
      assert.match(await text(confirm), message);
    }
    assert.equal(
      JSON.stringify([await outbox.stats(), await outbox.queues()]),
      before,
    );
    assert.equal((await outbox.stats()).pending, 1);
    assert.equal(
      (await outbox.list({ state: "pending" }))[0]?.id,
      pending,
    );
  });
});
