/** Payloads JSON would silently change are refused before any SQL. */
import assert from "node:assert/strict";
import { Outbox } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";

Deno.test("enqueue() refuses an array with a named property, which JSON drops", async () => {
  await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
  const items: number[] & { total?: number } = [1, 2];
  items.total = 3;
  await assert.rejects(
    outbox.enqueue({ items }),
    (error) =>
      error instanceof TypeError &&
      error.message.includes("'payload.items' must be JSON data") &&
      error.message.includes("without named properties"),
  );
  assert.equal((await outbox.stats()).pending, 0);
});

/**
 * A value read once as `first` and as `second` at every read after, by a
 * getter (or a Proxy's trap): what is stored must be what was checked.
 */
function flipping(first: unknown, second: () => unknown) {
  let reads = 0;
  return () => reads++ === 0 ? first : second();
}

const cyclic = () => {
  const o: Record<string, unknown> = { a: 1 };
  o["self"] = o;
  return o;
};
const named = () => Object.assign([1, 2], { total: 3 });

// What each payload's first reads give (the payload that was checked),
// and the payload. Every later read gives something JSON would change or
// refuse.
const SECOND_READS: [string, unknown, () => unknown][] = [
  ["a getter: 1, then a cycle", { v: 1 }, () => {
    const read = flipping(1, cyclic);
    return {
      get v() {
        return read();
      },
    };
  }],
  ["a getter: 1, then a BigInt", { v: 1 }, () => {
    const read = flipping(1, () => 1n);
    return {
      get v() {
        return read();
      },
    };
  }],
  ["a getter: [1], then an array with a named property", { v: [1] }, () => {
    const read = flipping([1], named);
    return {
      get v() {
        return read();
      },
    };
  }],
  ["a getter: 'x', then NaN", { v: "x" }, () => {
    const read = flipping("x", () => NaN);
    return {
      get v() {
        return read();
      },
    };
  }],
  ["a getter: 'x', then a Date", { v: "x" }, () => {
    const read = flipping("x", () => new Date(0));
    return {
      get v() {
        return read();
      },
    };
  }],
  ["a getter: 'x', then 10,000 bytes", { v: "x" }, () => {
    const read = flipping("x", () => "y".repeat(10_000));
    return {
      get v() {
        return read();
      },
    };
  }],
  ["an array element's getter: 1, then undefined", [1, 2], () => {
    const read = flipping(1, () => undefined);
    const array = [0, 2];
    Object.defineProperty(array, 0, { get: read, enumerable: true });
    return array;
  }],
  ["a Proxy's get: 1, then a Map", { v: 1 }, () => {
    const read = flipping(1, () => new Map([[1, 2]]));
    return new Proxy({ v: 0 }, {
      get: (_, key) => key === "v" ? read() : undefined,
    });
  }],
  ["a Proxy array's get: 1, then a function", [1], () => {
    const read = flipping(1, () => () => 1);
    return new Proxy([0], {
      get: (target, key) => key === "0" ? read() : Reflect.get(target, key),
    });
  }],
  ["a Proxy's ownKeys: ['a'], then ['a', 'b'] with b NaN", { a: 1 }, () => {
    const keys = flipping(["a"], () => ["a", "b"]);
    return new Proxy({ a: 1, b: NaN }, {
      ownKeys: () => keys() as string[],
    });
  }],
];

for (const [name, checked, make] of SECOND_READS) {
  Deno.test(`enqueue() stores what it checked or refuses, never a second read it did not check: ${name}`, async () => {
    await using outbox = await Outbox.open(await openSqliteWasm(":memory:"), {
      maxPayloadBytes: 1_000,
    });
    let refused: unknown;
    try {
      await outbox.enqueue(make());
    } catch (error) {
      refused = error;
    }
    if (refused !== undefined) {
      assert.ok(
        refused instanceof TypeError || refused instanceof RangeError,
        String(refused),
      );
      assert.equal((await outbox.stats()).pending, 0);
      return;
    }
    const [lease] = await outbox.claim({ max: 1 });
    assert.deepEqual(lease?.payload, checked);
  });
}

// The checked copy is what is stored: a member named __proto__ must stay a
// member of it. Deno has no __proto__ accessor, so this holds here without
// core/payload.ts's care; a browser's worker and Node have one.
Deno.test("enqueue() stores an own member named __proto__ (as JSON.parse makes one) as a member", async () => {
  await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
  const payload = JSON.parse('{"__proto__": {"a": 1}, "b": 2}');
  await outbox.enqueue(payload);
  const [lease] = await outbox.claim({ max: 1 });
  const back = lease?.payload as Record<string, unknown>;
  assert.deepEqual(Object.keys(back), ["__proto__", "b"]);
  assert.deepEqual(Object.getOwnPropertyDescriptor(back, "__proto__")?.value, {
    a: 1,
  });
  assert.equal(Object.getPrototypeOf(back), Object.prototype);
});
