// A task's page: the Scheduler's record (TaskQueryService.GetTask) and the task's history
// (its transitions, and the messages that carried it, correlated by its id).

import {call} from "./api.js";
import {badge, el} from "./dom.js";
import {attempt, facts, section, when} from "./page.js";
import {link} from "./router.js";

export async function load(id) {
  const task = await attempt(
    () => call("apiary.v1.TaskQueryService", "GetTask", {task_id: id}), "task", id);
  const t = task.value;
  return {state: t ? t.state : "", nodes: [section("Task", t ? record(t) : task.note)]};
}

export function concerns(id, event) {
  return event.correlation_id === id || (event.details || {}).task_id === id;
}

/** A workflow's node task is named workflow:<workflow id>:<node>:<attempt>, and its
 * messages carry the workflow's id as their correlation id. */
function workflowOf(t) {
  const flow = t.correlation_id || "";
  return flow && String(t.task_id).startsWith(`workflow:${flow}:`) ? flow : "";
}

function record(t) {
  const workflow = workflowOf(t);
  return facts([
    ["state", badge(t.state)],
    ["agent", link("agent", t.agent_id)],
    ["workflow", workflow ? link("workflow", workflow) : ""],
    ["priority", String(t.priority || 0)],
    ["lane", t.lane || "STANDARD"],
    ["attempts", String(t.attempts || 0)],
    ["scope", t.scope],
    ["note", t.note],
    ["error", t.error_code],
    ["submitted", when(t.submitted_at)],
    ["last change", when(t.updated_at)],
    ["correlation id", !workflow && t.correlation_id !== t.task_id ? t.correlation_id : ""],
    ["message", t.message_id ? el("span", {class: "mono", text: t.message_id}) : ""],
    ["parameters", t.params_size ? `${t.params_size} bytes of ${t.content_type || "?"}` : ""],
    ["submitter", t.submitter],
    ["result", resultText(t)],
  ]);
}

const RESULT_SHOWN = 400;

/** The task's result (JSON), its first characters when it is long. */
function resultText(t) {
  const text = t.result_json || "";
  if (text.length <= RESULT_SHOWN) return text ? el("span", {class: "mono", text}) : "";
  const size = Number(t.result_size || text.length);
  return el("span", {class: "mono", text: `${text.slice(0, RESULT_SHOWN)}… (${size} bytes)`});
}
