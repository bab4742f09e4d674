// Negotiation rooms (NegotiationRoomQueryService.ListProposals and ListDecisions, with
// NegotiationRoomService.GetVotes) and negotiations (NegotiationOperatorService.List).

import {call} from "./api.js";
import {badge, clock, countdown, el, emptyRow, fill, setText, shortId} from "./dom.js";
import {link} from "./router.js";

const QUERY = "apiary.v1.NegotiationRoomQueryService";
const ROOMS = "sw4rm.negotiation_room.NegotiationRoomService";
const SHOWN = 20;

export async function refreshRooms() {
  const [{proposals = []}, {negotiations = []}] = await Promise.all([
    call(QUERY, "ListProposals", {limit: SHOWN}),
    call("apiary.v1.NegotiationOperatorService", "List", {limit: SHOWN}),
  ]);
  const cards = await Promise.all(proposals.map(roomCard));
  setText("rooms-count", `(${proposals.length})`);
  fill("rooms-body", cards.length ? cards : el("p", {class: "muted", text: "no proposals"}));
  setText("negotiations-count", `(${negotiations.length})`);
  fill("negotiations-body", negotiations.length ? negotiations.map(negotiationRow)
    : emptyRow(6, "no negotiations"));
}

const OPEN_STATES = ["OPEN", "ESCALATED"]; // a decided proposal has no vote deadline
/** A decided or aborted negotiation has no deadline either (its page shows none). */
export const ENDED = ["DECIDED", "ABORTED"];

/** A proposal's card: its review, votes and latest decision. */
export async function roomCard(p) {
  const proposal = p.proposal || {};
  const ids = {artifact_id: proposal.artifact_id, negotiation_room_id: proposal.negotiation_room_id};
  const [{votes = []}, {decisions = []}] = await Promise.all([
    call(ROOMS, "GetVotes", ids),
    call(QUERY, "ListDecisions", ids),
  ]);
  const latest = decisions.length ? decisions[decisions.length - 1] : null;
  return el("article", {class: "card", "data-artifact": proposal.artifact_id},
    el("header", {},
      badge(p.state),
      el("strong", {text: proposal.artifact_type || "ARTIFACT"}),
      el("span", {class: "mono", title: proposal.artifact_id, text: shortId(proposal.artifact_id)}),
      el("span", {class: "muted"}, "room ", link("room", proposal.negotiation_room_id)),
      el("span", {class: "muted"}, "by ", link("agent", proposal.producer_id)),
      el("span", {text: `${Number(p.votes_received || 0)} / ${Number(p.votes_required || 0)} votes`}),
      p.vote_deadline && OPEN_STATES.includes(p.state) ? el("span", {class: "muted vote-deadline",
        title: clock(p.vote_deadline), text: `vote deadline ${countdown(p.vote_deadline)}`}) : null,
      p.invocation_id ? link("hitl", p.invocation_id, "HITL invocation", "") : null,
    ),
    (p.pending_critics || []).length
      ? el("div", {class: "muted", text: `waiting for: ${p.pending_critics.join(", ")}`}) : null,
    votes.length ? voteTable(votes) : null,
    latest ? decisionLine(latest) : null,
  );
}

function voteTable(votes) {
  return el("table", {},
    el("thead", {}, el("tr", {}, ["critic", "score", "confidence", "passed", "notes"]
      .map((h) => el("th", {text: h})))),
    el("tbody", {}, votes.map((v) => el("tr", {},
      el("td", {}, link("agent", v.critic_id)),
      el("td", {class: "num", text: Number(v.score || 0).toFixed(1)}),
      el("td", {class: "num", text: Number(v.confidence || 0).toFixed(2)}),
      el("td", {text: v.passed ? "yes" : "no"}),
      el("td", {class: "muted", text: [...(v.weaknesses || []), ...(v.recommendations || [])]
        .slice(0, 3).join(" · ")}),
    ))),
  );
}

function decisionLine(room) {
  const d = room.decision || {};
  const a = d.aggregated_score || {};
  const score = `mean ${Number(a.mean || 0).toFixed(2)}, weighted ${Number(a.weighted_mean || 0)
    .toFixed(2)}, min ${Number(a.min_score || 0).toFixed(1)}, max ${Number(a.max_score || 0)
    .toFixed(1)}, σ ${Number(a.std_dev || 0).toFixed(2)} over ${Number(a.vote_count || 0)} votes`;
  return el("div", {},
    badge(d.outcome), " ",
    el("span", {text: score}),
    el("div", {class: "muted", text: [`decided by ${room.decided_by || "?"} via ${room.via || "?"}`,
      d.reason, (room.triggers || []).join(", ")].filter(Boolean).join(" · ")}),
  );
}

function negotiationRow(n) {
  return el("tr", {"data-negotiation": n.negotiation_id},
    el("td", {}, link("negotiation", n.negotiation_id, shortId(n.negotiation_id))),
    el("td", {text: n.topic}),
    el("td", {class: "muted", text: (n.participants || []).join(", ")}),
    el("td", {}, badge(n.state), n.stop_reason ? el("div", {class: "muted", text: n.stop_reason})
      : null),
    el("td", {class: "num", text: Number(n.round || 0)}),
    el("td", {title: clock(n.deadline),
      text: n.deadline && !ENDED.includes(n.state) ? countdown(n.deadline) : ""}),
  );
}
