// A form control for one JobConfig field, as GET /api/web/defaults describes it (api/routes/web.py FormField:
// its kind, default, limits, label, help and example come from the field itself, config/parts.py), and the box
// around a control: its label, help line and error slot.

import {el} from "./util.js";

/** A value the form cannot send: not a number ("1e", "0,003"), or a required field left empty. */
export class BadInput extends Error {
  constructor(field, message) { super(message); this.field = field; }
}

// A number as JSON writes it: 3, -0.5, .5, 2e-4. Anything else is refused at its field, never guessed at.
const NUMBER = /^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i;

/** The number in a field's text; BadInput when there is none (a cleared field is not the default). */
function readNumber(f, text) {
  const raw = text.trim();
  if (raw === "") {
    if (f.nullable) return null;
    throw new BadInput(f.name, `give a value (the default is ${f.default})`);
  }
  if (raw.includes(",")) {
    throw new BadInput(f.name, "commas are not read: write decimals with a dot (0.003) and thousands without a "
      + "separator (1000)");
  }
  if (!NUMBER.test(raw)) throw new BadInput(f.name, "this is not a number (e.g. 3, 0.5 or 2e-4)");
  const n = Number(raw);
  if (f.kind === "integer" && !Number.isInteger(n)) throw new BadInput(f.name, "give a whole number");
  return n;
}

/** The field's bounds in words ("≥ 1, ≤ 256"). */
export function rangeHint(f) {
  const parts = [];
  if (f.minimum !== null) parts.push(`≥ ${f.minimum}`);
  if (f.exclusive_minimum !== null) parts.push(`> ${f.exclusive_minimum}`);
  if (f.maximum !== null) parts.push(`≤ ${f.maximum}`);
  if (f.exclusive_maximum !== null) parts.push(`< ${f.exclusive_maximum}`);
  return parts.join(", ");
}

/** A form control for one schema field, with get() returning its JSON value (undefined: leave unset). */
export function control(f) {
  const id = `f-${f.name}`;
  let input, get, set = (v) => { input.value = v === null || v === undefined ? "" : String(v); };
  const fallback = () => (f.nullable ? null : undefined);
  switch (f.kind) {
    case "boolean":
      input = el("input", {type: "checkbox", id, name: f.name});
      input.checked = Boolean(f.default);
      get = () => input.checked;
      set = (v) => { input.checked = Boolean(v); };
      break;
    case "choice":
      input = el("select", {id, name: f.name},
        f.choices.map((c) => el("option", {value: JSON.stringify(c)}, String(c))));
      input.value = JSON.stringify(f.default);
      get = () => JSON.parse(input.value);
      set = (v) => { input.value = JSON.stringify(v); };
      break;
    case "integer": case "number":
      // Text, not type=number: a browser's number field reads "0,003" as "" or as 3 depending on its locale,
      // and a cleared one as unset; here what was typed is read exactly, or refused at the field.
      input = el("input", {type: "text", inputmode: f.kind === "integer" ? "numeric" : "decimal", id, name: f.name,
        autocomplete: "off", spellcheck: "false", placeholder: f.nullable ? "unset" : ""});
      input.value = f.default === null || f.default === undefined ? "" : String(f.default);
      get = () => readNumber(f, input.value);
      break;
    case "list":
      input = el("textarea", {id, name: f.name, rows: "2"});
      input.value = (f.default || []).join("\n");
      get = () => {
        const items = input.value.split("\n").map((s) => s.trim()).filter(Boolean);
        return items.length ? items : (f.nullable ? null : []);
      };
      set = (v) => { input.value = (v || []).join("\n"); };
      break;
    case "mapping":
      // The field's example (its Field's examples) shows in the empty box.
      input = el("textarea", {id, name: f.name, rows: "2", placeholder: f.placeholder || ""});
      input.value = f.default ? JSON.stringify(f.default) : "";
      get = () => {
        const raw = input.value.trim();
        if (!raw) return fallback();
        try { return JSON.parse(raw); } catch { return raw; }
      };
      set = (v) => { input.value = v ? JSON.stringify(v) : ""; };
      break;
    default:  // string, secret
      input = el("input", {type: f.kind === "secret" ? "password" : "text", id, name: f.name,
        autocomplete: "off", placeholder: f.nullable ? "unset" : ""});
      input.value = f.default ?? "";
      get = () => {
        const raw = input.value.trim();
        return raw === "" ? fallback() : raw;
      };
  }
  return {input, get, set};
}

/** A control with its label, its help line and the slot its errors go to. */
export function fieldBox(name, labelText, input, help) {
  const isCheck = input.type === "checkbox";
  return el("div", {class: `field${isCheck ? " check" : ""}`, "data-field": name},
    isCheck ? el("label", {for: input.id}, input, " ", labelText) : el("label", {for: input.id}, labelText),
    isCheck ? null : input,
    help ? el("small", {class: "help"}, help) : null,
    el("div", {class: "field-error", "data-error-for": name, role: "alert"}));
}
