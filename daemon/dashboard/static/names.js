// What a run is, in a person's words: the agent or graph it runs and, for a child run, whose item
// or subagent it is. Agents and graphs are content-addressed, so what is read of one hash is kept
// for the page's life; a run's current node is read each time it is asked for.

import { get, runPath } from "./api.js";
import { h, shortId } from "./dom.js";

// The daemon's labels that place a run in a tree (written by the daemon alone).
const MAP_OF = "salvor.map_of";
const PARENT = "salvor.parent";

// A run's labels less the ones runOrigin tells in words.
export function ownLabels(labels) {
  return Object.fromEntries(Object.entries(labels ?? {}).filter(([key]) => key !== MAP_OF && key !== PARENT));
}

const agents = new Map(); // hash -> Promise<{name?, kind?} | null>
const graphs = new Map(); // hash -> Promise<document | null>

// GET /v1/agents/{hash}, once per hash; null when the daemon does not hold it.
export function agentOf(hash) {
  if (!agents.has(hash)) agents.set(hash, get(`/v1/agents/${encodeURIComponent(hash)}`).catch(() => null));
  return agents.get(hash);
}

function graphDocumentOf(hash) {
  if (!graphs.has(hash)) graphs.set(hash, get(`/v1/graphs/${encodeURIComponent(hash)}`).then((stored) => stored.document, () => null));
  return graphs.get(hash);
}

const bareHash = (hash) => shortId(hash.replace("sha256:", ""));

// A graph's name: a graph document has none of its own, so its hash is what tells one from another.
export function graphName(hash) {
  return `graph ${bareHash(hash)}`;
}

export function agentName(hash, agent) {
  return `agent ${agent?.name ?? bareHash(hash)}`;
}

// The node a graph run is in now, as "<name> (<id>)" or its id, or "" when it is in none.
async function currentNode(run, graphHash) {
  const [projection, document] = await Promise.all([get(runPath(run, "/graph"), { quiet: true }), graphDocumentOf(graphHash)]);
  const id = projection.current_node;
  if (!id) return "";
  const node = (document?.nodes ?? []).find((candidate) => candidate.id === id);
  return node?.name ? `${node.name} (${id})` : id;
}

const link = (run, name) => h("a", { href: `#/runs/${encodeURIComponent(run)}`, title: run, "data-test": name }, shortId(run));

// Where a waiting run stands, as parts of a sentence: "agent refund-desk", "graph 4f1c2a9b… at
// node Approve (approve)", "item of map node triage in run 6f…", "subagent of run 6f…". Each part
// is a <span data-test=...>; a part that cannot be read is left out, never guessed.
export async function runOrigin({ agent_def_hash: agent, graph_hash: graph, labels = {}, driven_by: drivenBy }, run) {
  const parts = [];
  if (graph) {
    const node = await currentNode(run, graph).catch(() => "");
    parts.push(h("span", { "data-test": "origin-graph", title: graph }, graphName(graph)));
    if (node) parts.push(h("span", { "data-test": "origin-node" }, `at node ${node}`));
  } else if (agent) {
    // A client-driven run's agent hash is its client's word, for no agent the daemon holds.
    const held = drivenBy === "client" ? null : await agentOf(agent);
    parts.push(h("span", { "data-test": "origin-agent", title: agent }, agentName(agent, held)));
  }
  if (drivenBy === "client") parts.push(h("span", { "data-test": "origin-client" }, "driven by a client"));
  const mapOf = labels?.[MAP_OF];
  if (mapOf) {
    let node = "";
    try {
      const parent = await get(runPath(mapOf), { quiet: true });
      node = parent.graph_hash ? await currentNode(mapOf, parent.graph_hash) : "";
    } catch {
      // The parent's node is a help; its link is still shown.
    }
    parts.push(h("span", { "data-test": "origin-map" }, `item of ${node ? `map node ${node}` : "a map"} in run `, link(mapOf, "origin-parent")));
  } else if (labels?.[PARENT]) {
    parts.push(h("span", { "data-test": "origin-subagent" }, "subagent of run ", link(labels[PARENT], "origin-parent")));
  }
  return parts;
}
