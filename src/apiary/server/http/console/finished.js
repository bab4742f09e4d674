// Finished work (GET /console/api/finished): tasks, workflow runs, room decisions,
// negotiations and HITL invocations that ended, newest first; a kind and a search (text any
// field of the item contains) kept in the page's address, **More** for the next page.

import {describe, read, readPath} from "./api.js";
import {ago, badge, clock, el, emptyRow, fill, setText} from "./dom.js";
import {KIND_NAMES, finishedHref, link} from "./router.js";

const PAGE = 50;
const WORK = ["task", "workflow", "room", "negotiation", "hitl"];

let shown = {kind: "", q: "", items: [], next: null};

function url(kind, q, before) {
  return readPath("/console/api/finished", {limit: PAGE, kind, q}, before);
}

/** Wire the search form (once): submitting it moves to its address, which reads;
 * `reread` reads the address on show again (its panel's refresh, in app.js). */
export function initFinished(reread) {
  const select = document.getElementById("finished-kind");
  select.replaceChildren(el("option", {value: "", text: "all kinds"}),
    ...WORK.map((k) => el("option", {value: k, text: KIND_NAMES[k]})));
  document.getElementById("finished-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const q = document.getElementById("finished-q").value.trim();
    const target = finishedHref(select.value, q);
    if (location.hash === target) reread();
    else location.hash = target;
  });
  document.getElementById("finished-more").addEventListener("click", more);
}

/** Read the first page for the address's kind and search. */
export async function refreshFinished(params) {
  const kind = WORK.includes(params.get("kind")) ? params.get("kind") : "";
  const q = params.get("q") || "";
  document.getElementById("finished-kind").value = kind;
  document.getElementById("finished-q").value = q;
  const page = await read(url(kind, q, null));
  shown = {kind, q, items: page.items || [], next: page.next};
  render();
}

async function more() {
  const button = document.getElementById("finished-more");
  button.disabled = true;
  try {
    const page = await read(url(shown.kind, shown.q, shown.next));
    shown.items.push(...(page.items || []));
    shown.next = page.next;
    render();
  } catch (err) {
    setText("finished-count", describe(err));
  } finally {
    button.disabled = false;
  }
}

function render() {
  const {items, next, q} = shown;
  setText("finished-count", `(${items.length}${next !== null ? "+" : ""})`);
  fill("finished-body", items.length ? items.map(row)
    : emptyRow(6, q ? `nothing finished matches "${q}"` : "nothing has finished yet"));
  document.getElementById("finished-more").hidden = next === null || next === undefined;
}

function row(item) {
  return el("tr", {"data-kind": item.kind, "data-id": item.id, "data-seq": item.sequence},
    el("td", {text: KIND_NAMES[item.kind] || item.kind}),
    el("td", {}, link(item.kind, item.id),
      item.detail ? el("div", {class: "muted mono", text: item.detail}) : null),
    el("td", {}, badge(item.state)),
    el("td", {}, link("agent", item.agent_id)),
    el("td", {class: "muted", text: item.summary}),
    el("td", {title: clock(item.ts), text: ago(item.ts)}),
  );
}
