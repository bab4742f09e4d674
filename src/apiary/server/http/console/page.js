// What every subject's page is made of: a title, facts (a two-column table), sections, and
// the subject's history below. A subject the coordinator no longer has (an agent that
// deregistered, a task removed) still has its history: a not_found read shows a note in
// place of the facts, never an empty page.

import {describe, isRefusal} from "./api.js";
import {badge, clock, el} from "./dom.js";
import {KIND_NAMES} from "./router.js";
import {accepted, refused} from "./signin.js";

/** The page's heading: the kind, the id and the state. */
export function heading(kind, id, state) {
  return el("header", {class: "page-head"},
    el("span", {class: "muted", text: KIND_NAMES[kind] || kind}),
    el("h2", {id: "page-title", class: "mono", text: id}),
    state ? badge(state) : null,
    el("a", {href: "#/", class: "back", text: "← dashboard"}),
  );
}

/** A two-column table of [label, value] rows; rows with no value are left out. */
export function facts(rows) {
  const shown = rows.filter(([, value]) => value !== undefined && value !== null && value !== "");
  return el("table", {class: "facts"}, el("tbody", {}, shown.map(([label, value]) =>
    el("tr", {"data-fact": label}, el("th", {text: label}),
      el("td", {}, value instanceof Node ? value : String(value))))));
}

/** A panel of the page. */
export function section(title, ...children) {
  return el("section", {class: "panel wide"}, el("h2", {text: title}), ...children);
}

/** "12:04:31 (3m ago)" style time, or nothing for an unset timestamp. */
export function when(value) {
  const shown = clock(value);
  return shown ? el("span", {title: String(value), text: shown}) : "";
}

/** The subject's own read, or the reason it is not shown (the history still is). A
 * refusal also opens the sign-in panel, with what the coordinator answered. */
export async function attempt(read, kind, id) {
  const where = `the ${KIND_NAMES[kind] || kind} page`;
  try {
    const value = await read();
    accepted(where);
    return {value};
  } catch (err) {
    if (isRefusal(err)) refused(where, err);
    const missing = err && err.code === "not_found";
    const text = missing
      ? `The coordinator has no ${KIND_NAMES[kind] || kind} ${id} now; its history follows.`
      : describe(err);
    return {value: null, note: el("p", {class: missing ? "muted" : "panel-error",
      "data-note": missing ? "missing" : "error", text})};
  }
}
