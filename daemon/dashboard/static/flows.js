// Flows: the flows kept by name (GET /v1/flows), each at its current version, with a link to the
// runs started by that name (labelled salvor.flow). Read when the screen opens; a name written
// since shows on the next visit.

import { get, query } from "./api.js";
import { age, clear, h, shortId } from "./dom.js";

export function showFlows(container) {
  const body = h("tbody", { "data-test": "flow-rows" });
  const error = h("p", { class: "error", "data-test": "flows-error", role: "alert" });
  clear(container,
    h("h1", {}, "Flows"),
    error,
    h("table", { class: "runs", "data-test": "flows" },
      h("thead", {}, h("tr", {}, ["name", "version", "graph", "updated"].map((c) => h("th", {}, c)))),
      body));

  function row(flow) {
    const runs = `#/runs${query({ label: `salvor.flow:${flow.flow}` })}`;
    return h("tr", { "data-test": "flow-row", "data-flow": flow.flow },
      h("td", {}, h("a", { href: runs, title: "its runs", "data-test": "flow-name" }, flow.flow)),
      h("td", { "data-test": "flow-version" }, String(flow.version)),
      h("td", { title: flow.graph, "data-test": "flow-graph" }, shortId(flow.graph.replace("sha256:", ""))),
      h("td", { title: flow.updated_at }, age(flow.updated_at)));
  }

  get("/v1/flows").then(({ flows }) => {
    if (!flows.length) body.append(h("tr", { "data-test": "no-flows" }, h("td", { colspan: 4 }, "No flows kept by name.")));
    for (const flow of flows) body.append(row(flow));
  }, (refusal) => {
    error.textContent = refusal.message;
  });
  return () => {};
}
