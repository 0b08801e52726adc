// The estimate beside Start: parameters, trainable parameters, memory by part, whether it fits this
// machine, the time a step and to finish with what each rests on (POST /api/models/estimate). It refuses
// nothing; it says when a job will not fit. Once the dataset report ran, it counts the rows' real tokens.

import {api} from "./api.js";
import {reportFigures} from "./report.js";
import {el, fmtDuration, fmtNumber, replaceKids} from "./util.js";

const count = (n) => (n >= 1e9 ? `${fmtNumber(n / 1e9, 3)}B` : n >= 1e6 ? `${fmtNumber(n / 1e6, 3)}M`
  : n >= 1e3 ? `${fmtNumber(n / 1e3, 3)}k` : String(n));

// Memory in binary units, as the worker and the OS count it: MiB under a GiB, GiB above.
const memory = (bytes) => (bytes >= 2 ** 30 ? `${fmtNumber(bytes / 2 ** 30, 3)} GiB`
  : `${fmtNumber(bytes / 2 ** 20, 3)} MiB`);

/** An image job's vision tower and what an image becomes (the estimate's `vision`, tunestudio/estimate.py). */
function visionLine(v) {
  const image = v.image;
  return el("p", {class: "muted small", id: "estimate-images", "data-tokens": String(image.tokens)},
    `vision tower ${count(v.parameters)} parameters, ${v.trains ? `${count(v.trainable)} trained` : "frozen"}`
    + (v.trains ? `, its activations ${memory(v.activations_bytes)}` : "")
    + ` · an image: ${image.tokens} tokens (${image.views > 1 ? `${image.views} views` : "one view"} of ${image.side}`
    + ` px, ${count(image.patches)} patches)${v.approximate ? " · approximate" : ""}`);
}

export function mountEstimate(box, config) {
  let timer = null, token = 0;
  const run = async () => {
    const mine = ++token;
    let body;
    try { body = config(); } catch { return; }
    if (!body.model_name) { replaceKids(box); return; }
    const facts = reportFigures(body);
    try {
      const e = await api.estimate(facts ? {...body, dataset: facts} : body);
      if (mine !== token) return;
      const parts = [["model", e.weights_bytes], ["adapter", e.adapter_bytes], ["gradients", e.gradients_bytes],
        ["optimizer", e.optimizer_bytes], ["activations", e.activations_bytes], ["runtime", e.runtime_bytes]]
        .filter(([, v]) => v > 0);
      box.dataset.fits = String(e.fits);
      replaceKids(box,
        el("p", {class: "estimate-head"},
          el("b", {id: "estimate-params"}, count(e.parameters)), " parameters · ",
          el("b", {id: "estimate-trainable"}, count(e.trainable)), " trained · ",
          el("b", {id: "estimate-total"}, memory(e.total_bytes)), " of memory",
          e.seconds_per_step ? ` · ~${e.seconds_per_step < 1 ? `${fmtNumber(e.seconds_per_step, 2)}s`
            : fmtDuration(e.seconds_per_step)} a step${e.seconds_source === "arithmetic" ? "" : " (measured here)"}` : "",
          e.total_seconds ? el("span", {id: "estimate-total-time"}, ` · ~${fmtDuration(e.total_seconds)} in all`) : ""),
        e.basis && e.basis.length ? el("details", {class: "muted small", id: "estimate-basis"},
          el("summary", {}, "what the time rests on"), el("ul", {}, ...e.basis.map((b) => el("li", {}, b)))) : "",
        el("p", {class: "muted small"}, parts.map(([k, v]) => `${k} ${memory(v)}`).join(" · ")),
        e.vision ? visionLine(e.vision) : "",
        e.fits === false
          ? el("p", {class: "error-text", id: "estimate-fit"}, `Will not fit: ${e.device} has `
            + `${memory(e.available_bytes)}. Lower the batch size or length, use LoRA/QLoRA, or turn on `
            + "activation checkpointing.")
          : el("p", {class: "muted small", id: "estimate-fit"}, e.fits ? `Fits: ${e.device}, ${memory(e.available_bytes)}`
            : "Free memory unknown"),
        e.notes.length ? el("p", {class: "muted small"}, e.notes.join("; ")) : "");
    } catch (err) {
      if (mine === token) replaceKids(box, el("p", {class: "muted small", id: "estimate-fit"}, `No estimate: ${err.message}`));
    }
  };
  const schedule = () => { clearTimeout(timer); timer = setTimeout(run, 400); };
  document.addEventListener("tunestudio:report", schedule);
  run();
  return {schedule, dispose() { clearTimeout(timer); token++; document.removeEventListener("tunestudio:report", schedule); }};
}

/** The job page's line: the estimate as it stood when the job was created (POST /api/models/estimate with
 * `as_of`: only jobs finished before it count) against the step time and tokens the job measures. */
export function estimateVersus(job) {
  const node = el("p", {class: "muted small", id: "estimate-versus", hidden: true});
  let asked = false, estimated = null;
  const update = async (record) => {
    if (job.kind !== "train" || job.resumed_from || !record || !record.step || !record.elapsed_seconds) return;
    if (!asked) {
      asked = true;
      try { estimated = await api.estimate({...job.config, as_of: job.created_at}); } catch { return; }
    }
    if (!estimated || !estimated.seconds_per_step) return;
    const step = record.elapsed_seconds / record.step;
    const tokens = record.num_tokens ? record.num_tokens / record.step : null;
    const secs = (s) => (s < 1 ? `${fmtNumber(s, 2)}s` : fmtDuration(s));
    node.textContent = `Estimated before start: ${secs(estimated.seconds_per_step)} a step`
      + ` (${estimated.seconds_source}, ${fmtNumber(estimated.tokens_per_step, 4)} tokens); measured: ${secs(step)}`
      + (tokens ? ` (${fmtNumber(tokens, 4)} tokens)` : "")
      + `, ${fmtNumber(step / estimated.seconds_per_step, 2)}× the estimate.`;
    node.dataset.ratio = String(step / estimated.seconds_per_step);
    node.hidden = false;
  };
  return {node, update};
}
