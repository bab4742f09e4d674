// Scheduler tasks not yet ended (TaskQueryService.ListTasks), in submission order.

import {call} from "./api.js";
import {ago, badge, clock, el, emptyRow, fill, setText, shortId} from "./dom.js";
import {link} from "./router.js";

/** The states of a task not yet ended (the agent page lists them too). */
export const OPEN = ["QUEUED", "HELD", "DISPATCHED", "RUNNING"];
const LIMIT = 200;

export async function refreshTasks() {
  const {tasks = []} = await call("apiary.v1.TaskQueryService", "ListTasks",
    {states: OPEN, limit: LIMIT});
  setText("tasks-count", `(${tasks.length}${tasks.length >= LIMIT ? "+" : ""})`);
  fill("tasks-body", tasks.length ? tasks.map(taskRow) : emptyRow(7, "no open tasks"));
}

function taskRow(t) {
  return el("tr", {"data-task": t.task_id},
    el("td", {}, link("task", t.task_id, shortId(t.task_id))),
    el("td", {}, link("agent", t.agent_id)),
    el("td", {}, badge(t.state)),
    el("td", {text: String(t.priority || 0)}),
    el("td", {text: t.lane || "STANDARD"}),
    el("td", {title: clock(t.updated_at), text: ago(t.updated_at)}),
    el("td", {class: "muted", text: t.note || t.scope || ""}),
  );
}
