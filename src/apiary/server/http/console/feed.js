// The live event feed: the newest events of GET /v1/events/stream, filterable, pausable.

import {clock, el} from "./dom.js";

const KEPT = 300;
const DETAILS_CHARS = 240;

let paused = false;
let filter = "";
const held = [];

export function initFeed() {
  const input = document.getElementById("feed-filter");
  input.addEventListener("input", () => {
    filter = input.value.trim().toLowerCase();
    for (const row of document.getElementById("feed-body").children) {
      row.hidden = !matches(row.dataset.search);
    }
  });
  const pause = document.getElementById("feed-pause");
  pause.addEventListener("click", () => {
    paused = !paused;
    pause.textContent = paused ? "Resume" : "Pause";
    if (!paused) held.splice(0).forEach(show);
  });
}

/** Forget every event shown and held (the tab signed out, or in as someone else). */
export function clearFeed() {
  held.length = 0;
  document.getElementById("feed-body").replaceChildren();
}

function matches(search) {
  return !filter || (search || "").split(" ").some((word) => word.startsWith(filter));
}

/** Add one stream event (the JSON of a `data:` line) at the top of the feed. */
export function addEvent(event) {
  if (paused) {
    held.push(event);
    if (held.length > KEPT) held.shift();
    return;
  }
  show(event);
}

function show(event) {
  const details = JSON.stringify(event.details || {});
  const search = [event.event_type, event.agent_id, event.correlation_id, event.actor]
    .filter(Boolean).join(" ").toLowerCase();
  const row = el("li", {"data-seq": event.sequence, "data-search": search},
    el("span", {text: `#${event.sequence}`}),
    el("span", {text: clock(event.ts)}),
    el("span", {text: event.event_type}),
    el("span", {title: event.correlation_id || "", text: event.agent_id || event.actor}),
    el("span", {class: "details", title: details,
      text: details.length > DETAILS_CHARS ? `${details.slice(0, DETAILS_CHARS)}…` : details}),
  );
  row.hidden = !matches(search);
  const list = document.getElementById("feed-body");
  list.prepend(row);
  while (list.children.length > KEPT) list.lastElementChild.remove();
}
