/**
 * Runs a bench script in a fresh Deno process: it receives one JSON
 * argument and prints one line of JSON.
 *
 * @module
 */

const CONFIG = new URL("../deno.json", import.meta.url).pathname;

/**
 * Runs `script` with `input` as its JSON argument and parses what it prints.
 *
 * @param script The script's path.
 * @param input Its argument, passed as JSON.
 * @param flags Deno flags for that process alone (e.g. `--unstable-kv`).
 * @returns What the process printed, parsed.
 * @throws {Error} When the process fails.
 */
export async function runJsonProcess<T>(
  script: string,
  input: unknown,
  flags: readonly string[] = [],
): Promise<T> {
  const output = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      ...flags,
      "--config",
      CONFIG,
      script,
      JSON.stringify(input),
    ],
    stdout: "piped",
    stderr: "inherit",
  }).output();
  if (!output.success) {
    throw new Error(`Scenario failed: ${JSON.stringify(input)}`);
  }
  return JSON.parse(new TextDecoder().decode(output.stdout));
}
