// A page's history: the subject's events from the event log (GET /console/api/history),
// newest first, a page at a time (**Older events** reads the next one), and refreshed by the
// page as events concerning the subject arrive.

import {describe, isRefusal, read, readPath} from "./api.js";
import {clock, el, emptyRow} from "./dom.js";
import {link} from "./router.js";
import {accepted, refused} from "./signin.js";

const WHERE = "page histories"; // how the sign-in panel names a refused history read

const PAGE = 50;
const DETAILS_CHARS = 200;

function url(kind, id, before) {
  return readPath("/console/api/history", {kind, id, limit: PAGE}, before);
}

export class HistoryView {
  constructor(kind, id) {
    this.kind = kind;
    this.id = id;
    this.events = [];
    this.next = null;
    this.rows = el("tbody", {});
    this.more = el("button", {type: "button", class: "history-older", text: "Older events",
      hidden: true, onclick: () => this.older()});
    this.problem = el("p", {class: "panel-error", hidden: true});
    this.node = el("section", {class: "panel wide history", "data-history": `${kind}:${id}`},
      el("h2", {}, "History ", el("span", {class: "count muted", text: "from the event log"})),
      this.problem,
      el("table", {},
        el("thead", {}, el("tr", {}, ["#", "time", "event", "actor", "agent", "details"]
          .map((h) => el("th", {text: h})))),
        this.rows),
      this.more);
  }

  /** Read the newest page; keep older pages already read when nothing was missed between.
   * A failed read shows its error in place (the rest of the page carries on). */
  async load() {
    let page;
    try {
      page = await read(url(this.kind, this.id, null));
      accepted(WHERE);
      this.show("");
    } catch (err) {
      if (isRefusal(err)) refused(WHERE, err);
      this.show(describe(err));
      return;
    }
    const fresh = page.events || [];
    const top = this.events.length ? this.events[0].sequence : 0;
    const newer = fresh.filter((e) => e.sequence > top);
    if (!this.events.length || (newer.length === fresh.length && fresh.length >= PAGE)) {
      this.events = fresh; // first read, or more happened than a page: start again
      this.next = page.next;
    } else {
      this.events = [...newer, ...this.events];
    }
    this.render();
  }

  async older() {
    if (this.next === null || this.next === undefined) return;
    this.more.disabled = true;
    try {
      const page = await read(url(this.kind, this.id, this.next));
      const last = this.events.length ? this.events[this.events.length - 1].sequence : Infinity;
      this.events.push(...(page.events || []).filter((e) => e.sequence < last));
      this.next = page.next;
      this.show("");
      this.render();
    } catch (err) {
      this.show(describe(err));
    } finally {
      this.more.disabled = false;
    }
  }

  show(problem) {
    this.problem.textContent = problem;
    this.problem.hidden = !problem;
  }

  render() {
    this.rows.replaceChildren(...(this.events.length ? this.events.map(row)
      : [emptyRow(6, "nothing recorded")]));
    this.more.hidden = this.next === null || this.next === undefined;
  }
}

function row(e) {
  const details = JSON.stringify(e.details || {});
  return el("tr", {"data-seq": e.sequence, "data-event-type": e.event_type},
    el("td", {class: "num", text: `#${e.sequence}`}),
    el("td", {title: new Date(e.ts * 1000).toISOString(), text: clock(e.ts)}),
    el("td", {class: "mono", text: e.event_type}),
    el("td", {class: "mono", text: e.actor}),
    el("td", {}, link("agent", e.agent_id)),
    el("td", {class: "details", title: details,
      text: details.length > DETAILS_CHARS ? `${details.slice(0, DETAILS_CHARS)}…` : details}),
  );
}
