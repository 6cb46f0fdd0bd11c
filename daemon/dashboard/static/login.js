// The login: a token field posting to POST /v1/session (JSON body, never a URL), which answers
// the session cookie and a CSRF value. The field is emptied at once; the token is kept nowhere.

import { post } from "./api.js";
import { h } from "./dom.js";

export function showLogin(container, entered) {
  const token = h("input", {
    type: "password",
    name: "token",
    autocomplete: "off",
    required: true,
    "data-test": "login-token",
    "aria-label": "token",
  });
  const error = h("p", { class: "error", "data-test": "login-error", role: "alert" });
  const form = h(
    "form",
    { class: "login", "data-test": "login", method: "post", action: "/v1/session" },
    h("h1", {}, "salvor"),
    h("p", {}, "This daemon needs its token. It is sent once, for a session cookie, and kept nowhere."),
    h("label", {}, "Token ", token),
    h("button", { type: "submit", "data-test": "login-submit" }, "Log in"),
    error,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const value = token.value;
    token.value = "";
    error.textContent = "";
    try {
      const session = await post("/v1/session", { token: value }, { quiet: true });
      entered(session.csrf);
    } catch (refusal) {
      error.textContent = refusal.message;
      token.focus();
    }
  });
  container.append(form);
  token.focus();
  return () => {};
}
