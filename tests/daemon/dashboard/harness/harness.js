// The harness the browser tests drive: it loads form.js and graph.js as the page does (ES modules
// from /ui/, under the page's CSP) and hands the tests one small API on window.harness.
// Every CSP refusal is kept, so a test can say the parts need no inline script or style.

import { renderForm } from "/ui/form.js";
import { drawGraph } from "/ui/graph.js";

const stage = document.getElementById("stage");
const violations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  violations.push(`${event.violatedDirective}: ${event.blockedURI || "inline"}`);
});

let form = null;
let graph = null;

window.harness = {
  // Schemas and documents come as JSON text: chromedriver hands an object's keys over sorted,
  // and the order of a schema's properties is the order of its fields.
  form(schemaText, initialText) {
    const schema = JSON.parse(schemaText);
    form =
      initialText === undefined
        ? renderForm(stage, schema)
        : renderForm(stage, schema, JSON.parse(initialText));
  },
  // JSON text, so the test tells 3 from "3" and an omitted answer (undefined) from null.
  value() {
    try {
      const value = form.value();
      return { json: value === undefined ? "undefined" : JSON.stringify(value) };
    } catch (error) {
      return { thrown: error.name, message: error.message };
    }
  },
  showErrors(envelopeText) {
    form.showErrors(JSON.parse(envelopeText));
  },
  graph(documentText) {
    graph = drawGraph(stage, JSON.parse(documentText));
  },
  update(nodeStatesText) {
    graph.update(JSON.parse(nodeStatesText));
  },
  violations: () => [...violations],
};
