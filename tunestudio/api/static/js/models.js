// The model picker: local model folders under the model roots (size, architecture), the models recent
// jobs used, hub ids in the local cache, and free text; a hub id says whether it is cached here.

import {api} from "./api.js";
import {appendKids, el, fmtBytes, fmtNumber, replaceKids} from "./util.js";

const HUB_ID = /^[\w.-]+\/[\w.-]+$/;

export function mountModelPicker(box, input) {
  const options = box.querySelector("datalist") || el("datalist", {id: "model-options"});
  if (!options.isConnected) appendKids(box, options);
  const info = el("small", {class: "help", id: "model-info", "aria-live": "polite"});
  const table = el("ul", {class: "model-list", id: "model-list"});
  const details = el("details", {class: "models-card"}, el("summary", {}, "Models on this machine"), table);
  appendKids(box, info, details);
  let local = [], timer = null, token = 0;

  const describe = async () => {
    const mine = ++token;
    const name = input.value.trim();
    const found = local.find((m) => m.path === name);
    if (found) {
      info.textContent = `${found.architecture || found.model_type || "model"} · ${fmtBytes(found.bytes)}`
        + (found.parameters ? ` · ${fmtNumber(found.parameters / 1e6, 3)}M parameters` : "");
      return;
    }
    if (!HUB_ID.test(name)) { info.textContent = ""; return; }
    try {
      const hub = await api.hubModel(name);
      if (mine !== token) return;
      info.textContent = hub.cached ? `in the local hub cache${hub.architecture ? ` · ${hub.architecture}` : ""}`
        : "not in the local hub cache: the job downloads it (needs the network)";
      info.dataset.cached = String(hub.cached);
    } catch (err) {
      if (mine === token) info.textContent = err.message;
    }
  };

  api.models().then(({local: found, recent, cached}) => {
    local = found;
    const values = new Map();
    for (const m of found) values.set(m.path, `${m.name} · ${m.architecture || m.model_type || "?"} · ${fmtBytes(m.bytes)}`);
    for (const r of recent) if (!values.has(r)) values.set(r, "used recently");
    for (const c of cached) if (!values.has(c)) values.set(c, "hub cache");
    replaceKids(options, ...[...values].map(([value, text]) => el("option", {value}, text)));
    replaceKids(table, ...found.map((m) => el("li", {},
      el("button", {type: "button", class: "link", title: m.path, onclick: () => {
        input.value = m.path;
        input.dispatchEvent(new Event("input", {bubbles: true}));
      }}, m.name),
      el("span", {class: "muted small"}, ` ${m.architecture || m.model_type || ""} · ${fmtBytes(m.bytes)}`))));
    details.hidden = found.length === 0;
    describe();
  }).catch((err) => { info.textContent = `Cannot list models: ${err.message}`; });
  input.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(describe, 300); });
}
