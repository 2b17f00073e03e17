/**
 * The dashboard's stylesheet and its one script, served as files so the
 * Content-Security-Policy allows no inline style or script.
 *
 * @module
 */

/** The stylesheet: calm, the usual state colours, a laptop or a phone. */
export const STYLESHEET = `
:root { color-scheme: light dark; --fg: #1f2328; --muted: #656d76; --bg: #ffffff;
  --panel: #f6f8fa; --line: #d0d7de; --link: #0969da; --pending: #9a6700;
  --leased: #0969da; --done: #1a7f37; --dead: #cf222e; --paused: #8250df; }
@media (prefers-color-scheme: dark) { :root { --fg: #e6edf3; --muted: #8d96a0;
  --bg: #0d1117; --panel: #161b22; --line: #30363d; --link: #4493f8;
  --pending: #d29922; --leased: #4493f8; --done: #3fb950; --dead: #f85149; } }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif;
  color: var(--fg); background: var(--bg); }
header { display: flex; flex-wrap: wrap; gap: 0.5rem 1.5rem; align-items: baseline;
  padding: 0.75rem 1rem; border-bottom: 1px solid var(--line); background: var(--panel); }
header h1 { font-size: 1rem; margin: 0; }
nav a { margin-right: 1rem; }
main { padding: 1rem; max-width: 72rem; }
a { color: var(--link); text-decoration: none; }
a:hover { text-decoration: underline; }
h2 { font-size: 1.1rem; margin: 1.25rem 0 0.5rem; }
.table-wrap { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 0.35rem 0.6rem; border-bottom: 1px solid var(--line);
  vertical-align: top; unicode-bidi: isolate; }
th { color: var(--muted); font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.state { font-weight: 600; }
.state-pending { color: var(--pending); } .state-leased { color: var(--leased); }
.state-done { color: var(--done); } .state-dead { color: var(--dead); }
.state-paused { color: var(--paused); font-weight: 600; }
.muted { color: var(--muted); }
pre { background: var(--panel); border: 1px solid var(--line); padding: 0.75rem;
  overflow-x: auto; white-space: pre-wrap; word-break: break-word; }
code, pre { font: 13px/1.45 ui-monospace, SFMono-Regular, Menlo, monospace; }
form.inline { display: inline; }
form.filters { display: flex; flex-wrap: wrap; gap: 0.5rem; align-items: end; margin: 0.5rem 0; }
label { display: flex; flex-direction: column; font-size: 12px; color: var(--muted); }
input, select, button { font: inherit; padding: 0.25rem 0.5rem; border: 1px solid var(--line);
  border-radius: 6px; background: var(--bg); color: var(--fg); }
button { cursor: pointer; background: var(--panel); }
button.danger { color: var(--dead); border-color: var(--dead); }
.notice { padding: 0.6rem 0.8rem; border: 1px solid var(--line); border-radius: 6px;
  background: var(--panel); margin: 0.5rem 0; }
.chart { margin: 0; }
time { white-space: nowrap; }
.chart svg { width: 100%; height: auto; max-height: 12rem; }
.chart .done { fill: var(--done); } .chart .failed { fill: var(--dead); }
.chart text { fill: var(--muted); font-size: 10px; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 0.25rem 1rem; }
dt { color: var(--muted); } dd { margin: 0; word-break: break-all; }
@media (max-width: 40rem) { main { padding: 0.5rem; } th, td { padding: 0.3rem; } }
`;

/**
 * The live-update script: every few seconds it fetches the page again and
 * swaps its `<main>` in, unless the reader is typing in a form or the tab
 * is hidden. Pages read the same without it.
 */
export const LIVE_SCRIPT = `"use strict";
(() => {
  const main = document.querySelector("main[data-live]");
  if (!main) return;
  const every = Number(main.dataset.live) || 5000;
  const tick = async () => {
    if (document.hidden || main.contains(document.activeElement) &&
      document.activeElement.matches("input, select, textarea")) return;
    try {
      const response = await fetch(location.href, { headers: { accept: "text/html" } });
      if (!response.ok) return;
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const next = page.querySelector("main[data-live]");
      if (next) main.replaceChildren(...next.childNodes);
    } catch { /* the next tick tries again */ }
  };
  setInterval(tick, every);
})();
`;

/** The tab's icon: a green square, so no request for /favicon.ico is made. */
export const FAVICON =
  `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" rx="3" fill="#1a7f37"/></svg>`;
