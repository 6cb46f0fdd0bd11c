// Runs: the run list with GET /v1/runs's filters (status, label, agent, graph) kept in the hash,
// paged by next_cursor; rows change live from the socket's run list (watch_runs).

import { get, query } from "./api.js";
import { age, clear, coalesce, h, labelChips, shortId, statePill, usageText } from "./dom.js";
import { graphName } from "./names.js";

const STATES = [
  "running", "awaiting_model", "awaiting_tool", "suspended", "sleeping", "budget_exceeded",
  "needs_reconciliation", "completed", "failed", "abandoned",
];
const PAGE = 50;
const FILTERS = ["status", "label", "agent", "graph"];

export function showRuns(container, { live, params }) {
  const filters = Object.fromEntries(FILTERS.map((name) => [name, params.get(name) ?? ""]));
  // The page size may be set in the hash too (#/runs?limit=20), within what the API takes.
  const size = Math.min(Math.max(Number.parseInt(params.get("limit"), 10) || PAGE, 1), 1000);
  const cursors = [null]; // the cursor of each page shown so far; the last is this page's
  const names = { agents: new Map(), graphs: new Map() };
  const rows = new Map(); // run -> its <tr>
  const shownRows = new Map(); // run -> the row it was drawn from
  let newest = ""; // the first run's first_recorded_at on the first page
  // While a page of the list loads: the newest row the socket told of each run meanwhile. The
  // list may have been read before those changes, so they are shown again once it is drawn.
  let heard = null;
  const body = h("tbody", { "data-test": "run-rows" });
  const error = h("p", { class: "error", "data-test": "runs-error", role: "alert" });
  const pager = h("div", { class: "pager" });

  const statusSelect = h("select", { name: "status", "data-test": "filter-status" },
    h("option", { value: "" }, "any status"),
    STATES.map((state) => h("option", { value: state }, state.replaceAll("_", " "))));
  statusSelect.value = filters.status;
  const labelInput = h("input", { name: "label", placeholder: "key:value", value: filters.label, "data-test": "filter-label" });
  const agentSelect = h("select", { name: "agent", "data-test": "filter-agent" }, h("option", { value: "" }, "any agent"));
  const graphSelect = h("select", { name: "graph", "data-test": "filter-graph" }, h("option", { value: "" }, "any graph"));
  const form = h("form", { class: "filters", "data-test": "run-filters" },
    statusSelect, labelInput, agentSelect, graphSelect,
    h("button", { type: "submit", "data-test": "filter-apply" }, "Filter"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const chosen = { status: statusSelect.value, label: labelInput.value.trim(), agent: agentSelect.value, graph: graphSelect.value, limit: params.get("limit") };
    location.hash = `#/runs${query(chosen)}`;
  });

  clear(container,
    h("h1", {}, "Runs"),
    form,
    error,
    h("table", { class: "runs", "data-test": "runs" },
      h("thead", {}, h("tr", {}, ["run", "status", "labels", "agent or graph", "usage", "steps", "age", "last event", "driver"].map((c) => h("th", {}, c)))),
      body),
    pager);

  function whatItRuns(row) {
    if (row.agent_def_hash) return names.agents.get(row.agent_def_hash) ?? shortId(row.agent_def_hash.replace("sha256:", ""));
    if (row.graph_hash) return h("span", { title: row.graph_hash }, graphName(row.graph_hash));
    return "";
  }

  function rowElement(row) {
    return h("tr", { "data-test": "run-row", "data-run": row.run, "data-state": row.status?.state ?? "" },
      h("td", {}, h("a", { href: `#/runs/${encodeURIComponent(row.run)}`, "data-test": "run-link", title: row.run }, shortId(row.run))),
      h("td", {}, statePill(row.status)),
      h("td", {}, labelChips(row.labels)),
      h("td", { "data-test": "run-what" }, whatItRuns(row)),
      h("td", { "data-test": "run-usage" }, usageText(row.usage)),
      h("td", {}, row.step_count ?? ""),
      h("td", { title: row.first_recorded_at }, age(row.first_recorded_at)),
      h("td", { title: row.last_recorded_at }, age(row.last_recorded_at)),
      h("td", {}, row.driver ?? ""));
  }

  function put(row, { prepend = false } = {}) {
    shownRows.set(row.run, row);
    const element = rowElement(row);
    const old = rows.get(row.run);
    rows.set(row.run, element);
    if (old) old.replaceWith(element);
    else if (prepend) body.prepend(element);
    else body.append(element);
  }

  function matches(row) {
    if (filters.status && row.status?.state !== filters.status) return false;
    if (filters.agent && row.agent_def_hash !== filters.agent) return false;
    if (filters.graph && row.graph_hash !== filters.graph) return false;
    if (filters.label) {
      const at = filters.label.indexOf(":");
      const key = filters.label.slice(0, at);
      if ((row.labels ?? {})[key] !== filters.label.slice(at + 1)) return false;
    }
    return true;
  }

  async function load() {
    error.textContent = "";
    const cursor = cursors[cursors.length - 1];
    const heardNow = (heard = new Map());
    try {
      const page = await get(`/v1/runs${query({ ...filters, limit: size, cursor })}`);
      rows.clear();
      shownRows.clear();
      body.replaceChildren();
      for (const row of page.runs) put(row);
      newest = page.runs[0]?.first_recorded_at ?? "";
      if (!page.runs.length) body.append(h("tr", { "data-test": "no-runs" }, h("td", { colspan: 9 }, "No runs.")));
      // A row older than the list's is passed over (showLive), a newer one shown.
      for (const row of heardNow.values()) showLive(row);
      clear(pager,
        cursors.length > 1 ? h("button", { type: "button", "data-test": "page-first", onclick: () => { cursors.length = 1; load(); } }, "First page") : null,
        page.next_cursor ? h("button", { type: "button", "data-test": "page-next", onclick: () => { cursors.push(page.next_cursor); load(); } }, "Next page") : null);
    } catch (refusal) {
      error.textContent = refusal.message;
    } finally {
      if (heard === heardNow) heard = null;
    }
  }

  async function loadNames() {
    try {
      const [agents, graphs] = await Promise.all([get("/v1/agents"), get("/v1/graphs")]);
      for (const agent of agents.agents) names.agents.set(agent.agent, agent.name ?? shortId(agent.agent.replace("sha256:", "")));
      for (const graph of graphs.graphs) names.graphs.set(graph.graph, `${graphName(graph.graph)} (${graph.node_count} nodes)`);
      clear(agentSelect, h("option", { value: "" }, "any agent"));
      clear(graphSelect, h("option", { value: "" }, "any graph"));
      for (const [hash, name] of names.agents) agentSelect.append(h("option", { value: hash }, name));
      for (const [hash, name] of names.graphs) graphSelect.append(h("option", { value: hash }, name));
      // A filter by a hash the lists do not hold (a link from elsewhere) is still shown.
      if (filters.agent && !names.agents.has(filters.agent)) agentSelect.append(h("option", { value: filters.agent }, shortId(filters.agent)));
      if (filters.graph && !names.graphs.has(filters.graph)) graphSelect.append(h("option", { value: filters.graph }, graphName(filters.graph)));
      agentSelect.value = filters.agent;
      graphSelect.value = filters.graph;
    } catch (refusal) {
      error.textContent = refusal.message;
    }
  }

  // A run of an agent or graph stored after the names were read: read them again, once.
  const reloadNames = coalesce(async () => {
    await loadNames();
    for (const row of [...shownRows.values()]) put(row);
  }, 300);

  // A run's row from the socket, unless the one shown is as new (its log as long).
  function showLive(row) {
    if ((shownRows.get(row.run)?.event_count ?? -1) >= row.event_count) return;
    if (rows.has(row.run)) {
      if (matches(row)) put(row);
      else rows.get(row.run).dataset.state = row.status?.state ?? "";
    } else if (cursors.length === 1 && matches(row) && row.first_recorded_at >= newest) {
      // A run started since the list was read (an older one not shown belongs to a later page).
      body.querySelector("[data-test=no-runs]")?.remove();
      put(row, { prepend: true });
    }
  }

  const unwatch = live.watchRuns((row) => {
    const hash = row.agent_def_hash ?? row.graph_hash;
    if (hash && !names.agents.has(hash) && !names.graphs.has(hash)) reloadNames();
    if (heard !== null && (heard.get(row.run)?.event_count ?? -1) < row.event_count) heard.set(row.run, row);
    showLive(row);
  });
  loadNames().then(load);
  // Ages move on without an event.
  const ticker = setInterval(() => {
    for (const cell of body.querySelectorAll("td[title]")) cell.textContent = age(cell.title);
  }, 15000);
  return () => {
    unwatch();
    clearInterval(ticker);
  };
}
