/**
 * Entry point of the dedicated worker that owns the database: the lease core
 * (`lease.ts`, unchanged) over the SQLite WASM driver on OPFS. Bundled beside
 * `browser.js` as `browser_worker.js`, with `sqlite3.wasm` (and
 * `sqlite3-opfs-async-proxy.js` for the `opfs` VFS) next to it.
 *
 * @module
 */
import { serveOutbox, type WorkerScope } from "./host.ts";
import { Outbox } from "../lease.ts";

serveOutbox(
  globalThis as unknown as WorkerScope,
  (driver, options) => Outbox.open(driver, options),
);
