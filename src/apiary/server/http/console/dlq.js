// The dead letter queue (DlqService.List) with a requeue button per entry (DlqService.Requeue).

import {call, describe} from "./api.js";
import {ago, clock, el, emptyRow, fill, setText, shortId} from "./dom.js";
import {link} from "./router.js";

const DLQ = "apiary.v1.DlqService";
const SHOWN = 100;

export async function refreshDlq() {
  const {entries = []} = await call(DLQ, "List", {filter: {exclude_requeued: true}, limit: SHOWN});
  setText("dlq-count", `(${entries.length}${entries.length >= SHOWN ? "+" : ""})`);
  fill("dlq-body", entries.length ? entries.map(row) : emptyRow(6, "the queue is empty"));
}

function row(e) {
  const result = el("div", {class: "muted"});
  const requeue = el("button", {type: "button", text: "Requeue"});
  requeue.addEventListener("click", () => requeueEntry(e.entry_id, requeue, result));
  const attempts = (e.attempts || []).length;
  return el("tr", {"data-entry": e.entry_id},
    el("td", {},
      el("span", {class: "mono", text: `#${e.entry_id}`}),
      el("div", {class: "muted mono", title: e.message_id, text: shortId(e.message_id)})),
    el("td", {}, link("agent", e.recipient)),
    el("td", {}, link("agent", e.producer_id)),
    el("td", {},
      el("strong", {text: e.error_code}),
      el("div", {class: "muted", text: e.reason}),
      attempts ? el("div", {class: "muted", text: `${attempts} attempt(s)`}) : null),
    el("td", {title: clock(e.failed_at), text: ago(e.failed_at)}),
    el("td", {}, requeue, result),
  );
}

async function requeueEntry(entryId, button, result) {
  button.disabled = true;
  result.textContent = "";
  try {
    // In secure mode this needs an operator with the role `dlq`; a refusal shows here.
    const {results = []} = await call(DLQ, "Requeue", {entry_ids: [entryId]});
    const outcome = results[0] || {};
    result.textContent = outcome.ok ? `requeued as ${shortId(outcome.new_message_id)}`
      : `not requeued: ${outcome.error || "unknown reason"}`;
  } catch (err) {
    result.textContent = describe(err);
  } finally {
    button.disabled = false;
  }
}
