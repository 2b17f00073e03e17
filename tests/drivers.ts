/** The table of drivers every contract test runs against. */
import type { Driver } from "../driver.ts";
import { openSqliteWasm } from "../sqlite_wasm.ts";

/** Two or more connections to one fresh database. */
export interface Connections {
  readonly drivers: readonly Driver[];
  close(): Promise<void>;
}

/** One row of the table. */
export interface DriverCase {
  readonly name: string;
  open(): Promise<Connections>;
}

export const DRIVERS: readonly DriverCase[] = [
  {
    name: "wasm memory",
    async open() {
      const name = `file:/${crypto.randomUUID()}?vfs=memdb`;
      const drivers = [await openSqliteWasm(name), await openSqliteWasm(name)];
      return {
        drivers,
        close: async () =>
          void await Promise.all(drivers.map((d) => d.close())),
      };
    },
  },
];
