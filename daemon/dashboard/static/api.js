// The daemon's public API from the page: fetch with the page's own credentials (the session
// cookie, when the daemon has a token), the CSRF header on every state-changing call, and a
// refusal as the error envelope it is, so the page shows its message as is.

// The session's CSRF value: in this variable only, never in storage, a cookie or a URL.
let csrf = null;
let onUnauthorized = () => {};

export function setCsrf(value) {
  csrf = value;
}

export function whenUnauthorized(handler) {
  onUnauthorized = handler;
}

export class ApiError extends Error {
  constructor(status, envelope) {
    const error = envelope?.error ?? {};
    super(error.message ?? `the daemon answered ${status}`);
    this.status = status;
    this.code = error.code ?? "unknown";
    this.details = error.details;
    this.envelope = envelope?.error ? envelope : { error: { code: this.code, message: this.message } };
  }
}

const SAFE = new Set(["GET", "HEAD"]);

export async function request(method, path, body, { quiet = false } = {}) {
  const headers = { Accept: "application/json" };
  const init = { method, headers, credentials: "same-origin", cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  if (!SAFE.has(method) && csrf !== null) headers["X-Salvor-CSRF"] = csrf;
  let response;
  try {
    response = await fetch(path, init);
  } catch (failure) {
    throw new ApiError(0, { error: { code: "unreachable", message: `the daemon cannot be reached (${failure.message})` } });
  }
  const text = await response.text();
  let answer = null;
  if (text) {
    try {
      answer = JSON.parse(text);
    } catch {
      answer = null;
    }
  }
  if (!response.ok) {
    const error = new ApiError(response.status, answer);
    if (response.status === 401 && !quiet) onUnauthorized(error);
    throw error;
  }
  return answer;
}

export const get = (path, options) => request("GET", path, undefined, options);
export const post = (path, body, options) => request("POST", path, body, options);

export function query(parameters) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(parameters)) {
    if (value !== undefined && value !== null && value !== "") search.set(name, value);
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

export const runPath = (run, tail = "") => `/v1/runs/${encodeURIComponent(run)}${tail}`;
