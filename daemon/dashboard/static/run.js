// A run: its status, pending call, labels, parent, children and forks; its timeline of events,
// live over the socket; what waits on a person (the inbox's card); the actions resume, abandon,
// re-run (offered only where the daemon can re-run) and, for a graph run, fork from a node (its
// write hazard shown, and every write acknowledged before the fork is offered); and a graph run's
// graph with its nodes' states, live.

import { ApiError, get, post, runPath } from "./api.js";
import { age, clear, coalesce, h, labelChips, pretty, short, shortId, statePill, usageText } from "./dom.js";
import { drawGraph } from "./graph.js";
import { waitingCard } from "./inbox.js";
import { agentName, agentOf, graphName } from "./names.js";

const WAITING = new Set(["suspended", "budget_exceeded", "needs_reconciliation"]);
const TERMINAL = new Set(["completed", "failed", "abandoned"]);
const NODE_EVENTS = new Set(["NodeEntered", "NodeExited", "NodeSkipped", "GraphRunStarted"]);
// The agents a re-run can reproduce: a program's recorded model calls are answered from its log.
// A built-in agent's run is derived again without running anything (`salvor replay --dry-run`).
const RERUN_KINDS = new Set(["process", "service"]);

export function showRun(container, run, { live }) {
  const summary = h("div", { class: "summary", "data-test": "run-summary" });
  const waiting = h("div", { class: "waiting", "data-test": "run-waiting" });
  const actions = h("div", { class: "actions", "data-test": "run-actions" });
  const actionError = h("p", { class: "error", "data-test": "action-error", role: "alert" });
  const actionPanel = h("div", { class: "action-panel", "data-test": "action-panel" });
  const relations = h("div", { class: "relations", "data-test": "run-relations" });
  const graphBox = h("div", { class: "graph", "data-test": "run-graph", hidden: true });
  const timeline = h("ol", { class: "timeline", "data-test": "timeline" });
  const error = h("p", { class: "error", "data-test": "run-error", role: "alert" });
  clear(container,
    h("p", {}, h("a", { href: "#/runs" }, "← Runs")),
    h("h1", {}, "Run ", h("code", { "data-test": "run-id" }, run)),
    error, summary, waiting, actions, actionError, actionPanel, graphBox, relations,
    h("h2", {}, "Timeline"), timeline);

  let current = null; // GET /v1/runs/{id}
  let graph = null; // {document, drawing, projection}
  let waitingFor = "";
  let agent = null; // an agent run's agent (GET /v1/agents/{hash}), once read
  let agentAsked = false;

  async function refresh() {
    try {
      current = await get(runPath(run));
      error.textContent = "";
    } catch (refusal) {
      error.textContent = refusal.message;
      return;
    }
    // A client-driven run's agent hash is its client's word, for no agent the daemon holds.
    if (current.agent_def_hash && current.driven_by !== "client" && !agentAsked) {
      agentAsked = true;
      agentOf(current.agent_def_hash).then((found) => {
        agent = found ?? {};
        summaryOf = "";
        renderSummary();
        renderActions();
      });
    }
    renderSummary();
    renderWaiting();
    renderActions();
    if (graph) graph.drawing.update(pictured(graph.projection));
  }

  function whatItRuns() {
    if (current.graph_hash) return h("span", { title: current.graph_hash }, graphName(current.graph_hash));
    if (!current.agent_def_hash) return "";
    const name = agentName(current.agent_def_hash, agent);
    return h("span", { title: current.agent_def_hash }, current.driven_by === "client" ? `${name}, driven by a client` : name);
  }

  // A re-run reproduces a completed run of a program agent from its log; anything else the daemon
  // refuses, so it is not offered.
  function rerunnable() {
    return current.status.state === "completed" && !current.graph_hash && current.driven_by !== "client"
      && RERUN_KINDS.has(agent?.kind);
  }
  const refreshSoon = coalesce(refresh, 150);

  let summaryOf = "";
  function renderSummary() {
    // Drawn again only when the run changed: a link is not swapped under a click for nothing.
    const drawn = JSON.stringify(current);
    if (drawn === summaryOf) return;
    summaryOf = drawn;
    const status = current.status;
    const detail = [];
    if (status.state === "failed") detail.push(h("p", { class: "error", "data-test": "run-failure" }, status.error));
    if (status.state === "completed") {
      const output = typeof status.output === "string" ? status.output : pretty(status.output);
      detail.push(h("pre", { "data-test": "run-output" }, output));
    }
    if (status.state === "sleeping") detail.push(h("p", {}, `until ${status.wake_at}`));
    if (status.state === "abandoned" && status.reason) detail.push(h("p", {}, status.reason));
    const pending = current.pending;
    clear(summary,
      h("dl", {},
        h("dt", {}, "runs"), h("dd", { "data-test": "run-what" }, whatItRuns()),
        h("dt", {}, "status"), h("dd", { "data-test": "run-status", "data-state": status.state }, statePill(status), " ", current.driver ? `driver ${current.driver}` : ""),
        h("dt", {}, "usage"), h("dd", { "data-test": "run-usage" }, usageText(current.usage)),
        h("dt", {}, "events"), h("dd", { "data-test": "event-count" }, current.event_count),
        h("dt", {}, "started"), h("dd", { title: current.first_recorded_at }, `${age(current.first_recorded_at)} ago`),
        h("dt", {}, "labels"), h("dd", { "data-test": "run-labels" }, labelChips(current.labels ?? {})),
        current.parent ? [h("dt", {}, "parent"), h("dd", {}, runLink(current.parent, "parent"))] : null,
        current.replay_of ? [h("dt", {}, "re-run of"), h("dd", {}, runLink(current.replay_of, "replay-of"))] : null,
        h("dt", {}, "pending"), h("dd", { "data-test": "pending" }, pending ? pendingText(pending) : "nothing")),
      detail);
  }

  function renderWaiting() {
    const state = current.status.state;
    const key = WAITING.has(state) ? `${state}:${current.event_count}` : "";
    if (key === waitingFor) return;
    waitingFor = key;
    clear(waiting);
    if (!key || current.status.kind === "signal") return;
    const kind = state === "suspended" ? (Object.keys(current.status.input_schema?.properties ?? {}).join() === "answer" ? "question" : "gate")
      : state === "budget_exceeded" ? "budget" : "unknown_write";
    const item = { kind, run, row: current, status: current.status, intent: current.pending };
    if (kind === "unknown_write") {
      // The queue's entry says what resolve expects (a client's declared output schema).
      get("/v1/reconciliations").then((queue) => {
        const entry = queue.reconciliations.find((candidate) => candidate.run === run);
        clear(waiting, waitingCard(entry ? { ...item, item: entry } : item, refreshSoon));
      }, () => clear(waiting, waitingCard(item, refreshSoon)));
    } else {
      waiting.append(waitingCard(item, refreshSoon));
    }
  }

  function act(name, label, handler) {
    return h("button", {
      type: "button",
      "data-test": `action-${name}`,
      onclick: async () => {
        actionError.textContent = "";
        try {
          await handler();
        } catch (refusal) {
          actionError.textContent = refusal instanceof ApiError ? refusal.message : String(refusal);
        }
      },
    }, label);
  }

  let actionsFor = "";
  function renderActions() {
    const state = current.status.state;
    // Drawn again only when what they offer changes: a button is never swapped under a click.
    const key = `${state}:${graph ? "graph" : "agent"}:${rerunnable()}`;
    if (key === actionsFor) return;
    actionsFor = key;
    clear(actions,
      // A run waiting on a person resumes with what the person gives (the card above).
      !TERMINAL.has(state) && !WAITING.has(state) ? act("resume", "Resume", async () => {
        await post(runPath(run, "/resume"));
        refreshSoon();
      }) : null,
      !TERMINAL.has(state) ? act("abandon", "Abandon…", async () => abandonPanel()) : null,
      rerunnable() ? act("rerun", "Re-run", async () => {
        const started = await post("/v1/runs", { replay_of: run });
        location.hash = `#/runs/${encodeURIComponent(started.run)}`;
      }) : null,
      graph ? act("fork", "Fork from node…", async () => forkPanel()) : null);
  }

  function abandonPanel() {
    const reason = h("input", { placeholder: "why (optional)", "data-test": "abandon-reason", "aria-label": "reason" });
    const form = h("form", { class: "panel" }, h("label", {}, "Abandon this run for good: ", reason),
      h("button", { type: "submit", "data-test": "abandon-confirm" }, "Abandon"),
      h("button", { type: "button", onclick: () => clear(actionPanel) }, "Cancel"));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      actionError.textContent = "";
      try {
        await post(runPath(run, "/abandon"), reason.value ? { reason: reason.value } : {});
        clear(actionPanel);
        refreshSoon();
      } catch (refusal) {
        actionError.textContent = refusal.message;
      }
    });
    clear(actionPanel, form);
  }

  // A fork: the node, then a dry run that lists the writes it would fire again; only with every
  // one acknowledged does the daemon fork.
  function forkPanel() {
    const reached = (graph.projection.nodes ?? []).filter((node) => node.state !== "skipped").map((node) => node.node);
    const node = h("select", { "data-test": "fork-node", "aria-label": "node" }, reached.map((id) => h("option", { value: id }, id)));
    const hazard = h("div", { class: "hazard", "data-test": "fork-hazard" });
    const form = h("form", { class: "panel" }, h("label", {}, "Fork from ", node),
      h("button", { type: "submit", "data-test": "fork-preview" }, "Preview"),
      h("button", { type: "button", onclick: () => clear(actionPanel) }, "Cancel"), hazard);
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      actionError.textContent = "";
      clear(hazard);
      try {
        const plan = await post(runPath(run, "/fork"), { from_node: node.value, dry_run: true });
        showHazard(hazard, node.value, plan);
      } catch (refusal) {
        actionError.textContent = refusal.message;
      }
    });
    clear(actionPanel, form);
  }

  function showHazard(hazard, fromNode, plan) {
    const writes = plan.writes ?? [];
    // Forking fires each listed write again: the button waits for every one to be accepted.
    const go = h("button", { type: "button", "data-test": "fork-confirm", disabled: writes.length > 0 }, "Fork");
    const ticks = writes.map((write) => h("input", { type: "checkbox", value: String(write.seq), "data-test": "fork-ack" }));
    for (const box of ticks) box.addEventListener("change", () => { go.disabled = !ticks.every((tick) => tick.checked); });
    const boxes = writes.map((write, i) => h("li", { "data-test": "fork-write" }, h("label", {}, ticks[i],
      ` seq ${write.seq}: ${write.tool} ${short(write.input)} (recorded ${write.recorded_at})`)));
    go.addEventListener("click", async () => {
      actionError.textContent = "";
      const acknowledged = [...hazard.querySelectorAll("[data-test=fork-ack]:checked")].map((box) => Number(box.value));
      try {
        const child = await post(runPath(run, "/fork"), { from_node: fromNode, acknowledge_writes: acknowledged });
        location.hash = `#/runs/${encodeURIComponent(child.run)}`;
      } catch (refusal) {
        actionError.textContent = refusal.message;
      }
    });
    clear(hazard,
      boxes.length
        ? [h("p", { class: "warning" }, `Forking from ${fromNode} runs these recorded writes again. Tick each one you accept may happen twice:`), h("ul", {}, boxes)]
        : h("p", {}, `Forking from ${fromNode} runs no recorded write again (${plan.prefix_event_count} events copied).`),
      go);
  }

  async function loadRelations() {
    try {
      const [children, forks] = await Promise.all([get(runPath(run, "/children")), get(runPath(run, "/forks"))]);
      clear(relations,
        children.children.length ? [h("h2", {}, "Children"), h("ul", { "data-test": "children" }, children.children.map((child) => h("li", {}, runLink(child.run, "child"), " ", statePill(child.status))))] : null,
        forks.forks.length ? [h("h2", {}, "Forks"), h("ul", { "data-test": "forks" }, forks.forks.map((fork) => h("li", {}, runLink(fork.run, "fork"), ` from ${fork.from_node}`)))] : null);
    } catch (refusal) {
      error.textContent = refusal.message;
    }
  }

  async function loadGraph() {
    let projection;
    try {
      projection = await get(runPath(run, "/graph"));
    } catch (refusal) {
      if (refusal.code !== "not_a_graph_run") error.textContent = refusal.message;
      return;
    }
    try {
      const stored = await get(`/v1/graphs/${encodeURIComponent(projection.graph_hash)}`);
      graphBox.hidden = false;
      const canvas = h("div", { class: "canvas", "data-test": "graph-canvas" });
      clear(graphBox, h("h2", {}, "Graph"), canvas);
      graph = { projection, drawing: drawGraph(canvas, stored.document) };
      graph.drawing.update(pictured(projection));
      if (current) renderActions();
    } catch (refusal) {
      graphBox.hidden = false;
      clear(graphBox, h("p", { class: "error" }, refusal.message));
    }
  }

  // The projection with the run's state beside it: a node entered while the run waits on a
  // person is drawn waiting, not running.
  function pictured(projection) {
    return current ? { ...projection, run_state: current.status.state } : projection;
  }

  const refreshGraph = coalesce(async () => {
    if (!graph) return current?.graph_hash ? loadGraph() : undefined;
    try {
      graph.projection = await get(runPath(run, "/graph"));
      graph.drawing.update(pictured(graph.projection));
    } catch {
      // The next node event tries again.
    }
  }, 100);

  const unsubscribe = live.subscribe(run, {
    onEvent(envelope) {
      timeline.append(eventItem(envelope));
      if (NODE_EVENTS.has(envelope.event.kind)) refreshGraph();
      refreshSoon();
    },
    onStatus() {
      refreshSoon();
      if (graph) refreshGraph();
    },
    onError(refusal) {
      error.textContent = refusal.message;
    },
  });
  // Only a graph run has a graph to ask for (any other run's answer is a refusal).
  refresh().then(() => current?.graph_hash && loadGraph());
  loadRelations();
  return unsubscribe;
}

function runLink(run, name) {
  return h("a", { href: `#/runs/${encodeURIComponent(run)}`, title: run, "data-test": `${name}-link` }, shortId(run));
}


function pendingText(pending) {
  if (pending.kind === "model") return `model call at seq ${pending.seq}`;
  return `${pending.tool} (${pending.effect}${pending.idempotency_key ? `, key ${pending.idempotency_key}` : ""}) at seq ${pending.seq}`;
}

// One event of the timeline: its kind and what a person reads of it; the payload on demand.
function eventItem(envelope) {
  const { kind, payload } = envelope.event;
  const line = describe(kind, payload);
  const details = h("details", {}, h("summary", {}, "payload"), h("pre", {}, pretty(payload)));
  const failed = kind === "RunFailed" || (kind === "ToolCallCompleted" && payload.output?.error !== undefined && payload.output?.error !== null);
  return h("li", { class: `event event-${kind}${failed ? " event-error" : ""}`, "data-test": "event", "data-seq": envelope.seq, "data-kind": kind },
    h("span", { class: "seq" }, envelope.seq),
    h("span", { class: "kind" }, kind),
    h("span", { class: "what" }, line),
    h("time", { datetime: envelope.recorded_at, title: envelope.recorded_at }, envelope.recorded_at.slice(11, 19)),
    details);
}

function describe(kind, payload) {
  switch (kind) {
    case "RunStarted": return `agent ${shortId(payload.agent_def_hash.replace("sha256:", ""))}, input ${short(payload.input)}`;
    case "GraphRunStarted": return `graph ${shortId(payload.graph_hash.replace("sha256:", ""))}${payload.forked_from ? `, forked from ${shortId(payload.forked_from.run_id)} at ${payload.forked_from.from_node}` : ""}`;
    case "ModelCallRequested": return `model call${payload.performed_by ? ` (by ${payload.performed_by})` : ""}`;
    case "ModelCallCompleted": return `answered: ${usageText(payload.usage)}`;
    case "ToolCallRequested": return `${payload.tool} · ${payload.effect}${payload.idempotency_key ? ` · key ${payload.idempotency_key}` : ""} · ${short(payload.input, 60)}`;
    case "ToolCallCompleted": return `→ ${short(payload.output, 80)}${payload.settled_by ? ` (settled by ${payload.settled_by})` : ""}${payload.deduplicated_from ? " (deduplicated)" : ""}`;
    case "Suspended": return `waits: ${payload.reason}${payload.kind ? ` (${payload.kind})` : ""}`;
    case "Resumed": return `resumed with ${short(payload.input)}`;
    case "SleepStarted": return `sleeps until ${payload.wake_at}`;
    case "BudgetExceeded": return `${payload.budget.kind} budget ${payload.budget.limit} crossed at ${payload.observed}`;
    case "RunCompleted": return `completed: ${short(payload.output)}`;
    case "RunFailed": return payload.error;
    case "RunAbandoned": return `abandoned${payload.reason ? `: ${payload.reason}` : ""}`;
    case "NodeEntered": return `node ${payload.node} entered`;
    case "NodeExited": return `node ${payload.node} exited${payload.branch_case ? ` (case ${payload.branch_case})` : ""}`;
    case "NodeSkipped": return `node ${payload.node} skipped: ${payload.reason}`;
    case "NowObserved": return payload.now;
    case "ToolsAttached": return `tools attached by the ${payload.by}: ${payload.tools.join(", ")}`;
    default: return "";
  }
}
