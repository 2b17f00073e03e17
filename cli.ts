/**
 * The `outbox` command: looks after a queue in production, beside live
 * workers. `outbox <command> <database> [argument] [options]` once installed
 * from a checkout with `deno install -g -A -n outbox --config
 * <checkout>/deno.json <checkout>/cli.ts` (`docs/cli.md`), or
 * `deno task outbox …` in the checkout.
 *
 * The database is a SQLite file or a PostgreSQL URL
 * (`postgres://user:password@host/database`, with `--schema` for an outbox
 * other than the one the connection's `search_path` leads to). Read-only
 * commands (`stats`, `list`, `explain`, `watch`) open it read-only (a file
 * with `?mode=ro`) through {@linkcode OutboxReader}: they never write,
 * never create or upgrade the schema, and wait on a writer's lock for
 * `--busy-timeout`. The others open it read-write through
 * {@linkcode Outbox} after the same check, so neither creates an outbox
 * where there is none. A file opens through the Deno file VFS, or through
 * `node:sqlite` where the VFS cannot open it (Windows, or a file in WAL
 * mode off x86-64) or where the process already has it open through
 * `node:sqlite`: `main()` run beside the process's own outbox keeps that
 * outbox's locks (`docs/persistence-and-platforms.md`). A PostgreSQL outbox is judged by
 * the server's clock, as `openPostgres` judges it; a URL's password never
 * appears in the output.
 *
 * Exit codes: 0 done, 1 a runtime error (no such file, not a regular
 * file, not an outbox, lock held too long), 2 a usage error (one line, and
 * the command's synopsis).
 *
 * Each command is a module of `cli/` listed in `cli/commands.ts`.
 *
 * @example Print the counts of a database as JSON
 * ```ts
 * import { main } from "@leased/outbox/cli";
 * import { Outbox } from "@leased/outbox";
 * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
 * import assert from "node:assert/strict";
 *
 * const dir = await Deno.makeTempDir();
 * {
 *   await using outbox = await Outbox.open(await openSqliteWasm(`${dir}/o.db`));
 *   await outbox.enqueue({ to: "ada@example.com" });
 * }
 * const lines: string[] = [];
 * const code = await main(["stats", `${dir}/o.db`, "--json"], {
 *   stdout: (line) => lines.push(line),
 * });
 * assert.equal(code, 0);
 * assert.equal(JSON.parse(lines[0]!).pending, 1);
 * await Deno.remove(dir, { recursive: true });
 * ```
 *
 * @module
 */
export { type CliIo, main } from "./cli/main.ts";
import { main } from "./cli/main.ts";

if (import.meta.main) Deno.exit(await main(Deno.args));
