// A workflow run's page: its graph and nodes (GET /console/api/workflows?workflow_id=) and
// its history (the run's and its nodes' events, correlated by the workflow's id).

import {read} from "./api.js";
import {badge, el, emptyRow} from "./dom.js";
import {attempt, section, when} from "./page.js";
import {link} from "./router.js";
import {block} from "./workflows.js";

export async function load(id) {
  const found = await attempt(
    () => read(`/console/api/workflows?workflow_id=${encodeURIComponent(id)}`), "workflow", id);
  const shown = found.value && (found.value.workflows || [])[0];
  if (!shown) return {state: "", nodes: [section("Workflow run", found.note)]};
  const status = (shown.state.metadata && shown.state.metadata.status) || "CREATED";
  return {state: status, nodes: [
    section("Workflow run", block(shown)),
    section("Nodes", nodeTable(shown.definition, shown.state)),
  ]};
}

export function concerns(id, event) {
  return event.correlation_id === id || (event.details || {}).workflow_id === id;
}

function nodeTable(definition, state) {
  const nodes = definition.nodes || {};
  const states = state.node_states || {};
  const ids = Object.keys(nodes).sort();
  return el("table", {},
    el("thead", {}, el("tr", {}, ["node", "agent", "status", "depends on", "started", "finished",
      "error"].map((h) => el("th", {text: h})))),
    el("tbody", {}, ids.length ? ids.map((nodeId) => {
      const node = nodes[nodeId];
      const s = states[nodeId] || {};
      return el("tr", {"data-node": nodeId},
        el("td", {class: "mono", text: nodeId}),
        el("td", {}, link("agent", node.agent_id)),
        el("td", {}, badge(s.status || "PENDING")),
        el("td", {class: "mono", text: (node.dependencies || []).join(", ")}),
        el("td", {}, when(s.started_at)),
        el("td", {}, when(s.completed_at)),
        el("td", {class: "muted", text: s.error || ""}),
      );
    }) : emptyRow(7, "no nodes")));
}
