/**
 * Keeping a database URL's password out of the CLI's messages.
 *
 * @module
 */

/**
 * The parts of `database` that hold a password, each with what replaces it
 * in a message: a URL's `user:password@` (up to the last `@`, as URL
 * parsers read an unencoded one, and a `/`, `?` or `#` in a password), its
 * query's `…password=` pairs, or all of a libpq `key=value` string that
 * names a password.
 */
export function credentialsOf(database: string): [string, string][] {
  const scheme = /^[a-z][a-z0-9+.-]*:/i.exec(database)?.[0];
  if (scheme === undefined) {
    return /password\s*=/i.test(database) ? [[database, "***"]] : [];
  }
  const found: [string, string][] = [];
  const rest = database.slice(scheme.length).replace(/^\/{0,2}/, "");
  const userinfo = rest.slice(0, rest.lastIndexOf("@") + 1);
  if (userinfo.includes(":")) found.push([userinfo, "***@"]);
  const query = database.indexOf("?");
  for (const pair of query < 0 ? [] : database.slice(query + 1).split(/[&#]/)) {
    const equals = pair.indexOf("=");
    if (equals < 0) continue;
    // The key as a client reads it, percent-decoded (`pass%77ord`).
    const key = pair.slice(0, equals);
    if (/^[a-z_]*password$/i.test(decoded(key))) {
      found.push([pair, `${key}=***`]);
    }
  }
  // Also as a client may quote them, decoded.
  return found.flatMap(([text, mask]) => {
    const plain = decoded(text);
    return plain === text ? [[text, mask]] : [[text, mask], [plain, mask]];
  });
}

/** `text` percent-decoded, or as it is where it does not decode. */
function decoded(text: string): string {
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
}

/** `line` with every credential of the command line masked. */
export function redacted(
  credentials: readonly [string, string][],
  line: string,
): string {
  return credentials.reduce(
    (text, [secret, mask]) => text.replaceAll(secret, mask),
    line,
  );
}
