// The console's entry point: shows the view the address names (the dashboard, a subject's
// page, the finished work; router.js), loads its panels, follows the event stream, and
// refreshes the panels an event concerns, debounced, so a burst of events costs one read per
// panel. Panels not on show are read when they are shown again. A read the coordinator
// refuses (401, 403) empties its panel and opens the sign-in panel; signing in or out reads
// everything again with the new credential.

import {call, describe, isRefusal, token} from "./api.js";
import {blank, panelError, setText} from "./dom.js";
import {refreshActivity, refreshAgents} from "./agents.js";
import {refreshDlq} from "./dlq.js";
import {addEvent, clearFeed, initFeed} from "./feed.js";
import {initFinished, refreshFinished} from "./finished.js";
import {initHitl, refreshHitl} from "./hitl.js";
import {closePage, openPage, pageConcerns, refreshPage} from "./pages.js";
import {refreshRooms} from "./rooms.js";
import {parse} from "./router.js";
import {accepted, initSignin, refused} from "./signin.js";
import {LiveStream} from "./stream.js";
import {refreshTasks} from "./tasks.js";
import {refreshWorkflows} from "./workflows.js";

const DEBOUNCE_MS = 250; // wait this long for the rest of a burst
const MIN_GAP_MS = 1000; // and read a panel at most once a second
const BACKLOG = 100; // events shown from before the page opened
const EVENT_LOG = "event log"; // how the sign-in panel names the reads that are not panels
const LIVE = "live events";

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
  constructor(id, label, load) {
    this.id = id;
    this.label = label;
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
    if (document.hidden || !onShow(this.id)) {
      stale.add(this.id); // read when it is shown again
      return;
    }
    this.running = true;
    this.last = Date.now();
    const asked = token(); // an answer speaks for the credential it was read with only
    try {
      await this.load();
      panelError(this.id, "");
      if (token() === asked) accepted(this.label);
    } catch (err) {
      if (isRefusal(err) && token() === asked) {
        blank(this.id); // nothing read with an earlier credential stays on show
        refused(this.label, err);
      }
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
  ["agents", new Panel("agents", "agents", refreshAgents)],
  ["activity", new Panel("activity", "activity buffer", refreshActivity)],
  ["tasks", new Panel("tasks", "open tasks", refreshTasks)],
  ["hitl", new Panel("hitl", "HITL inbox", refreshHitl)],
  ["dlq", new Panel("dlq", "dead letter queue", refreshDlq)],
  ["workflows", new Panel("workflows", "workflows", refreshWorkflows)],
  ["rooms", new Panel("rooms", "negotiation rooms", refreshRooms)],
  ["page", new Panel("page", "this page", refreshPage)],
  ["finished", new Panel("finished", "finished work", () => refreshFinished(route.params))],
]);
const VIEWS = ["dashboard", "page", "finished"]; // each the id of its <main>
const stale = new Set();
let route = parse(location.hash);

function onShow(id) {
  if (id === "page" || id === "finished") return route.view === id;
  return route.view === "dashboard";
}

/** Show the view the address names and read what it shows. */
function navigate() {
  route = parse(location.hash);
  for (const view of VIEWS) document.getElementById(view).hidden = view !== route.view;
  for (const link of document.querySelectorAll(".views a")) {
    link.classList.toggle("current", link.dataset.view === route.view);
  }
  if (route.view === "page") {
    openPage(route.kind, route.id);
    refresh("page");
  } else {
    closePage();
    if (route.view === "finished") refresh("finished");
  }
  const shown = [...stale].filter(onShow);
  shown.forEach((id) => stale.delete(id));
  refresh(...shown);
  window.scrollTo(0, 0);
}

function refresh(...ids) {
  for (const id of ids) panels.get(id).request();
}

/** Every panel: those not on show are only marked stale (Panel.run), read once shown. */
function refreshAll() {
  refresh(...panels.keys());
}

function affected(eventType) {
  const found = ROUTES.find(([prefix]) => eventType.startsWith(prefix));
  return found ? found[1] : [];
}

// ---- the event stream

let liveFrom = 0; // the log's end when the panels were first read
let dropped = false;

function showStatus(text, className, title = "") {
  const status = document.getElementById("live-status");
  status.textContent = text;
  status.className = `status ${className}`;
  status.title = title || "The live event stream";
}

const live = new LiveStream({
  onOpen() {
    showStatus("live", "status-live");
    accepted(LIVE);
    if (dropped) refreshAll(); // whatever changed while we were away
    dropped = false;
  },
  onDrop(err) {
    showStatus("reconnecting", "status-off", err ? describe(err) : "");
    dropped = true; // it reconnects by itself, sending Last-Event-ID
  },
  onRefused(err) {
    showStatus("refused", "status-off", describe(err));
    refused(LIVE, err);
  },
  onMessage(message) {
    if (message.type !== "message") return;
    let event;
    try {
      event = JSON.parse(message.data);
    } catch {
      return;
    }
    addEvent(event);
    setText("last-sequence", `event #${event.sequence}`);
    if (event.sequence > liveFrom) {
      refresh(...affected(String(event.event_type || "")));
      if (pageConcerns(event)) refresh("page");
    }
  },
});

let generation = 0;

/** Read everything with the tab's credential: at load, and whenever it signs in or out. */
async function begin() {
  const mine = ++generation;
  live.stop();
  clearFeed();
  showStatus("connecting", "status-off");
  setText("last-sequence", "");
  // The log's end first, then the panels: whatever happens after `liveFrom` refreshes the
  // panels it concerns, and whatever happened before is in the panels' first reads.
  let from = 0;
  let failed = null;
  try {
    const doc = await call("apiary.v1.EventLogService", "ReadEvents", {limit: 1});
    from = Number(doc.last_sequence || 0);
  } catch (err) {
    failed = err;
  }
  if (mine !== generation) return; // signed in or out again meanwhile: that run reads
  if (!failed) accepted(EVENT_LOG);
  else if (isRefusal(failed)) refused(EVENT_LOG, failed);
  else setText("last-sequence", describe(failed));
  liveFrom = from;
  dropped = false;
  refreshAll();
  live.start(Math.max(0, liveFrom - BACKLOG));
}

function start() {
  initSignin(begin);
  initFeed();
  initFinished(() => refresh("finished"));
  initHitl(() => refresh("hitl", "rooms", "page"));
  document.getElementById("activity-history").addEventListener("change", () => refresh("activity"));
  document.addEventListener("visibilitychange", () => {
    if (document.hidden || !stale.size) return;
    const ids = [...stale].filter(onShow);
    ids.forEach((id) => stale.delete(id));
    refresh(...ids);
  });
  window.addEventListener("hashchange", navigate);
  navigate();
  begin();
}

start();
