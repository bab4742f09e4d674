// A negotiation room's page: its proposals with their votes and decisions
// (NegotiationRoomQueryService.ListProposals, as the dashboard shows them) and its history
// (every proposal, vote and decision, correlated by the room's id).

import {call} from "./api.js";
import {el} from "./dom.js";
import {attempt, section} from "./page.js";
import {roomCard} from "./rooms.js";

const SHOWN = 100;

export async function load(id) {
  const listed = await attempt(() => call("apiary.v1.NegotiationRoomQueryService",
    "ListProposals", {negotiation_room_id: id, limit: SHOWN}), "room", id);
  if (!listed.value) return {state: "", nodes: [section("Proposals", listed.note)]};
  const proposals = listed.value.proposals || [];
  const cards = await Promise.all(proposals.map(roomCard));
  return {state: "", nodes: [section(`Proposals (${proposals.length})`,
    el("div", {class: "cards"}, cards.length ? cards
      : el("p", {class: "muted", text: "no proposals in this room"})))]};
}

export function concerns(id, event) {
  return event.correlation_id === id;
}
