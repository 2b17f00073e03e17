/** The import graph of the library's own modules has no cycle. */
import assert from "node:assert/strict";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
// What is not the library: its tests, benchmarks, examples, demo, scripts.
const OUTSIDE = new Set([
  "tests",
  "bench",
  "examples",
  "demo",
  "scripts",
  "node_modules",
  ".scratch",
  ".git",
]);

async function libraryFiles(dir = ROOT): Promise<string[]> {
  const files: string[] = [];
  for await (const entry of Deno.readDir(dir)) {
    const path = join(dir, entry.name);
    if (entry.isDirectory) {
      if (!OUTSIDE.has(entry.name)) files.push(...await libraryFiles(path));
    } else if (entry.name.endsWith(".ts") && path !== join(ROOT, "demo.ts")) {
      files.push(path);
    }
  }
  return files;
}

// `import … from "x"`, `export … from "x"` (type-only ones too: a cycle of
// types is a cycle of what the files mean), `import "x"` and `import("x")`.
const SPECIFIER =
  /(?:^|[\s;])(?:import|export)\s(?:[^'";]*?\sfrom\s*)?["']([^"']+)["']|import\(\s*["']([^"']+)["']\s*\)/g;

/** The relative imports of a module's source, resolved to paths. */
export function relativeImports(path: string, source: string): string[] {
  // Comments hold examples (`import { Outbox } from "@leased/outbox"`) and
  // prose, not imports.
  const code = source.replace(/\/\*[\s\S]*?\*\//g, "").replace(
    /(^|[^:"'`])\/\/.*$/gm,
    "$1",
  );
  const found = new Set<string>();
  for (const match of code.matchAll(SPECIFIER)) {
    const specifier = match[1] ?? match[2]!;
    if (specifier.startsWith("./") || specifier.startsWith("../")) {
      found.add(join(dirname(path), specifier));
    }
  }
  return [...found];
}

/** Every cycle's first occurrence found by a depth-first walk, as paths. */
export function cycles(graph: ReadonlyMap<string, string[]>): string[][] {
  const found: string[][] = [];
  const state = new Map<string, "open" | "done">();
  const stack: string[] = [];
  const visit = (node: string) => {
    state.set(node, "open");
    stack.push(node);
    for (const next of graph.get(node) ?? []) {
      if (state.get(next) === "open") {
        found.push([...stack.slice(stack.indexOf(next)), next]);
      } else if (!state.has(next)) {
        visit(next);
      }
    }
    stack.pop();
    state.set(node, "done");
  };
  for (const node of [...graph.keys()].sort()) {
    if (!state.has(node)) visit(node);
  }
  return found;
}

Deno.test("no library module imports itself back through its imports, type imports included", async () => {
  const graph = new Map<string, string[]>();
  for (const path of await libraryFiles()) {
    graph.set(
      relative(ROOT, path),
      relativeImports(path, await Deno.readTextFile(path))
        .filter((target) => target.endsWith(".ts"))
        .map((target) => relative(ROOT, target)),
    );
  }
  assert.ok(graph.has("lease.ts") && graph.has("core/transaction.ts"));
  assert.deepEqual(
    cycles(graph).map((cycle) => cycle.join(" -> ")),
    [],
  );
});

Deno.test("the import walk sees type imports, re-exports and dynamic imports, and finds a cycle of two", () => {
  const source = `import type { A } from "./a.ts";
export { B } from "../b.ts";
export * from "./c.ts";
const d = await import("./d.ts");
import "./e.ts";
// import { F } from "./f.ts";
/** @example import { G } from "./g.ts"; */
import { H } from "npm:h";`;
  assert.deepEqual(relativeImports("/x/y/m.ts", source), [
    "/x/y/a.ts",
    "/x/b.ts",
    "/x/y/c.ts",
    "/x/y/d.ts",
    "/x/y/e.ts",
  ]);
  assert.deepEqual(
    cycles(
      new Map([["a", ["b"]], ["b", ["c", "a"]], ["c", []]]),
    ),
    [["a", "b", "a"]],
  );
});
