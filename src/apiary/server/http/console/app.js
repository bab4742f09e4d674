// The console's entry point: loads every panel, follows the event stream, and refreshes the
// panels an event concerns, debounced, so a burst of events costs one read per panel.

import {call, describe, setToken, token} from "./api.js";
import {panelError, setText} from "./dom.js";
import {refreshActivity, refreshAgents} from "./agents.js";
import {refreshDlq} from "./dlq.js";
import {addEvent, initFeed} from "./feed.js";
import {initHitl, refreshHitl} from "./hitl.js";
import {refreshRooms} from "./rooms.js";
import {refreshTasks} from "./tasks.js";
import {refreshWorkflows} from "./workflows.js";

const DEBOUNCE_MS = 250; // wait this long for the rest of a burst
const MIN_GAP_MS = 1000; // and read a panel at most once a second
const BACKLOG = 100; // events shown from before the page opened

/** Which panels an event type concerns: the first matching prefix decides. */
const ROUTES = [
  ["agent.log", []], // agents' own log lines change nothing a panel shows
  ["agent.", ["agents", "activity"]],
  ["message.", ["agents", "dlq"]],
  ["stream.", ["agents"]],
  ["dlq.", ["dlq", "agents"]],
  ["task.", ["tasks", "activity", "agents"]],
  ["activity.", ["activity"]],
  ["hitl.", ["hitl", "rooms"]],
  ["workflow.", ["workflows"]],
  ["room.", ["rooms"]],
  ["negotiation.", ["rooms"]],
  ["coordinator.", ["agents", "activity", "tasks", "hitl", "dlq", "workflows", "rooms"]],
];

class Panel {
  constructor(id, load) {
    this.id = id;
    this.load = load;
    this.timer = null;
    this.running = false;
    this.again = false;
    this.last = 0;
  }

  request() {
    if (this.running) {
      this.again = true;
      return;
    }
    if (this.timer !== null) return;
    const wait = Math.max(DEBOUNCE_MS, this.last + MIN_GAP_MS - Date.now());
    this.timer = setTimeout(() => this.run(), wait);
  }

  async run() {
    this.timer = null;
    if (document.hidden) {
      stale.add(this.id); // read when the tab is visible again
      return;
    }
    this.running = true;
    this.last = Date.now();
    try {
      await this.load();
      panelError(this.id, "");
    } catch (err) {
      panelError(this.id, describe(err));
    } finally {
      this.running = false;
      if (this.again) {
        this.again = false;
        this.request();
      }
    }
  }
}

const panels = new Map([
  ["agents", new Panel("agents", refreshAgents)],
  ["activity", new Panel("activity", refreshActivity)],
  ["tasks", new Panel("tasks", refreshTasks)],
  ["hitl", new Panel("hitl", refreshHitl)],
  ["dlq", new Panel("dlq", refreshDlq)],
  ["workflows", new Panel("workflows", refreshWorkflows)],
  ["rooms", new Panel("rooms", refreshRooms)],
]);
const stale = new Set();

function refresh(...ids) {
  for (const id of ids) panels.get(id).request();
}

function refreshAll() {
  refresh(...panels.keys());
}

function affected(eventType) {
  const route = ROUTES.find(([prefix]) => eventType.startsWith(prefix));
  return route ? route[1] : [];
}

// ---- the event stream

function follow(liveFrom) {
  const status = document.getElementById("live-status");
  const source = new EventSource(`/v1/events/stream?after=${Math.max(0, liveFrom - BACKLOG)}`);
  let dropped = false;
  source.addEventListener("open", () => {
    status.textContent = "live";
    status.className = "status status-live";
    if (dropped) refreshAll(); // whatever changed while we were away
    dropped = false;
  });
  source.addEventListener("error", () => {
    status.textContent = "reconnecting";
    status.className = "status status-off";
    dropped = true; // the browser reconnects by itself, sending Last-Event-ID
  });
  source.addEventListener("message", (message) => {
    let event;
    try {
      event = JSON.parse(message.data);
    } catch {
      return;
    }
    addEvent(event);
    setText("last-sequence", `event #${event.sequence}`);
    if (event.sequence > liveFrom) refresh(...affected(String(event.event_type || "")));
  });
}

// ---- the operator token

function showToken() {
  const set = !!token();
  document.getElementById("token-form").hidden = set;
  document.getElementById("token-set").hidden = !set;
}

function initToken() {
  const form = document.getElementById("token-form");
  const input = document.getElementById("token-input");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    setToken(input.value.trim());
    input.value = "";
    showToken();
    refresh("hitl");
  });
  document.getElementById("token-forget").addEventListener("click", () => {
    setToken("");
    showToken();
    refresh("hitl");
  });
  showToken();
}

async function start() {
  initToken();
  initFeed();
  initHitl(() => refresh("hitl", "rooms"));
  document.getElementById("activity-history").addEventListener("change", () => refresh("activity"));
  document.addEventListener("visibilitychange", () => {
    if (document.hidden || !stale.size) return;
    const ids = [...stale];
    stale.clear();
    refresh(...ids);
  });
  // The log's end first, then the panels: whatever happens after `liveFrom` refreshes the
  // panels it concerns, and whatever happened before is in the panels' first reads.
  let liveFrom = 0;
  try {
    const doc = await call("apiary.v1.EventLogService", "ReadEvents", {limit: 1});
    liveFrom = Number(doc.last_sequence || 0);
  } catch (err) {
    setText("last-sequence", describe(err));
  }
  refreshAll();
  follow(liveFrom);
}

start();
