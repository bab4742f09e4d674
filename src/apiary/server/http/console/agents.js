// Agents (DiscoveryService.ListAgents: lifecycle state and inbound queue depth) and the
// activity buffer (ActivityBufferService.List).

import {call} from "./api.js";
import {ago, badge, clock, el, emptyRow, fill, setText, shortId} from "./dom.js";
import {link} from "./router.js";

export async function refreshAgents() {
  const {agents = []} = await call("apiary.v1.DiscoveryService", "ListAgents", {});
  agents.sort((a, b) => agentId(a).localeCompare(agentId(b)));
  setText("agents-count", `(${agents.length})`);
  fill("agents-body", agents.length ? agents.map(agentRow) : emptyRow(5, "no agents registered"));
}

function agentId(info) {
  return (info.descriptor && info.descriptor.agent_id) || "";
}

function agentRow(info) {
  const d = info.descriptor || {};
  const depth = Number(info.buffer_depth || 0);
  const capacity = Number(info.buffer_capacity || 0);
  const name = d.name && d.name !== d.agent_id ? el("div", {class: "muted", text: d.name}) : null;
  return el("tr", {"data-agent": d.agent_id},
    el("td", {}, link("agent", d.agent_id), name),
    el("td", {}, badge(info.state)),
    el("td", {title: `${depth} of ${capacity} messages`},
      el("meter", {min: 0, max: Math.max(capacity, 1), value: depth,
        high: Math.max(capacity, 1) * 0.8, optimum: 0}),
      ` ${depth} / ${capacity}`),
    el("td", {title: clock(info.last_heartbeat_at)}, ago(info.last_heartbeat_at)),
    el("td", {class: "muted", text: (d.capabilities || []).join(", ")}),
  );
}

export async function refreshActivity() {
  const history = document.getElementById("activity-history").checked;
  const doc = await call("apiary.v1.ActivityBufferService", "List", {history});
  const entries = doc.entries || [];
  const use = Math.round(Number(doc.utilization || 0) * 100);
  setText("activity-count", `(${entries.length}${history ? " recent" : `, ${use}% used`})`);
  fill("activity-body", entries.length ? entries.map(activityRow)
    : emptyRow(6, history ? "no recent completions" : "no work in flight"));
}

function activityRow(e) {
  const where = [e.repo_id, e.worktree_id].filter(Boolean).join(" / ");
  return el("tr", {},
    el("td", {}, link("agent", e.agent_id)),
    el("td", {}, link("task", e.task_id, shortId(e.task_id))),
    el("td", {}, where, e.branch ? el("div", {class: "muted", text: e.branch}) : null),
    el("td", {text: e.description}),
    el("td", {title: clock(e.started_at), text: ago(e.started_at)}),
    el("td", {}, e.outcome ? badge(e.outcome) : el("span", {class: "muted", text: "active"})),
  );
}
