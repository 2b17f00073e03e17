// How the CLI's tests run `deno task outbox` as the user would.
import assert from "node:assert/strict";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

/** The project's directory. */
export const root = dirname(dirname(fileURLToPath(import.meta.url)));
const decoder = new TextDecoder();

/** What one run of the CLI printed, and its exit code. */
export interface Output {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

/** Runs `deno task outbox` as the user would, with stdout piped (no TTY). */
export async function cli(...args: string[]): Promise<Output> {
  const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", join(root, "cli.ts"), ...args],
    cwd: root,
    stdout: "piped",
    stderr: "piped",
  }).output();
  return {
    code,
    stdout: decoder.decode(stdout),
    stderr: decoder.decode(stderr),
  };
}

/** Runs the CLI and parses its stdout as one JSON value; it must exit 0. */
export async function json(
  ...args: string[]
): Promise<Record<string, unknown>> {
  const output = await cli(...args, "--json");
  assert.equal(output.code, 0, output.stderr);
  const lines = output.stdout.trimEnd().split("\n");
  assert.equal(lines.length, 1, output.stdout);
  return JSON.parse(lines[0]!);
}
