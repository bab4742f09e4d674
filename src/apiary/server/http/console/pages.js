// The subject pages (#/<kind>/<id>): which module reads each kind, the page on show, and
// whether an event of the live stream concerns it (the app then reads it again). Each page
// module exports load(id) -> {state, nodes} and concerns(id, event) -> bool.

import * as agent from "./agent_page.js";
import {el, fill} from "./dom.js";
import {HistoryView} from "./history.js";
import * as hitl from "./hitl_page.js";
import * as negotiation from "./negotiation_page.js";
import {heading} from "./page.js";
import * as room from "./room_page.js";
import * as task from "./task_page.js";
import * as workflow from "./workflow_page.js";

const PAGES = {agent, task, workflow, room, negotiation, hitl};

let current = null;

/** Show the page of `kind` `id` (read by the next refreshPage). */
export function openPage(kind, id) {
  if (current && current.kind === kind && current.id === id) return;
  current = {kind, id, history: new HistoryView(kind, id)};
  const page = document.getElementById("page");
  page.dataset.kind = kind;
  page.dataset.loaded = "";
  fill("page-body", heading(kind, id, ""), el("p", {class: "muted", text: "reading…"}));
}

/** No page is on show (the dashboard or the finished work is). */
export function closePage() {
  current = null;
}

/** Read the page on show: its subject and its history's newest events. */
export async function refreshPage() {
  const mine = current;
  if (!mine) return;
  const [shown] = await Promise.all([PAGES[mine.kind].load(mine.id), mine.history.load()]);
  if (mine !== current) return; // another page was opened meanwhile
  fill("page-body", heading(mine.kind, mine.id, shown.state), ...shown.nodes, mine.history.node);
  document.getElementById("page").dataset.loaded = `${mine.kind}:${mine.id}`;
}

/** Whether `event` (from the live stream) changes what the page on show says. */
export function pageConcerns(event) {
  return current !== null && PAGES[current.kind].concerns(current.id, event);
}
