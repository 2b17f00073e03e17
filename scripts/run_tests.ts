/**
 * `deno task test`: every test, doc examples included (`deno test -A --doc`
 * plus any arguments given), on a fresh machine too. With no arguments, `deno
 * test --doc` finds the test files, the JSDoc examples, and the code blocks of
 * README.md and docs/*.md.
 *
 * - Chromium: the browser tests drive Debian's `/usr/bin/chromium`. When it
 *   is missing and this runs as root on a system with apt-get, it installs
 *   Debian's `chromium` package first (non-interactive, at most 10 minutes,
 *   never a browser downloaded from elsewhere). When Chromium is still
 *   missing, the browser tests are ignored and a banner at the end says what
 *   did not run and how to run it; with `CI` set, that run fails.
 * - strace: one test holds a process's writes back with it; installed the
 *   same way when missing (Debian's `strace`). Without it that test fails.
 * - Temporary files: the tests run with `TMPDIR` set to a fresh directory,
 *   and the run fails if anything is left in it afterwards.
 *
 * @module
 */
import {
  CHROMIUM_PATH,
  isExecutable,
  SKIP_NOTICE,
} from "../tests/fixtures/browser/chromium.ts";

const INSTALL_TIMEOUT_MS = 10 * 60_000;
const STRACE = "/usr/bin/strace";

function say(message: string): void {
  console.error(`test: ${message}`);
}

/** Runs one apt-get command, quietly, within what is left of `deadline`. */
async function aptGet(args: string[], deadline: number): Promise<boolean> {
  try {
    const { success } = await new Deno.Command("apt-get", {
      args: ["-o", "DPkg::Lock::Timeout=120", ...args],
      env: { DEBIAN_FRONTEND: "noninteractive" },
      stdin: "null",
      stdout: "null",
      stderr: "inherit",
      signal: AbortSignal.timeout(Math.max(0, deadline - Date.now())),
    }).output();
    return success;
  } catch {
    return false;
  }
}

/**
 * Installs Debian's package `name` when that is possible here (as root, with
 * apt-get); says why not. `missing` says what is missing.
 */
async function installPackage(name: string, missing: string): Promise<void> {
  if (Deno.uid() !== 0) {
    say(`no ${missing}, and not root: not installing it with apt-get`);
    return;
  }
  if (!isExecutable("/usr/bin/apt-get")) {
    say(`no ${missing}, and no apt-get to install it with`);
    return;
  }
  say(
    `no ${missing}: installing Debian's ${name} with apt-get (at most ${
      INSTALL_TIMEOUT_MS / 60_000
    } minutes)`,
  );
  const deadline = Date.now() + INSTALL_TIMEOUT_MS;
  const install = ["install", "-y", "-q", "--no-install-recommends", name];
  // A fresh image has no package lists yet: update only when needed.
  const installed = await aptGet(install, deadline) ||
    (await aptGet(["update", "-q"], deadline) &&
      await aptGet(install, deadline));
  if (!installed) say(`apt-get could not install ${name}`);
}

if (!isExecutable(CHROMIUM_PATH)) {
  if (Deno.env.get("CHROMIUM_PATH") !== undefined) {
    say(`no Chromium at CHROMIUM_PATH=${CHROMIUM_PATH}; not installing one`);
  } else {
    await installPackage("chromium", `Chromium at ${CHROMIUM_PATH}`);
  }
}
// tests/vfs_wal_test.ts holds one process's writes back with strace's
// fault injection.
if (!isExecutable(STRACE)) await installPackage("strace", STRACE);
const chromium = isExecutable(CHROMIUM_PATH);

const tmp = await Deno.makeTempDir({ prefix: "leased-outbox-test-" });
// As root, the PostgreSQL tests run the server as nobody, which must pass
// through TMPDIR to reach its data directory: traverse, but not list.
await Deno.chmod(tmp, 0o711);
let code = 1;
try {
  ({ code } = await new Deno.Command(Deno.execPath(), {
    // The project lock is not read by default (deno.json: "lock": false, so
    // that a task caches only what it runs); the tests are checked by it.
    args: ["test", "-A", "--doc", "--lock=deno.lock", ...Deno.args],
    env: { TMPDIR: tmp },
    stdin: "null",
    stdout: "inherit",
    stderr: "inherit",
  }).spawn().status);
  const left = [];
  for await (const entry of Deno.readDir(tmp)) {
    // scripts/postgres_server.ts keeps the server's binaries and initdb
    // template here on purpose, shared by every test file; it is removed
    // with TMPDIR below.
    if (!entry.name.startsWith("leased-outbox-postgres-")) {
      left.push(entry.name);
    }
  }
  if (left.length > 0) {
    say(`the tests left temporary files behind: ${left.sort().join(", ")}`);
    code ||= 1;
  }
} finally {
  await Deno.remove(tmp, { recursive: true });
}

if (!chromium) {
  const ci = (Deno.env.get("CI") ?? "") !== "";
  const bar = "=".repeat(78);
  console.error(
    [
      "",
      bar,
      `${SKIP_NOTICE} at ${CHROMIUM_PATH}: the browser tests did NOT run`,
      "(tests/browser_*_test.ts, shown as ignored above).",
      "To run them: install Debian's Chromium (sudo apt-get install chromium),",
      "or run `deno task test` as root, which installs it; or point",
      "CHROMIUM_PATH at a Chromium binary. Then run `deno task test` again.",
      ci ? "CI is set: this run fails." : "",
      bar,
    ].filter((line) => line !== "").join("\n"),
  );
  if (ci) code ||= 1;
}
Deno.exit(code);
