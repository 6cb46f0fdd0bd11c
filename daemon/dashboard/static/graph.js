// A stand-in until the page's full drawing module lands: a graph document as SVG, nodes in
// layers top to bottom (a node one below its deepest parent), each a <g data-node data-state>.
// Same exports and contract: drawGraph(container, document) -> {update(nodeStates)}.

const NS = "http://www.w3.org/2000/svg";
const WIDTH = 150;
const HEIGHT = 36;
const GAP_X = 30;
const GAP_Y = 40;

function svg(tag, attributes = {}) {
  const element = document.createElementNS(NS, tag);
  for (const [name, value] of Object.entries(attributes)) element.setAttribute(name, String(value));
  return element;
}

export function drawGraph(container, graphDocument) {
  const nodes = graphDocument.nodes ?? [];
  const edges = graphDocument.edges ?? [];
  const depth = new Map(nodes.map((node) => [node.id, 0]));
  // Longest path from an entry: an acyclic document settles in at most |nodes| rounds.
  for (let round = 0; round < nodes.length; round += 1) {
    for (const edge of edges) depth.set(edge.to, Math.max(depth.get(edge.to) ?? 0, (depth.get(edge.from) ?? 0) + 1));
  }
  const layers = [];
  for (const node of nodes) (layers[depth.get(node.id)] ??= []).push(node);
  const widest = Math.max(1, ...layers.map((layer) => layer.length));
  const width = widest * (WIDTH + GAP_X) + GAP_X;
  const height = layers.length * (HEIGHT + GAP_Y) + GAP_Y;
  const where = new Map();
  layers.forEach((layer, row) => {
    const offset = (width - layer.length * (WIDTH + GAP_X) + GAP_X) / 2;
    layer.forEach((node, column) => where.set(node.id, { x: offset + column * (WIDTH + GAP_X), y: GAP_Y + row * (HEIGHT + GAP_Y) }));
  });
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, width, height, "data-test": "graph", role: "img" });
  for (const edge of edges) {
    const from = where.get(edge.from);
    const to = where.get(edge.to);
    if (!from || !to) continue;
    root.append(svg("line", { x1: from.x + WIDTH / 2, y1: from.y + HEIGHT, x2: to.x + WIDTH / 2, y2: to.y, class: "edge" }));
  }
  const groups = new Map();
  for (const node of nodes) {
    const at = where.get(node.id);
    const group = svg("g", { "data-node": node.id, "data-state": "pending", class: "node", transform: `translate(${at.x},${at.y})` });
    group.append(svg("rect", { width: WIDTH, height: HEIGHT, rx: 6 }));
    const text = svg("text", { x: WIDTH / 2, y: HEIGHT / 2 + 4, "text-anchor": "middle" });
    text.textContent = `${node.id} · ${node.kind}`;
    group.append(text);
    root.append(group);
    groups.set(node.id, group);
  }
  container.replaceChildren(root);
  return {
    update(nodeStates) {
      for (const [id, group] of groups) group.setAttribute("data-state", nodeStates[id] ?? "pending");
    },
  };
}
