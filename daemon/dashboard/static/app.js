// The page's entry: finds out whether the daemon needs a login, then routes on the URL hash
// (#/runs, #/runs/<id>, #/inbox, #/flows) to one screen at a time. A screen returns its cleanup,
// which drops its live subscriptions when the page moves on.

import { ApiError, get, setCsrf, whenUnauthorized } from "./api.js";
import { clear, coalesce, h } from "./dom.js";
import { movesTheInbox, showInbox, waitingRuns } from "./inbox.js";
import { Live } from "./live.js";
import { showFlows } from "./flows.js";
import { showLogin } from "./login.js";
import { showRun } from "./run.js";
import { showRuns } from "./runs.js";

const screen = document.getElementById("screen");
const nav = document.querySelector("[data-test=nav]");
const liveState = document.querySelector("[data-test=live-state]");
const inboxCount = document.querySelector("[data-test=inbox-count]");

let live = null;
let leave = () => {};
let unwatch = () => {};

function route() {
  const hash = location.hash || "#/runs";
  const [path, search = ""] = hash.slice(1).split("?");
  const params = new URLSearchParams(search);
  const parts = path.split("/").filter(Boolean);
  if (parts[0] === "runs" && parts[1]) return { screen: "run", run: decodeURIComponent(parts[1]), params };
  if (parts[0] === "inbox") return { screen: "inbox", params };
  if (parts[0] === "flows") return { screen: "flows", params };
  return { screen: "runs", params };
}

function render() {
  leave();
  leave = () => {};
  const where = route();
  for (const link of nav.querySelectorAll("a")) {
    link.classList.toggle("here", link.getAttribute("href") === `#/${where.screen === "run" ? "runs" : where.screen}`);
  }
  const context = { live, params: where.params, refreshCount };
  const view = h("section", { class: `screen screen-${where.screen}`, "data-test": `screen-${where.screen}` });
  clear(screen, view);
  if (where.screen === "run") leave = showRun(view, where.run, context);
  else if (where.screen === "inbox") leave = showInbox(view, context);
  else if (where.screen === "flows") leave = showFlows(view);
  else leave = showRuns(view, context);
}

let waiting = new Set();

const refreshCount = coalesce(async () => {
  try {
    waiting = await waitingRuns();
    inboxCount.textContent = waiting.size ? String(waiting.size) : "";
  } catch {
    // The count is a hint; the inbox itself shows the error.
  }
}, 300);

function enter() {
  nav.hidden = false;
  live = new Live((state) => {
    liveState.textContent = state;
    liveState.dataset.state = state;
  });
  live.start();
  // The count is read again only when a changed run can change it.
  unwatch = live.watchRuns((row) => {
    if (movesTheInbox(row, waiting)) refreshCount();
  });
  window.addEventListener("hashchange", render);
  refreshCount();
  render();
}

// The login screen, and nothing else: no data, no socket, until the daemon takes the token.
function askForLogin() {
  leave();
  unwatch();
  live?.stop();
  live = null;
  nav.hidden = true;
  window.removeEventListener("hashchange", render);
  leave = showLogin(clear(screen), (csrf) => {
    setCsrf(csrf);
    enter();
  });
}

async function start() {
  whenUnauthorized(() => askForLogin());
  try {
    await get("/v1/capabilities", { quiet: true });
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) {
      askForLogin();
      return;
    }
    clear(screen, h("p", { class: "error", "data-test": "fatal" }, error.message));
    return;
  }
  // Reached with a live session cookie (a reload) or a daemon without a token: a session, if
  // there is one, gives its CSRF value back.
  try {
    const session = await get("/v1/session", { quiet: true });
    if (session?.csrf) setCsrf(session.csrf);
  } catch {
    // No session: a daemon without a token takes no CSRF value.
  }
  enter();
}

start();
