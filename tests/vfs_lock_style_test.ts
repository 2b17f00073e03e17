/**
 * Which byte-range locks the Deno file VFS takes on Linux: open file
 * description locks by default, classic POSIX locks (os_unix.c's, as on
 * macOS and the BSDs) when the test-only `LEASED_OUTBOX_VFS_LOCKS=posix`
 * says so. Each case runs in a child process, which reads the variable at
 * its first open.
 */
import assert from "node:assert/strict";
import { join } from "node:path";

const FIXTURE = new URL("./fixtures/vfs_lock_calls.ts", import.meta.url);

interface Report {
  readonly calls?: Record<string, number>;
  readonly kinds?: string[];
  readonly error?: string;
}

/** Runs the fixture on a new database with `LEASED_OUTBOX_VFS_LOCKS` set to `locks`. */
async function run(locks: string | undefined): Promise<Report> {
  const dir = await Deno.makeTempDir({ prefix: "vfs_lock_style_" });
  try {
    const env: Record<string, string> = {};
    if (locks !== undefined) env.LEASED_OUTBOX_VFS_LOCKS = locks;
    const output = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", FIXTURE.pathname, join(dir, "style.db")],
      env,
      clearEnv: false,
      stdout: "piped",
      stderr: "piped",
    }).output();
    const stderr = new TextDecoder().decode(output.stderr);
    assert.equal(output.code, 0, stderr);
    return JSON.parse(new TextDecoder().decode(output.stdout)) as Report;
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

// The variable this test process was started with must not decide for the
// children: each case sets it, or removes it.
function without<T>(fn: () => Promise<T>): Promise<T> {
  const saved = Deno.env.get("LEASED_OUTBOX_VFS_LOCKS");
  Deno.env.delete("LEASED_OUTBOX_VFS_LOCKS");
  return fn().finally(() => {
    if (saved !== undefined) Deno.env.set("LEASED_OUTBOX_VFS_LOCKS", saved);
  });
}

Deno.test("by default on Linux the VFS takes open file description locks: F_OFD_SETLK calls, never F_SETLK, and the kernel lists OFDLCK locks", async () => {
  const report = await without(() => run(undefined));
  assert.ok((report.calls?.F_OFD_SETLK ?? 0) > 0, JSON.stringify(report));
  assert.equal(report.calls?.F_SETLK, undefined);
  assert.equal(report.calls?.F_GETLK, undefined);
  assert.deepEqual(report.kinds, ["OFDLCK"]);
});

Deno.test("with LEASED_OUTBOX_VFS_LOCKS=posix the VFS takes classic POSIX locks: F_SETLK calls, never F_OFD_SETLK, and the kernel lists POSIX locks", async () => {
  const report = await without(() => run("posix"));
  assert.ok((report.calls?.F_SETLK ?? 0) > 0, JSON.stringify(report));
  assert.equal(report.calls?.F_OFD_SETLK, undefined);
  assert.equal(report.calls?.F_OFD_GETLK, undefined);
  assert.equal(report.calls?.F_OFD_SETLKW, undefined);
  assert.deepEqual(report.kinds, ["POSIX"]);
});

Deno.test("LEASED_OUTBOX_VFS_LOCKS set to anything but posix fails the open, naming the variable", async () => {
  const report = await without(() => run("flock"));
  assert.match(
    report.error ?? "",
    /LEASED_OUTBOX_VFS_LOCKS must be "posix" or unset: current value is "flock"/,
  );
});
