// An agent's page: its registration (DiscoveryService.GetAgent: the state every reader
// shows, capabilities, inbound queue), its open tasks (TaskQueryService.ListTasks), a link to
// its finished tasks, and its history (the events naming the agent).

import {call} from "./api.js";
import {ago, badge, clock, el, emptyRow} from "./dom.js";
import {attempt, facts, section, when} from "./page.js";
import {finishedHref, link} from "./router.js";
import {OPEN} from "./tasks.js";

export async function load(id) {
  const [agent, open] = await Promise.all([
    attempt(() => call("apiary.v1.DiscoveryService", "GetAgent", {agent_id: id}), "agent", id),
    attempt(() => call("apiary.v1.TaskQueryService", "ListTasks",
      {agent_id: id, states: OPEN, limit: 100}), "agent", id),
  ]);
  const info = agent.value;
  const nodes = [section("Agent", info ? record(info) : agent.note)];
  const tasks = (open.value && open.value.tasks) || [];
  nodes.push(section(`Open tasks (${tasks.length})`,
    open.value ? taskTable(tasks) : open.note,
    el("p", {}, el("a", {href: finishedHref("task", id), "data-finished-of": id,
      text: "finished tasks of this agent"}))));
  return {state: info ? info.state : "", nodes};
}

export function concerns(id, event) {
  return event.agent_id === id;
}

function record(info) {
  const d = info.descriptor || {};
  const depth = Number(info.buffer_depth || 0);
  const capacity = Number(info.buffer_capacity || 0);
  return facts([
    ["state", badge(info.state)],
    ["name", d.name],
    ["description", d.description],
    ["capabilities", (d.capabilities || []).join(", ") || "none"],
    ["modalities", (d.modalities_supported || []).join(", ")],
    ["communication class", d.communication_class],
    ["reasoning connectors", (d.reasoning_connectors || []).join(", ")],
    ["signing key", d.public_key ? "registered" : "none"],
    ["registered", when(info.registered_at)],
    ["last heartbeat", info.last_heartbeat_at
      ? el("span", {title: clock(info.last_heartbeat_at), text: ago(info.last_heartbeat_at)}) : ""],
    ["inbound queue", `${depth} of ${capacity} messages`],
  ]);
}

function taskTable(tasks) {
  return el("table", {},
    el("thead", {}, el("tr", {}, ["task", "state", "priority", "note"].map((h) => el("th", {text: h})))),
    el("tbody", {}, tasks.length ? tasks.map((t) => el("tr", {"data-task": t.task_id},
      el("td", {}, link("task", t.task_id)),
      el("td", {}, badge(t.state)),
      el("td", {class: "num", text: String(t.priority || 0)}),
      el("td", {class: "muted", text: t.note || t.scope || ""}),
    )) : emptyRow(4, "no open tasks")));
}
