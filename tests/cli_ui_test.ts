/**
 * `outbox ui`: the dashboard served from the command line, on a file and
 * on a PostgreSQL URL, read-only unless `--actions`.
 */
import assert from "node:assert/strict";
import { main } from "../cli.ts";
import { Outbox } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { openPostgres } from "../drivers/postgres.ts";
import { sharedPostgres } from "../scripts/postgres_server.ts";

/** Runs `outbox ui` with `args` until `fn` is done with the URL it printed. */
async function withUi(
  args: string[],
  fn: (url: string, line: string) => Promise<void>,
): Promise<number> {
  const controller = new AbortController();
  const lines: string[] = [];
  let printed!: () => void;
  const ready = new Promise<void>((resolve) => printed = resolve);
  const exit = main(["ui", ...args], {
    stdout: (line) => {
      lines.push(line);
      printed();
    },
    stderr: (line) => lines.push(`stderr: ${line}`),
    signal: controller.signal,
  });
  await Promise.race([ready, exit]);
  try {
    const line = lines[0] ?? "";
    const url = /(http:\/\/\S+\/)/.exec(line)?.[1];
    assert.ok(url !== undefined, lines.join("\n"));
    await fn(url, line);
  } finally {
    controller.abort();
  }
  return await exit;
}

Deno.test("outbox ui serves the dashboard read-only on 127.0.0.1 and stops at its signal", async () => {
  const dir = await Deno.makeTempDir();
  try {
    {
      await using outbox = await Outbox.open(
        await openSqliteWasm(`${dir}/o.db`),
      );
      await outbox.enqueue({ to: "ada" }, { queue: "mail" });
    }
    const code = await withUi(
      [`${dir}/o.db`, "--port", "0"],
      async (url, line) => {
        assert.match(
          line,
          /^dashboard on http:\/\/127\.0\.0\.1:\d+\/ \(read-only; Ctrl-C to stop\)$/,
        );
        const page = await fetch(url);
        assert.equal(page.status, 200);
        assert.match(await page.text(), />mail</);
        const post = await fetch(`${url}actions/purge`, {
          method: "POST",
          body: new URLSearchParams({ olderThan: "0" }),
        });
        assert.equal(post.status, 405);
        await post.body?.cancel();
      },
    );
    assert.equal(code, 0);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("outbox ui --actions on a PostgreSQL URL offers redrive, and no page shows the URL's password", async () => {
  const server = await sharedPostgres();
  const schema = await server.createSchema();
  {
    await using outbox = await openPostgres(server.url, { schema });
    await outbox.enqueue({ n: 1 }, { queue: "mail", maxAttempts: 1 });
    const lease = await outbox.claim({ queue: "mail" });
    await outbox.release(lease!, { error: "boom" });
  }
  const password = new URL(server.url).password;
  const code = await withUi(
    [server.url, "--schema", schema, "--port", "0", "--actions", "--json"],
    async (url, line) => {
      assert.deepEqual(JSON.parse(line), { url, actions: true });
      for (const path of ["", "dead", "events/1", "confirm/redrive?id=1"]) {
        const body = await (await fetch(`${url}${path}`)).text();
        assert.match(body, /boom|Redrive|Overview/, path);
        if (password !== "") assert.ok(!body.includes(password), path);
      }
      assert.match(await (await fetch(`${url}dead`)).text(), /Redrive…/);
    },
  );
  assert.equal(code, 0);
});

Deno.test("outbox ui refuses a port past 65535 and an argument after the database", async () => {
  const lines: string[] = [];
  const io = { stdout: () => {}, stderr: (line: string) => lines.push(line) };
  assert.equal(await main(["ui", "x.db", "--port", "70000"], io), 2);
  assert.equal(await main(["ui", "x.db", "extra"], io), 2);
  assert.match(lines[0]!, /--port must be at most 65535: got 70000/);
  assert.match(lines.join("\n"), /ui takes no argument after the database/);
});

/** Sends one raw HTTP/1.1 GET of `path` with `host` as its Host header. */
async function rawGet(port: number, path: string, host: string) {
  const connection = await Deno.connect({ hostname: "127.0.0.1", port });
  try {
    await connection.write(
      new TextEncoder().encode(
        `GET ${path} HTTP/1.1\r\nhost: ${host}\r\nconnection: close\r\n\r\n`,
      ),
    );
    const text = new TextDecoder().decode(
      await new Response(connection.readable).arrayBuffer(),
    );
    return { status: Number(text.split(" ")[1]), text };
  } catch (error) {
    connection.close();
    throw error;
  }
}

Deno.test("outbox ui answers only requests addressed to its own host, so a DNS-rebound page cannot read or act", async () => {
  const dir = await Deno.makeTempDir();
  try {
    {
      await using outbox = await Outbox.open(
        await openSqliteWasm(`${dir}/o.db`),
      );
      await outbox.enqueue({ secret: "s3cr3t-payload" }, { queue: "mail" });
    }
    const code = await withUi(
      [
        `${dir}/o.db`,
        "--port",
        "0",
        "--actions",
        "--allow-host",
        "outbox.internal",
      ],
      async (url) => {
        const port = Number(new URL(url).port);
        const rebound = await rawGet(
          port,
          "/events?state=pending",
          `rebind.attacker.example:${port}`,
        );
        assert.equal(rebound.status, 421);
        assert.doesNotMatch(rebound.text, /s3cr3t-payload/);
        assert.doesNotMatch(rebound.text, /set-cookie/i);
        for (
          const host of [
            `127.0.0.1:${port}`,
            `localhost:${port}`,
            "localhost",
            `outbox.internal:${port}`,
          ]
        ) {
          const own = await rawGet(port, "/events?state=pending", host);
          assert.equal(own.status, 200, host);
          assert.match(own.text, /s3cr3t-payload/);
        }
      },
    );
    assert.equal(code, 0);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("outbox ui on a port in use, an address not of this machine or a name that does not resolve says which and what to do", async () => {
  const dir = await Deno.makeTempDir();
  try {
    {
      await using _ = await Outbox.open(await openSqliteWasm(`${dir}/o.db`));
    }
    using taken = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const port = (taken.addr as Deno.NetAddr).port;
    const cases: [string[], RegExp][] = [
      [
        ["--port", String(port)],
        new RegExp(
          `^outbox: cannot listen on 127\\.0\\.0\\.1:${port}: the port is in use .*--port 0`,
        ),
      ],
      [
        ["--port", "0", "--hostname", "192.0.2.1"],
        /^outbox: cannot listen on 192\.0\.2\.1:0: --hostname is not an address of this machine$/,
      ],
      [
        ["--port", "0", "--hostname", "no-such-host.invalid"],
        /^outbox: cannot listen on no-such-host\.invalid:0: --hostname is not a name this machine can resolve$/,
      ],
    ];
    for (const [args, expected] of cases) {
      const errors: string[] = [];
      const code = await main(["ui", `${dir}/o.db`, ...args], {
        stdout: (line) => errors.push(`stdout: ${line}`),
        stderr: (line) => errors.push(line),
        signal: AbortSignal.abort(),
      });
      assert.equal(code, 1, errors.join("\n"));
      assert.match(errors.join("\n"), expected);
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
