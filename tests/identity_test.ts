/** Event identities: UUIDv7 text, its format, order and validation. */
import assert from "node:assert/strict";
import { isIdentity, uuidv7, uuidv7Time } from "../mod.ts";

const V7 =
  /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

Deno.test("uuidv7() writes RFC 9562's layout: 48-bit milliseconds, version 7, variant 10", () => {
  const identity = uuidv7(0x0190_b2c4_7d3e);
  assert.match(identity, V7);
  assert.equal(identity.slice(0, 13), "0190b2c4-7d3e");
  assert.equal(uuidv7Time(identity), 0x0190_b2c4_7d3e);
});

Deno.test("uuidv7() identities minted in one process sort in minting order, within one millisecond and when the clock steps back", () => {
  const minted = [];
  for (let i = 0; i < 10_000; i++) minted.push(uuidv7(2_000_000_000_000));
  for (let i = 0; i < 100; i++) minted.push(uuidv7(1_000_000_000_000));
  minted.push(uuidv7(2_000_000_000_500));
  assert.deepEqual([...minted].sort(), minted);
  assert.equal(new Set(minted).size, minted.length);
  for (const identity of minted) assert.match(identity, V7);
  // 10,100 in one millisecond overflow the 12-bit counter: the timestamp
  // moves on a millisecond at a time, never back.
  assert.ok(uuidv7Time(minted.at(-2)!) >= 2_000_000_000_000);
  assert.ok(uuidv7Time(minted.at(-2)!) <= 2_000_000_000_010);
  assert.equal(uuidv7Time(minted.at(-1)!), 2_000_000_000_500);
});

Deno.test("uuidv7() draws 74 random bits: identities minted in one millisecond differ beyond the counter", () => {
  const tails = new Set<string>();
  for (let i = 0; i < 1_000; i++) {
    tails.add(uuidv7(3_000_000_000_000).slice(19));
  }
  assert.equal(tails.size, 1_000);
});

Deno.test("uuidv7() refuses a time before 1970, NaN or Infinity, naming the field, and mints well-formed text after", () => {
  for (const bad of [-5, -0.5, NaN, Infinity, "1" as unknown as number]) {
    assert.throws(
      () => uuidv7(bad),
      (error) =>
        error instanceof (typeof bad === "number" ? RangeError : TypeError) &&
        error.message.includes("'unixMs' must be a finite number"),
      String(bad),
    );
  }
  assert.match(uuidv7(0), V7);
  // Across refills of the pool of random bytes (400 identities each).
  const minted = Array.from({ length: 1_201 }, () => uuidv7(4_000_000_000_000));
  for (const identity of minted) assert.match(identity, V7);
  assert.equal(new Set(minted).size, minted.length);
});

Deno.test("isIdentity() takes canonical lowercase UUID text of any version and nothing else", () => {
  assert.equal(isIdentity("3f2b8c1e-9a4d-4e6f-b1c2-d3e4f5a6b7c8"), true);
  assert.equal(isIdentity(crypto.randomUUID()), true);
  assert.equal(isIdentity("00000000-0000-0000-0000-000000000000"), true);
  for (
    const value of [
      "3F2B8C1E-9A4D-4E6F-B1C2-D3E4F5A6B7C8",
      "3f2b8c1e9a4d4e6fb1c2d3e4f5a6b7c8",
      "urn:uuid:3f2b8c1e-9a4d-4e6f-b1c2-d3e4f5a6b7c8",
      " 3f2b8c1e-9a4d-4e6f-b1c2-d3e4f5a6b7c8",
      "3f2b8c1e-9a4d-4e6f-b1c2-d3e4f5a6b7c8\n",
      "",
      null,
      42,
    ]
  ) {
    assert.equal(isIdentity(value), false, String(value));
  }
});

Deno.test("uuidv7Time() refuses text that is not a UUIDv7, naming the field", () => {
  assert.throws(
    () => uuidv7Time("3f2b8c1e-9a4d-4e6f-b1c2-d3e4f5a6b7c8"),
    new TypeError(
      `Cannot read the time as 'identity' must be UUIDv7 text: current value is "3f2b8c1e-9a4d-4e6f-b1c2-d3e4f5a6b7c8"`,
    ),
  );
});
