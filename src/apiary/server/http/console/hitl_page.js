// A HITL invocation's page: the invocation as operators see it (HitlOperatorService.Get,
// which needs a signed-in operator when operators are configured), its decision, links to
// what it is about, and its history (the events naming the invocation). A pending one can
// be decided here as in the inbox; a decided one shows no deadline.

import {HITL, call} from "./api.js";
import {el, pretty} from "./dom.js";
import {card} from "./hitl.js";
import {attempt, facts, section, when} from "./page.js";
import {link} from "./router.js";

const SUBJECT_LINKS = [
  ["agent_id", "agent"], ["task_id", "task"], ["workflow_id", "workflow"],
  ["negotiation_room_id", "room"], ["negotiation_id", "negotiation"],
];

export async function load(id) {
  const found = await attempt(() => call(HITL, "Get", {invocation_id: id}), "hitl", id);
  const v = found.value;
  if (!v) return {state: "", nodes: [section("Invocation", found.note)]};
  return {state: v.state, nodes: [
    section("Invocation", el("div", {class: "cards"}, card(v)), record(v)),
  ]};
}

export function concerns(id, event) {
  return (event.details || {}).invocation_id === id;
}

function parsed(text) {
  try {
    const value = JSON.parse(text || "{}");
    return value && typeof value === "object" ? value : {};
  } catch {
    return {};
  }
}

function record(v) {
  const subject = parsed(v.subject_json);
  const decision = parsed(v.decision_json);
  const about = SUBJECT_LINKS.filter(([key]) => subject[key])
    .flatMap(([key, kind], i) => [i ? ", " : "", link(kind, String(subject[key]))]);
  return facts([
    ["about", about.length ? el("span", {}, about) : ""],
    ["requested by", v.requested_by],
    ["created", when(v.created_at)],
    ["correlation id", v.correlation_id],
    ["decision", decision.action ? `${decision.action} by ${decision.decided_by || "?"}` : ""],
    ["rationale", decision.rationale],
    ["decided", decision.decided_at ? when(decision.decided_at) : ""],
    ["decision record", v.decision_json ? el("pre", {text: pretty(v.decision_json)}) : ""],
  ]);
}
