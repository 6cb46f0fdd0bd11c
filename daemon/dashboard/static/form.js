// A form generated from a JSON Schema: what a person answers a gate or an ask_user question with.
//
// Rules of this module:
// * It covers the subset the daemon validates answers with (type, required, properties, items,
//   enum, the numeric bounds, the length and item counts; default, title and description for
//   what is shown). Every other keyword is ignored here as the daemon ignores it; a schema this
//   module cannot render field by field (no type, an object without properties, a union) is
//   edited as JSON text.
// * The daemon is the judge of an answer: value() reads what is filled in without refusing it,
//   and showErrors() places the API's refusal beside the form and beside the field it names.
// * Every field's wrapper carries data-field="<JSON pointer>" (the root is ""), so a test or
//   the page finds a field by the path of its value. Nothing here talks to the network.
//
// The form is a <form>: pressing Enter in a field raises its "submit" event, which bubbles to the
// container (the page listens there); this module only stops the browser's own navigation.

let nextId = 0;

function uniqueId(prefix) {
  nextId += 1;
  return `${prefix}-${nextId}`;
}

function element(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  append(node, ...children);
  return node;
}

// DOM append() writes null as the text "null": a part left out is skipped here instead.
function append(node, ...children) {
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
}

// -- paths: a field's JSON pointer and the daemon's spelling of the same place ---------------------

function escapeToken(token) {
  return String(token).replaceAll("~", "~0").replaceAll("/", "~1");
}

function childPointer(pointer, token) {
  return `${pointer}/${escapeToken(token)}`;
}

// The daemon names the failing value as "$.name.list[2]" (fastjsonschema's path with "$" for the
// root); a field keeps that spelling beside its pointer so a refusal finds it even when a property
// name holds a dot or a space, which the daemon's spelling cannot tell apart.
function childDollarPath(path, token, isIndex) {
  return isIndex ? `${path}[${token}]` : `${path}.${token}`;
}

function isPlainObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

// -- what kind of field a schema asks for ---------------------------------------------------------

function typeOf(schema) {
  const type = schema.type;
  if (Array.isArray(type)) {
    // A nullable field ("string", "null") is edited as its non-null type.
    const concrete = type.filter((name) => name !== "null");
    return concrete.length === 1 ? concrete[0] : concrete.length === 0 ? "null" : undefined;
  }
  if (typeof type === "string") return type;
  // As the daemon reads it: required or properties without a type ask for an object.
  if ("properties" in schema || "required" in schema) return "object";
  return undefined;
}

function kindOf(schema) {
  if (!isPlainObject(schema)) return "json";
  if (Array.isArray(schema.enum) && schema.enum.length > 0) return "enum";
  const type = typeOf(schema);
  if (type === "object") return isPlainObject(schema.properties) ? "object" : "json";
  if (type === "array") {
    const items = schema.items;
    if (isPlainObject(items) && Array.isArray(items.enum) && schema.uniqueItems === true) {
      return "choices";
    }
    return isPlainObject(items) ? "array" : "json";
  }
  if (type === "string" || type === "number" || type === "integer" || type === "boolean") {
    return type === "integer" ? "number" : type;
  }
  return "json";
}

// Short strings get one line; a string with no bound or a long one gets a text area.
const ONE_LINE_MAX_LENGTH = 120;

function constraintHint(schema) {
  const parts = [];
  if (typeof schema.minimum === "number") parts.push(`≥ ${schema.minimum}`);
  if (typeof schema.exclusiveMinimum === "number") parts.push(`> ${schema.exclusiveMinimum}`);
  if (typeof schema.maximum === "number") parts.push(`≤ ${schema.maximum}`);
  if (typeof schema.exclusiveMaximum === "number") parts.push(`< ${schema.exclusiveMaximum}`);
  if (typeOf(schema) === "integer") parts.push("a whole number");
  if (typeof schema.minLength === "number") parts.push(`at least ${schema.minLength} characters`);
  if (typeof schema.maxLength === "number") parts.push(`at most ${schema.maxLength} characters`);
  if (typeof schema.minItems === "number") parts.push(`at least ${schema.minItems} items`);
  if (typeof schema.maxItems === "number") parts.push(`at most ${schema.maxItems} items`);
  return parts.join(", ");
}

function enumLabel(value) {
  return typeof value === "string" ? value : JSON.stringify(value);
}

function sameJson(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}

// -- one field -------------------------------------------------------------------------------------
//
// build() returns {element, read()}; read() gives {present, value}: an optional field left empty
// is not present, so the answer omits it instead of sending "" or null.

function build(schema, place, start) {
  const kind = kindOf(schema);
  const wrapper = element("div", {
    class: `sf-field sf-kind-${kind}`,
    "data-field": place.pointer,
    "data-path": place.path,
    "data-kind": kind,
  });
  const inputId = uniqueId("sf");
  const labelText = (isPlainObject(schema) && schema.title) || place.name;
  const initial = start !== undefined ? start : isPlainObject(schema) ? schema.default : undefined;
  const heading = (tag, attributes) =>
    labelText === undefined
      ? null
      : element(
          tag,
          { class: "sf-label", ...attributes },
          labelText,
          place.required
            ? element(
                "abbr",
                { class: "sf-required", title: "required", "data-test": "required" },
                "*",
              )
            : null,
        );
  const description =
    isPlainObject(schema) && typeof schema.description === "string"
      ? element("p", { class: "sf-description" }, schema.description)
      : null;
  const hint = isPlainObject(schema) ? constraintHint(schema) : "";
  const hintElement = hint ? element("p", { class: "sf-hint" }, hint) : null;
  const fieldError = element("p", {
    class: "sf-field-error",
    "data-test": "field-error",
    hidden: true,
  });
  const control = CONTROLS[kind](schema, place, initial, inputId);
  if (kind === "object" || kind === "choices") {
    // A group of fields: a fieldset whose legend is the label (the root object has none).
    const fieldset = element("fieldset", { class: "sf-group" }, heading("legend"), description);
    append(fieldset, control.element, hintElement, fieldError);
    wrapper.append(fieldset);
  } else if (kind === "boolean") {
    append(
      wrapper,
      element("div", { class: "sf-check" }, control.element, heading("label", { for: inputId })),
      description,
      fieldError,
    );
  } else {
    append(
      wrapper,
      heading("label", { for: inputId }),
      description,
      control.element,
      hintElement,
      fieldError,
    );
  }
  // Editing a field takes its refusal away: the message was about the old value.
  wrapper.addEventListener("input", () => clearFieldError(wrapper));
  wrapper.addEventListener("change", () => clearFieldError(wrapper));
  return { element: wrapper, read: control.read };
}

const CONTROLS = {
  string(schema, place, initial, id) {
    const attributes = { id, name: place.pointer || "value", "data-test": "input" };
    let input;
    if (Array.isArray(schema.examples) && schema.examples.length > 0) {
      // A select question that allows a custom answer: its options as suggestions.
      const listId = uniqueId("sf-list");
      input = element("input", { ...attributes, type: "text", list: listId, class: "sf-input" });
      const list = element("datalist", { id: listId });
      for (const option of schema.examples)
        list.append(element("option", { value: enumLabel(option) }));
      input = element("span", { class: "sf-suggest" }, input, list);
    } else if (typeof schema.maxLength === "number" && schema.maxLength <= ONE_LINE_MAX_LENGTH) {
      input = element("input", { ...attributes, type: "text", class: "sf-input" });
    } else {
      input = element("textarea", { ...attributes, rows: 3, class: "sf-input sf-text" });
    }
    const field = input.querySelector("input") || input;
    if (typeof initial === "string") field.value = initial;
    return {
      element: input,
      read: () =>
        field.value === "" && !place.required
          ? { present: false }
          : { present: true, value: field.value },
    };
  },

  number(schema, place, initial, id) {
    const integer = typeOf(schema) === "integer";
    const input = element("input", {
      id,
      name: place.pointer || "value",
      type: "number",
      class: "sf-input sf-number",
      step: integer ? "1" : "any",
      min: typeof schema.minimum === "number" ? schema.minimum : undefined,
      max: typeof schema.maximum === "number" ? schema.maximum : undefined,
      "data-test": "input",
    });
    if (typeof initial === "number") input.value = String(initial);
    return {
      element: input,
      read() {
        // An empty box (or text the browser cannot read as a number) is no number: the answer
        // omits it, and the daemon names a required one as missing.
        if (input.value === "" || Number.isNaN(input.valueAsNumber)) return { present: false };
        return { present: true, value: input.valueAsNumber };
      },
    };
  },

  boolean(schema, place, initial, id) {
    const input = element("input", {
      id,
      name: place.pointer || "value",
      type: "checkbox",
      class: "sf-checkbox",
      "data-test": "input",
    });
    input.checked = initial === true;
    // A checkbox has no "unset": it always answers true or false.
    return { element: input, read: () => ({ present: true, value: input.checked }) };
  },

  enum(schema, place, initial, id) {
    const select = element("select", {
      id,
      name: place.pointer || "value",
      class: "sf-input sf-select",
      "data-test": "input",
    });
    // The first entry chooses nothing, so a required choice is made on purpose, never by default.
    select.append(element("option", { value: "" }, place.required ? "— choose —" : "— none —"));
    schema.enum.forEach((option, index) => {
      select.append(element("option", { value: String(index) }, enumLabel(option)));
    });
    const chosen = schema.enum.findIndex((option) => sameJson(option, initial));
    if (chosen >= 0) select.value = String(chosen);
    return {
      element: select,
      read: () =>
        select.value === ""
          ? { present: false }
          : { present: true, value: schema.enum[Number(select.value)] },
    };
  },

  choices(schema, place, initial) {
    // A set of options (uniqueItems over an enum): one checkbox each, answered in the enum's order.
    const options = schema.items.enum;
    const list = element("div", { class: "sf-choices" });
    const boxes = options.map((option, index) => {
      const id = uniqueId("sf");
      const box = element("input", {
        id,
        type: "checkbox",
        class: "sf-checkbox",
        value: String(index),
        "data-test": "choice",
      });
      box.checked = Array.isArray(initial) && initial.some((value) => sameJson(value, option));
      list.append(
        element(
          "div",
          { class: "sf-check" },
          box,
          element("label", { for: id }, enumLabel(option)),
        ),
      );
      return box;
    });
    return {
      element: list,
      read() {
        const value = options.filter((_, index) => boxes[index].checked);
        return value.length === 0 && !place.required
          ? { present: false }
          : { present: true, value };
      },
    };
  },

  array(schema, place, initial) {
    const list = element("ol", { class: "sf-items", "data-test": "items" });
    const add = element(
      "button",
      { type: "button", class: "sf-add", "data-test": "add-item" },
      "Add",
    );
    const entries = [];
    const container = element("div", { class: "sf-array-body" }, list, add);

    function renumber() {
      // Removing an item moves the ones after it: their pointers (and the daemon's spelling of
      // them) follow, so a refusal about "$.list[1]" finds what is now the second item.
      entries.forEach((entry, index) => {
        const oldPointer = entry.pointer;
        const oldPath = entry.path;
        entry.pointer = childPointer(place.pointer, index);
        entry.path = childDollarPath(place.path, index, true);
        if (oldPointer === entry.pointer) return;
        for (const node of [entry.item, ...entry.item.querySelectorAll("[data-field]")]) {
          if (!node.hasAttribute("data-field")) continue;
          node.setAttribute(
            "data-field",
            entry.pointer + node.getAttribute("data-field").slice(oldPointer.length),
          );
          node.setAttribute(
            "data-path",
            entry.path + node.getAttribute("data-path").slice(oldPath.length),
          );
        }
      });
    }

    function append(value) {
      const index = entries.length;
      const itemPlace = {
        pointer: childPointer(place.pointer, index),
        path: childDollarPath(place.path, index, true),
        name: undefined,
        required: true,
      };
      const field = build(schema.items, itemPlace, value);
      const remove = element(
        "button",
        { type: "button", class: "sf-remove", "data-test": "remove-item" },
        "Remove",
      );
      const item = element("li", { class: "sf-item", "data-test": "item" }, field.element, remove);
      const entry = { item, field, pointer: itemPlace.pointer, path: itemPlace.path };
      remove.addEventListener("click", () => {
        entries.splice(entries.indexOf(entry), 1);
        item.remove();
        renumber();
      });
      entries.push(entry);
      list.append(item);
    }

    const start = Array.isArray(initial)
      ? initial
      : Array.from({ length: typeof schema.minItems === "number" ? schema.minItems : 0 });
    for (const value of start) append(value);
    add.addEventListener("click", () => append(undefined));
    return {
      element: container,
      read() {
        // An item left empty is still an item (the list's length is what the person built);
        // it answers null so the daemon names what is wrong with it by its index.
        const value = entries.map((entry) => {
          const read = entry.field.read();
          return read.present ? read.value : null;
        });
        return value.length === 0 && !place.required
          ? { present: false }
          : { present: true, value };
      },
    };
  },

  object(schema, place, initial) {
    const body = element("div", { class: "sf-properties" });
    const required = new Set(Array.isArray(schema.required) ? schema.required : []);
    const start = isPlainObject(initial) ? initial : {};
    const fields = Object.entries(schema.properties).map(([name, sub]) => {
      const field = build(
        sub,
        {
          pointer: childPointer(place.pointer, name),
          path: childDollarPath(place.path, name, false),
          name,
          required: required.has(name),
        },
        start[name],
      );
      body.append(field.element);
      return [name, field];
    });
    return {
      element: body,
      read() {
        const value = {};
        for (const [name, field] of fields) {
          const read = field.read();
          if (read.present) value[name] = read.value;
        }
        // An optional object with nothing filled in is left out as a whole.
        return Object.keys(value).length === 0 && !place.required
          ? { present: false }
          : { present: true, value };
      },
    };
  },

  json(schema, place, initial, id) {
    const area = element("textarea", {
      id,
      name: place.pointer || "value",
      rows: 4,
      class: "sf-input sf-json",
      spellcheck: "false",
      "data-test": "input",
    });
    // A required object (a gate's default approval schema) starts as {}, so the person edits it
    // rather than writes it; an optional one starts empty and is left out until written.
    const empty =
      place.required && isPlainObject(schema) && typeOf(schema) === "object" ? {} : undefined;
    const start = initial !== undefined ? initial : empty;
    if (start !== undefined) area.value = JSON.stringify(start, null, 2);
    return {
      element: area,
      read() {
        if (area.value.trim() === "") return { present: false };
        try {
          return { present: true, value: JSON.parse(area.value) };
        } catch (error) {
          throw new FormInputError(
            `${place.name || "the answer"} is not valid JSON: ${error.message}`,
            place.pointer,
          );
        }
      },
    };
  },
};

// -- the refusal beside the fields ----------------------------------------------------------------

/** A value the form itself cannot read (JSON text that does not parse); `pointer` names its field. */
export class FormInputError extends Error {
  constructor(message, pointer) {
    super(message);
    this.name = "FormInputError";
    this.pointer = pointer;
  }
}

function clearFieldError(wrapper) {
  if (!wrapper.classList.contains("sf-invalid")) return;
  wrapper.classList.remove("sf-invalid");
  const slot = ownErrorSlot(wrapper);
  slot.textContent = "";
  slot.hidden = true;
}

function ownErrorSlot(wrapper) {
  // The field's own slot, not one of a nested field's.
  return [...wrapper.querySelectorAll(".sf-field-error")].find(
    (slot) => slot.closest(".sf-field") === wrapper,
  );
}

function markField(wrapper, message) {
  wrapper.classList.add("sf-invalid");
  const slot = ownErrorSlot(wrapper);
  slot.textContent = slot.textContent ? `${slot.textContent}; ${message}` : message;
  slot.hidden = false;
}

// "$ must contain ['approved', 'note'] properties": the missing names, as Python's repr wrote them.
const MISSING = /^(\$\S*) must contain \[(.*)\] properties/;
const QUOTED = /'((?:[^'\\]|\\.)*)'|"((?:[^"\\]|\\.)*)"/g;

function errorBody(envelope) {
  if (envelope instanceof Error) return { message: envelope.message, pointer: envelope.pointer };
  if (typeof envelope === "string") return { message: envelope };
  if (isPlainObject(envelope) && isPlainObject(envelope.error)) return envelope.error;
  if (isPlainObject(envelope)) return envelope;
  return { message: String(envelope) };
}

export function renderForm(container, schema, initial) {
  const form = element("form", { class: "sf-form", "data-test": "schema-form", novalidate: true });
  const formError = element("p", {
    class: "sf-form-error",
    "data-test": "form-error",
    role: "alert",
    hidden: true,
  });
  const root = build(schema, { pointer: "", path: "$", name: undefined, required: true }, initial);
  form.append(formError, root.element);
  form.addEventListener("submit", (event) => event.preventDefault());
  container.replaceChildren(form);

  function fields() {
    return [...form.querySelectorAll(".sf-field")];
  }

  // The deepest field whose daemon path is `path` or holds it (a message about "$.list[1].id"
  // belongs to that id, or to the list item when the id is no field of its own).
  function fieldAt(path) {
    let best = null;
    for (const wrapper of fields()) {
      const own = wrapper.getAttribute("data-path");
      const holds = path === own || path.startsWith(`${own}.`) || path.startsWith(`${own}[`);
      if (holds && (best === null || own.length > best.getAttribute("data-path").length))
        best = wrapper;
    }
    return best;
  }

  function place(path, message) {
    const missing = MISSING.exec(message);
    if (missing && missing[1] === path) {
      let placed = false;
      for (const match of missing[2].matchAll(QUOTED)) {
        const name = (match[1] ?? match[2]).replace(/\\(.)/g, "$1");
        const wrapper = form.querySelector(
          `[data-path="${CSS.escape(childDollarPath(path, name, false))}"]`,
        );
        if (wrapper) {
          markField(wrapper, "required");
          placed = true;
        }
      }
      if (placed) return;
    }
    const wrapper = fieldAt(path);
    // The root's refusal is the form's own message, already shown above the fields.
    if (wrapper && wrapper !== root.element)
      markField(wrapper, message.startsWith(path) ? message.slice(path.length).trim() : message);
  }

  function clearErrors() {
    formError.textContent = "";
    formError.hidden = true;
    for (const wrapper of fields()) clearFieldError(wrapper);
  }

  return {
    /** The answer as the API expects it. Throws FormInputError (shown on its field) for JSON text that does not parse. */
    value() {
      try {
        const read = root.read();
        return read.present ? read.value : undefined;
      } catch (error) {
        if (error instanceof FormInputError) this.showErrors(error);
        throw error;
      }
    },

    /** Show a refusal: the envelope's message above the form, and each violation beside its field. */
    showErrors(envelope) {
      clearErrors();
      const body = errorBody(envelope);
      formError.textContent = String(body.message ?? "");
      formError.hidden = false;
      if (typeof body.pointer === "string") {
        const wrapper = fields().find((node) => node.getAttribute("data-field") === body.pointer);
        if (wrapper) markField(wrapper, body.message);
        return;
      }
      const violations =
        isPlainObject(body.details) && Array.isArray(body.details.violations)
          ? body.details.violations.filter((v) => isPlainObject(v) && typeof v.path === "string")
          : [];
      if (violations.length > 0) {
        for (const violation of violations) place(violation.path, String(violation.message ?? ""));
        return;
      }
      // No details: the daemon's message still names the place ("...schema: $.approved must be
      // boolean"), after the last ": " that opens a path.
      const message = String(body.message ?? "");
      const at = message.search(/(?:^|: )\$(?=[.\[\s]|$)/);
      if (at >= 0) {
        const rest = message.slice(at).replace(/^: /, "");
        place(rest.split(/\s/, 1)[0], rest);
      }
    },

    clearErrors,
  };
}
