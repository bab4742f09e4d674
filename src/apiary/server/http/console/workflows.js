// Workflows (GET /console/api/workflows: definition and WorkflowService state) as graphs.

import {read} from "./api.js";
import {ago, badge, clock, el, fill, setText} from "./dom.js";
import {workflowGraph} from "./graph.js";
import {link} from "./router.js";

const SHOWN = 10;
const MAX_DRAWN = 300; // nodes; a bigger workflow is summarised instead of drawn

export async function refreshWorkflows() {
  const {workflows = []} = await read(`/console/api/workflows?limit=${SHOWN}`);
  setText("workflows-count", `(${workflows.length}${workflows.length >= SHOWN ? " latest" : ""})`);
  fill("workflows-body", workflows.length ? workflows.map(block)
    : el("p", {class: "muted", text: "no workflows yet"}));
}

function counts(states) {
  const by = {};
  for (const s of Object.values(states)) {
    const status = String(s.status || "PENDING");
    by[status] = (by[status] || 0) + 1;
  }
  return Object.entries(by).map(([status, n]) => `${n} ${status.toLowerCase()}`).join(", ");
}

/** A workflow run: its id, status, node counts and times, and its graph. */
export function block({definition, state}) {
  const nodes = definition.nodes || {};
  const states = state.node_states || {};
  const status = (state.metadata && state.metadata.status) || "CREATED";
  const failures = Object.values(states).filter((s) => s.error);
  const size = Object.keys(nodes).length;
  return el("div", {class: "workflow", "data-workflow": definition.workflow_id},
    el("h3", {},
      link("workflow", definition.workflow_id), " ", badge(status),
      el("span", {class: "muted", text: ` ${size} nodes: ${counts(states)}`}),
      state.started_at ? el("span", {class: "muted", title: clock(state.started_at),
        text: ` · started ${ago(state.started_at)}`}) : null,
      state.completed_at ? el("span", {class: "muted", title: clock(state.completed_at),
        text: ` · finished ${ago(state.completed_at)}`}) : null,
    ),
    size <= MAX_DRAWN ? workflowGraph(definition, state)
      : el("p", {class: "muted", text: `too large to draw (${size} nodes)`}),
    failures.length ? el("ul", {}, failures.map((s) =>
      el("li", {}, el("span", {class: "mono", text: s.node_id}), `: ${s.error}`))) : null,
  );
}
