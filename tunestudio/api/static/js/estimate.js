// The estimate beside Start: parameters, trainable parameters, memory by part, whether it fits this
// machine, a rough time per step (POST /api/models/estimate). It refuses nothing; it says when a job
// will not fit.

import {api} from "./api.js";
import {el, fmtBytes, fmtDuration, fmtNumber} from "./util.js";

const count = (n) => (n >= 1e9 ? `${fmtNumber(n / 1e9, 3)}B` : n >= 1e6 ? `${fmtNumber(n / 1e6, 3)}M`
  : n >= 1e3 ? `${fmtNumber(n / 1e3, 3)}k` : String(n));

export function mountEstimate(box, config) {
  let timer = null, token = 0;
  const run = async () => {
    const mine = ++token;
    let body;
    try { body = config(); } catch { return; }
    if (!body.model_name) { box.replaceChildren(); return; }
    try {
      const e = await api.estimate(body);
      if (mine !== token) return;
      const parts = [["model", e.weights_bytes], ["adapter", e.adapter_bytes], ["gradients", e.gradients_bytes],
        ["optimizer", e.optimizer_bytes], ["activations", e.activations_bytes]].filter(([, v]) => v > 0);
      box.dataset.fits = String(e.fits);
      box.replaceChildren(
        el("p", {class: "estimate-head"},
          el("b", {id: "estimate-params"}, count(e.parameters)), " parameters · ",
          el("b", {id: "estimate-trainable"}, count(e.trainable)), " trained · ",
          el("b", {id: "estimate-total"}, fmtBytes(e.total_bytes)), " of memory",
          e.seconds_per_step ? ` · ~${e.seconds_per_step < 1 ? `${fmtNumber(e.seconds_per_step, 2)}s`
            : fmtDuration(e.seconds_per_step)} a step${e.seconds_source === "calibration" ? " (measured)" : ""}` : ""),
        el("p", {class: "muted small"}, parts.map(([k, v]) => `${k} ${fmtBytes(v)}`).join(" · ")),
        e.fits === false
          ? el("p", {class: "error-text", id: "estimate-fit"}, `Will not fit: ${e.device} has `
            + `${fmtBytes(e.available_bytes)}. Lower the batch size or length, use LoRA/QLoRA, or turn on `
            + "activation checkpointing.")
          : el("p", {class: "muted small", id: "estimate-fit"}, e.fits ? `Fits: ${e.device}, ${fmtBytes(e.available_bytes)}`
            : "Free memory unknown"),
        e.notes.length ? el("p", {class: "muted small"}, e.notes.join("; ")) : "");
    } catch (err) {
      if (mine === token) box.replaceChildren(el("p", {class: "muted small", id: "estimate-fit"}, `No estimate: ${err.message}`));
    }
  };
  const schedule = () => { clearTimeout(timer); timer = setTimeout(run, 400); };
  run();
  return {schedule, dispose() { clearTimeout(timer); token++; }};
}
