/**
 * The table of the `outbox` tool's commands, in the order the usage lists
 * them. A new command is a module exporting a {@linkcode Command} and one
 * entry here.
 *
 * @module
 */
import type { Command } from "./command.ts";
import { cancel } from "./cancel.ts";
import { explain } from "./explain.ts";
import { list } from "./list.ts";
import { purge } from "./purge.ts";
import { redrive, retry } from "./redrive.ts";
import { stats } from "./stats.ts";
import { limits, pause, resume, schedules } from "./flow_commands.ts";
import { ui } from "./ui.ts";
import { watch } from "./watch.ts";

/** Every command, in the usage's order. */
export const COMMANDS: readonly Command[] = [
  stats,
  list,
  explain,
  watch,
  redrive,
  retry,
  cancel,
  purge,
  pause,
  resume,
  limits,
  schedules,
  ui,
];
