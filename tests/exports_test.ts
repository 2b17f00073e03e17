/**
 * No public name is lost: every name each `deno.json` export gave at
 * 1f584e1 (before the redesign) is still exported by that entry, as the
 * same kind of declaration. The list (tests/fixtures/exports_1f584e1.json)
 * was generated once with `deno doc --json` on each entry of a checkout of
 * 1f584e1.
 */
import assert from "node:assert/strict";

const root = new URL("../", import.meta.url);

interface DocNode {
  readonly name: string;
  readonly declarations: readonly {
    readonly kind: string;
    readonly declarationKind: string;
  }[];
}

/** The names an entry exports, each with the kinds of its declarations. */
async function exported(path: string): Promise<Map<string, string[]>> {
  const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
    args: ["doc", "--json", path],
    cwd: root,
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(code, 0, new TextDecoder().decode(stderr));
  const doc = JSON.parse(new TextDecoder().decode(stdout)) as {
    nodes: Record<string, { symbols: DocNode[] }>;
  };
  const file = new URL(path, root).href;
  const symbols = doc.nodes[file]?.symbols;
  assert.ok(symbols !== undefined, `no symbols for ${file}`);
  // deno doc also lists the private declarations an export refers to.
  return new Map(
    symbols.flatMap((symbol) => {
      const kinds = symbol.declarations
        .filter((d) => d.declarationKind === "export")
        .map((d) => d.kind);
      return kinds.length === 0
        ? []
        : [[symbol.name, [...new Set(kinds)].sort()] as const];
    }),
  );
}

const config = JSON.parse(
  await Deno.readTextFile(new URL("deno.json", root)),
) as { exports: Record<string, string> };
const before = JSON.parse(
  await Deno.readTextFile(
    new URL("./fixtures/exports_1f584e1.json", import.meta.url),
  ),
) as { exports: Record<string, Record<string, string[]>> };

for (const [entry, names] of Object.entries(before.exports)) {
  Deno.test(`every name the '${entry}' export gave at 1f584e1 is still exported, as the same kind`, async () => {
    const path = config.exports[entry];
    assert.ok(path !== undefined, `deno.json lost the '${entry}' export`);
    const now = await exported(path);
    const lost = Object.keys(names).filter((name) => !now.has(name));
    assert.deepEqual(lost, [], `'${entry}' lost names`);
    for (const [name, kinds] of Object.entries(names)) {
      assert.deepEqual(now.get(name), kinds, `'${entry}' ${name}`);
    }
  });
}
