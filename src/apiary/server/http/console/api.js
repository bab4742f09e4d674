// The JSON gateway (POST /v1/<package.Service>/<Method>), the console's own reads, and the
// credential this tab is signed in with.
//
// The credential (an operator's API key or operator token) lives in sessionStorage: this tab
// only, gone when the tab closes; never in lasting storage, a cookie or a URL. Once it is set,
// every request carries it as `Authorization: Bearer <credential>`, the way the CLI sends it.
// Without one the requests carry nothing: dev mode needs nothing, and a browser's client
// certificate (mTLS) authenticates below HTTP.

const CREDENTIAL_KEY = "apiary.console.credential";

export function token() {
  return sessionStorage.getItem(CREDENTIAL_KEY) || "";
}

export function setToken(value) {
  if (value) sessionStorage.setItem(CREDENTIAL_KEY, value);
  else sessionStorage.removeItem(CREDENTIAL_KEY);
}

/** The headers that authenticate a request: none until the tab signs in. */
export function authHeaders() {
  const headers = {};
  const bearer = token();
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  return headers;
}

/** An error answered by the gateway: its code, message and details, as it sent them. */
export class GatewayError extends Error {
  constructor(status, code, message, details) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details || {};
  }
}

/** The error a refused response carries (the one JSON error shape of every route). */
export async function errorOf(resp) {
  const doc = await resp.json().catch(() => null);
  const e = (doc && doc.error) || {};
  return new GatewayError(resp.status, e.code || `http_${resp.status}`,
    e.message || resp.statusText, e.details);
}

/** Whether the coordinator refused the caller (401: who are you; 403: not you, not this). */
export function isRefusal(err) {
  return err instanceof GatewayError && (err.status === 401 || err.status === 403);
}

/** Call one RPC through the gateway; `operator`: the call cannot succeed unsigned in. */
export async function call(service, method, body = {}, {operator = false} = {}) {
  if (operator && !token()) {
    throw new GatewayError(0, "no_token", "sign in as an operator first (top right)");
  }
  const headers = {"Content-Type": "application/json", Accept: "application/json",
    ...authHeaders()};
  let resp;
  try {
    resp = await fetch(`/v1/${service}/${method}`, {
      method: "POST", headers, body: JSON.stringify(body), cache: "no-store",
      credentials: "same-origin",
    });
  } catch (err) {
    throw new GatewayError(0, "unreachable", `the coordinator did not answer (${err.message})`);
  }
  if (!resp.ok) throw await errorOf(resp);
  return (await resp.json().catch(() => null)) || {};
}

/** The address of a console read: `path` with the `params` that hold a value, and `before`
 * (a page's cursor) when there is one. */
export function readPath(path, params, before = null) {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) if (value) query.set(name, String(value));
  if (before !== null && before !== undefined) query.set("before", String(before));
  return `${path}?${query}`;
}

/** A console read that is not an RPC (GET /console/api/...). */
export async function read(path) {
  let resp;
  try {
    resp = await fetch(path, {cache: "no-store", credentials: "same-origin",
      headers: {Accept: "application/json", ...authHeaders()}});
  } catch (err) {
    throw new GatewayError(0, "unreachable", `the coordinator did not answer (${err.message})`);
  }
  if (!resp.ok) throw await errorOf(resp);
  return (await resp.json().catch(() => null)) || {};
}

export const HITL = "apiary.v1.HitlOperatorService";

/**
 * The HITL decision request, exactly as the page sends it (tests/server/test_console.py
 * sends the same): POST /v1/apiary.v1.HitlOperatorService/Decide with the bearer token.
 */
export function decide(invocationId, action, rationale, patchJson) {
  const body = {invocation_id: invocationId, action, rationale};
  if (patchJson) body.patch_json = patchJson;
  return call(HITL, "Decide", body, {operator: true});
}

/** A message for a panel: the gateway's code and message. */
export function describe(err) {
  return err instanceof GatewayError ? `${err.code}: ${err.message}` : String(err);
}
