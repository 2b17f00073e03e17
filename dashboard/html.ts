/**
 * HTML built by a tagged template that escapes every interpolated value,
 * so stored text (payloads, errors, queue names, keys) always shows as text.
 * Only {@linkcode Html} values, which this template made, pass unescaped.
 *
 * @module
 */

/** Markup this module's template built: interpolated as is. */
export class Html {
  /** The markup. */
  readonly text: string;
  constructor(text: string) {
    this.text = text;
  }
  /** The markup. */
  toString(): string {
    return this.text;
  }
}

const ENTITIES: Record<string, string> = {
  "&": "&amp;",
  "<": "&lt;",
  ">": "&gt;",
  '"': "&quot;",
  "'": "&#39;",
};

/**
 * Escapes text for HTML element content and quoted attribute values.
 *
 * @param text Any text.
 * @returns The text with `&`, `<`, `>`, `"` and `'` as character references.
 */
export function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => ENTITIES[c]!);
}

/**
 * A template literal tag: `html\`<td>${value}</td>\`` escapes `value` unless
 * it is {@linkcode Html}. Arrays join their items, each escaped the same way;
 * `null`, `undefined` and `false` render nothing.
 */
export function html(
  strings: TemplateStringsArray,
  ...values: readonly unknown[]
): Html {
  let text = strings[0]!;
  for (let i = 0; i < values.length; i++) {
    text += render(values[i]) + strings[i + 1]!;
  }
  return new Html(text);
}

function render(value: unknown): string {
  if (value instanceof Html) return value.text;
  if (value === null || value === undefined || value === false) return "";
  if (Array.isArray(value)) return value.map(render).join("");
  return escapeHtml(String(value));
}
