// A workflow's DAG as SVG: one column per dependency depth (the longest path from a root),
// nodes coloured by their state, an arrow from each dependency to its dependent.

import {svg} from "./dom.js";

const W = 160;
const H = 44;
const GAP_X = 56;
const GAP_Y = 14;
const PAD = 8;
const LABEL = 22;
const STATUSES = ["PENDING", "READY", "RUNNING", "COMPLETED", "FAILED", "SKIPPED"];

/** Depth of every node: 0 for roots, else one more than its deepest dependency. */
export function depths(nodes) {
  const depth = new Map();
  const visiting = new Set();
  const visit = (id) => {
    if (depth.has(id)) return depth.get(id);
    if (visiting.has(id) || !nodes[id]) return 0; // a cycle or a missing node: never valid
    visiting.add(id);
    const deps = nodes[id].dependencies || [];
    const d = deps.length ? 1 + Math.max(...deps.map(visit)) : 0;
    visiting.delete(id);
    depth.set(id, d);
    return d;
  };
  Object.keys(nodes).forEach(visit);
  return depth;
}

/** Positions: columns by depth, rows in id order within a column. */
export function layout(nodes) {
  const depth = depths(nodes);
  const columns = [];
  for (const id of Object.keys(nodes).sort()) {
    const d = depth.get(id) || 0;
    (columns[d] = columns[d] || []).push(id);
  }
  const at = new Map();
  columns.forEach((ids, col) => ids.forEach((id, row) => {
    at.set(id, {x: PAD + col * (W + GAP_X), y: PAD + row * (H + GAP_Y)});
  }));
  const rows = Math.max(1, ...columns.map((ids) => (ids ? ids.length : 0)));
  return {
    at,
    width: PAD * 2 + columns.length * W + Math.max(0, columns.length - 1) * GAP_X,
    height: PAD * 2 + rows * H + (rows - 1) * GAP_Y,
  };
}

function clip(text, max) {
  const s = String(text || "");
  return s.length > max ? `${s.slice(0, max - 1)}…` : s;
}

/** The graph of `definition.nodes` with the statuses of `state.node_states`. */
export function workflowGraph(definition, state) {
  const nodes = definition.nodes || {};
  const states = state.node_states || {};
  const {at, width, height} = layout(nodes);
  const edges = [];
  for (const [id, node] of Object.entries(nodes)) {
    for (const dep of node.dependencies || []) {
      const from = at.get(dep);
      const to = at.get(id);
      if (!from || !to) continue;
      const x1 = from.x + W;
      const y1 = from.y + H / 2;
      const x2 = to.x - 2;
      const y2 = to.y + H / 2;
      const mid = (x1 + x2) / 2;
      edges.push(svg("path", {class: "wf-edge", d: `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2},${y2}`},
        svg("title", {text: `${dep} → ${id}`})));
    }
  }
  const boxes = Object.entries(nodes).map(([id, node]) => {
    const {x, y} = at.get(id);
    const status = String((states[id] && states[id].status) || "PENDING").toUpperCase();
    const look = STATUSES.includes(status) ? status.toLowerCase() : "pending";
    const error = states[id] && states[id].error;
    return svg("g", {class: `wf-node node-${look}`, "data-node": id},
      svg("title", {text: `${id} · ${node.agent_id || ""} · ${status}${error ? ` · ${error}` : ""}`}),
      svg("rect", {x, y, width: W, height: H, rx: 6}),
      svg("text", {x: x + 8, y: y + 15, text: clip(id, LABEL)}),
      svg("text", {x: x + 8, y: y + 32, class: "sub", text: clip(`${status} · ${node.agent_id || ""}`, LABEL + 4)}),
    );
  });
  const arrow = svg("marker", {id: "wf-arrow", viewBox: "0 0 10 10", refX: 9, refY: 5,
    markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse"},
  svg("path", {class: "wf-arrow", d: "M0,0 L10,5 L0,10 z"}));
  return svg("svg", {width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": `workflow ${definition.workflow_id || ""}`},
  svg("defs", {}, arrow), ...edges, ...boxes);
}
