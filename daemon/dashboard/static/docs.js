// The API reference at /docs, drawn in the browser from the document the daemon serves at
// /v1/openapi.json: each operation under its group, with its parameters, request body, answers
// and error codes, and the shared schemas they link to. Every text of the document is set as text
// (dom.js), never parsed as HTML. The document is read under its own rule: a daemon with a token
// asks for the page's login first.

import { ApiError, get, setCsrf } from "./api.js";
import { clear, h } from "./dom.js";
import { showLogin } from "./login.js";

const main = document.getElementById("reference");
const toc = document.querySelector("[data-test=toc]");
const METHODS = ["get", "put", "post", "patch", "delete"];
// How deep a schema is drawn inline before it is left to its own section (or the JSON document).
const DEPTH = 5;

async function load() {
  let spec;
  try {
    spec = await get("/v1/openapi.json", { quiet: true });
  } catch (refusal) {
    clear(toc);
    if (refusal instanceof ApiError && refusal.status === 401) {
      clear(main);
      showLogin(main, (csrf) => {
        setCsrf(csrf);
        load();
      });
      return;
    }
    clear(main, h("p", { class: "error", role: "alert", "data-test": "reference-error" }, refusal.message));
    return;
  }
  draw(spec);
  const target = location.hash && document.getElementById(decodeURIComponent(location.hash.slice(1)));
  if (target) target.scrollIntoView();
}

// -- reading the document ------------------------------------------------------------------------

function resolve(spec, ref) {
  if (typeof ref !== "string" || !ref.startsWith("#/")) return undefined;
  let node = spec;
  for (const part of ref.slice(2).split("/")) {
    node = node?.[part.replaceAll("~1", "/").replaceAll("~0", "~")];
  }
  return node;
}

const refName = (ref) => ref.slice(ref.lastIndexOf("/") + 1);
const slug = (text) => String(text).toLowerCase().replace(/[^a-z0-9]+/g, "-");
const schemaAnchor = (name) => `schema-${name}`;
const tagAnchor = (name) => `tag-${slug(name)}`;
const operationAnchor = (operation, method, path) => operation.operationId || slug(`${method} ${path}`);

// The error codes a refusal's schema narrows `error.code` to (none for the bare envelope).
function codesOf(spec, schema, seen = new Set()) {
  if (!schema || typeof schema !== "object") return [];
  if (schema.$ref) {
    if (seen.has(schema.$ref) || refName(schema.$ref) === "Error") return [];
    seen.add(schema.$ref);
    return codesOf(spec, resolve(spec, schema.$ref), seen);
  }
  const found = [];
  for (const part of [...(schema.allOf ?? []), ...(schema.oneOf ?? []), ...(schema.anyOf ?? [])]) {
    found.push(...codesOf(spec, part, seen));
  }
  const code = schema.properties?.error?.properties?.code;
  if (code && "const" in code) found.push(code.const);
  if (code && Array.isArray(code.enum)) found.push(...code.enum);
  return [...new Set(found.map(String))];
}

// -- drawing -------------------------------------------------------------------------------------

// Prose from the document: `backticked` spans become code, everything else stays text.
function prose(text, tag = "p", attributes = {}) {
  if (!text) return null;
  const parts = String(text).split(/`([^`]*)`/);
  return h(tag, attributes, parts.map((part, i) => (i % 2 ? h("code", {}, part) : part)));
}

function schemaLink(ref) {
  const name = refName(ref);
  return h("a", { href: `#${schemaAnchor(name)}`, class: "ref", "data-test": "schema-link" }, name);
}

function literal(value) {
  return h("code", { class: "literal" }, JSON.stringify(value));
}

// One line saying what kind of value a schema admits.
function facts(schema) {
  const out = [];
  const add = (label, ...value) => out.push(h("span", { class: "fact" }, label, ...value));
  if (schema.type !== undefined) add("", h("span", { class: "type" }, [].concat(schema.type).join(" | ")));
  if ("const" in schema) add("exactly ", literal(schema.const));
  if (Array.isArray(schema.enum)) {
    add("one of ", schema.enum.map((value, i) => [i ? ", " : "", literal(value)]));
  }
  if (schema.format) add("format ", h("code", {}, schema.format));
  if (schema.pattern) add("pattern ", h("code", {}, schema.pattern));
  for (const [key, label] of [
    ["minimum", "≥ "],
    ["maximum", "≤ "],
    ["minLength", "length ≥ "],
    ["maxLength", "length ≤ "],
    ["minItems", "items ≥ "],
    ["maxItems", "items ≤ "],
    ["minProperties", "fields ≥ "],
    ["maxProperties", "fields ≤ "],
  ]) {
    if (schema[key] !== undefined) add(label, String(schema[key]));
  }
  if (schema.contentMediaType) add("carrying ", h("code", {}, schema.contentMediaType));
  if (schema.not && Object.keys(schema.not).length === 0) add("", h("em", {}, "nothing is valid here"));
  return out.length ? h("div", { class: "facts" }, out) : null;
}

// `expand`: a reference is drawn once in place (a body's or an answer's own shape), beside its link.
function schemaView(spec, schema, depth = 0, expand = false) {
  if (schema === true || schema === undefined) return h("div", { class: "schema" }, h("em", {}, "any value"));
  if (schema === false) return h("div", { class: "schema" }, h("em", {}, "nothing is valid here"));
  if (schema.$ref) {
    const target = expand ? resolve(spec, schema.$ref) : undefined;
    return h(
      "div",
      { class: "schema" },
      schemaLink(schema.$ref),
      prose(schema.description, "p", { class: "note" }),
      target && typeof target === "object" ? schemaView(spec, target, depth + 1) : null,
    );
  }
  const box = h("div", { class: "schema" }, prose(schema.description, "p", { class: "note" }), facts(schema));
  if (depth >= DEPTH) {
    if (schema.properties || schema.items || schema.oneOf || schema.anyOf || schema.allOf) {
      box.append(h("p", { class: "note" }, "(deeper: see the JSON document)"));
    }
    return box;
  }
  if (schema.properties) {
    const required = new Set(schema.required ?? []);
    box.append(
      h(
        "dl",
        { class: "fields" },
        Object.entries(schema.properties).map(([name, property]) => [
          h("dt", {}, h("code", {}, name), required.has(name) ? h("span", { class: "required" }, "required") : null),
          h("dd", {}, schemaView(spec, property, depth + 1)),
        ]),
      ),
    );
  } else if (Array.isArray(schema.required) && schema.required.length) {
    box.append(h("p", { class: "note" }, "requires ", schema.required.map((name, i) => [i ? ", " : "", h("code", {}, name)])));
  }
  if (schema.additionalProperties === false && schema.properties) {
    box.append(h("p", { class: "note" }, "No other field."));
  } else if (schema.additionalProperties && typeof schema.additionalProperties === "object") {
    box.append(h("div", { class: "nested" }, h("span", { class: "label" }, "each value"), schemaView(spec, schema.additionalProperties, depth + 1)));
  }
  if (schema.items) {
    box.append(h("div", { class: "nested" }, h("span", { class: "label" }, "items"), schemaView(spec, schema.items, depth + 1)));
  }
  for (const [key, label] of [
    ["allOf", "all of"],
    ["oneOf", "exactly one of"],
    ["anyOf", "any of"],
  ]) {
    if (Array.isArray(schema[key])) {
      box.append(
        h(
          "div",
          { class: "nested" },
          h("span", { class: "label" }, label),
          h("ol", { class: "variants" }, schema[key].map((part) => h("li", {}, schemaView(spec, part, depth + 1)))),
        ),
      );
    }
  }
  if (schema.if) box.append(h("p", { class: "note" }, "With a rule between fields (if / then / else): see the JSON document."));
  return box;
}

function parametersView(spec, parameters) {
  if (!parameters?.length) return null;
  const rows = parameters.map((parameter) => {
    const p = parameter.$ref ? resolve(spec, parameter.$ref) ?? {} : parameter;
    return h(
      "tr",
      { "data-test": "parameter" },
      h("td", {}, h("code", {}, p.name ?? "?"), p.required ? h("span", { class: "required" }, "required") : null),
      h("td", {}, p.in ?? ""),
      h("td", {}, schemaView(spec, p.schema, 2), prose(p.description, "p", { class: "note" })),
    );
  });
  return h(
    "div",
    { class: "part" },
    h("h4", {}, "Parameters"),
    h("table", { class: "params" }, h("thead", {}, h("tr", {}, h("th", {}, "name"), h("th", {}, "in"), h("th", {}, "value"))), h("tbody", {}, rows)),
  );
}

function contentView(spec, content, depth) {
  return Object.entries(content ?? {}).map(([media, body]) => {
    const frames = body["x-frame-schemas"]
      ? h(
          "div",
          { class: "nested" },
          h("span", { class: "label" }, "frames by event name"),
          h(
            "dl",
            { class: "fields" },
            Object.entries(body["x-frame-schemas"]).map(([name, frame]) => [h("dt", {}, h("code", {}, name)), h("dd", {}, schemaView(spec, frame, depth + 1))]),
          ),
        )
      : null;
    return h("div", { class: "media" }, h("span", { class: "media-type" }, media), schemaView(spec, body.schema, depth, true), frames);
  });
}

function bodyView(spec, requestBody) {
  if (!requestBody) return null;
  const body = requestBody.$ref ? resolve(spec, requestBody.$ref) ?? {} : requestBody;
  return h(
    "div",
    { class: "part", "data-test": "request-body" },
    h("h4", {}, "Request body ", h("span", { class: "note" }, body.required ? "(required)" : "(optional)")),
    prose(body.description, "p", { class: "note" }),
    contentView(spec, body.content, 1),
  );
}

function responsesView(spec, responses) {
  const rows = Object.entries(responses ?? {}).map(([status, given]) => {
    const response = given.$ref ? resolve(spec, given.$ref) ?? {} : given;
    const json = response.content?.["application/json"]?.schema;
    const codes = Number(status) >= 400 ? codesOf(spec, json) : [];
    const kind = status.startsWith("2") || status.startsWith("1") ? "ok" : "refusal";
    return h(
      "div",
      { class: `answer answer-${kind}`, "data-test": "response", "data-status": status },
      h(
        "div",
        { class: "answer-head" },
        h("span", { class: `status status-${kind}` }, status),
        prose(response.description, "span", { class: "answer-text" }),
        given.$ref ? h("span", { class: "note" }, ` (${refName(given.$ref)})`) : null,
      ),
      codes.length ? h("div", { class: "codes" }, "code ", codes.map((code) => h("code", { class: "code", "data-test": "error-code" }, code))) : null,
      response.headers ? h("p", { class: "note" }, "headers: ", Object.keys(response.headers).map((name, i) => [i ? ", " : "", h("code", {}, name)])) : null,
      response.content && kind === "ok" ? contentView(spec, response.content, 1) : null,
    );
  });
  return h("div", { class: "part" }, h("h4", {}, "Answers"), rows);
}

function operationView(spec, path, method, operation) {
  const anchor = operationAnchor(operation, method, path);
  const open = Array.isArray(operation.security) && operation.security.length === 1 && Object.keys(operation.security[0]).length === 0;
  return h(
    "section",
    { class: "operation", id: anchor, "data-test": "operation", "data-method": method, "data-path": path },
    h(
      "h3",
      {},
      h("a", { href: `#${anchor}`, class: "anchor" }, h("span", { class: `method method-${method}` }, method.toUpperCase()), " ", h("code", { class: "path" }, path)),
    ),
    prose(operation.summary, "p", { class: "summary", "data-test": "summary" }),
    prose(operation.description),
    open ? h("p", { class: "note" }, "Needs no credentials.") : null,
    parametersView(spec, operation.parameters),
    bodyView(spec, operation.requestBody),
    responsesView(spec, operation.responses),
  );
}

function groups(spec) {
  const byTag = new Map((spec.tags ?? []).map((tag) => [tag.name, { tag, operations: [] }]));
  for (const [path, item] of Object.entries(spec.paths ?? {})) {
    for (const method of METHODS) {
      const operation = item[method];
      if (!operation) continue;
      const name = operation.tags?.[0] ?? "other";
      if (!byTag.has(name)) byTag.set(name, { tag: { name }, operations: [] });
      byTag.get(name).operations.push({ path, method, operation });
    }
  }
  // Within a group, by path and then by method: a resource's operations read together.
  for (const group of byTag.values()) {
    group.operations.sort((a, b) => a.path.localeCompare(b.path) || METHODS.indexOf(a.method) - METHODS.indexOf(b.method));
  }
  return [...byTag.values()].filter((group) => group.operations.length);
}

function draw(spec) {
  const info = spec.info ?? {};
  const all = groups(spec);
  const schemas = Object.entries(spec.components?.schemas ?? {}).sort(([a], [b]) => a.localeCompare(b));

  clear(
    toc,
    h("a", { href: "#overview", class: "toc-head" }, "Overview"),
    all.map(({ tag, operations }) =>
      h(
        "div",
        { class: "toc-group" },
        h("a", { href: `#${tagAnchor(tag.name)}`, class: "toc-head" }, tag.name),
        h(
          "ul",
          {},
          operations.map(({ path, method, operation }) =>
            h("li", {}, h("a", { href: `#${operationAnchor(operation, method, path)}`, "data-test": "toc-link" }, h("span", { class: `method method-${method}` }, method.toUpperCase()), " ", path)),
          ),
        ),
      ),
    ),
    h("a", { href: "#schemas", class: "toc-head" }, "Schemas"),
  );

  const schemes = Object.entries(spec.components?.securitySchemes ?? {});
  clear(
    main,
    h(
      "section",
      { id: "overview", class: "overview" },
      h("h1", { "data-test": "title" }, info.title ?? "API", " ", h("span", { class: "version" }, info.version ?? "")),
      prose(info.summary, "p", { class: "summary" }),
      prose(info.description),
      schemes.length
        ? h(
            "div",
            { class: "part" },
            h("h4", {}, "Credentials"),
            h("dl", { class: "fields" }, schemes.map(([name, scheme]) => [h("dt", {}, h("code", {}, name)), h("dd", {}, prose(scheme.description, "p", { class: "note" }))])),
          )
        : null,
      h("p", { class: "note" }, "This page is drawn from ", h("a", { href: "/v1/openapi.json" }, "/v1/openapi.json"), ", the document this daemon serves."),
    ),
    all.map(({ tag, operations }) =>
      h(
        "section",
        { class: "group", id: tagAnchor(tag.name), "data-test": "group" },
        h("h2", {}, tag.name),
        prose(tag.description, "p", { class: "note" }),
        operations.map(({ path, method, operation }) => operationView(spec, path, method, operation)),
      ),
    ),
    h(
      "section",
      { class: "group", id: "schemas" },
      h("h2", {}, "Schemas"),
      schemas.map(([name, schema]) =>
        h("section", { class: "component", id: schemaAnchor(name), "data-test": "schema" }, h("h3", {}, h("a", { href: `#${schemaAnchor(name)}`, class: "anchor" }, name)), schemaView(spec, schema, 0)),
      ),
    ),
  );
}

load();
