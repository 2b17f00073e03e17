/**
 * libc's errno is read by a second FFI call after the call that failed, so
 * the runtime may have set it in between (a futex wait leaves EAGAIN). A
 * full test run saw the VFS's probe for a WAL file that did not exist fail
 * as "Resource temporarily unavailable (os error 11): stat '...-wal'", a
 * disk I/O error opening the outbox. Here errno reads EAGAIN after every
 * call, as if clobbered each time.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { Libc, symbolsOf } from "../deno/libc.ts";
import { platformFor } from "../deno/platform.ts";

/** A Libc whose errno always reads EAGAIN, whatever the call set. */
function clobberedLibc(): { libc: Libc; close(): void } {
  const platform = platformFor(Deno.build.os, Deno.build.arch);
  const library = Deno.dlopen(platform.library, symbolsOf(platform));
  const errno = new Int32Array([platform.errno.EAGAIN]);
  const symbols = {
    ...library.symbols,
    errnoLocation: () => Deno.UnsafePointer.of(errno),
  };
  return {
    libc: new Libc(symbols as never, platform, "ofd"),
    close: () => library.close(),
  };
}

Deno.test("stat() of a missing file whose errno reads EAGAIN (clobbered after the call) answers absent, not an I/O error", async () => {
  const dir = await Deno.makeTempDir();
  const { libc, close } = clobberedLibc();
  try {
    assert.equal(libc.stat(join(dir, "outbox.db-wal")), undefined);
    await Deno.writeTextFile(join(dir, "outbox.db"), "x");
    assert.deepEqual(libc.stat(join(dir, "outbox.db")), {
      regular: true,
      size: 1,
    });
  } finally {
    close();
    await Deno.remove(dir, { recursive: true });
  }
});
