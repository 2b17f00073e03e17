/**
 * `outbox watch <db>`: the counts again every `--interval` until Ctrl-C,
 * with the acknowledgement rate over the last interval.
 *
 * @module
 */
import { duration, noArguments } from "./args.ts";
import type { Command } from "./command.ts";
import { interruption, stringOption } from "./command.ts";
import { age } from "./format.ts";
import { openReader } from "./open.ts";
import { QUEUE } from "./options.ts";
import { readSummary, summaryText } from "./stats.ts";

// Under the longest delay setTimeout keeps (2^31 - 1 ms): a longer one
// fires at once.
const MAX_INTERVAL_MS = 24 * 86_400_000;

export const watch: Command = {
  name: "watch",
  synopsis: "<db>",
  summary: "live counts and rates until Ctrl-C",
  options: {
    queue: QUEUE,
    interval: {
      type: "string",
      value: "<d>",
      help: "refresh period (default 2s)",
    },
  },
  async run(context) {
    noArguments(context, "watch");
    const interval = stringOption(context, "interval");
    const intervalMs = interval === undefined
      ? 2_000
      : duration("--interval", interval, { min: 1, max: MAX_INTERVAL_MS });
    using interrupted = interruption(context);
    const { signal } = interrupted;
    {
      await using reader = await openReader(context);
      const live = context.color && !context.json;
      let previous: { at: number; done: number } | undefined;
      while (!signal.aborted) {
        const summary = await readSummary(reader, context);
        const at = context.now();
        // Per second over the last interval, from the change in done events.
        const perSecond = previous === undefined || at === previous.at
          ? null
          : Math.max(0, summary.done - previous.done) * 1000 /
            (at - previous.at);
        previous = { at, done: summary.done };
        if (context.json) {
          context.out(
            JSON.stringify({ ...summary, acknowledgedPerSecond: perSecond }),
          );
        } else if (live) {
          // A terminal gets the whole table redrawn in place.
          context.out(
            `\x1b[H\x1b[2J${summary.at}  acks ${
              perSecond === null ? "-" : perSecond.toFixed(1)
            }/s now (Ctrl-C to stop)\n${summaryText(context, summary)}`,
          );
        } else {
          context.out(
            `${summary.at}  pending ${summary.pending}  leased ${summary.leased}  done ${summary.done}  dead ${summary.dead}  oldest pending ${
              summary.pending === 0 ? "-" : age(summary.oldestPendingAgeMs)
            }  acks ${summary.acknowledgedLastMinute}/min${
              perSecond === null ? "" : `  ${perSecond.toFixed(1)}/s now`
            }`,
          );
        }
        await abortableSleep(intervalMs, signal);
      }
    }
  },
};

function abortableSleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done);
  });
}
