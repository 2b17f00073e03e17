/**
 * What one look at this process's locks costs (deno/proc_locks.ts): the
 * `fdinfo` of its descriptors (list `/proc/self/fd`, fstat each, read the
 * `fdinfo` of those on the file asked) against what the readers did before,
 * one read of `/proc/locks` (the lock audit's) and up to eight (the
 * descriptor sweep's, while the listing is longer than a page), with 50 and 500
 * descriptors open, and with `/proc/locks` as the machine has it and
 * lengthened past two pages by tests/fixtures/vfs_locks.ts's churn.
 * Alternating blocks (bench/blocks.ts); microseconds per look, wall time
 * (median of 15 blocks of 200 looks) and in parentheses this process's CPU
 * time, user and system (median of the blocks), less swayed by the load.
 *
 *     deno run -A --lock=deno.lock bench/own_locks_cost.ts
 *
 * @module
 */
import { bindLibc, F_RDLCK, type Libc } from "../deno/libc.ts";
import { platformFor } from "../deno/platform.ts";
import { classicLocks } from "../deno/proc_locks.ts";
import { startLockChurn } from "../tests/fixtures/vfs_locks.ts";
import { alternateAll } from "./blocks.ts";
import { median } from "./table.ts";
import process from "node:process";

const LOOKS = 200;
const libc = bindLibc(platformFor(Deno.build.os, Deno.build.arch), "posix");
const dir = await Deno.makeTempDir({ prefix: "own_locks_cost_" });
const path = `${dir}/locked`;
Deno.writeFileSync(path, new Uint8Array(1));
const mode = { write: false, create: false, createNew: false };
const locked = libc.open(path, mode);
if (!libc.setLock(locked, F_RDLCK, 100, 1)) throw new Error("not locked");
const id = libc.fileId(locked);
// The other descriptors' file (the asked file's fdinfo is read for each
// descriptor of it: 13 µs each here).
const other = `${dir}/other`;
Deno.writeFileSync(other, new Uint8Array(1));

/**
 * The readers before: /proc/locks through libc, a page per read; a listing
 * longer than a page read again, up to `reads` times.
 */
function procLocksHasClassic(libc: Libc, reads: number): boolean {
  const pid = ` ${Deno.pid} `;
  let found = false;
  const chunk = new Uint8Array(65_536);
  const decoder = new TextDecoder();
  for (let read = 0; read < reads; read++) {
    const fd = libc.open("/proc/locks", mode);
    let text = "";
    let length = 0;
    try {
      for (;;) {
        const n = libc.read(fd, chunk, length);
        if (n === 0) break;
        length += n;
        text += decoder.decode(chunk.subarray(0, n), { stream: true });
      }
    } finally {
      libc.close(fd);
    }
    for (const line of text.split("\n")) {
      if (line.includes(" POSIX ") && line.includes(pid)) found = true;
    }
    if (length <= 4096) break;
  }
  return found;
}

/** Looks that missed the lock, by side. */
const misses = [0, 0, 0];
/** Each side's CPU time (user and system) per look in each block, in µs. */
const cpu: number[][] = [[], [], []];
const side = (look: () => boolean, index: number) => ({
  block() {
    const before = process.cpuUsage();
    for (let i = 0; i < LOOKS; i++) if (!look()) misses[index]!++;
    const { user, system } = process.cpuUsage(before);
    cpu[index]!.push((user + system) / LOOKS);
    return Promise.resolve(LOOKS);
  },
});
const sides = [
  side(() => classicLocks(libc)!(id), 0),
  side(() => procLocksHasClassic(libc, 1), 1),
  side(() => procLocksHasClassic(libc, 8), 2),
];

const extra: Deno.FsFile[] = [];
const descriptors = () => [...Deno.readDirSync("/proc/self/fd")].length - 1;
const rows: string[] = [];
for (const churned of [false, true]) {
  const churn = churned ? await startLockChurn(dir) : undefined;
  try {
    for (const open of [50, 500]) {
      while (descriptors() > open && extra.length > 0) extra.pop()!.close();
      while (descriptors() < open) extra.push(Deno.openSync(other));
      const listing = Deno.readTextFileSync("/proc/locks").length;
      for (const times of cpu) times.length = 0;
      const { blockRates } = await alternateAll(sides, 2, 15);
      const cells = blockRates.map((rates, i) => {
        const wall = 1e6 / median(rates);
        return `${wall.toFixed(0)} (${median(cpu[i]!.slice(2)).toFixed(0)})`;
      });
      rows.push(
        `| ${descriptors()} | ${listing} B${churned ? " (churned)" : ""} | ${
          cells.join(" | ")
        } |`,
      );
    }
  } finally {
    await churn?.[Symbol.asyncDispose]();
  }
}
for (const file of extra) file.close();
libc.close(locked);
await Deno.remove(dir, { recursive: true });
console.log(`load: ${Deno.loadavg().map((l) => l.toFixed(2)).join(" ")}`);
console.log(
  "| descriptors | /proc/locks | fdinfo look | /proc/locks, 1 read (the audit's) | until a page or 8 reads (the sweep's) |",
);
console.log("|---|---|---|---|---|");
console.log(rows.join("\n"));
console.log(`looks that missed the lock: ${misses.join(", ")}`);
