/**
 * The database files this process has open through the `node:sqlite`
 * driver, by device and inode: native SQLite takes classic POSIX locks on
 * every system, and closing any other descriptor of such a file in this
 * process drops them. The CLI asks here before choosing its driver (see
 * `cli/open.ts`), and the Deno file VFS before it closes a descriptor
 * (`deno/inodes.ts`).
 *
 * @module
 */
import { statSync } from "node:fs";

const open = new Map<string, number>();
let closing: (() => void) | undefined;

function key(dev: number | bigint, ino: number | bigint): string {
  return `${dev}:${ino}`;
}

/** Counts a connection to the file with device `dev` and inode `ino`. */
export function openedNodeSqlite(dev: number, ino: number): void {
  const at = key(dev, ino);
  open.set(at, (open.get(at) ?? 0) + 1);
}

/**
 * Forgets one connection counted by {@linkcode openedNodeSqlite}, closed
 * now (its locks let go), and says so to the listener.
 */
export function closedNodeSqlite(dev: number, ino: number): void {
  const at = key(dev, ino);
  const left = (open.get(at) ?? 0) - 1;
  if (left > 0) open.set(at, left);
  else open.delete(at);
  closing?.();
}

/** Whether a connection of this driver has the file `id` names open. */
export function nodeSqliteHasOpenFile(
  id: { readonly dev: number | bigint; readonly ino: number | bigint },
): boolean {
  return open.size > 0 && open.has(key(id.dev, id.ino));
}

/**
 * Has `listener` called after each close of a connection of this driver
 * (the Deno file VFS's, which may close descriptors it kept for it).
 */
export function whenNodeSqliteCloses(listener: () => void): void {
  closing = listener;
}

/**
 * Whether a `node:sqlite` connection of this driver has the file `path`
 * names open in this process (a file it cannot stat: `false`).
 */
export function nodeSqliteHasOpen(path: string | URL): boolean {
  const now = statSync(path, { throwIfNoEntry: false });
  return now !== undefined && open.has(key(now.dev, now.ino));
}
