/**
 * How the CLI writes for people: durations, clipped text, escaped control
 * characters, padded tables, and a stdout line writer that notices a closed
 * pipe.
 *
 * @module
 */

/**
 * An instant as ISO 8601 text, or, past what a Date holds (±8.64e15 ms, a
 * time another program wrote), the number stored: never a throw.
 */
export function isoTime(at: number): string {
  const date = new Date(at);
  return Number.isFinite(date.getTime())
    ? date.toISOString()
    : `${at} ms since the epoch`;
}

/** A duration for people: `850 ms`, `4.2 s`, `3.5 min`, `2.1 h`, `3.0 d`. */
export function age(ms: number): string {
  if (ms < 1_000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1_000).toFixed(1)} s`;
  if (ms < 3_600_000) return `${(ms / 60_000).toFixed(1)} min`;
  if (ms < 86_400_000) return `${(ms / 3_600_000).toFixed(1)} h`;
  return `${(ms / 86_400_000).toFixed(1)} d`;
}

/** `in 3.0 min` or `2.0 s ago`, from `now`. */
export function relative(at: number, now: number): string {
  return at > now ? `in ${age(at - now)}` : `${age(now - at)} ago`;
}

/** `text` on one line, cut to `length` characters with an ellipsis. */
export function clip(text: string, length: number): string {
  const line = text.replaceAll(/\s+/g, " ");
  return line.length <= length ? line : `${line.slice(0, length - 1)}…`;
}

/**
 * A payload as JSON text on one line: as stored when it is a string that
 * is not JSON (written by another program), clipped to `length` unless
 * `length` is `Infinity`.
 */
export function payloadText(payload: unknown, length: number): string {
  let text: string;
  try {
    text = JSON.stringify(payload) ?? String(payload);
  } catch {
    text = String(payload);
  }
  return length === Infinity
    ? text.replaceAll(/\s+/g, " ")
    : clip(text, length);
}

/**
 * `text` with the characters a terminal acts on rather than shows (C0 and
 * C1 controls, DEL, bidirectional overrides, and the line and paragraph
 * separators U+2028 and U+2029, which some terminals and most log viewers
 * break a line at) written as `\u` escapes: a queue name or an error text
 * stored by any producer must not move the cursor, recolour the screen,
 * start what looks like a line of its own or reorder what an operator
 * reads.
 */
export function printable(text: string): string {
  return text.replaceAll(
    // Matching control characters is the point.
    // deno-lint-ignore no-control-regex
    /[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`,
  );
}

/**
 * Padded columns; `right` lists the columns aligned right (numbers). The
 * header is bold when `color` is true.
 */
export function table(
  color: boolean,
  header: readonly string[],
  rows: readonly (readonly (string | number)[])[],
  right: readonly number[],
): string {
  const cells = [
    header,
    ...rows.map((row) => row.map((cell) => printable(String(cell)))),
  ];
  const widths = header.map((_, i) =>
    Math.max(...cells.map((row) => row[i]!.length))
  );
  const lines = cells.map((row) =>
    row.map((cell, i) =>
      right.includes(i) ? cell.padStart(widths[i]!) : cell.padEnd(widths[i]!)
    ).join("  ").trimEnd()
  );
  if (color) lines[0] = `\x1b[1m${lines[0]}\x1b[22m`;
  return lines.join("\n");
}

/** An error's message; any other thrown value as text, whatever it is. */
export function message(error: unknown): string {
  try {
    return error instanceof Error ? error.message : String(error);
  } catch {
    return "an error that cannot be printed";
  }
}

const encoder = new TextEncoder();

/**
 * Writes a line to stdout; unlike `console.log`, throws
 * `Deno.errors.BrokenPipe` once the reader is gone, which ends the command.
 */
export function writeLine(line: string): void {
  const bytes = encoder.encode(`${line}\n`);
  for (let written = 0; written < bytes.length;) {
    written += Deno.stdout.writeSync(bytes.subarray(written));
  }
}

/** Colour on a terminal, unless `NO_COLOR` is set. */
export function colorByDefault(): boolean {
  return Deno.stdout.isTerminal() && !Deno.env.get("NO_COLOR");
}
