import { Outbox } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
const cases: [string, () => unknown][] = [
  ["-0", () => ({ x: -0 })],
  ["top -0", () => -0],
  ["array extra prop", () => { const a: unknown[] & { extra?: number } = [1, 2]; a.extra = 3; return { a }; }],
  ["non-enumerable", () => Object.defineProperty({ a: 1 }, "hidden", { value: 2, enumerable: false })],
  ["getter changes", () => { let n = 0; return { get g() { n++; return n === 1 ? 1 : NaN; } }; }],
  ["__proto__ own", () => Object.defineProperty({}, "__proto__", { value: { a: 1 }, enumerable: true, configurable: true, writable: true })],
  ["inherited toJSON via null proto", () => { const o = Object.create(null); o.a = 1; return o; }],
  ["Buffer", () => new Uint8Array(new ArrayBuffer(16), 4, 4).fill(7)],
  ["array toJSON own", () => { const a: any = [1]; a.toJSON = () => "x"; return a; }],
  ["lone surrogate", () => ({ s: "\ud800" })],
  ["proxy array", () => new Proxy([1,2], {})],
  ["proxy obj getOwnKeys lies", () => new Proxy({ a: 1 }, { ownKeys: () => ["a", "b"], getOwnPropertyDescriptor: (_t, k) => ({ value: k === "a" ? 1 : 2, enumerable: true, configurable: true }) })],
  ["string top", () => "hello"],
  ["number key order", () => ({ b: 1, 2: 2, 1: 3 })],
];
for (const [name, make] of cases) {
  const p = make();
  try {
    await outbox.enqueue(p as never, { type: "t" } as never).catch(async (e) => { throw e; });
  } catch (e) {
    try { await outbox.enqueue(p as never); } catch (e2) { console.log(name, "REFUSED", (e2 as Error).message.slice(0, 120)); continue; }
  }
  const l = await outbox.claim({ leaseMs: 1000 });
  const back = l?.payload;
  console.log(name, "ACCEPTED ->", back instanceof Uint8Array ? back : JSON.stringify(back), Object.is((back as any)?.x, -0) ? "(-0 kept)" : "", back === -0 ? "top -0 kept" : "");
  if (l) await outbox.acknowledge(l);
}
