/**
 * The dashboard's `basePath` as the URL parser writes a request's path, so
 * that comparing the two is exact.
 *
 * @module
 */
import { describe } from "../validate.ts";

/**
 * `basePath` without its trailing slashes and percent-encoded as a request
 * URL's `pathname` has it (`"/ops team"` is `"/ops%20team"`), or `""`.
 *
 * @param op What the caller was doing, for the message.
 * @param basePath The option's value.
 * @returns The path to compare request paths with.
 * @throws {TypeError} When it is not a string, or not empty nor a path of
 * non-empty segments after `/` without `?`, `#`, `;`, `\`, `.` or `..`
 * (the browser would resolve those away, or a cookie's `Path` would end).
 */
export function basePathOf(op: string, basePath: unknown): string {
  const refuse = () =>
    new TypeError(
      `Cannot ${op} as 'basePath' must be empty or a path starting with '/', of non-empty segments without '.', '..', '?', '#', ';' or '\\': current value is ${
        describe(basePath)
      }`,
    );
  if (basePath === undefined) return "";
  if (typeof basePath !== "string") throw refuse();
  const path = basePath.replace(/\/+$/, "");
  if (path === "") return "";
  const segments = path.split("/");
  if (
    segments[0] !== "" || /[?#;\\]/.test(path) ||
    // Control characters: U+0000 to U+001F and U+007F.
    Array.from(path).some((c) => c <= "\x1f" || c === "\x7f") ||
    segments.slice(1).some((s) => s === "" || s === "." || s === "..")
  ) {
    throw refuse();
  }
  const encoded = new URL(path, "http://localhost").pathname;
  // "%2e" is a dot segment to the parser too.
  if (encoded.split("/").length !== segments.length) throw refuse();
  return encoded;
}
