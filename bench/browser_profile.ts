/**
 * Where a claim+acknowledge cycle of the browser outbox spends its time
 * (issue 37's browser row): in headless Chromium, through the worker as
 * `bench/browser_bench.ts` runs it, it prints
 *
 * - the page's cycles per second, the same cycles run inside the worker
 *   (`bench/browser_cycles_worker.ts`: no message per call; the difference
 *   per cycle is the messaging's), and the round trip of a call that does
 *   no work (`hasVfs`), each over a block of cycles;
 * - the OPFS sync access handle calls per cycle as the VFS makes them
 *   (counted and timed by wrapping `FileSystemSyncAccessHandle.prototype`
 *   in the worker, over the host's own wrappers: a WAL frame's header,
 *   which the host holds for its page, counts as a call); `--log` prints
 *   them for three cycles, `--strace` counts the renderers' system calls
 *   (`pwrite64` are the writes that reach OPFS) over the last block;
 * - with `--profile`, a CPU profile of the worker (Chrome DevTools Protocol)
 *   over one block, by function and by kind;
 * - with `--trace`, a Chrome trace of one block: per thread of every
 *   process, over the page's cycles, the tasks it ran and their time, and
 *   the time of structured clones, per cycle (`--save` keeps the trace).
 *
 * `deno run -A --lock=deno.lock bench/browser_profile.ts [--synchronous
 * normal] [--cycles 400] [--blocks 3] [--log] [--strace] [--profile] [--trace]
 * [--save profile.cpuprofile]` (`STRACE_ARGS` replaces `-c -S calls`).
 *
 * @module
 */
import { type CDPSession, chromium } from "npm:playwright-core@1.65.1";
import { buildBrowser, ENTRIES } from "../examples/browser/build.ts";
import { serveExample } from "../examples/browser/server.ts";
import {
  CHROMIUM_ARGS,
  CHROMIUM_PATH,
} from "../tests/fixtures/browser/chromium.ts";

const args = Deno.args;
const option = (name: string, fallback: string) => {
  const at = args.indexOf(name);
  return at === -1 ? fallback : args[at + 1]!;
};
const synchronous = option("--synchronous", "full");
const cycles = Number(option("--cycles", "400"));
const blocks = Number(option("--blocks", "3"));
const profile = args.includes("--profile");
const save = option("--save", "");
const trace = args.includes("--strace");
const chromeTrace = args.includes("--trace");

const fixturesDir = new URL("../tests/fixtures/browser/", import.meta.url);
const dir = await Deno.makeTempDir({ prefix: "outbox_browser_profile_" });
const buildDir = await buildBrowser(new URL(`file://${dir}/build/`), [
  ...ENTRIES,
  "bench/browser_cycles_worker.ts",
]);
const server = serveExample({ buildDir, fixturesDir });
const context = await chromium.launchPersistentContext(`${dir}/profile`, {
  executablePath: CHROMIUM_PATH,
  args: [...CHROMIUM_ARGS],
});

/** Wraps the sync access handle's methods: counts and time per method. */
function instrument() {
  const g = globalThis as unknown as {
    __ops: Record<string, { n: number; ms: number; bytes: number }>;
    __log?: string[];
    __handles: number;
    FileSystemSyncAccessHandle: { prototype: Record<string, unknown> };
  };
  g.__ops = {};
  g.__handles = 0;
  const proto = g.FileSystemSyncAccessHandle.prototype;
  for (const name of ["read", "write", "flush", "getSize", "truncate"]) {
    const original = proto[name] as (...a: unknown[]) => unknown;
    proto[name] = function (this: unknown, ...a: unknown[]) {
      const start = performance.now();
      try {
        return original.apply(this, a);
      } finally {
        const op = g.__ops[name] ??= { n: 0, ms: 0, bytes: 0 };
        op.n++;
        op.ms += performance.now() - start;
        const buffer = a[0] as { byteLength?: number } | undefined;
        if (buffer?.byteLength) op.bytes += buffer.byteLength;
        const at = (a[1] as { at?: number } | undefined)?.at;
        g.__log?.push(
          `${name} ${
            buffer?.byteLength ?? (typeof a[0] === "number" ? a[0] : "")
          }${at === undefined ? "" : ` @${at}`} ${(this as { __id?: number })
            .__id ??= ++g.__handles}`,
        );
      }
    };
  }
}

interface Sample {
  rate: number;
  inWorker: number;
  rtMs: number;
  ops: Record<string, { n: number; ms: number; bytes: number }>;
}

try {
  const page = await context.newPage();
  await page.goto(`${server.url}fixtures/blank.html`);
  await page.evaluate(async ({ synchronous, total }) => {
    const m = await import(["/build", "browser.js"].join("/"));
    const outbox = await m.openWorkerOutbox("profile", {
      synchronous,
      workerUrl: "/build/browser_cycles_worker.js",
    });
    (globalThis as unknown as { outbox: unknown }).outbox = outbox;
    for (let i = 0; i < total; i++) await outbox.enqueue({ i });
    for (let i = 0; i < 50; i++) {
      await outbox.acknowledge(await outbox.claim());
    }
  }, { synchronous, total: 50 + 2 * cycles * (blocks + 1) });
  const worker = page.workers()[0]!;
  await worker.evaluate(instrument);

  const block = async (): Promise<Sample> => {
    await worker.evaluate(() => {
      (globalThis as unknown as { __ops: unknown }).__ops = {};
    });
    const { rate, inWorker, rtMs } = await page.evaluate(async (cycles) => {
      // deno-lint-ignore no-explicit-any
      const outbox = (globalThis as any).outbox;
      const start = performance.now();
      performance.mark("cycles-start");
      for (let i = 0; i < cycles; i++) {
        await outbox.acknowledge(await outbox.claim());
      }
      performance.mark("cycles-end");
      const rate = cycles / ((performance.now() - start) / 1000);
      // The same cycles run inside the worker: no message per call.
      const inWorker = await outbox.invoke("cycles", [cycles]);
      // The round trip of a call that does no database work.
      const t = performance.now();
      for (let i = 0; i < cycles; i++) await outbox.invoke("hasVfs", ["x"]);
      return { rate, inWorker, rtMs: (performance.now() - t) / cycles };
    }, cycles);
    const ops = await worker.evaluate(() =>
      (globalThis as unknown as { __ops: Sample["ops"] }).__ops
    );
    return { rate, inWorker, rtMs, ops };
  };

  if (args.includes("--log")) {
    await worker.evaluate(() => {
      (globalThis as unknown as { __log: string[] }).__log = [];
    });
    await page.evaluate(async () => {
      // deno-lint-ignore no-explicit-any
      const outbox = (globalThis as any).outbox;
      for (let i = 0; i < 3; i++) {
        await outbox.acknowledge(await outbox.claim());
      }
    });
    console.log(
      (await worker.evaluate(() =>
        (globalThis as unknown as { __log: string[] }).__log
      )).join("\n"),
    );
    await worker.evaluate(() => {
      delete (globalThis as unknown as { __log?: string[] }).__log;
    });
  }
  const renderers = trace ? await rendererPids(`${dir}/profile`) : [];
  for (let b = 0; b < blocks; b++) {
    const strace = trace && b === blocks - 1
      ? new Deno.Command("strace", {
        args: [
          "-f",
          ...(Deno.env.get("STRACE_ARGS") ?? "-c -S calls").split(" "),
          ...renderers.flatMap((pid) => ["-p", String(pid)]),
        ],
        stderr: "piped",
        stdout: "null",
      }).spawn()
      : undefined;
    if (strace) await new Promise((resolve) => setTimeout(resolve, 1000));
    const { rate, inWorker, rtMs, ops } = await block();
    if (strace) {
      strace.kill("SIGINT");
      const { stderr } = await strace.output();
      console.log(new TextDecoder().decode(stderr));
    }
    // The calls of both runs of the block, the page's and the worker's.
    const perCycle = Object.entries(ops).map(([name, op]) =>
      `${name} ${(op.n / (2 * cycles)).toFixed(2)}/cycle ${
        (op.ms / (2 * cycles) * 1000).toFixed(0)
      } µs/cycle ${(op.bytes / Math.max(op.n, 1)).toFixed(0)} B/call`
    ).join("; ");
    console.log(
      `block ${b}: ${rate.toFixed(0)} cycles/s (${
        (1000 / rate).toFixed(3)
      } ms/cycle), inside the worker ${inWorker.toFixed(0)} cycles/s (${
        (1000 / inWorker).toFixed(3)
      } ms/cycle), no-op round trip ${rtMs.toFixed(3)} ms; ${perCycle}`,
    );
  }

  if (profile) {
    const cdp = await context.newCDPSession(page);
    const { send } = await attachWorker(cdp);
    await send("Profiler.enable");
    await send("Profiler.setSamplingInterval", { interval: 100 });
    await send("Profiler.start");
    const { rate } = await block();
    const { profile: cpu } = await send("Profiler.stop") as {
      profile: CpuProfile;
    };
    console.log(`profiled block: ${rate.toFixed(0)} cycles/s`);
    if (save) await Deno.writeTextFile(save, JSON.stringify(cpu));
    // Both runs of the block: the page's cycles and the worker's own.
    summarize(cpu, 2 * cycles);
  }

  if (chromeTrace) {
    const cdp = await context.newCDPSession(page);
    await cdp.send("Tracing.start", {
      traceConfig: {
        includedCategories: [
          "toplevel",
          "blink",
          "blink.user_timing",
          "disabled-by-default-devtools.timeline",
        ],
      },
      transferMode: "ReturnAsStream",
    });
    const { rate } = await block();
    const complete = new Promise<{ stream?: string }>((resolve) =>
      cdp.once("Tracing.tracingComplete", resolve)
    );
    await cdp.send("Tracing.end");
    const { stream } = await complete;
    let text = "";
    for (;;) {
      const chunk = await cdp.send("IO.read", { handle: stream! });
      text += chunk.base64Encoded ? atob(chunk.data) : chunk.data;
      if (chunk.eof) break;
    }
    console.log(`traced block: ${rate.toFixed(0)} cycles/s`);
    if (save) await Deno.writeTextFile(`${save}.trace.json`, text);
    summarizeTrace(JSON.parse(text), cycles);
  }
} finally {
  await context.close();
  await server.shutdown();
  await Deno.remove(dir, { recursive: true });
}

/** The renderer processes of the Chromium whose profile is `profile`. */
async function rendererPids(profile: string): Promise<number[]> {
  const ps = new TextDecoder().decode(
    (await new Deno.Command("ps", { args: ["-eo", "pid,ppid,args"] }).output())
      .stdout,
  ).trim().split("\n").slice(1).map((line) => {
    const [pid, ppid, ...rest] = line.trim().split(/\s+/);
    return { pid: Number(pid), ppid: Number(ppid), args: rest.join(" ") };
  });
  const browser = ps.find((p) =>
    p.args.includes(`--user-data-dir=${profile}`) && !p.args.includes("--type=")
  )!;
  const mine = new Set([browser.pid]);
  for (let changed = true; changed;) {
    changed = false;
    for (const p of ps) {
      if (!mine.has(p.pid) && mine.has(p.ppid)) {
        mine.add(p.pid);
        changed = true;
      }
    }
  }
  return ps.filter((p) => mine.has(p.pid) && p.args.includes("--type=renderer"))
    .map((p) => p.pid);
}

interface CpuNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}
interface CpuProfile {
  nodes: CpuNode[];
  samples: number[];
  timeDeltas: number[];
  startTime: number;
  endTime: number;
}

/** Self time by function and inclusive time of chosen frames, per cycle. */
function summarize(cpu: CpuProfile, cycles: number) {
  const byId = new Map(cpu.nodes.map((node) => [node.id, node]));
  const parent = new Map<number, number>();
  for (const node of cpu.nodes) {
    for (const child of node.children ?? []) parent.set(child, node.id);
  }
  const self = new Map<number, number>();
  for (let i = 0; i < cpu.samples.length; i++) {
    const dt = cpu.timeDeltas[i + 1] ?? 0;
    self.set(cpu.samples[i]!, (self.get(cpu.samples[i]!) ?? 0) + dt);
  }
  const total = (cpu.endTime - cpu.startTime) / 1000;
  const label = (node: CpuNode) => {
    const f = node.callFrame;
    const file = f.url.split("/").pop() ?? "";
    return `${f.functionName || "(anonymous)"} ${file}:${f.lineNumber + 1}`;
  };
  const bySelf = new Map<string, number>();
  const inclusive = new Map<string, number>();
  for (const [id, us] of self) {
    const node = byId.get(id)!;
    const name = label(node);
    bySelf.set(name, (bySelf.get(name) ?? 0) + us);
    const seen = new Set<string>();
    for (
      let at: number | undefined = id;
      at !== undefined;
      at = parent.get(at)
    ) {
      const each = label(byId.get(at)!);
      if (seen.has(each)) continue;
      seen.add(each);
      inclusive.set(each, (inclusive.get(each) ?? 0) + us);
    }
  }
  const per = (us: number) => `${(us / cycles).toFixed(1)} µs/cycle`;
  console.log(`profile: ${total.toFixed(0)} ms over ${cycles} cycles`);
  console.log("self time, top 40:");
  for (
    const [name, us] of [...bySelf].sort((a, b) => b[1] - a[1]).slice(0, 40)
  ) {
    console.log(`  ${per(us).padStart(18)}  ${name}`);
  }
  console.log("inclusive time, top 60:");
  for (
    const [name, us] of [...inclusive].sort((a, b) => b[1] - a[1]).slice(
      0,
      60,
    )
  ) {
    console.log(`  ${per(us).padStart(18)}  ${name}`);
  }
}

interface TraceEvent {
  name: string;
  ph: string;
  pid: number;
  tid: number;
  ts: number;
  dur?: number;
  cat?: string;
  args?: { name?: string };
}

/**
 * Per thread, over the page's cycles (between its `cycles-start` and
 * `cycles-end` marks): the tasks it ran and how long they took, and the
 * time of the structured clones (`SerializedScriptValueFactory`), per
 * cycle.
 */
function summarizeTrace(
  trace: { traceEvents: TraceEvent[] } | TraceEvent[],
  cycles: number,
) {
  const events = Array.isArray(trace) ? trace : trace.traceEvents;
  const names = new Map<string, string>();
  for (const e of events) {
    if (e.name === "thread_name") {
      names.set(`${e.pid}:${e.tid}`, e.args?.name ?? "");
    }
  }
  const mark = (name: string) =>
    events.find((e) => e.name === name && e.cat?.includes("user_timing"))
      ?.ts ?? NaN;
  const [from, to] = [mark("cycles-start"), mark("cycles-end")];
  const per = new Map<string, number>();
  const add = (key: string, us: number) =>
    per.set(key, (per.get(key) ?? 0) + us);
  for (const e of events) {
    if (e.ph !== "X" || e.ts < from || e.ts > to) continue;
    const thread = `${names.get(`${e.pid}:${e.tid}`) ?? e.tid} (${e.pid})`;
    if (e.name === "ThreadControllerImpl::RunTask") {
      add(`${thread}: tasks`, 1);
      add(`${thread}: busy µs`, e.dur ?? 0);
    } else if (e.name.startsWith("SerializedScriptValueFactory::")) {
      add(`${thread}: ${e.name.split("::")[1]} µs`, e.dur ?? 0);
    }
  }
  console.log(
    `trace: ${((to - from) / 1000 / cycles).toFixed(3)} ms per cycle`,
  );
  for (const [key, value] of [...per].sort((a, b) => b[1] - a[1])) {
    if (value / cycles < 0.5) continue;
    console.log(`  ${(value / cycles).toFixed(1).padStart(8)}/cycle  ${key}`);
  }
}

/** A CDP session to the page's dedicated worker (non-flat attach). */
async function attachWorker(cdp: CDPSession) {
  let nextId = 1;
  const waiting = new Map<number, (value: unknown) => void>();
  const attached = new Promise<string>((resolve) => {
    cdp.on("Target.attachedToTarget", (event) => {
      if (event.targetInfo.type === "worker") resolve(event.sessionId);
    });
  });
  cdp.on("Target.receivedMessageFromTarget", (event) => {
    const message = JSON.parse(event.message);
    if (message.id !== undefined) waiting.get(message.id)?.(message);
  });
  await cdp.send("Target.setAutoAttach", {
    autoAttach: true,
    waitForDebuggerOnStart: false,
    flatten: false,
  });
  const sessionId = await attached;
  const send = async (method: string, params: object = {}) => {
    const id = nextId++;
    const reply = new Promise((resolve) => waiting.set(id, resolve));
    await cdp.send("Target.sendMessageToTarget", {
      sessionId,
      message: JSON.stringify({ id, method, params }),
    });
    const message = await reply as { result?: unknown; error?: unknown };
    if (message.error) throw new Error(JSON.stringify(message.error));
    return message.result;
  };
  return { send, sessionId };
}
