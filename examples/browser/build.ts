/**
 * Builds the browser bundle: `browser.js` (the public entry),
 * `browser_worker.js` (the database worker), `app.js` (the example page),
 * and beside them the files the SQLite WASM build loads relative to itself,
 * `sqlite3.wasm` and `sqlite3-opfs-async-proxy.js`.
 *
 * Run with `deno task build:browser`; the browser tests and the benchmark
 * call {@linkcode buildBrowser} themselves, so a clean clone needs no step.
 *
 * @module
 */
import { fileURLToPath as fromFileUrl } from "node:url";

const root = new URL("../../", import.meta.url);

/** The entry points of the bundle, relative to the repository root. */
export const ENTRIES: readonly string[] = [
  "browser/outbox.ts",
  "browser/worker.ts",
  "examples/browser/app.ts",
];

/**
 * The bundles' names where they differ from their entry's: the public entry
 * and its worker, which the entry loads by that name from beside itself.
 */
const BUNDLE_NAMES: Readonly<Record<string, string>> = {
  "browser/outbox.ts": "browser.js",
  "browser/worker.ts": "browser_worker.js",
};

/**
 * Bundles `entries` for the browser into `outDir` and copies the SQLite WASM
 * files next to them.
 *
 * @param outDir The output directory, created when missing.
 * @param entries Entry points relative to the repository root.
 * @returns `outDir`.
 * @throws {Error} When `deno bundle` fails, with its output.
 */
export async function buildBrowser(
  outDir: URL = new URL("build/", import.meta.url),
  entries: readonly string[] = ENTRIES,
): Promise<URL> {
  await Deno.mkdir(outDir, { recursive: true });
  // One run per entry: given several, the bundler mirrors their directories.
  // One at a time: concurrent first runs race to install the bundler's
  // esbuild binary into an empty Deno cache and one of them fails.
  for (const entry of entries) {
    const name = BUNDLE_NAMES[entry] ??
      entry.split("/").pop()!.replace(/\.ts$/, ".js");
    const { code, stderr } = await new Deno.Command(Deno.execPath(), {
      args: [
        "bundle",
        "--quiet",
        "--platform",
        "browser",
        "--output",
        fromFileUrl(new URL(name, outDir)),
        fromFileUrl(new URL(entry, root)),
      ],
      cwd: fromFileUrl(root),
      stdout: "null",
      stderr: "piped",
    }).output();
    if (code !== 0) {
      throw new Error(
        `deno bundle ${entry} failed:\n${new TextDecoder().decode(stderr)}`,
      );
    }
  }
  // The bundler cannot see these: the module fetches them at run time from
  // `new URL(name, import.meta.url)`, i.e. next to the bundle.
  for (const file of ["sqlite3.wasm", "sqlite3-opfs-async-proxy.js"]) {
    await Deno.copyFile(await packageFile(file), new URL(file, outDir));
  }
  return outDir;
}

async function packageFile(name: string): Promise<URL> {
  const resolved = import.meta.resolve("@sqlite.org/sqlite-wasm/sqlite3.wasm");
  if (!resolved.startsWith("file:")) {
    throw new Error(
      `Cannot find the @sqlite.org/sqlite-wasm package files: resolved to ${resolved}`,
    );
  }
  const url = new URL(name, resolved);
  await Deno.stat(url);
  return url;
}

if (import.meta.main) {
  const outDir = await buildBrowser();
  console.log(`Built ${ENTRIES.length} bundles into ${fromFileUrl(outDir)}`);
}
