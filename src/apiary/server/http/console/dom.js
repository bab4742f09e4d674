// DOM helpers. Every piece of data reaches the page as text (textContent, text nodes) or as
// an attribute value set with setAttribute; nothing here ever parses markup.

const SVG_NS = "http://www.w3.org/2000/svg";

function build(node, props, children) {
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "text") node.textContent = String(value);
    else if (key === "class") node.setAttribute("class", String(value));
    else if (key.startsWith("on") && typeof value === "function") {
      node.addEventListener(key.slice(2), value);
    } else node.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** An HTML element: el("td", {class: "num", text: 3}) or el("tr", {}, cell1, cell2). */
export function el(tag, props, ...children) {
  return build(document.createElement(tag), props, children);
}

/** An SVG element, the same way. */
export function svg(tag, props, ...children) {
  return build(document.createElementNS(SVG_NS, tag), props, children);
}

/** Replace the children of the element with id `id`. */
export function fill(id, ...children) {
  const target = document.getElementById(id);
  target.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
  return target;
}

export function setText(id, text) {
  document.getElementById(id).textContent = text;
}

/** Show (or, with an empty message, hide) a panel's error line. */
export function panelError(panelId, message) {
  const line = document.querySelector(`#${panelId} .panel-error`);
  if (!line) return;
  line.textContent = message || "";
  line.hidden = !message;
}

/** Empty a panel's tables, cards and counts: what a refused read may no longer show. */
export function blank(panelId) {
  for (const node of document.querySelectorAll(`#${panelId} tbody, #${panelId} [id$="-body"]`)) {
    node.replaceChildren();
  }
  for (const node of document.querySelectorAll(`#${panelId} .count`)) node.textContent = "";
}

/** A row that says there is nothing to show, spanning `columns` cells. */
export function emptyRow(columns, text) {
  return el("tr", {}, el("td", {colspan: columns, class: "muted", text}));
}

// ---- time: the gateway sends RFC 3339 strings; the event stream sends epoch seconds

export function parseTime(value) {
  if (value === undefined || value === null || value === "") return null;
  const date = typeof value === "number" ? new Date(value * 1000) : new Date(value);
  return Number.isNaN(date.getTime()) || date.getTime() <= 0 ? null : date;
}

export function clock(value) {
  const date = parseTime(value);
  return date ? date.toLocaleTimeString([], {hour12: false}) : "";
}

function span(seconds) {
  const s = Math.abs(Math.round(seconds));
  if (s < 90) return `${s}s`;
  if (s < 5400) return `${Math.round(s / 60)}m`;
  if (s < 172800) return `${Math.round(s / 3600)}h`;
  return `${Math.round(s / 86400)}d`;
}

export function ago(value) {
  const date = parseTime(value);
  return date ? `${span((Date.now() - date.getTime()) / 1000)} ago` : "never";
}

/** "in 4m" / "passed 10s ago" for a deadline. */
export function countdown(value) {
  const date = parseTime(value);
  if (!date) return "no deadline";
  const left = (date.getTime() - Date.now()) / 1000;
  return left >= 0 ? `in ${span(left)}` : `passed ${span(left)} ago`;
}

/** A badge whose colour says how the state reads (ok, running, waiting, bad, done). */
export function badge(state) {
  return el("span", {class: `badge tone-${tone(state)}`, text: state || "UNKNOWN"});
}

const TONES = {
  ok: ["RUNNABLE", "READY", "SCHEDULED", "RESUMED", "APPROVED", "DECIDED", "OPEN", "BOUND_HOME"],
  run: ["RUNNING", "DELIBERATING", "ACTIVE"],
  wait: ["INITIALIZING", "WAITING", "WAITING_RESOURCES", "SUSPENDED", "RECOVERING", "PENDING",
    "AWAITING_COUNTER", "AWAITING_HITL", "PAUSED", "ESCALATED", "ESCALATED_TO_HITL",
    "REVISION_REQUESTED"],
  bad: ["FAILED", "UNAVAILABLE", "SHUTTING_DOWN", "ABORTED", "TIMED_OUT", "CANCELLED"],
};

export function tone(state) {
  const name = String(state || "").toUpperCase();
  for (const [key, names] of Object.entries(TONES)) if (names.includes(name)) return key;
  return "done";
}

/** Pretty JSON of a value or of a JSON string, for <pre> blocks (as text). */
export function pretty(value) {
  if (typeof value === "string") {
    if (!value) return "";
    try {
      return JSON.stringify(JSON.parse(value), null, 2);
    } catch {
      return value;
    }
  }
  return JSON.stringify(value, null, 2);
}

export function shortId(id) {
  const text = String(id || "");
  return text.length > 14 ? `${text.slice(0, 8)}…${text.slice(-4)}` : text;
}
