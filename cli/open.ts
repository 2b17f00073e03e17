/**
 * How a command opens its database: read-only through
 * {@linkcode OutboxReader}, or read-write through {@linkcode Outbox} after
 * the same read-only check (so no command creates an outbox where there is
 * none); a file through the Deno file VFS (the WASM build), or through
 * `node:sqlite` where the VFS cannot open it (Windows; a file in WAL mode
 * off x86-64) or where this process already has it open through
 * `node:sqlite`; a URL through the PostgreSQL driver. A path that is not a
 * regular file (a FIFO, a directory, a device) is refused before anything
 * opens it: reading a FIFO's header would wait for a writer forever.
 *
 * `main()` may run in a process whose outbox has the same file open, and
 * with classic POSIX locks (the VFS's on macOS and the BSDs, native
 * SQLite's everywhere) closing any descriptor of the file drops every lock
 * the process holds on it. So nothing here opens the file but the driver
 * the process already uses for it: two connections of the VFS share its
 * descriptors (`deno/inodes.ts`), two of native SQLite share its own.
 *
 * @module
 */
import { resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { BusyError, READONLY_ROLLBACK, SqliteError } from "../errors.ts";
import { Outbox } from "../lease.ts";
import { OutboxReader } from "../reader.ts";
import type { WalStats } from "../wal.ts";
import { openNodeSqlite } from "../drivers/node_sqlite.ts";
import { nodeSqliteHasOpen } from "../drivers/node_sqlite_files.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { vfsHasOpen } from "../deno/inodes.ts";
import { loadLibc } from "../deno/libc.ts";
import {
  connectPostgres,
  lockTimeoutFor,
  openPostgres,
} from "../drivers/postgres.ts";
import { type Context, stringOption } from "./command.ts";
import { message } from "./format.ts";

/** Opens the database read-only, after checking it holds an outbox. */
export async function openReader(context: Context): Promise<OutboxReader> {
  let driver;
  if (context.postgres) {
    driver = await withPath(context, () =>
      connectPostgres(context.database, {
        ...postgresOptions(context),
        lockTimeoutMs: lockTimeoutFor(context.busyTimeoutMs),
      }));
  } else {
    const url = fileUrl(context.database);
    url.searchParams.set("mode", "ro");
    driver = await open(context, url);
  }
  return await withPath(
    context,
    () => OutboxReader.open(driver, { busyTimeoutMs: context.busyTimeoutMs }),
  );
}

/** Opens the database read-write, after the read-only check. */
export async function openOutbox(context: Context): Promise<Outbox> {
  if (context.postgres) {
    // Checked first, as a file is: openPostgres creates what is missing.
    await (await openReader(context)).close();
    return await withPath(context, () =>
      openPostgres(context.database, {
        ...postgresOptions(context),
        busyTimeoutMs: context.busyTimeoutMs,
      }));
  }
  const url = fileUrl(context.database);
  url.searchParams.set("mode", "rw");
  // Checked read-only first: Outbox.open would create the schema in any
  // database that has none. A crashed writer's hot journal stops a
  // read-only connection; a read-write one rolls it back on its first read.
  await openReader(context).catch(async (error) => {
    if (
      !(error.cause instanceof SqliteError &&
        error.cause.code === READONLY_ROLLBACK)
    ) {
      throw error;
    }
    const driver = await open(context, url);
    try {
      await withPath(
        context,
        () => driver.query("SELECT count(*) FROM sqlite_schema"),
      );
    } finally {
      await driver.close();
    }
    return await openReader(context);
  }).then((reader) => reader.close());
  const driver = await open(context, url);
  return await withPath(
    context,
    () => Outbox.open(driver, { busyTimeoutMs: context.busyTimeoutMs }),
  );
}

function postgresOptions(context: Context) {
  const schema = stringOption(context, "schema");
  return {
    ...(schema === undefined ? {} : { schema }),
    applicationName: "leased-outbox cli",
    listen: false,
  };
}

async function open(context: Context, url: URL) {
  const options = { busyTimeoutMs: context.busyTimeoutMs };
  return await withPath(context, async () => {
    const path = new URL(url.pathname, url);
    await refuseIrregular(path);
    return throughVfs(path)
      ? await openSqliteWasm(url, options)
      : await openNodeSqlite(path, {
        ...options,
        readOnly: url.searchParams.get("mode") === "ro",
      });
  });
}

/**
 * The WAL's state, `null` on PostgreSQL or a file not in WAL mode (as the
 * connection says): through a read-write connection of its own, as its
 * passive checkpoint cannot run read-only (it changes no row; a file this
 * process may not write gives `null` too).
 */
export async function readWal(context: Context): Promise<WalStats | null> {
  if (context.postgres) return null;
  const url = fileUrl(context.database);
  url.searchParams.set("mode", "rw");
  await using reader = await OutboxReader.open(await open(context, url), {
    busyTimeoutMs: context.busyTimeoutMs,
  });
  return await reader.wal();
}

/**
 * Throws when `path` exists and is not a regular file: a FIFO would block
 * the first read (here or in a driver) until a writer came, whatever
 * `--busy-timeout` says; a directory or a device is no database either. A
 * missing file is left to the open, which says so.
 */
async function refuseIrregular(path: URL): Promise<void> {
  let info: Deno.FileInfo;
  try {
    info = await Deno.stat(path);
  } catch {
    return;
  }
  if (info.isFile) return;
  const kind = info.isDirectory
    ? "a directory"
    : info.isFifo
    ? "a FIFO"
    : info.isSocket
    ? "a socket"
    : info.isCharDevice || info.isBlockDevice
    ? "a device"
    : "something else";
  throw new Error(`not a regular file (it is ${kind})`);
}

/**
 * Whether the Deno file VFS opens the file at `path` (else `node:sqlite`):
 * the driver of this process's open connections to it when it has any, as
 * a connection of the other would drop their classic locks when it closes
 * (and under classic locks neither would exclude the other); else the VFS
 * wherever it opens every file, x86-64 outside Windows, so that an outbox
 * this process opens later finds its locks kept. Off x86-64 a file in WAL
 * mode needs `node:sqlite`; its header is read with no await between the
 * open and the close, after no connection of this process was found on it.
 */
function throughVfs(path: URL): boolean {
  const name = fileURLToPath(path);
  if (vfsHasOpen(name, () => loadLibc(name))) return true;
  if (nodeSqliteHasOpen(path)) return false;
  if (Deno.build.os === "windows") return false;
  return Deno.build.arch === "x86_64" || !headerSaysWal(path);
}

/**
 * Whether the file's header marks it WAL mode (the file format read and
 * write versions, bytes 18 and 19, are 2). A file that cannot be read is
 * left to the open that follows, which reports why.
 */
function headerSaysWal(path: URL): boolean {
  let file: Deno.FsFile;
  try {
    file = Deno.openSync(path);
  } catch {
    return false;
  }
  using _ = file;
  const header = new Uint8Array(20);
  let read = 0;
  while (read < header.length) {
    const n = file.readSync(header.subarray(read));
    if (n === null) return false;
    read += n;
  }
  return header[18] === 2 || header[19] === 2;
}

async function withPath<T>(context: Context, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (error) {
    // An option the driver refuses (--schema) is a usage error.
    if (error instanceof TypeError) throw error;
    const schema = stringOption(context, "schema");
    const why = error instanceof BusyError
      ? `locked by another connection for longer than --busy-timeout (${context.busyTimeoutMs} ms)`
      : error instanceof SqliteError && /not a database/.test(error.message)
      ? "not an outbox database (not SQLite)"
      : /no outbox/.test(message(error))
      ? `not an outbox database (no outbox tables${
        !context.postgres
          ? ""
          : schema === undefined
          ? " where its search_path leads"
          : ` in schema ${schema}`
      })`
      : message(error);
    throw new Error(`cannot open ${context.database}: ${why}`, {
      cause: error,
    });
  }
}

/** The database's file URL, a relative path resolved where the user is. */
function fileUrl(path: string): URL {
  // `deno task` runs in the project's directory; INIT_CWD is where the
  // user typed the command, which a relative path is relative to.
  const cwd = Deno.env.get("INIT_CWD") ?? Deno.cwd();
  if (!path.startsWith("file:")) return pathToFileURL(resolve(cwd, path));
  // `file:o.db` is relative, as SQLite reads a URI filename without `//`
  // or `/`; the URL parser would put it at the root.
  const relative = /^file:([^/?#][^?#]*)(.*)$/.exec(path);
  if (relative === null) return new URL(path);
  const url = pathToFileURL(
    resolve(cwd, decodeURIComponent(relative[1]!)),
  );
  return new URL(relative[2]!, url);
}
