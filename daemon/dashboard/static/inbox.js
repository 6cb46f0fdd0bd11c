// Inbox: every run waiting on a person. Gates and ask_user questions get a form from the
// recorded input_schema (form.js) and resume with its value; unknown writes show their intent
// and take a resolve (the output, or "did not land"); budget crossings take an extension. A
// refusal's envelope is shown beside the form as the daemon worded it. Each card says which run
// waits: its id, the agent or graph (and node) it runs, and whose map item or subagent it is.

import { get, post, query, runPath } from "./api.js";
import { age, clear, coalesce, h, labelChips, pretty, shortId } from "./dom.js";
import { FormInputError, renderForm } from "./form.js";
import { ownLabels, runOrigin } from "./names.js";

// Everything the inbox lists, as cards: [{kind, run, ...}].
export async function waitingItems() {
  const [suspended, budgets, writes] = await Promise.all([
    get(`/v1/runs${query({ status: "suspended" })}`),
    get(`/v1/runs${query({ status: "budget_exceeded" })}`),
    get("/v1/reconciliations"),
  ]);
  const items = [];
  for (const row of suspended.runs) {
    // A signal wait is a system's to end, not a person's.
    if (row.status?.kind === "signal") continue;
    items.push({ kind: waitKind(row.status), run: row.run, row, status: row.status });
  }
  for (const item of writes.reconciliations) items.push({ kind: "unknown_write", run: item.run, item });
  for (const row of budgets.runs) items.push({ kind: "budget", run: row.run, row, status: row.status });
  return items;
}

// The runs the inbox lists now.
export async function waitingRuns() {
  return new Set((await waitingItems()).map((item) => item.run));
}

// Whether a changed run-list row can change what the inbox lists: it waits now, or it did.
export function movesTheInbox(row, waiting) {
  const state = row.status?.state;
  const waitsNow = state === "suspended" || state === "budget_exceeded" || state === "needs_reconciliation";
  return waitsNow || waiting.has(row.run);
}

// An ask_user question's schema is the tool's answer object, {answer: ...}; any other is a gate.
function waitKind(status) {
  const properties = Object.keys(status?.input_schema?.properties ?? {});
  return properties.length === 1 && properties[0] === "answer" ? "question" : "gate";
}

const TITLES = { gate: "Gate", question: "Question", unknown_write: "Unknown write", budget: "Budget crossed" };

export function showInbox(container, { live, refreshCount }) {
  const list = h("div", { class: "inbox", "data-test": "inbox" });
  const error = h("p", { class: "error", "data-test": "inbox-error", role: "alert" });
  clear(container, h("h1", {}, "Inbox"), h("p", { class: "hint" }, "Runs waiting on a person."), error, list);
  const shown = new Map(); // run -> card; a card being worked on is left in place

  async function load() {
    try {
      const items = await waitingItems();
      error.textContent = "";
      const waiting = new Set(items.map((item) => item.run));
      for (const [run, card] of shown) {
        if (!waiting.has(run)) {
          card.remove();
          shown.delete(run);
        }
      }
      for (const item of items) {
        const existing = shown.get(item.run);
        // A card being filled in stays; a run that has moved on to another wait gets a new one.
        const since = item.row?.last_recorded_at ?? item.item?.parked_since ?? "";
        if (existing && existing.dataset.kind === item.kind && existing.dataset.since === since) continue;
        const card = waitingCard(item, () => {
          refreshCount();
          reload();
        });
        card.dataset.since = since;
        if (existing) existing.replaceWith(card);
        else list.append(card);
        shown.set(item.run, card);
      }
      list.querySelector("[data-test=inbox-empty]")?.remove();
      if (!items.length) list.append(h("p", { "data-test": "inbox-empty" }, "Nobody is waited on."));
    } catch (refusal) {
      error.textContent = refusal.message;
    }
  }
  const reload = coalesce(load, 200);
  const unwatch = live.watchRuns((row) => {
    if (movesTheInbox(row, new Set(shown.keys()))) reload();
  });
  load();
  return unwatch;
}

// One waiting run as a card with its action. `done` is called once the daemon took the action.
export function waitingCard(item, done = () => {}) {
  const row = item.row ?? {};
  const origin = h("span", { class: "origin", "data-test": "card-origin" });
  const card = h("article", { class: `card card-${item.kind}`, "data-test": "inbox-item", "data-run": item.run, "data-kind": item.kind },
    h("header", {},
      h("span", { class: "kind" }, TITLES[item.kind]),
      h("span", {}, "run ", h("a", { href: `#/runs/${encodeURIComponent(item.run)}`, title: item.run, "data-test": "inbox-run" }, shortId(item.run))),
      origin,
      labelChips(ownLabels(row.labels ?? item.item?.labels)),
      row.last_recorded_at ? h("span", { class: "age", title: row.last_recorded_at }, `waiting ${age(row.last_recorded_at)}`) : null));
  showOrigin(origin, item);
  if (item.kind === "unknown_write") card.append(...resolveParts(item, done));
  else if (item.kind === "budget") card.append(...extendParts(item, done));
  else card.append(...answerParts(item, done));
  return card;
}

// What the run runs and where it stands (names.js), once read; a listing's row says what it runs,
// a parked write's entry may not (a graph run's tool node), and then the run is read.
async function showOrigin(element, item) {
  try {
    const row = item.row?.agent_def_hash || item.row?.graph_hash ? item.row : await get(runPath(item.run), { quiet: true });
    const parts = await runOrigin(row, item.run);
    element.replaceChildren(...parts.flatMap((part, i) => (i ? [" · ", part] : [part])));
    element.dataset.ready = "";
  } catch {
    // The card's action does not depend on it.
  }
}

function answered(message) {
  return h("p", { class: "answered", "data-test": "action-done" }, message);
}

function answerParts(item, done) {
  // form.js renders a <form> of its own into the holder; Enter in a field raises its "submit",
  // which bubbles here.
  const holder = h("div", { class: "form-holder", "data-test": item.kind === "gate" ? "gate-form" : "question-form" });
  const form = renderForm(holder, item.status.input_schema ?? {});
  const submit = h("button", { type: "button", class: "primary", "data-test": "answer-submit" }, item.kind === "gate" ? "Resume with this" : "Answer");
  const element = h("div", { class: "answer" }, holder, submit);

  async function send() {
    let input;
    try {
      input = form.value();
    } catch {
      return; // JSON text that does not parse: form.js shows it on its field
    }
    submit.disabled = true;
    try {
      await post(runPath(item.run, "/resume"), { input: input ?? null });
      element.replaceWith(answered("Resumed."));
      done();
    } catch (refusal) {
      form.showErrors(refusal.envelope);
    } finally {
      submit.disabled = false;
    }
  }
  holder.addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });
  submit.addEventListener("click", send);
  return [h("p", { class: "reason", "data-test": "wait-reason" }, item.status.reason ?? ""), element];
}

function resolveParts(item, done) {
  const intent = item.item?.intent ?? item.intent ?? {};
  const resolve = item.item?.resolve ?? {};
  const error = h("p", { class: "error", "data-test": "resolve-error", role: "alert" });
  const facts = h("dl", { class: "intent", "data-test": "write-intent" },
    h("dt", {}, "tool"), h("dd", { "data-test": "write-tool" }, intent.tool ?? ""),
    h("dt", {}, "effect"), h("dd", {}, intent.effect ?? "write"),
    h("dt", {}, "idempotency key"), h("dd", {}, intent.idempotency_key ?? "none"),
    h("dt", {}, "recorded"), h("dd", {}, intent.recorded_at ?? ""),
    item.item?.probe ? [h("dt", {}, "probe"), h("dd", {}, `${item.item.probe.tool}: ${item.item.probe.verdict}`)] : null,
    h("dt", {}, "input"), h("dd", {}, h("pre", {}, pretty(intent.input))));
  // A client's declared write has an output schema to build a form from; otherwise the output is
  // typed as JSON.
  let output;
  const holder = h("div", { class: "form-holder" });
  if (resolve.output_schema && typeof resolve.output_schema === "object") {
    const form = renderForm(holder, resolve.output_schema);
    output = { value: () => form.value(), showErrors: (envelope) => form.showErrors(envelope) };
  } else {
    const text = h("textarea", { rows: 4, "data-test": "resolve-output", placeholder: '{"refund_id": "..."}', "aria-label": "what the write returned, as JSON" });
    holder.append(h("label", {}, "What the write returned (JSON)", text));
    output = {
      value: () => JSON.parse(text.value),
      showErrors: (envelope) => { error.textContent = envelope.error.message; },
    };
  }
  const landed = h("button", { type: "button", class: "primary", "data-test": "resolve-submit" }, "It landed: record this output");
  const notLanded = h("button", { type: "button", "data-test": "resolve-not-landed" }, "It did not land");
  const element = h("div", { class: "resolve", "data-test": "resolve-form" }, holder, h("div", { class: "buttons" }, landed, notLanded), error);

  async function send(body) {
    error.textContent = "";
    try {
      await post(resolve.path ?? runPath(item.run, "/resolve"), body);
      element.replaceWith(answered("Resolved."));
      done();
    } catch (refusal) {
      output.showErrors(refusal.envelope);
      if (!error.textContent && refusal.envelope) error.textContent = refusal.envelope.error.message;
    }
  }
  function record() {
    let value;
    try {
      value = output.value();
    } catch (failure) {
      if (!(failure instanceof FormInputError)) error.textContent = `not JSON: ${failure.message}`;
      return;
    }
    send({ output: value ?? null });
  }
  holder.addEventListener("submit", (event) => {
    event.preventDefault();
    record();
  });
  landed.addEventListener("click", record);
  notLanded.addEventListener("click", () => send({ not_landed: true }));
  return [h("p", { class: "reason" }, "A write was started and nobody knows whether it happened. Check, then say."), facts, element];
}

function extendParts(item, done) {
  const budget = item.status.budget ?? {};
  const amount = h("input", { type: "number", min: "0", step: "any", required: true, "data-test": "extend-by", "aria-label": "extend by" });
  const error = h("p", { class: "error", "data-test": "extend-error", role: "alert" });
  const element = h("form", { class: "extend", "data-test": "extend-form" },
    h("label", {}, `Extend the ${budget.kind ?? ""} budget by `, amount),
    h("button", { type: "submit", "data-test": "extend-submit" }, "Extend and resume"), error);
  element.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.textContent = "";
    try {
      await post(runPath(item.run, "/resume"), { input: { extend_by: Number(amount.value) } });
      element.replaceWith(answered("Extended."));
      done();
    } catch (refusal) {
      error.textContent = refusal.message;
    }
  });
  return [h("p", { class: "reason", "data-test": "wait-reason" }, `${budget.kind ?? "a"} budget of ${budget.limit ?? "?"} crossed at ${item.status.observed ?? "?"}`), element];
}
