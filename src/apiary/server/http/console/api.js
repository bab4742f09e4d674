// The JSON gateway (POST /v1/<package.Service>/<Method>) and the operator's token.
//
// The token lives in sessionStorage: this tab only, gone when the tab closes. It is sent
// only on operator calls, as `Authorization: Bearer <token>`, the way `apiary hitl` sends it.

const TOKEN_KEY = "apiary.console.operator-token";

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
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

/** Call one RPC through the gateway; `operator` adds the operator's bearer token. */
export async function call(service, method, body = {}, {operator = false} = {}) {
  const headers = {"Content-Type": "application/json", Accept: "application/json"};
  if (operator) {
    const bearer = token();
    if (!bearer) throw new GatewayError(0, "no_token", "enter your operator token first");
    headers.Authorization = `Bearer ${bearer}`;
  }
  let resp;
  try {
    resp = await fetch(`/v1/${service}/${method}`, {
      method: "POST", headers, body: JSON.stringify(body), cache: "no-store",
      credentials: "same-origin",
    });
  } catch (err) {
    throw new GatewayError(0, "unreachable", `the coordinator did not answer (${err.message})`);
  }
  let doc = null;
  try {
    doc = await resp.json();
  } catch {
    doc = null;
  }
  if (!resp.ok) {
    const e = (doc && doc.error) || {};
    throw new GatewayError(resp.status, e.code || `http_${resp.status}`,
      e.message || resp.statusText, e.details);
  }
  return doc || {};
}

/** A console read that is not an RPC (GET /console/api/...). */
export async function read(path) {
  const resp = await fetch(path, {cache: "no-store", headers: {Accept: "application/json"}});
  const doc = await resp.json().catch(() => null);
  if (!resp.ok) {
    const e = (doc && doc.error) || {};
    throw new GatewayError(resp.status, e.code || `http_${resp.status}`,
      e.message || resp.statusText, e.details);
  }
  return doc || {};
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
