// A graph document drawn as SVG, top to bottom, with each node's state from the run's projection.
//
// Rules of this module:
// * The layout is computed here, from the document alone (no library, nothing fetched): layers
//   by the longest path from an entry node, an edge that skips layers routed through a point per
//   layer it crosses, then a few barycentre sweeps to reduce crossings, keeping the best order.
// * drawGraph draws once; update() only changes attributes and texts of what was drawn (states,
//   a map's progress, a branch's case), so nothing flickers and references to nodes stay valid.
// * Every node is <g data-node="<id>" data-state="<state>" class="sg-node sg-<state>">, every
//   edge <g data-edge="<from>-><to>" data-from data-to>: a test reads the picture from the DOM.
//
// States shown: pending (not reached), running (entered), waiting (entered while the run waits
// on a person or the clock), completed (exited), failed (entered when the run failed), skipped.

const SVG = "http://www.w3.org/2000/svg";

const NODE_WIDTH = 184;
const NODE_HEIGHT = 52;
const GAP_X = 36;
const GAP_Y = 64;
// A layer-crossing edge's waypoint takes a slot this wide in its layer.
const WAYPOINT_WIDTH = 16;
const MARGIN = 16;
const SWEEPS = 8;
// Counting crossings compares every pair of links between two rows; past this many links the
// order stays the document's rather than stall the page on a graph no one reads edge by edge.
const MAX_COUNTED_LINKS = 4000;
const ALIGN_SWEEPS = 6;
const ARROW = 8;
const ID_CHARS = 24;

export const STATES = ["pending", "running", "waiting", "completed", "failed", "skipped"];

// The projection's states (GET /v1/runs/{id}/graph) in the picture's words.
const PROJECTED = { entered: "running", exited: "completed", skipped: "skipped" };
// Run states in which the node the walk is in does not move on by itself.
const WAITING_RUN_STATES = new Set([
  "suspended",
  "sleeping",
  "budget_exceeded",
  "needs_reconciliation",
]);
const FAILED_RUN_STATES = new Set(["failed", "abandoned"]);

function svg(tag, attributes = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value !== undefined && value !== null) node.setAttribute(name, String(value));
  }
  for (const child of children) {
    if (child !== null && child !== undefined) {
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
  }
  return node;
}

function clip(text, chars) {
  return text.length > chars ? `${text.slice(0, chars - 1)}…` : text;
}

// -- reading the document -----------------------------------------------------------------------

function readDocument(graphDocument) {
  // GET /v1/graphs/{hash} answers {graph, document}; the page may hand either over.
  const doc =
    graphDocument && graphDocument.document && Array.isArray(graphDocument.document.nodes)
      ? graphDocument.document
      : graphDocument;
  if (!doc || !Array.isArray(doc.nodes)) throw new TypeError("a graph document has a nodes list");
  const nodes = [];
  const seen = new Set();
  for (const node of doc.nodes) {
    if (!node || typeof node.id !== "string" || seen.has(node.id)) continue;
    seen.add(node.id);
    nodes.push(node);
  }
  const edges = (Array.isArray(doc.edges) ? doc.edges : []).filter(
    (edge) => edge && seen.has(edge.from) && seen.has(edge.to) && edge.from !== edge.to,
  );
  return { nodes, edges };
}

function kindText(node) {
  if (node.kind === "map" && node.body && typeof node.body.kind === "string") {
    return `map · ${node.body.kind}`;
  }
  return String(node.kind ?? "node");
}

// -- layout ------------------------------------------------------------------------------------

// Layer of each node: the longest path from an entry node, over Kahn's order.
// A node on a cycle (never in a valid document) goes one layer below everything else.
function layersOf(nodes, edges) {
  const index = new Map(nodes.map((node, i) => [node.id, i]));
  const waiting = nodes.map(() => 0);
  const targets = nodes.map(() => []);
  for (const edge of edges) {
    targets[index.get(edge.from)].push(index.get(edge.to));
    waiting[index.get(edge.to)] += 1;
  }
  const layer = nodes.map(() => 0);
  const ready = [];
  waiting.forEach((count, i) => count === 0 && ready.push(i));
  const placed = new Set();
  // The longest path does not depend on the order nodes leave the queue, so a stack will do.
  while (ready.length > 0) {
    const i = ready.pop();
    placed.add(i);
    for (const target of targets[i]) {
      layer[target] = Math.max(layer[target], layer[i] + 1);
      waiting[target] -= 1;
      if (waiting[target] === 0) ready.push(target);
    }
  }
  const deepest = Math.max(0, ...layer);
  return layer.map((value, i) => (placed.has(i) ? value : deepest + 1));
}

function crossings(rows, links) {
  // Pairs of links between the same two rows that cross: one sorted pass per pair of rows.
  const position = new Map();
  rows.forEach((row) => row.forEach((vertex, i) => position.set(vertex, i)));
  let count = 0;
  const byRow = new Map();
  for (const [from, to] of links) {
    const key = from.layer;
    if (!byRow.has(key)) byRow.set(key, []);
    byRow.get(key).push([position.get(from), position.get(to)]);
  }
  for (const pairs of byRow.values()) {
    for (let a = 0; a < pairs.length; a += 1) {
      for (let b = a + 1; b < pairs.length; b += 1) {
        const [a1, a2] = pairs[a];
        const [b1, b2] = pairs[b];
        if ((a1 - b1) * (a2 - b2) < 0) count += 1;
      }
    }
  }
  return count;
}

// Place a row's vertices as near their wanted x as their order and gaps allow (least squares):
// with each vertex's offset from the first taken out, the positions must only not decrease,
// which pooling adjacent violators solves exactly.
function placeRow(row, wanted) {
  const offsets = [];
  let offset = 0;
  row.forEach((vertex, i) => {
    if (i > 0) offset += (row[i - 1].width + vertex.width) / 2 + GAP_X;
    offsets.push(offset);
  });
  const blocks = [];
  row.forEach((_, i) => {
    blocks.push({ sum: wanted[i] - offsets[i], count: 1 });
    while (blocks.length > 1) {
      const last = blocks[blocks.length - 1];
      const before = blocks[blocks.length - 2];
      if (before.sum / before.count <= last.sum / last.count) break;
      before.sum += last.sum;
      before.count += last.count;
      blocks.pop();
    }
  });
  let i = 0;
  for (const block of blocks) {
    for (let k = 0; k < block.count; k += 1, i += 1) {
      row[i].x = block.sum / block.count + offsets[i];
    }
  }
}

function layout(nodes, edges) {
  const layer = layersOf(nodes, edges);
  // Vertices: the nodes, and one waypoint per layer a long edge passes through.
  const vertices = nodes.map((node, i) => ({
    node,
    layer: layer[i],
    width: NODE_WIDTH,
    order: i,
    up: [],
    down: [],
  }));
  const byId = new Map(vertices.map((vertex) => [vertex.node.id, vertex]));
  const links = [];
  const routes = edges.map((edge, order) => {
    const from = byId.get(edge.from);
    const to = byId.get(edge.to);
    const chain = [from];
    // An edge drawn upwards (only on a cycle) is routed as it stands, without waypoints.
    for (let at = from.layer + 1; at < to.layer; at += 1) {
      chain.push({
        node: null,
        layer: at,
        width: WAYPOINT_WIDTH,
        order: nodes.length + order,
        up: [],
        down: [],
      });
      vertices.push(chain[chain.length - 1]);
    }
    chain.push(to);
    for (let i = 0; i + 1 < chain.length; i += 1) {
      if (chain[i].layer < chain[i + 1].layer) {
        chain[i].down.push(chain[i + 1]);
        chain[i + 1].up.push(chain[i]);
        links.push([chain[i], chain[i + 1]]);
      }
    }
    return { edge, chain };
  });
  const depth = Math.max(0, ...vertices.map((vertex) => vertex.layer)) + 1;
  let rows = Array.from({ length: depth }, () => []);
  for (const vertex of [...vertices].sort((a, b) => a.order - b.order))
    rows[vertex.layer].push(vertex);

  // Barycentre sweeps, down then up: each vertex moves to the mean position of its neighbours in
  // the row just swept; the order with the fewest crossings seen is kept.
  let best = rows.map((row) => [...row]);
  let fewest = links.length > MAX_COUNTED_LINKS ? 0 : crossings(best, links);
  for (let sweep = 0; sweep < SWEEPS && fewest > 0; sweep += 1) {
    const downward = sweep % 2 === 0;
    const sequence = downward ? rows.keys() : [...rows.keys()].reverse();
    for (const r of sequence) {
      const neighbourRow = rows[downward ? r - 1 : r + 1];
      if (!neighbourRow) continue;
      const at = new Map(neighbourRow.map((vertex, i) => [vertex, i]));
      const keyed = rows[r].map((vertex, i) => {
        const neighbours = (downward ? vertex.up : vertex.down).filter((n) => at.has(n));
        const centre =
          neighbours.length === 0
            ? i
            : neighbours.reduce((sum, n) => sum + at.get(n), 0) / neighbours.length;
        return { vertex, centre, i };
      });
      keyed.sort((a, b) => a.centre - b.centre || a.i - b.i);
      rows[r] = keyed.map((entry) => entry.vertex);
    }
    const count = crossings(rows, links);
    if (count < fewest) {
      fewest = count;
      best = rows.map((row) => [...row]);
    }
  }
  rows = best;

  // x: each row starts centred on the widest, then sweeps pull every vertex towards the mean x
  // of its neighbours (above on the way down, below on the way up), rows keeping their order
  // and gaps, so a chain runs straight and a fan-out sits under its source.
  const rowWidth = (row) => row.reduce((sum, v) => sum + v.width, 0) + GAP_X * (row.length - 1);
  const widest = Math.max(...rows.map(rowWidth));
  rows.forEach((row) => {
    let x = (widest - rowWidth(row)) / 2;
    for (const vertex of row) {
      vertex.x = x + vertex.width / 2;
      x += vertex.width + GAP_X;
    }
  });
  for (let sweep = 0; sweep < ALIGN_SWEEPS; sweep += 1) {
    const downward = sweep % 2 === 0;
    const sequence = downward ? [...rows.keys()] : [...rows.keys()].reverse();
    for (const r of sequence) {
      const wanted = rows[r].map((vertex) => {
        const neighbours = downward ? vertex.up : vertex.down;
        return neighbours.length === 0
          ? vertex.x
          : neighbours.reduce((sum, n) => sum + n.x, 0) / neighbours.length;
      });
      placeRow(rows[r], wanted);
    }
  }
  const left = Math.min(...vertices.map((vertex) => vertex.x - vertex.width / 2));
  const right = Math.max(...vertices.map((vertex) => vertex.x + vertex.width / 2));
  const width = right - left + 2 * MARGIN;
  rows.forEach((row, r) => {
    for (const vertex of row) {
      vertex.x += MARGIN - left;
      vertex.y = MARGIN + r * (NODE_HEIGHT + GAP_Y);
    }
  });
  const height = MARGIN * 2 + depth * NODE_HEIGHT + (depth - 1) * GAP_Y;
  return {
    vertices: vertices.filter((vertex) => vertex.node),
    routes,
    width,
    height,
    crossings: fewest,
  };
}

// -- drawing ----------------------------------------------------------------------------------

function edgeShape(chain) {
  // From the bottom middle of the source to the top middle of the target, through each
  // waypoint, as vertical S-curves: every curve leaves and arrives vertically, so the arrowhead
  // always points straight down (up only on a cycle) and the line stops at its base.
  const points = chain.map((vertex, i) => {
    if (vertex.node === null) return [vertex.x, vertex.y + NODE_HEIGHT / 2];
    return [vertex.x, i === 0 ? vertex.y + NODE_HEIGHT : vertex.y];
  });
  const [tipX, tipY] = points[points.length - 1];
  const direction = tipY >= points[points.length - 2][1] ? 1 : -1;
  points[points.length - 1] = [tipX, tipY - ARROW * direction];
  let d = `M ${points[0][0]} ${points[0][1]}`;
  for (let i = 1; i < points.length; i += 1) {
    const [x0, y0] = points[i - 1];
    const [x1, y1] = points[i];
    const mid = (y0 + y1) / 2;
    d += ` C ${x0} ${mid} ${x1} ${mid} ${x1} ${y1}`;
  }
  const base = tipY - ARROW * direction;
  const arrow = `M ${tipX} ${tipY} L ${tipX - ARROW / 2} ${base} L ${tipX + ARROW / 2} ${base} Z`;
  // The middle of the first curve, where a branch's case is written.
  const label = [(points[0][0] + points[1][0]) / 2, (points[0][1] + points[1][1]) / 2];
  return { d, arrow, label };
}

function nodeStatesOf(nodeStates) {
  // The picture's state of every node named, and what else the projection says of it.
  const found = new Map();
  if (!nodeStates) return found;
  let entries;
  let runState;
  let current;
  if (Array.isArray(nodeStates)) {
    entries = nodeStates;
  } else if (Array.isArray(nodeStates.nodes)) {
    // A projection, optionally with the run's state: {nodes, current_node?, run_state?} or a
    // status object beside it ({status: {state}}).
    entries = nodeStates.nodes;
    current = nodeStates.current_node;
    runState = nodeStates.run_state ?? nodeStates.status?.state;
  } else {
    entries = Object.entries(nodeStates).map(([node, value]) =>
      typeof value === "string" ? { node, state: value } : { ...value, node },
    );
  }
  for (const entry of entries) {
    if (!entry || typeof entry.node !== "string") continue;
    let state = PROJECTED[entry.state] ?? (STATES.includes(entry.state) ? entry.state : "pending");
    if (state === "running" && (current === undefined || current === entry.node)) {
      if (WAITING_RUN_STATES.has(runState)) state = "waiting";
      if (FAILED_RUN_STATES.has(runState)) state = "failed";
    }
    found.set(entry.node, { ...entry, state });
  }
  return found;
}

function detailText(node, entry) {
  if (entry?.map && typeof entry.map.completed === "number") {
    return typeof entry.map.items === "number"
      ? `${entry.map.completed}/${entry.map.items} items`
      : `${entry.map.completed} items`;
  }
  if (typeof entry?.branch_case === "string") return `→ ${clip(entry.branch_case, 20)}`;
  return "";
}

export function drawGraph(container, graphDocument) {
  const { nodes, edges } = readDocument(graphDocument);
  const picture = layout(nodes, edges);
  const root = svg("svg", {
    class: "sg-graph",
    "data-test": "graph",
    viewBox: `0 0 ${picture.width} ${picture.height}`,
    width: picture.width,
    height: picture.height,
    role: "img",
    "aria-label": `a graph of ${nodes.length} nodes`,
  });
  const edgeLayer = svg("g", { class: "sg-edges" });
  const edgeViews = picture.routes.map(({ edge, chain }) => {
    const group = svg("g", {
      class: "sg-edge",
      "data-test": "graph-edge",
      "data-edge": `${edge.from}->${edge.to}`,
      "data-from": edge.from,
      "data-to": edge.to,
      "data-case": typeof edge.case === "string" ? edge.case : undefined,
      "data-state": "pending",
    });
    const shape = edgeShape(chain);
    group.append(
      svg("path", { d: shape.d, class: "sg-edge-line" }),
      svg("path", { d: shape.arrow, class: "sg-arrowhead" }),
    );
    if (typeof edge.case === "string") {
      // The case on the edge, halfway down from the branch it leaves.
      const [x, y] = shape.label;
      group.append(svg("text", { class: "sg-case", x, y: y + 4 }, clip(edge.case, 16)));
    }
    edgeLayer.append(group);
    return { edge, group };
  });
  root.append(edgeLayer);

  const nodeLayer = svg("g", { class: "sg-nodes" });
  const nodeViews = new Map();
  for (const vertex of picture.vertices) {
    const node = vertex.node;
    const left = vertex.x - NODE_WIDTH / 2;
    const kind = kindText(node);
    const title = svg("title", {}, `${node.id} (${kind})${node.name ? `: ${node.name}` : ""}`);
    const detail = svg(
      "text",
      { class: "sg-detail", x: left + NODE_WIDTH - 10, y: vertex.y + 40 },
      "",
    );
    const group = svg(
      "g",
      {
        class: `sg-node sg-kind-${String(node.kind)} sg-pending`,
        "data-test": "graph-node",
        "data-node": node.id,
        "data-kind": String(node.kind),
        "data-state": "pending",
      },
      title,
      svg("rect", {
        class: "sg-box",
        x: left,
        y: vertex.y,
        width: NODE_WIDTH,
        height: NODE_HEIGHT,
        rx: node.kind === "gate" ? 16 : 6,
      }),
      node.kind === "map"
        ? svg("rect", {
            // A map runs its body per item: a second box behind the first says "many".
            class: "sg-stack",
            x: left + 4,
            y: vertex.y + 4,
            width: NODE_WIDTH,
            height: NODE_HEIGHT,
            rx: 6,
          })
        : null,
      svg("text", { class: "sg-id", x: left + 10, y: vertex.y + 21 }, clip(node.id, ID_CHARS)),
      svg("text", { class: "sg-kind", x: left + 10, y: vertex.y + 40 }, kind),
      detail,
    );
    // The stack goes behind the box.
    const stack = group.querySelector(".sg-stack");
    if (stack) group.insertBefore(stack, group.querySelector(".sg-box"));
    nodeLayer.append(group);
    nodeViews.set(node.id, { node, group, title, detail, state: "pending" });
  }
  root.append(nodeLayer);
  container.replaceChildren(root);

  return {
    /**
     * Show `nodeStates`, a whole picture (a node not named is pending again), one of:
     * the projection GET /v1/runs/{id}/graph answers, with the run's state beside it as
     * `run_state` or `status: {state}` (a node entered while the run waits is "waiting", while
     * it failed "failed"); its `nodes` list alone; or {id: state}, a state being the
     * projection's (entered, exited, skipped) or the picture's (STATES).
     */
    update(nodeStates) {
      const states = nodeStatesOf(nodeStates);
      for (const [id, view] of nodeViews) {
        const entry = states.get(id);
        const state = entry ? entry.state : "pending";
        if (state !== view.state) {
          view.group.classList.remove(`sg-${view.state}`);
          view.group.classList.add(`sg-${state}`);
          view.group.setAttribute("data-state", state);
          view.state = state;
        }
        view.detail.textContent = detailText(view.node, entry);
        const why = entry?.reason ? ` — ${entry.reason}` : "";
        view.title.textContent = `${id} (${kindText(view.node)})${view.node.name ? `: ${view.node.name}` : ""}: ${state}${why}`;
      }
      // An edge was taken when its source finished and its target was reached, and for a
      // branch only the edge of the case it fired.
      for (const { edge, group } of edgeViews) {
        const source = states.get(edge.from);
        const target = states.get(edge.to);
        let state = "pending";
        if (target?.state === "skipped") state = "skipped";
        else if (source?.state === "completed" && target && target.state !== "pending") {
          const fired = source.branch_case;
          state =
            typeof edge.case === "string" && typeof fired === "string" && edge.case !== fired
              ? "skipped"
              : "taken";
        }
        group.setAttribute("data-state", state);
      }
    },
  };
}
