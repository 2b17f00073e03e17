/**
 * The dashboard's guard on writes: a double-submit token bound to a cookie
 * by an HMAC (OWASP's "signed double-submit cookie"), plus a same-origin
 * check of the request's `Origin` or `Sec-Fetch-Site` header.
 *
 * @module
 */

import { hex } from "../core/enqueue.ts";

/** The cookie holding the browser's random nonce. */
export const CSRF_COOKIE = "outbox_dashboard_csrf";

const encoder = new TextEncoder();

/** Signs nonces with a key made once per dashboard. */
export class CsrfGuard {
  readonly #key: Promise<CryptoKey>;

  constructor() {
    this.#key = crypto.subtle.generateKey(
      { name: "HMAC", hash: "SHA-256" },
      false,
      ["sign", "verify"],
    ) as Promise<CryptoKey>;
  }

  /** A fresh random nonce for a new browser's cookie. */
  static nonce(): string {
    return hex(crypto.getRandomValues(new Uint8Array(32)), 0, 32);
  }

  /** The token a form carries for the cookie's `nonce`. */
  async token(nonce: string): Promise<string> {
    const mac = await crypto.subtle.sign(
      "HMAC",
      await this.#key,
      encoder.encode(nonce),
    );
    const bytes = new Uint8Array(mac);
    return hex(bytes, 0, bytes.length);
  }

  /** Whether `token` was made by {@linkcode CsrfGuard.token} for `nonce`. */
  async verify(nonce: string, token: string): Promise<boolean> {
    if (!/^[0-9a-f]{64}$/.test(token) || !/^[0-9a-f]{64}$/.test(nonce)) {
      return false;
    }
    // verify() compares in constant time.
    return await crypto.subtle.verify(
      "HMAC",
      await this.#key,
      unhex(token),
      encoder.encode(nonce),
    );
  }
}

/**
 * Whether a write comes from the dashboard's own pages: its `Origin` is
 * `origin`, or, without `Origin`, the browser says `Sec-Fetch-Site:
 * same-origin`. A request with neither header is refused.
 */
export function sameOrigin(request: Request, origin: string): boolean {
  const from = request.headers.get("origin");
  if (from !== null) return from === origin;
  return request.headers.get("sec-fetch-site") === "same-origin";
}

/** The value of cookie `name` in `request`, or `undefined`. */
export function cookie(request: Request, name: string): string | undefined {
  for (const part of (request.headers.get("cookie") ?? "").split(";")) {
    const [key, ...value] = part.trim().split("=");
    if (key === name) return value.join("=");
  }
  return undefined;
}

function unhex(text: string): Uint8Array<ArrayBuffer> {
  const bytes = new Uint8Array(text.length / 2);
  for (let i = 0; i < bytes.length; i++) {
    bytes[i] = parseInt(text.slice(2 * i, 2 * i + 2), 16);
  }
  return bytes;
}
