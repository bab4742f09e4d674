// A negotiation's page: its record and rounds (NegotiationOperatorService.Get) and its
// history (its rounds, evaluations and decision, correlated by the negotiation's id). A
// decided or aborted negotiation shows no deadline: it waits for nothing.

import {call} from "./api.js";
import {badge, countdown, el, emptyRow, pretty} from "./dom.js";
import {attempt, facts, section, when} from "./page.js";
import {link} from "./router.js";
import {ENDED} from "./rooms.js";

export async function load(id) {
  const found = await attempt(() => call("apiary.v1.NegotiationOperatorService", "Get",
    {negotiation_id: id}), "negotiation", id);
  const n = found.value;
  if (!n) return {state: "", nodes: [section("Negotiation", found.note)]};
  return {state: n.state, nodes: [
    section("Negotiation", record(n)),
    section(`Rounds (${(n.rounds || []).length})`, rounds(n.rounds || [])),
  ]};
}

export function concerns(id, event) {
  return event.correlation_id === id;
}

function record(n) {
  const open = !ENDED.includes(n.state);
  const d = n.decision || {};
  return facts([
    ["state", badge(n.state)],
    ["topic", n.topic],
    ["participants", el("span", {}, (n.participants || []).flatMap((p, i) =>
      [i ? ", " : "", link("agent", p)]))],
    ["intensity", n.intensity],
    ["profile", n.profile],
    ["round", String(n.round || 0)],
    ["tokens spent", String(n.tokens_spent || 0)],
    ["deadline", open && n.deadline ? el("span", {class: "deadline", text: countdown(n.deadline)})
      : ""],
    ["round deadline", open && n.round_deadline ? countdown(n.round_deadline) : ""],
    ["waits for", n.invocation_id ? link("hitl", n.invocation_id) : ""],
    ["stop reason", n.stop_reason],
    ["decided by", d.decided_by],
    ["final score", d.final_score !== undefined ? Number(d.final_score).toFixed(2) : ""],
    ["rationale", d.rationale],
    ["opened by", n.opened_by],
    ["opened", when(n.created_at)],
    ["last change", when(n.updated_at)],
  ]);
}

function rounds(list) {
  return el("table", {},
    el("thead", {}, el("tr", {}, ["round", "kind", "from", "submitted", "score", "tokens", "checks"]
      .map((h) => el("th", {text: h})))),
    el("tbody", {}, list.length ? list.map((r) => el("tr", {"data-round": r.round},
      el("td", {class: "num", text: `v${r.round || 0}`}),
      el("td", {text: r.kind}),
      el("td", {}, link("agent", r.from_agent)),
      el("td", {}, when(r.submitted_at)),
      el("td", {class: "num", text: r.scored ? Number(r.score || 0).toFixed(2) : ""}),
      el("td", {class: "num", text: String(r.tokens || 0)}),
      el("td", {class: "details", text: pretty(r.checks_json)}),
    )) : emptyRow(7, "no rounds yet")));
}
