// Where the console is: the dashboard (#/), one page per agent, task, workflow run, room,
// negotiation and HITL invocation (#/<kind>/<id>), or the finished work (#/finished?kind=&q=).
// Ids go into the hash percent-encoded, so any id (a task id with colons, a room named with
// slashes) round-trips.

import {el} from "./dom.js";

export const KINDS = ["agent", "task", "workflow", "room", "negotiation", "hitl"];
export const KIND_NAMES = {
  agent: "agent", task: "task", workflow: "workflow run", room: "negotiation room",
  negotiation: "negotiation", hitl: "HITL invocation",
};

/** The route of a location hash: {view: "dashboard"|"finished"|"page", kind, id, params}. */
export function parse(hash) {
  const text = String(hash || "").replace(/^#\/?/, "");
  const [path, search = ""] = text.split("?", 2);
  const params = new URLSearchParams(search);
  if (path === "finished") return {view: "finished", params};
  const slash = path.indexOf("/");
  if (slash > 0) {
    const kind = path.slice(0, slash);
    let id = "";
    try {
      id = decodeURIComponent(path.slice(slash + 1));
    } catch {
      id = "";
    }
    if (KINDS.includes(kind) && id) return {view: "page", kind, id, params};
  }
  return {view: "dashboard", params};
}

/** The hash of a subject's page. */
export function href(kind, id) {
  return `#/${kind}/${encodeURIComponent(String(id))}`;
}

/** The hash of the finished work, with a kind and a search. */
export function finishedHref(kind = "", q = "") {
  const params = new URLSearchParams();
  if (kind) params.set("kind", kind);
  if (q) params.set("q", q);
  const search = params.toString();
  return `#/finished${search ? `?${search}` : ""}`;
}

/** A link to a subject's page (its id as text unless `text` is given); nothing for no id. */
export function link(kind, id, text = "", className = "mono") {
  if (!id) return null;
  return el("a", {href: href(kind, id), class: className, "data-link": kind, title: String(id),
    text: text || String(id)});
}
