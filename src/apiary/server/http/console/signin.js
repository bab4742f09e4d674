// Signing in: the panel that asks for an operator's API key or operator token when the
// coordinator refuses a read (401 or 403), showing what it answered (the answer names the
// principal and what it lacks), and the top bar's session line and sign-out button. The
// credential itself is api.js's to keep; this module only takes it from the operator.

import {describe, setToken, token} from "./api.js";
import {el, fill} from "./dom.js";

// Printable ASCII: what an HTTP header can carry (and what keys and tokens are made of).
const CREDENTIAL = /^[\x20-\x7e]+$/;
const KEY_ID = /^(apk_[a-z2-7]+)_/; // an API key's id may be shown; its secret never is

const refusals = new Map(); // where -> the coordinator's answer
const dismissed = new Set(); // `${where}\n${answer}` the operator closed the panel on
let opened = false; // opened from the top bar, refused or not
let changed = () => {};

/** `onChange` runs when the credential changes (signed in, signed out): read everything again. */
export function initSignin(onChange) {
  changed = onChange;
  const form = document.getElementById("signin-form");
  const input = document.getElementById("signin-credential");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const value = input.value.trim();
    if (!CREDENTIAL.test(value)) {
      showProblem("paste an API key (apk_...) or an operator token: printable characters only");
      return;
    }
    input.value = "";
    use(value);
  });
  document.getElementById("signin-open").addEventListener("click", () => {
    opened = true;
    render();
    input.focus();
  });
  document.getElementById("signin-close").addEventListener("click", () => {
    opened = false;
    for (const [where, answer] of refusals) dismissed.add(`${where}\n${answer}`);
    render();
  });
  document.getElementById("signout").addEventListener("click", () => use(""));
  render();
}

function use(credential) {
  setToken(credential);
  refusals.clear();
  dismissed.clear();
  opened = false;
  showProblem("");
  render();
  changed();
}

/** The coordinator refused the read `where` (a panel, the live stream): show why. */
export function refused(where, err) {
  const answer = describe(err);
  if (refusals.get(where) === answer) return;
  refusals.set(where, answer);
  render();
}

/** The read `where` succeeded: whatever refused it before no longer does. */
export function accepted(where) {
  if (refusals.delete(where)) render();
}

function showProblem(message) {
  const line = document.getElementById("signin-problem");
  line.textContent = message;
  line.hidden = !message;
}

/** Who the tab is signed in as, as far as it can tell without asking. */
function holder(credential) {
  const key = KEY_ID.exec(credential);
  return key ? `API key ${key[1]}` : "an operator token";
}

function render() {
  const credential = token();
  document.getElementById("session").textContent =
    credential ? `signed in with ${holder(credential)}` : "";
  document.getElementById("signin-open").hidden = !!credential;
  document.getElementById("signout").hidden = !credential;

  const byAnswer = new Map();
  for (const [where, answer] of refusals) {
    byAnswer.set(answer, [...(byAnswer.get(answer) || []), where]);
  }
  fill("signin-refusals", [...byAnswer].map(([answer, wheres]) => el("li", {},
    el("span", {class: "refusal", text: answer}),
    el("span", {class: "muted", text: ` (${wheres.join(", ")})`}))));
  document.getElementById("signin-lead").textContent = !refusals.size
    ? "Sign in as an operator to see the HITL inbox and decide, or to read what needs a role."
    : credential ? "The coordinator refused this tab's credential:"
      : "The coordinator answers only a signed-in operator:";
  const unseen = [...refusals].some(([where, answer]) => !dismissed.has(`${where}\n${answer}`));
  document.getElementById("signin").hidden = !(opened || unseen);
}
