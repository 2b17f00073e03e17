/**
 * The dashboard's pages, rendered on the server: each is complete HTML that
 * reads the same with JavaScript off.
 *
 * @module
 */
import type { EventInfo, QueueCounts } from "../admin.ts";
import type { EventState, Explanation } from "../lease.ts";
import { type ActivityBucket, activityChart } from "./chart.ts";
import { type Html, html } from "./html.ts";

/** Where the overview's counts stop: see `COUNT_UP_TO` in mod.ts. */
export const COUNT_UP_TO = 10_000;

/**
 * Where the overview's count of queues stops: a seek per queue counted, so
 * 20,000 queues cost no more than 1,000.
 */
export const QUEUES_UP_TO = 1_000;

/** What every page needs to link and to guard its forms. */
export interface PageContext {
  /** The path the dashboard is mounted under, without a trailing slash. */
  readonly base: string;
  /** The page's title. */
  readonly title: string;
  /** Whether actions are enabled. */
  readonly actions: boolean;
  /** The CSRF token forms carry, when actions are enabled. */
  readonly csrf: string;
  /** How often pages refresh themselves, milliseconds; 0 for never. */
  readonly refreshMs: number;
  /** The clock the ages are counted by, epoch milliseconds. */
  readonly now: number;
}

const STATES: readonly EventState[] = ["pending", "leased", "done", "dead"];

/** The frame every page shares: header, navigation, `<main>`. */
export function page(
  context: PageContext,
  heading: string,
  body: Html,
  live = true,
): Html {
  const { base, title } = context;
  return html`
    <!doctype html>
    <html lang="en">
      <head>
        <meta charset="utf-8">
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <title>${heading} · ${title}</title>
        <link rel="stylesheet" href="${base}/assets/dashboard.css">
        <link rel="icon" href="${base}/assets/favicon.svg">
        <script src="${base}/assets/live.js" defer></script>
      </head>
      <body>
        <header>
          <h1><a href="${base}/">${title}</a></h1>
          <nav><a href="${base}/">Overview</a><a href="${base}/events">Events</a><a href="${base}/dead">Dead letters</a></nav>
          <form class="inline" action="${base}/events" method="get"
            role="search">
            <input name="q" placeholder="id, identity or dedup key"
              aria-label="Find an event" size="28">
          </form>
        </header>
        <main${live && context.refreshMs > 0
          ? html`
            data-live="${context.refreshMs}"
          `
          : ""}><h2>${heading}</h2>
        ${body}</main></body></html>
  `;
}

/** One page of the overview's queues. */
export interface QueuesShown {
  /** The queues on this page, by name. */
  readonly queues: readonly QueueCounts[];
  /** How many queues match the filter, counted up to `QUEUES_UP_TO`. */
  readonly total: number;
  /** The name prefix filtered by, `""` for none. */
  readonly prefix: string;
  /** The last queue of the previous page, if this is not the first. */
  readonly after: string | undefined;
  /** Queues per page. */
  readonly limit: number;
}

/**
 * The overview: each queue's counts, the oldest pending age, the chart. Its
 * queues are one page at a time, filtered by a name prefix, so it stays
 * small however many queues there are.
 */
export function overviewPage(
  context: PageContext,
  shown: QueuesShown,
  activity: readonly ActivityBucket[] | null,
): Html {
  const { base } = context;
  const { queues, prefix, after, limit } = shown;
  const filtered = prefix === "" ? "" : `prefix=${encodeURIComponent(prefix)}`;
  const last = queues.at(-1);
  const next = queues.length === limit && last !== undefined
    ? html`<a href="${base}/?${filtered === "" ? "" : `${filtered}&`}after=${
      encodeURIComponent(last.queue)
    }">Next queues →</a>`
    : "";
  const search = html`<form class="filters" action="${base}/" method="get">
<label>Queue name starts with<input name="prefix" value="${prefix}" size="20"></label><button>Filter</button></form>`;
  const said = `Showing ${queues.length} of ${
    count(shown.total, QUEUES_UP_TO)
  } ${shown.total === 1 ? "queue" : "queues"}${
    prefix === "" ? "" : ` starting with “${prefix}”`
  }${after === undefined ? "" : ` after “${after}”`}.`;
  const first = after === undefined
    ? ""
    : html`<a href="${base}/${
      filtered === "" ? "" : `?${filtered}`
    }">First queues</a>`;
  const summary = html`<p class="muted">${said} ${first} ${next}</p>`;
  const rows = queues.map((q) =>
    html`<tr><td><a href="${base}/events?queue=${
      encodeURIComponent(q.queue)
    }">${q.queue}</a></td>${
      STATES.map((state) =>
        html`
          <td
            class="num"><a class="state-${state}" href="${base}/events?state=${state}&amp;queue=${encodeURIComponent(
              q.queue,
            )}">${count(q[state])}</a></td>
        `
      )
    }<td class="num">${
      q.oldestPendingAt === null ? "–" : age(context.now - q.oldestPendingAt)
    }</td><td>${flowCell(context, q)}</td></tr>`
  );
  const table = queues.length === 0
    ? html`<p class="muted">${
      prefix === "" && after === undefined ? "No events yet." : "No queues."
    }</p>`
    : html`
      <div class="table-wrap">
        <table>
          <thead>
            <tr><th>Queue</th>${STATES.map((s) =>
              html`<th class="num state-${s}">${s}</th>`
            )}<th class="num">Oldest pending</th><th>Flow</th></tr>
          </thead>
          <tbody>${rows}</tbody>
        </table>
      </div>
    `;
  return page(
    context,
    "Overview",
    html`${search}${summary}${table}${
      activity === null
        ? ""
        : html`<h2>Last hour</h2>${activityChart(activity)}`
    }`,
  );
}

/**
 * A queue's flow control (`Outbox.pause`, `Outbox.setLimits`): "paused",
 * its limits, and with actions a link to pause or resume it.
 */
function flowCell(context: PageContext, q: QueueCounts): Html {
  const notes = [
    ...q.paused ? ["paused"] : [],
    ...q.perKey === undefined ? [] : [`${q.perKey} per key`],
    ...q.perSecond === undefined ? [] : [`${q.perSecond}/s`],
  ];
  const action = q.paused ? "resume" : "pause";
  return html`<span class="${q.paused ? "state-paused" : "muted"}">${
    notes.join(", ")
  }</span>${
    context.actions
      ? html`
        <a href="${context.base}/confirm/${action}?queue=${encodeURIComponent(
          q.queue,
        )}">${q.paused ? "Resume…" : "Pause…"}</a>
      `
      : ""
  }`;
}

/** Filters of the events page. */
export interface EventFilter {
  readonly state: EventState;
  readonly queue: string | undefined;
  readonly afterId: number;
}

/**
 * One page of events in a state, by enqueue time, with filters and the next
 * page's link.
 */
export function eventsPage(
  context: PageContext,
  filter: EventFilter,
  events: readonly EventInfo[],
  limit: number,
  notice?: Html,
): Html {
  const { base } = context;
  const query = (afterId: number) =>
    `${base}/events?state=${filter.state}${
      filter.queue === undefined
        ? ""
        : `&queue=${encodeURIComponent(filter.queue)}`
    }${afterId > 0 ? `&after=${afterId}` : ""}`;
  const form = html`<form class="filters" action="${base}/events" method="get">
<label>State<select name="state">${
    STATES.map((s) =>
      html`<option${
        s === filter.state
          ? html`
            selected
          `
          : ""
      }>${s}</option>`
    )
  }</select></label>
<label>Queue<input name="queue" value="${filter.queue ?? ""}"
  placeholder="every queue" size="20"></label><button>Show</button></form>`;
  const rows = events.map((e) =>
    html`
      <tr>
        <td class="num"><a href="${base}/events/${e.id}">${e.id}</a></td>
        <td>${e.queue}</td>
        <td class="state state-${e.state}">${e.state}</td>
        <td class="num">${e.attempt}/${e.maxAttempts}</td>
        <td>${when(e.createdAt, context.now)}</td>
        <td><code>${clip(payloadText(e.payload), 80)}</code></td>
        <td>${e.lastError === null ? "" : clip(e.lastError, 80)}</td>
      </tr>
    `
  );
  const last = events.at(-1);
  const next = events.length === limit && last !== undefined
    ? html`<p><a href="${query(last.id)}">Next page →</a></p>`
    : "";
  const table = events.length === 0
    ? html`<p class="muted">No ${filter.state} events${
      filter.queue === undefined ? "" : html`
        in ${filter.queue}
      `
    }${
      filter.afterId > 0
        ? html`
          after #${filter.afterId}
        `
        : ""
    }.</p>`
    : html`
      <div class="table-wrap">
        <table>
          <thead>
            <tr>
              <th class="num">Id</th>
              <th>Queue</th>
              <th>State</th>
              <th class="num">Attempt</th>
              <th>Enqueued</th>
              <th>Payload</th>
              <th>Last error</th>
            </tr>
          </thead>
          <tbody>${rows}</tbody>
        </table>
      </div>
    `;
  return page(
    context,
    `Events: ${filter.state}`,
    html`${notice ?? ""}${form}${table}${next}`,
  );
}

/** Dead letters, each with its last error, and the actions on them. */
export function deadPage(
  context: PageContext,
  events: readonly EventInfo[],
  limit: number,
): Html {
  const { base } = context;
  const rows = events.map((e) =>
    html`
      <tr>
        <td class="num"><a href="${base}/events/${e.id}">${e.id}</a></td>
        <td>${e.queue}</td>
        <td class="num">${e.attempt}/${e.maxAttempts}</td>
        <td>${when(e.updatedAt, context.now)}</td>
        <td>${e.lastError ?? ""}</td>
        <td>${context.actions
          ? html`<a href="${base}/confirm/redrive?id=${e.id}">Redrive…</a>`
          : ""}</td>
      </tr>
    `
  );
  const last = events.at(-1);
  const more = events.length === limit && last !== undefined
    ? html`<p><a href="${base}/events?state=dead&amp;after=${last.id}">More dead letters →</a></p>`
    : "";
  const bulk = context.actions && events.length > 0
    ? html`<p><a href="${base}/confirm/redrive">Redrive every dead letter…</a> · <a href="${base}/confirm/purge">Purge finished events by age…</a></p>`
    : "";
  return page(
    context,
    "Dead letters",
    events.length === 0 ? html`<p class="muted">No dead letters.</p>` : html`
      ${bulk}<div class="table-wrap">
        <table>
          <thead>
            <tr>
              <th class="num">Id</th>
              <th>Queue</th>
              <th class="num">Attempts</th>
              <th>Died</th>
              <th>Last error</th>
              <th></th>
            </tr>
          </thead>
          <tbody>${rows}</tbody>
        </table>
      </div>${more}
    `,
  );
}

/** One event: its fields, its payload as pretty JSON, its ledger's timeline. */
export function eventPage(
  context: PageContext,
  info: EventInfo,
  explanation: Explanation,
): Html {
  const { base, now } = context;
  const timeline = explanation.history.map((entry) =>
    html`
      <tr>
        <td>${when(entry.at, now)}</td>
        <td>${entry.kind}</td>
        <td class="num">${entry.fence}</td>
        <td>${entry.leaseUntil === null ? "" : when(entry.leaseUntil, now)}</td>
        <td>${entry.detail ?? ""}</td>
      </tr>
    `
  );
  const actions = !context.actions
    ? ""
    : info.state === "dead"
    ? html`<p><a href="${base}/confirm/redrive?id=${info.id}">Redrive…</a></p>`
    : info.state === "pending"
    ? html`<p><a href="${base}/confirm/cancel?id=${info.id}">Cancel…</a></p>`
    : "";
  return page(
    context,
    `Event ${info.id}`,
    html`
      <dl>
        <dt>State</dt>
        <dd class="state state-${info.state}">${info.state}</dd>
        <dt>Queue</dt>
        <dd>${info.queue}</dd>
        <dt>Identity</dt>
        <dd><code>${info.identity}</code></dd>
        <dt>Attempts</dt>
        <dd>${info.attempt} of ${info.maxAttempts} (fence ${explanation
          .fence})</dd>
        <dt>Enqueued</dt>
        <dd>${when(info.createdAt, now)}</dd>
        <dt>${info.state === "leased"
          ? "Lease until"
          : info.state === "pending"
          ? "Due"
          : info.state === "done"
          ? "Acknowledged"
          : "Died"}</dt>
        <dd>${when(finishedOrDue(info), now)}</dd>
        <dt>Ordering key</dt>
        <dd>${info.orderingKey ?? html`<span class="muted">none</span>`}</dd>
        <dt>Dedup key</dt>
        <dd>${info.dedupKey ?? html`<span class="muted">none</span>`}</dd>
        <dt>Last error</dt>
        <dd>${info.lastError ?? html`<span class="muted">none</span>`}</dd>
      </dl>${actions}
      <h2>Payload</h2><pre>${prettyPayload(info.payload)}</pre>
      <h2>Timeline</h2>${timeline.length === 0
        ? html`<p class="muted">Never claimed.</p>`
        : html`
          <div class="table-wrap">
            <table>
              <thead>
                <tr>
                  <th>When</th>
                  <th>What</th>
                  <th class="num">Fence</th>
                  <th>Lease until</th>
                  <th>Detail</th>
                </tr>
              </thead>
              <tbody>${timeline}</tbody>
            </table>
          </div>
        `}
    `,
  );
}

/** A confirmation form for one action, posted with the CSRF token. */
export function confirmPage(
  context: PageContext,
  action: string,
  question: string,
  fields: Readonly<Record<string, string>>,
  extra?: Html,
): Html {
  const { base } = context;
  const hidden = Object.entries(fields).map(([name, value]) =>
    html`<input type="hidden" name="${name}" value="${value}">`
  );
  return page(
    context,
    `Confirm: ${action}`,
    html`<form method="post" action="${base}/actions/${action}">
<p>${question}</p>${hidden}${extra ?? ""}
<input type="hidden" name="csrf" value="${context.csrf}">
<button class="danger" type="submit">${action}</button> <a href="${base}/">Back</a>
</form>`,
    false,
  );
}

/** What an action changed. */
export function donePage(context: PageContext, what: Html): Html {
  return page(
    context,
    "Done",
    html`
      <div class="notice" role="status">${what}</div>
      <p><a href="${context.base}/">Back to the overview</a></p>
    `,
    false,
  );
}

/** The title of an error page, by its status. */
const ERROR_TITLES = { 400: "Bad request", 404: "Not found" } as const;

/**
 * A page for an error the reader can act on, titled by its status: 400 a
 * request the dashboard cannot act on (a missing or malformed field), 404
 * a page or event that is not there.
 */
export function errorPage(
  context: PageContext,
  status: keyof typeof ERROR_TITLES,
  message: string,
): Html {
  return page(
    context,
    ERROR_TITLES[status],
    html`
      <p>${message}</p>
      <p><a href="${context.base}/">Back to the overview</a></p>
    `,
    false,
  );
}

/** When a finished event finished; when another is next due. */
function finishedOrDue(info: EventInfo): number {
  return info.state === "done" || info.state === "dead"
    ? info.updatedAt
    : info.dueAt;
}

/** A count, or e.g. "10,000+" where the overview's counting stopped. */
function count(n: number, upTo = COUNT_UP_TO): string {
  return n >= upTo ? `${upTo.toLocaleString("en")}+` : String(n);
}

function payloadText(payload: unknown): string {
  if (typeof payload === "string") return payload;
  try {
    return JSON.stringify(payload) ?? String(payload);
  } catch {
    return String(payload);
  }
}

function prettyPayload(payload: unknown): string {
  if (typeof payload === "string") return payload;
  try {
    return JSON.stringify(payload, null, 2) ?? String(payload);
  } catch {
    return String(payload);
  }
}

function clip(text: string, length: number): string {
  return text.length <= length ? text : `${text.slice(0, length - 1)}…`;
}

/** An instant as ISO time with its age: "2026-12-06 21:04:05 (3 min ago)". */
function when(at: number, now: number): Html {
  // A time another program wrote may lie outside what a Date can hold
  // (±8.64e15 ms): shown as it is stored, rather than failing the page.
  if (!Number.isFinite(new Date(at).getTime())) {
    return html`<span class="muted">${at} ms since the epoch</span>`;
  }
  const iso = new Date(at).toISOString();
  const delta = now - at;
  return html`
    <time datetime="${iso}">${iso.slice(0, 19).replace("T", " ")}</time> <span
      class="muted">(${delta >= 0
        ? `${age(delta)} ago`
        : `in ${age(-delta)}`})</span>
  `;
}

/** A duration in its largest unit: "45 s", "3 min", "2 h", "4 d". */
export function age(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 90) return `${s} s`;
  if (s < 90 * 60) return `${Math.round(s / 60)} min`;
  if (s < 36 * 3600) return `${Math.round(s / 3600)} h`;
  return `${Math.round(s / 86400)} d`;
}
