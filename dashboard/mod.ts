/**
 * A web dashboard for an outbox, as a `(request) => Promise<Response>`
 * handler that mounts in `Deno.serve`, Hono (`app.mount`) or Fresh, with no
 * framework of its own: the queues and their counts, what is stuck, why an
 * event failed (its ledger's timeline), and, when enabled, one click to
 * redrive it.
 *
 * It is an admin door, so it is read-only unless `actions` is true; every
 * write is a POST that carries a CSRF token bound to a cookie and passes a
 * same-origin check; an `authorize` hook sees every request; every stored
 * text is escaped; and every response carries a strict
 * Content-Security-Policy with no inline script or style.
 *
 * @example Serve it beside an outbox
 * ```ts
 * import { Outbox } from "@leased/outbox";
 * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
 * import { dashboard } from "@leased/outbox/dashboard";
 * import assert from "node:assert/strict";
 *
 * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
 * await outbox.enqueue({ to: "ada@example.com" }, { queue: "mail" });
 * const handler = dashboard(outbox, { basePath: "/admin/outbox" });
 * const response = await handler(new Request("http://localhost/admin/outbox/"));
 * assert.equal(response.status, 200);
 * assert.match(await response.text(), /mail/);
 * // In an application: Deno.serve((request) => handler(request));
 * ```
 *
 * @module
 */
import type { EventInfo, QueueCounts } from "../admin.ts";
import type { EventState, Outbox } from "../lease.ts";
import type { OutboxReader } from "../reader.ts";
import {
  checkFunction,
  checkName,
  checkOptions,
  checkOrigin,
  describe,
} from "../validate.ts";
import { basePathOf } from "./base_path.ts";
import { DASHBOARD_OPTIONS } from "./options.ts";
import { FAVICON, LIVE_SCRIPT, STYLESHEET } from "./assets.ts";
import type { ActivityBucket } from "./chart.ts";
import { cookie, CSRF_COOKIE, CsrfGuard, sameOrigin } from "./csrf.ts";
import { type Html, html } from "./html.ts";
import {
  confirmPage,
  COUNT_UP_TO,
  deadPage,
  donePage,
  errorPage,
  eventPage,
  eventsPage,
  overviewPage,
  type PageContext,
  QUEUES_UP_TO,
} from "./pages.ts";

export type { Outbox } from "../lease.ts";
export type { OutboxReader } from "../reader.ts";

/** Options of {@linkcode dashboard}. */
export interface DashboardOptions {
  /**
   * The path the dashboard is mounted under, e.g. `"/admin/outbox"`; requests
   * outside it answer 404.
   *
   * @default {""}
   */
  readonly basePath?: string;
  /**
   * Whether the pages offer actions (redrive, cancel, purge by age). Needs
   * an {@linkcode Outbox} as the source; off, every POST answers 405 and
   * nothing changes.
   *
   * @default {false}
   */
  readonly actions?: boolean;
  /**
   * Sees every request first: `true` lets it through, `false` answers 403,
   * and a `Response` (e.g. a 401 asking for basic auth) is answered as is.
   *
   * @default {every request is let through}
   */
  readonly authorize?: (
    request: Request,
  ) => boolean | Response | Promise<boolean | Response>;
  /**
   * The origin the browser's writes must come from (`Origin` header),
   * when the dashboard runs behind a proxy that changes the request URL's:
   * scheme, host and port, e.g. `"https://admin.example.com"`. Compared
   * as browsers write it (lowercase, no default port, no trailing slash),
   * so `"https://Admin.example.com/"` is the same origin; a path, query,
   * fragment, credentials or a scheme other than `http:` and `https:` is
   * refused.
   *
   * @default {the request URL's origin}
   */
  readonly origin?: string;
  /**
   * How often an open page updates itself, in milliseconds; `0` never.
   *
   * @default {5000}
   */
  readonly refreshMs?: number;
  /** The pages' title. @default {"Outbox"} */
  readonly title?: string;
  /** The clock ages are counted by, epoch ms. @default {Date.now} */
  readonly now?: () => number;
}

/** What the dashboard reads: an {@linkcode Outbox} or an {@linkcode OutboxReader}. */
export type DashboardSource = Outbox | OutboxReader;

/**
 * The longest delay browsers' `setInterval` keeps (2^31 - 1 ms); past it
 * they run the timer every millisecond.
 */
const MAX_TIMER_MS = 2_147_483_647;

/** The most bytes a POST's form may have: the dashboard's are tiny. */
const MAX_FORM_BYTES = 16_384;

/** Events per page. */
const PAGE = 50;

/** Queues per page of the overview. */
const QUEUES_PAGE = 50;

const STATES = new Set<string>(["pending", "leased", "done", "dead"]);
const HOUR_MS = 3_600_000;
const MINUTE_MS = 60_000;

const SECURITY_HEADERS: Readonly<Record<string, string>> = {
  "content-security-policy":
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
  "x-content-type-options": "nosniff",
  // Not no-referrer: Chromium then sends `Origin: null` with a form POST.
  "referrer-policy": "same-origin",
  "x-frame-options": "DENY",
  "cache-control": "no-store",
};

/**
 * Makes the dashboard's request handler.
 *
 * Pages under `basePath`: `/?prefix=&after=` (the overview: 50 queues at a
 * time by name, filtered by a name prefix, with their counts per state and
 * the oldest pending age, and events done and failed per minute over the
 * last hour), `/events?state=&queue=&after=&q=` (a page of events in one
 * state by enqueue time, or the event whose id, identity or dedup key is
 * `q`), `/events/<id>` (one
 * event: payload, identity, attempts, times, the ledger's timeline),
 * `/dead` (dead letters with their last errors). With `actions`:
 * `/confirm/<action>` asks, and a POST to `/actions/<action>` (`redrive`,
 * `cancel`, `purge`) does it and shows what changed.
 *
 * @param source The outbox to show; an {@linkcode OutboxReader} never
 * writes, so actions need an {@linkcode Outbox}.
 * @param options See {@linkcode DashboardOptions}.
 * @returns A handler; it never throws, answering 500 with the error's
 * message for a failed read.
 * @throws {TypeError} When an option is of the wrong type or unknown,
 * `origin` is not an origin, or `actions` is true with a source that
 * cannot write.
 * @throws {RangeError} When `refreshMs` is negative or not an integer.
 */
export function dashboard(
  source: DashboardSource,
  options: DashboardOptions = {},
): (request: Request) => Promise<Response> {
  const op = "create dashboard";
  checkOptions(op, options, DASHBOARD_OPTIONS);
  if (
    source === null || typeof source !== "object" ||
    typeof (source as Partial<OutboxReader>).queues !== "function"
  ) {
    throw new TypeError(
      `Cannot ${op} as 'source' must be an Outbox or an OutboxReader: current value is ${
        describe(source)
      }`,
    );
  }
  const base = basePathOf(op, options.basePath);
  const actions = options.actions === undefined ? false : options.actions;
  if (typeof actions !== "boolean") {
    throw new TypeError(
      `Cannot ${op} as 'actions' must be a boolean: current value is ${
        describe(actions)
      }`,
    );
  }
  const writer = source as Partial<Outbox>;
  if (actions && typeof writer.redrive !== "function") {
    throw new TypeError(
      `Cannot ${op} as 'actions' needs an Outbox as 'source': an OutboxReader never writes`,
    );
  }
  for (const name of ["authorize", "now"] as const) {
    if (options[name] !== undefined) checkFunction(op, name, options[name]);
  }
  if (options.title !== undefined && typeof options.title !== "string") {
    throw new TypeError(
      `Cannot ${op} as 'title' must be a string: current value is ${
        describe(options.title)
      }`,
    );
  }
  // As browsers send it, so that the same-origin check compares like
  // with like: "https://Admin.example.com/" is "https://admin.example.com".
  const origin = checkOrigin(op, "origin", options.origin);
  const refreshMs = options.refreshMs === undefined ? 5_000 : options.refreshMs;
  if (
    !Number.isSafeInteger(refreshMs) || refreshMs < 0 ||
    refreshMs > MAX_TIMER_MS
  ) {
    throw new RangeError(
      `Cannot ${op} as 'refreshMs' must be an integer from 0 to ${MAX_TIMER_MS}: current value is ${
        describe(refreshMs)
      }`,
    );
  }
  const now = options.now ?? Date.now;
  const title = options.title ?? "Outbox";
  const guard = new CsrfGuard();

  return async (request) => {
    const url = new URL(request.url);
    if (url.pathname !== base && !url.pathname.startsWith(`${base}/`)) {
      return text(404, "Not found");
    }
    const path = url.pathname.slice(base.length) || "/";
    if (options.authorize !== undefined) {
      let verdict: boolean | Response;
      try {
        verdict = await options.authorize(request);
      } catch {
        // Not its message: the client may not be signed in, and a hook's
        // error may name its directory, its URL or a credential.
        return text(500, "The dashboard's authorize hook failed");
      }
      if (verdict instanceof Response) return verdict;
      if (verdict !== true) return text(403, "Forbidden");
    }
    try {
      if (path === "/assets/dashboard.css") {
        return asset(STYLESHEET, "text/css; charset=utf-8");
      }
      if (path === "/assets/favicon.svg") {
        return asset(FAVICON, "image/svg+xml");
      }
      if (path === "/assets/live.js") {
        return asset(LIVE_SCRIPT, "text/javascript; charset=utf-8");
      }
      let nonce = cookie(request, CSRF_COOKIE);
      const fresh = nonce === undefined || !/^[0-9a-f]{64}$/.test(nonce);
      if (fresh) nonce = CsrfGuard.nonce();
      const context: PageContext = {
        base,
        title,
        actions,
        csrf: actions ? await guard.token(nonce!) : "",
        refreshMs,
        now: await clockOf(source, now),
      };
      let response: Response;
      if (request.method === "POST") {
        if (!actions) {
          return text(405, "Actions are disabled on this dashboard", {
            allow: "GET",
          });
        }
        const refused = () =>
          text(
            403,
            "Refused: the form's CSRF token or origin did not match; reload the page and try again",
          );
        // What needs no body first: a refused request is not read at all.
        if (fresh || !sameOrigin(request, origin ?? url.origin)) {
          await request.body?.cancel().catch(() => {});
          return refused();
        }
        const form = await formOf(request);
        if (form === "too large") {
          return text(413, `A form is at most ${MAX_FORM_BYTES} bytes`);
        }
        const token = form?.get("csrf");
        if (
          form === null || typeof token !== "string" ||
          !(await guard.verify(nonce!, token))
        ) {
          return refused();
        }
        response = await act(writer as Outbox, context, path, form);
      } else if (request.method === "GET" || request.method === "HEAD") {
        response = await show(source, context, path, url.searchParams);
      } else {
        return text(405, "Method not allowed", { allow: "GET, POST" });
      }
      if (fresh && actions) {
        response.headers.append(
          "set-cookie",
          `${CSRF_COOKIE}=${nonce}; Path=${
            base || "/"
          }; HttpOnly; SameSite=Strict`,
        );
      }
      return response;
    } catch (error) {
      return text(
        500,
        `The dashboard could not read the outbox: ${
          error instanceof Error ? error.message : String(error)
        }`,
      );
    }
  };
}

/**
 * The request's form, read up to {@linkcode MAX_FORM_BYTES} (then the body
 * is cancelled, so a client cannot make the dashboard buffer a body of any
 * size), or `null` when it is no form.
 */
async function formOf(
  request: Request,
): Promise<FormData | null | "too large"> {
  const declared = Number(request.headers.get("content-length"));
  if (declared > MAX_FORM_BYTES) {
    await request.body?.cancel().catch(() => {});
    return "too large";
  }
  const chunks: Uint8Array[] = [];
  let size = 0;
  if (request.body !== null) {
    const reader = request.body.getReader();
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        size += value.byteLength;
        if (size > MAX_FORM_BYTES) {
          await reader.cancel().catch(() => {});
          return "too large";
        }
        chunks.push(value);
      }
    } catch {
      return null;
    }
  }
  const type = request.headers.get("content-type");
  return await new Response(
    new Blob(chunks as BlobPart[]),
    type === null ? {} : { headers: { "content-type": type } },
  ).formData().catch(() => null);
}

/** Answers a GET. */
async function show(
  source: DashboardSource,
  context: PageContext,
  path: string,
  query: URLSearchParams,
): Promise<Response> {
  if (path === "/") {
    const prefix = query.get("prefix") ?? "";
    const after = query.get("after") || undefined;
    const filter = {
      ...prefix === "" ? {} : { prefix },
      ...after === undefined ? {} : { after },
    };
    let counted: [QueueCounts[], number];
    try {
      counted = await Promise.all([
        source.queues({
          countUpTo: COUNT_UP_TO,
          limit: QUEUES_PAGE,
          ...filter,
        }),
        source.countQueues({
          upTo: QUEUES_UP_TO,
          ...filter.prefix === undefined ? {} : { prefix },
        }),
      ]);
    } catch (error) {
      if (!(error instanceof TypeError)) throw error;
      return errorResponse(context, 400, "No such queue filter.");
    }
    const [queues, total] = counted;
    const activity = await activityOf(source, context.now);
    return page(overviewPage(context, {
      queues,
      total,
      prefix,
      after,
      limit: QUEUES_PAGE,
    }, activity));
  }
  if (path === "/dead") {
    const events = await source.list({
      state: "dead",
      limit: PAGE,
      order: "enqueued",
    });
    return page(deadPage(context, events, PAGE));
  }
  if (path === "/events") {
    const q = query.get("q")?.trim() ?? "";
    if (q !== "") {
      const found = await find(source, q);
      if (found !== null) return redirect(`${context.base}/events/${found}`);
    }
    const state = query.get("state") ?? "pending";
    const queue = query.get("queue") || undefined;
    const afterText = query.get("after") || "0";
    const after = /^\d{1,15}$/.test(afterText) ? Number(afterText) : -1;
    if (!STATES.has(state) || after < 0) {
      return errorResponse(context, 400, "No such filter.");
    }
    let events: EventInfo[];
    try {
      events = await source.list({
        state: state as EventState,
        limit: PAGE,
        afterId: after,
        order: "enqueued",
        ...(queue === undefined ? {} : { queue }),
      });
    } catch (error) {
      if (!(error instanceof TypeError)) throw error;
      return errorResponse(context, 400, "No such queue.");
    }
    return page(eventsPage(
      context,
      { state: state as EventState, queue, afterId: after },
      events,
      PAGE,
      q === ""
        ? undefined
        : html`<p class="notice">No event has the id, identity or dedup key ${q}.</p>`,
    ));
  }
  const match = /^\/events\/(\d{1,15})$/.exec(path);
  if (match !== null) {
    const id = idOf(match[1]!);
    const info = id === undefined ? null : await eventInfo(source, id);
    return info === null
      ? errorResponse(context, 404, `No event ${match[1]}.`)
      : page(eventPage(context, info.event, info.explanation));
  }
  const confirm = /^\/confirm\/(redrive|cancel|purge|pause|resume)$/.exec(path);
  if (confirm !== null && context.actions) {
    if (confirm[1] === "cancel" && idOf(query.get("id")) === undefined) {
      return errorResponse(context, 400, "Cancel which event? No id given.");
    }
    // A malformed id would otherwise ask to redrive every dead letter.
    if (
      confirm[1] === "redrive" && query.has("id") &&
      idOf(query.get("id")) === undefined
    ) {
      return errorResponse(
        context,
        400,
        `Redrive which event? 'id' must be an event id (decimal digits): got ${
          describeField(query.get("id"))
        }.`,
      );
    }
    const refusal = confirm[1] === "pause" || confirm[1] === "resume"
      ? queueRefusal(confirm[1] === "pause", query.get("queue"))
      : undefined;
    if (refusal !== undefined) return errorResponse(context, 400, refusal);
    return page(confirmation(context, confirm[1]!, query));
  }
  return errorResponse(context, 404, "No such page.");
}

/** The confirmation page of `action`. */
function confirmation(
  context: PageContext,
  action: string,
  query: URLSearchParams,
): Html {
  const id = idOf(query.get("id"));
  const ids = id === undefined ? {} : { id: String(id) };
  switch (action) {
    case "pause":
    case "resume": {
      const queue = query.get("queue") ?? "";
      return confirmPage(
        context,
        action,
        action === "pause"
          ? `Pause queue ${queue}? Claims from it return nothing, in every process, until it is resumed; leases already held run to their end.`
          : `Resume queue ${queue}? Claims take its events again.`,
        { queue },
      );
    }
    case "redrive":
      return confirmPage(
        context,
        "redrive",
        "id" in ids
          ? `Redrive dead letter ${id}? It becomes pending with its attempts reset.`
          : "Redrive every dead letter? They become pending with their attempts reset.",
        ids,
      );
    case "cancel":
      return confirmPage(
        context,
        "cancel",
        `Cancel pending event ${id}? It becomes a dead letter ("cancelled"), which can be redriven.`,
        ids,
      );
    default:
      return confirmPage(
        context,
        "purge",
        "Delete finished events (done and dead) older than:",
        {},
        html`<p><label>Age<select name="olderThan"><option value="3600000">1 hour</option><option value="86400000" selected>1 day</option><option value="604800000">7 days</option><option value="2592000000">30 days</option></select></label></p>`,
      );
  }
}

/** Runs a confirmed POST and shows what it changed. */
async function act(
  outbox: Outbox,
  context: PageContext,
  path: string,
  form: FormData,
): Promise<Response> {
  // A field that is there but malformed is refused, never read as absent:
  // absent widens redrive to every dead letter.
  const refused = (message: string) =>
    errorResponse(context, 400, `${message} Nothing changed.`);
  const one = idOf(form.get("id"));
  const badId = form.has("id") && one === undefined
    ? `'id' must be an event id (decimal digits): got ${
      describeField(form.get("id"))
    }.`
    : undefined;
  switch (path) {
    case "/actions/redrive": {
      if (badId !== undefined) return refused(`Redrive which event? ${badId}`);
      const n = await outbox.redrive(one === undefined ? {} : { ids: [one] });
      return page(donePage(
        context,
        one === undefined
          ? html`Redrove ${n} dead ${
            n === 1 ? "letter" : "letters"
          }: pending again.`
          : n === 1
          ? html`
            Redrove event <a
              href="${context.base}/events/${one}">${one}</a>: pending again.
          `
          : html`Event ${one} was not a dead letter: nothing changed.`,
      ));
    }
    case "/actions/cancel": {
      if (one === undefined) {
        return refused(
          `Cancel which event? ${badId ?? "'id' is required."}`,
        );
      }
      const cancelled = await outbox.cancel(one);
      return page(donePage(
        context,
        cancelled
          ? html`
            Cancelled event <a
              href="${context
                .base}/events/${one}">${one}</a>: a dead letter now.
          `
          : html`Event ${one} was not pending (a worker may hold it): nothing changed.`,
      ));
    }
    case "/actions/pause":
    case "/actions/resume": {
      const pause = path === "/actions/pause";
      const queue = form.get("queue");
      const refusal = queueRefusal(pause, queue);
      if (refusal !== undefined || typeof queue !== "string") {
        return refused(refusal!);
      }
      await (pause ? outbox.pause(queue) : outbox.resume(queue));
      return page(donePage(
        context,
        pause
          ? html`Paused queue ${queue}: claims from it return nothing until it is resumed.`
          : html`Resumed queue ${queue}: claims take its events again.`,
      ));
    }
    case "/actions/purge": {
      const olderThan = form.get("olderThan");
      const olderThanMs = typeof olderThan === "string" &&
          /^\d{1,15}$/.test(olderThan)
        ? Number(olderThan)
        : undefined;
      if (olderThanMs === undefined) {
        return refused(
          `Purge events older than what? 'olderThan' must be milliseconds (decimal digits): got ${
            describeField(olderThan)
          }.`,
        );
      }
      const n = await outbox.purge({ olderThanMs });
      return page(
        donePage(
          context,
          html`Purged ${n} finished ${n === 1 ? "event" : "events"}.`,
        ),
      );
    }
  }
  return errorResponse(context, 400, "No such action.");
}

/**
 * An event id written as decimal digits (1 to 999,999,999,999,999, so
 * always a safe integer), or `undefined` for anything else: `0`, a sign,
 * hex, an exponent, blanks, a form's file.
 */
function idOf(text: FormDataEntryValue | null): number | undefined {
  if (typeof text !== "string" || !/^\d{1,15}$/.test(text)) return undefined;
  const id = Number(text);
  return id > 0 ? id : undefined;
}

/**
 * Why `queue` cannot be paused or resumed, naming the field, or `undefined`
 * when it names a queue: checked here, so that a name the outbox refuses
 * (too long, a NUL) answers 400 rather than 500.
 */
function queueRefusal(
  pause: boolean,
  queue: FormDataEntryValue | null,
): string | undefined {
  const which = `${pause ? "Pause" : "Resume"} which queue?`;
  if (typeof queue !== "string" || queue === "") {
    return `${which} 'queue' must name one: got ${describeField(queue)}.`;
  }
  try {
    checkName(pause ? "pause" : "resume", "queue", queue);
  } catch (error) {
    return `${which} ${(error as Error).message}.`;
  }
  return undefined;
}

/** A form or query field as a message shows it. */
function describeField(value: FormDataEntryValue | null): string {
  if (value === null) return "nothing";
  if (typeof value !== "string") return "a file";
  return JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}…` : value);
}

/** The event an id, identity or dedup key names, or `null`. */
async function find(
  source: DashboardSource,
  q: string,
): Promise<number | null> {
  const id = idOf(q);
  if (id !== undefined) {
    const explanation = await source.explain(id);
    if (explanation !== null) return explanation.eventId;
  }
  if (
    /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(q)
  ) {
    const explanation = await source.explain(q.toLowerCase());
    if (explanation !== null) return explanation.eventId;
  }
  if (q.length > 1_000 || q.includes("\0") || !q.isWellFormed()) return null;
  return await source.eventIdByDedupKey(undefined, q);
}

/** One event's listing and explanation, or `null` when it does not exist. */
async function eventInfo(
  source: DashboardSource,
  id: number,
): Promise<
  {
    event: EventInfo;
    explanation: NonNullable<Awaited<ReturnType<DashboardSource["explain"]>>>;
  } | null
> {
  const explanation = await source.explain(id);
  if (explanation === null) return null;
  const [event] = await source.list({
    state: explanation.state,
    queue: explanation.queue,
    afterId: id - 1,
    limit: 1,
  });
  return event?.id === id ? { event, explanation } : null;
}

/** The last hour's activity per minute, where the source can tell it. */
async function activityOf(
  source: DashboardSource,
  now: number,
): Promise<ActivityBucket[]> {
  const since = Math.floor((now - HOUR_MS) / MINUTE_MS) * MINUTE_MS + MINUTE_MS;
  const rows = await source.activity(since, MINUTE_MS);
  const byMinute = new Map(rows.map((row) => [row.at, row]));
  return Array.from({ length: 60 }, (_, i) => {
    const at = since + i * MINUTE_MS;
    return byMinute.get(at) ?? { at, done: 0, failed: 0 };
  });
}

/** The clock ages are counted by: the server's, where the source has one. */
async function clockOf(
  source: DashboardSource,
  now: () => number,
): Promise<number> {
  const databaseNow = (source as { databaseNow?: () => Promise<number | null> })
    .databaseNow;
  return (databaseNow === undefined ? null : await databaseNow.call(source)) ??
    now();
}

/** An error page answered with its status. */
function errorResponse(
  context: PageContext,
  status: 400 | 404,
  message: string,
): Response {
  return page(errorPage(context, status, message), status);
}

function page(body: Html, status = 200): Response {
  return new Response(body.text, {
    status,
    headers: {
      ...SECURITY_HEADERS,
      "content-type": "text/html; charset=utf-8",
    },
  });
}

function asset(body: string, type: string): Response {
  return new Response(body, {
    headers: {
      ...SECURITY_HEADERS,
      "content-type": type,
      "cache-control": "public, max-age=300",
    },
  });
}

function redirect(location: string): Response {
  return new Response(null, {
    status: 303,
    headers: { ...SECURITY_HEADERS, location },
  });
}

function text(
  status: number,
  body: string,
  headers: Record<string, string> = {},
): Response {
  return new Response(body, {
    status,
    headers: {
      ...SECURITY_HEADERS,
      "content-type": "text/plain; charset=utf-8",
      ...headers,
    },
  });
}
