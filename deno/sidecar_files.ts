/**
 * The journal and WAL files beside each database, as the Deno file VFS
 * keeps track of them: where each was last seen, whether Deno's permission
 * for them may be taken as granted, and opening them.
 *
 * @module
 */
import { type Libc, LibcError } from "./libc.ts";
import type { DatabaseFile } from "./vfs_files.ts";
import {
  permissionBits,
  statIfPresent,
  takeDatabaseMode,
} from "./file_access.ts";

/** One VFS's bookkeeping of the files beside its databases. */
export class SidecarFiles {
  /**
   * Whether each journal, WAL or probed path was on disk when this VFS last
   * looked: SQLite probes the same few paths on every transaction, and
   * guessing right saves a system call (a wrong guess costs one more).
   */
  readonly #seen = new Map<string, boolean>();
  /**
   * Each database path's open connections, and how many of them Deno's
   * permissions let read and write its journal and WAL file when they
   * opened. In rollback mode SQLite opens the journal at every write
   * transaction (and deletes it, in DELETE mode), and asking Deno again
   * each time cost more than the open: while every open connection to the
   * database had that permission, the journal's opens and deletes do not
   * ask again, and the permission lasts as long as they do, as the
   * database's own does. A connection opened without it (after a
   * revocation, or read-only) has every journal open ask.
   */
  readonly #connections = new Map<string, { open: number; granted: number }>();
  readonly #granted = new Set<DatabaseFile>();

  /**
   * A connection to `database` opened; `granted`: whether Deno's
   * permissions let it read and write the database's journal and WAL file.
   */
  opened(database: DatabaseFile, granted: boolean): void {
    const entry = this.#connections.get(database.path) ??
      { open: 0, granted: 0 };
    this.#connections.set(database.path, entry);
    entry.open++;
    if (granted) {
      this.#granted.add(database);
      entry.granted++;
    }
  }

  /** A connection to `database` closed. */
  closed(database: DatabaseFile): void {
    const entry = this.#connections.get(database.path)!;
    entry.open--;
    if (this.#granted.delete(database)) entry.granted--;
    if (entry.open === 0) this.#connections.delete(database.path);
  }

  /**
   * Whether the journal or WAL file `path` of a database may be opened (or
   * deleted) without asking Deno's permissions: every open connection to
   * the database had them.
   */
  granted(path: string): boolean {
    const suffix = /-(journal|wal)$/.exec(path)?.[0];
    const entry = suffix === undefined
      ? undefined
      : this.#connections.get(path.slice(0, -suffix.length));
    return entry !== undefined && entry.granted === entry.open;
  }

  /** What the VFS saw of `path` last: there or not. */
  seen(path: string, present: boolean): void {
    this.#seen.set(path, present);
  }

  /**
   * Opens (creating if need be) a journal or WAL file and tells whether
   * this call created it, which decides the directory fsync: in one system
   * call when the file is where it was last time (there in TRUNCATE and
   * PERSIST mode, deleted in DELETE mode), in two when that guess is wrong.
   * A new one gets the database's permission bits from the start (no
   * moment at the umask's, when another user could open it).
   */
  openJournal(
    libc: Libc,
    path: string,
    database: string | undefined,
  ): [number, boolean] {
    const seen = this.#seen;
    for (let attempt = 0;; attempt++) {
      if (seen.get(path) !== false) {
        try {
          const fd = libc.open(path, {
            write: true,
            create: false,
            createNew: false,
            noFollow: true,
          });
          seen.set(path, true);
          return [fd, false];
        } catch (error) {
          if (
            !(error instanceof LibcError && error.code === "ENOENT") ||
            attempt > 2
          ) {
            throw error;
          }
        }
      }
      const db = database === undefined ? undefined : statIfPresent(database);
      try {
        const fd = libc.open(path, {
          write: true,
          create: true,
          createNew: true,
          noFollow: true,
          permissions: permissionBits(db),
        });
        seen.set(path, true);
        takeDatabaseMode(libc, fd, db);
        return [fd, true];
      } catch (error) {
        if (
          !(error instanceof LibcError && error.code === "EEXIST") ||
          attempt > 2
        ) {
          throw error;
        }
      }
      // Created or deleted by another connection in between: look again.
      seen.set(path, true);
    }
  }
}
