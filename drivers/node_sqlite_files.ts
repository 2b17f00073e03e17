/**
 * The database files this process has open through the `node:sqlite`
 * driver, by device and inode: native SQLite takes classic POSIX locks on
 * every system, and closing any other descriptor of such a file in this
 * process drops them. The CLI asks here before choosing its driver (see
 * `cli/open.ts`).
 *
 * @module
 */
import { statSync } from "node:fs";

const open = new Map<string, number>();

function key(dev: number, ino: number): string {
  return `${dev}:${ino}`;
}

/** Counts a connection to the file with device `dev` and inode `ino`. */
export function openedNodeSqlite(dev: number, ino: number): void {
  const at = key(dev, ino);
  open.set(at, (open.get(at) ?? 0) + 1);
}

/** Forgets one connection counted by {@linkcode openedNodeSqlite}. */
export function closedNodeSqlite(dev: number, ino: number): void {
  const at = key(dev, ino);
  const left = (open.get(at) ?? 0) - 1;
  if (left > 0) open.set(at, left);
  else open.delete(at);
}

/**
 * Whether a `node:sqlite` connection of this driver has the file `path`
 * names open in this process (a file it cannot stat: `false`).
 */
export function nodeSqliteHasOpen(path: string | URL): boolean {
  const now = statSync(path, { throwIfNoEntry: false });
  return now !== undefined && open.has(key(now.dev, now.ino));
}
