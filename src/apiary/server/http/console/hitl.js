// The HITL inbox (HitlOperatorService.List, which needs a signed-in operator) and the
// decision dialog: approve, deny, defer (and modify, with a patch) with a rationale, sent
// with the tab's credential; whatever the gateway answers on refusal is shown as it came.

import {HITL, call, decide, describe, token} from "./api.js";
import {badge, clock, countdown, el, fill, parseTime, pretty, setText, shortId} from "./dom.js";
import {link} from "./router.js";

const ACTIONS = [
  ["approve", "Approve", "approve"],
  ["deny", "Deny", "deny"],
  ["defer", "Defer", ""],
];
const SOON_S = 60;

let afterDecision = () => {};

/** `done` runs after a decision was applied (the page refreshes the affected panels). */
export function initHitl(done) {
  afterDecision = done;
  const dialog = document.getElementById("decide-dialog");
  document.getElementById("decide-cancel").addEventListener("click", () => dialog.close());
  document.getElementById("decide-form").addEventListener("submit", sendDecision);
  setInterval(tickDeadlines, 1000);
}

export async function refreshHitl() {
  const locked = !token();
  document.getElementById("hitl-locked").hidden = !locked;
  if (locked) {
    setText("hitl-count", "");
    fill("hitl-body");
    return;
  }
  const {invocations = []} = await call(HITL, "List", {include_decided: false}, {operator: true});
  invocations.sort((a, b) => (parseTime(a.deadline) || 0) - (parseTime(b.deadline) || 0));
  setText("hitl-count", `(${invocations.length} pending)`);
  fill("hitl-body", invocations.length ? invocations.map(card)
    : el("p", {class: "muted", text: "nothing waits for a decision"}));
}

/** An invocation's card; only a pending one has a deadline and decision buttons. */
export function card(v) {
  const pending = v.state === "PENDING";
  const proposed = v.proposed_actions || [];
  const buttons = pending ? ACTIONS.map(([action, label, style]) => el("button", {
    type: "button", class: style, text: label, onclick: () => openDialog(v, action),
  })) : [];
  if (pending && proposed.some((a) => a.toLowerCase() === "modify")) {
    buttons.push(el("button", {type: "button", text: "Modify…",
      onclick: () => openDialog(v, "modify")}));
  }
  return el("article", {class: "card", "data-invocation": v.invocation_id},
    el("header", {},
      badge(v.state),
      el("strong", {text: v.reason_type}),
      link("hitl", v.invocation_id, shortId(v.invocation_id)),
      el("span", {class: "muted", text: `from ${v.requested_by || "?"}`}),
      pending && v.deadline ? el("span", {class: "deadline", "data-deadline": v.deadline,
        title: `deadline ${clock(v.deadline)}`, text: countdown(v.deadline)}) : null,
    ),
    el("div", {},
      v.suggested_action ? `suggested: ${v.suggested_action}` : "",
      proposed.length ? el("span", {class: "muted", text: ` · proposed: ${proposed.join(", ")}`})
        : null,
      (v.approver_roles || []).length
        ? el("span", {class: "muted", text: ` · roles: ${v.approver_roles.join(", ")}`}) : null,
      Number(v.extensions || 0) ? el("span", {class: "muted", text: ` · deferred ${v.extensions}×`})
        : null,
    ),
    el("details", {},
      el("summary", {text: "subject and context"}),
      el("pre", {text: pretty(v.subject_json)}),
      el("pre", {text: pretty(v.context_json)}),
    ),
    buttons.length ? el("div", {class: "actions"}, buttons) : null,
  );
}

function tickDeadlines() {
  for (const node of document.querySelectorAll(".card .deadline[data-deadline]")) {
    const at = parseTime(node.dataset.deadline);
    node.textContent = countdown(node.dataset.deadline);
    node.classList.toggle("deadline-soon", !!at && at.getTime() - Date.now() < SOON_S * 1000);
  }
}

let pending = null;

function openDialog(view, action) {
  pending = {id: view.invocation_id, action};
  document.getElementById("decide-title").textContent =
    `${action[0].toUpperCase()}${action.slice(1)} ${view.reason_type}`;
  document.getElementById("decide-subject").textContent =
    `${view.invocation_id} · from ${view.requested_by || "?"} · deadline ${clock(view.deadline)}`;
  document.getElementById("decide-rationale").value = "";
  document.getElementById("decide-patch").value = "";
  document.getElementById("decide-patch-row").hidden = action !== "modify";
  showError("");
  document.getElementById("decide-dialog").showModal();
  document.getElementById("decide-rationale").focus();
}

function showError(message) {
  const line = document.getElementById("decide-error");
  line.textContent = message;
  line.hidden = !message;
}

async function sendDecision(event) {
  event.preventDefault();
  if (!pending) return;
  const rationale = document.getElementById("decide-rationale").value.trim();
  const patch = document.getElementById("decide-patch").value.trim();
  if (!rationale) {
    showError("a rationale is required: it is recorded with the decision");
    return;
  }
  if (!token()) {
    showError("sign in as an operator (top right) first: decisions are sent as the operator");
    return;
  }
  const send = document.getElementById("decide-send");
  send.disabled = true;
  try {
    await decide(pending.id, pending.action, rationale, pending.action === "modify" ? patch : "");
    pending = null;
    document.getElementById("decide-dialog").close();
    afterDecision();
  } catch (err) {
    showError(describe(err));
  } finally {
    send.disabled = false;
  }
}
