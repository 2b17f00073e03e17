/**
 * Leases a leader tab leaves behind as it goes (closing, reloading, frozen,
 * or into the back-forward cache), kept in the origin's `localStorage` until
 * the next leader releases them. `pagehide` and `freeze` listeners cannot
 * wait for anything, and the tab's database worker may be ended before it
 * reads a last message; a synchronous `localStorage` write survives both,
 * and reaches the next leader whether it is another tab or this page
 * reloaded.
 *
 * @module
 */

/** What a release needs of a lease (its payload stays out of storage). */
export interface LeftLease {
  readonly eventId: number;
  readonly token: string;
  readonly fence: number;
}

// The slice of the Storage API used here (absent from Deno's own lib).
interface KeyValueStorage {
  readonly length: number;
  key(index: number): string | null;
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
  removeItem(key: string): void;
}

function storage(): KeyValueStorage | undefined {
  try {
    return (globalThis as { localStorage?: KeyValueStorage }).localStorage;
  } catch {
    // A sandboxed page or blocked storage throws on access.
    return undefined;
  }
}

/** The leases left behind by the tabs of one shared outbox. */
export class LeftLeases {
  readonly #prefix: string;

  /**
   * Keeps the left leases of the outbox `name`.
   *
   * @param name The outbox name.
   */
  constructor(name: string) {
    this.#prefix = `leased-outbox:${name}:left:`;
  }

  /**
   * Records the leases tab `tab` leaves behind (added to any it left
   * before). Synchronous, for `pagehide` and `freeze`.
   *
   * @param tab The departing tab's id.
   * @param leases Its unfinished leases.
   * @returns Whether they were recorded (there is a `localStorage`).
   */
  leave(tab: string, leases: readonly LeftLease[]): boolean {
    const store = storage();
    if (store === undefined || leases.length === 0) return false;
    const key = this.#prefix + tab;
    try {
      const before = parse(store.getItem(key));
      store.setItem(
        key,
        JSON.stringify([
          ...before,
          ...leases.map(({ eventId, token, fence }) => ({
            eventId,
            token,
            fence,
          })),
        ]),
      );
      return true;
    } catch {
      // Storage full or blocked: the leases lapse at their deadline.
      return false;
    }
  }

  /**
   * Takes every lease any tab left behind, removing them from storage, so
   * that each is released once.
   *
   * @returns The leases.
   */
  take(): LeftLease[] {
    const store = storage();
    if (store === undefined) return [];
    const keys: string[] = [];
    for (let i = 0; i < store.length; i++) {
      const key = store.key(i);
      if (key?.startsWith(this.#prefix)) keys.push(key);
    }
    const leases: LeftLease[] = [];
    for (const key of keys) {
      leases.push(...parse(store.getItem(key)));
      store.removeItem(key);
    }
    return leases;
  }

  /**
   * Calls `listener` when another tab leaves leases behind (the `storage`
   * event), where there is a page.
   *
   * @param listener Called with no arguments; {@linkcode LeftLeases.take}
   * them.
   * @returns A function that stops listening.
   */
  watch(listener: () => void): () => void {
    if (typeof globalThis.addEventListener !== "function") return () => {};
    const onStorage = (event: Event) => {
      const { key, newValue } = event as Event & {
        key?: string | null;
        newValue?: string | null;
      };
      if (key?.startsWith(this.#prefix) && newValue) listener();
    };
    globalThis.addEventListener("storage", onStorage);
    return () => globalThis.removeEventListener("storage", onStorage);
  }
}

function parse(text: string | null): LeftLease[] {
  if (text === null) return [];
  try {
    const value = JSON.parse(text);
    return Array.isArray(value) ? value : [];
  } catch {
    return [];
  }
}
