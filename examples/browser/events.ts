/**
 * The example's event lists: the messages still waiting (pending or being
 * delivered) and those that gave up (dead letters), each with its identity,
 * attempt, next retry and last error, read with `outbox.list`.
 *
 * @module
 */
import type { EventInfo, ListOptions } from "../../admin.ts";

/** The few DOM members the lists use (the repository is not checked with the DOM lib). */
export interface Node {
  textContent: string | null;
  title: string;
  className: string;
  hidden: boolean;
  append(...nodes: (Node | string)[]): void;
  addEventListener(type: string, listener: () => void): void;
  replaceChildren(...nodes: Node[]): void;
}

/** The document, as far as the lists need it. */
export interface Document {
  getElementById(id: string): Node | null;
  createElement(tag: string): Node;
}

/** What the lists read of the outbox. */
export interface ListedOutbox {
  list(options: ListOptions): Promise<EventInfo<{ text: string }>[]>;
}

/** Rows shown per list; the page says when there are more. */
export const SHOWN = 50;

/**
 * Fills `#waiting-events-list` with pending and leased messages and `#dead-letters-list`
 * with dead letters, hiding each section while it is empty.
 *
 * @param outbox The shared outbox.
 * @param document The page's document.
 * @param redrive Called with a dead letter's id when its button is clicked.
 * @param now The time to count retries from, epoch milliseconds.
 */
export async function showEvents(
  outbox: ListedOutbox,
  document: Document,
  redrive: (eventId: number) => void,
  now: number = Date.now(),
): Promise<void> {
  const [pending, leased, dead] = await Promise.all(
    (["pending", "leased", "dead"] as const).map((state) =>
      outbox.list({ state, limit: SHOWN })
    ),
  );
  const waiting = [...pending!, ...leased!].sort((a, b) => a.id - b.id);
  fill(document, "waiting-events", waiting, (event) => [
    event.state === "leased"
      ? "delivering now"
      : event.dueAt <= now
      ? "now"
      : `in ${Math.ceil((event.dueAt - now) / 1000)} s`,
  ]);
  fill(document, "dead-letters", dead!, (event) => {
    const button = document.createElement("button");
    button.textContent = "redrive";
    button.addEventListener("click", () => redrive(event.id));
    // A time, not an age: the row stays as it is between refreshes, so its
    // button is not replaced under the pointer.
    return [
      `gave up at ${new Date(event.updatedAt).toLocaleTimeString()}`,
      button,
    ];
  });
}

/** What each list shows now, to leave a list alone while it is unchanged. */
const shown = new Map<string, string>();

function fill(
  document: Document,
  section: string,
  events: readonly EventInfo<{ text: string }>[],
  status: (event: EventInfo<{ text: string }>) => (Node | string)[],
): void {
  document.getElementById(section)!.hidden = events.length === 0;
  const rows = events.map((event) => {
    const [next, ...actions] = status(event);
    return { event, next: next!, actions };
  });
  const signature = JSON.stringify(
    rows.map((
      { event, next },
    ) => [event, typeof next === "string" ? next : ""]),
  );
  if (shown.get(section) === signature) return;
  shown.set(section, signature);
  document.getElementById(`${section}-list`)!.replaceChildren(
    ...rows.map(({ event, next, actions }) => {
      const row = document.createElement("tr");
      const identity = cell(document, event.identity.slice(-12));
      identity.title = event.identity;
      identity.className = "identity";
      row.append(
        cell(document, event.payload.text),
        identity,
        cell(document, `${event.attempt}/${event.maxAttempts}`),
        cell(document, next!),
        cell(document, event.lastError ?? "–"),
        ...actions.map((action) => cell(document, action)),
      );
      return row;
    }),
  );
}

function cell(document: Document, content: Node | string): Node {
  const td = document.createElement("td");
  td.append(content);
  return td;
}
