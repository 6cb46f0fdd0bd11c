// Building the page's elements: text is always set as text (never parsed as HTML), so nothing a
// run recorded can become markup or script on the page.

export function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      element.addEventListener(name.slice(2), value);
    } else if (name === "dataset") {
      Object.assign(element.dataset, value);
    } else if (name === "value" || name === "checked") {
      element[name] = value;
    } else {
      element.setAttribute(name, value === true ? "" : String(value));
    }
  }
  append(element, children);
  return element;
}

function append(element, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function clear(element, ...children) {
  element.replaceChildren();
  append(element, children);
  return element;
}

// JSON for reading: indented, cut so a large payload cannot swamp the page.
export function pretty(value, limit = 4000) {
  const text = JSON.stringify(value, null, 2) ?? "null";
  return text.length > limit ? text.slice(0, limit) + "\n…" : text;
}

export function short(value, limit = 80) {
  const text = typeof value === "string" ? value : JSON.stringify(value) ?? "null";
  return text.length > limit ? text.slice(0, limit) + "…" : text;
}

export function shortId(run) {
  return run.length > 13 ? run.slice(0, 8) + "…" : run;
}

// "3 s", "5 min", "2 h", "4 d" since an RFC 3339 instant.
export function age(instant, now = Date.now()) {
  const seconds = Math.max(0, Math.round((now - Date.parse(instant)) / 1000));
  if (seconds < 60) return `${seconds} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h`;
  return `${Math.floor(seconds / 86400)} d`;
}

export function usageText(usage) {
  if (!usage) return "";
  const input = usage.input_tokens ?? 0;
  const output = usage.output_tokens ?? 0;
  return `${input} in / ${output} out`;
}

export function labelChips(labels) {
  return Object.entries(labels ?? {}).map(([key, value]) =>
    h("span", { class: "chip", "data-test": "label" }, `${key}: ${value}`),
  );
}

export function statePill(status) {
  const state = status?.state ?? "unknown";
  return h("span", { class: `state state-${state}`, "data-test": "run-state", "data-state": state }, state.replaceAll("_", " "));
}

// Calls fn at most once per `wait` ms, with the latest call's arguments, trailing.
export function coalesce(fn, wait = 150) {
  let timer = null;
  let latest = [];
  return (...args) => {
    latest = args;
    if (timer !== null) return;
    timer = setTimeout(() => {
      timer = null;
      fn(...latest);
    }, wait);
  };
}
