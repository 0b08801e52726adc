// The Export panel of a finished training job: choose a target, start an export job, watch its progress,
// and see where its files are. An export is a job of its own (kind "export", source_job this job).

import {api, errorText} from "./api.js";
import {el, replaceKids, statusBadge} from "./util.js";

const QUANTIZATIONS = {
  gguf: ["f16", "bf16", "q8_0", "f32", "q4_k_m"],
  "gguf-lora": ["f16", "bf16", "q8_0", "f32"],
};
const HELP = {
  merged: "The base model with the adapter merged in, as safetensors with the tokenizer and chat template.",
  gguf: "One GGUF file for llama.cpp, Ollama or LM Studio, with an Ollama Modelfile beside it "
    + "(q4_k_m needs llama.cpp's llama-quantize on the server's PATH).",
  "gguf-lora": "The adapter alone as a GGUF LoRA (llama.cpp --lora).",
  hub: "Push the adapter or the merged model to a hub repository (private unless you untick it). "
    + "The token is sent to the export's worker only; it is never stored.",
};

export function exportPanel(job, {navigate}) {
  const target = el("select", {id: "export-target"},
    ...["merged", "gguf", "gguf-lora", "hub"].map((t) => el("option", {value: t}, t)));
  const quantization = el("select", {id: "export-quantization"});
  const dtype = el("select", {id: "export-dtype"}, ...["fp32", "bf16", "fp16"].map((d) => el("option", {value: d}, d)));
  const repo = el("input", {id: "export-repo", placeholder: "owner/name", autocomplete: "off"});
  const token = el("input", {id: "export-token", type: "password", placeholder: "hf_…", autocomplete: "off"});
  const isPrivate = el("input", {id: "export-private", type: "checkbox", checked: true});
  const content = el("select", {id: "export-content"},
    el("option", {value: "adapter"}, "adapter"), el("option", {value: "merged"}, "merged model"));
  const help = el("p", {class: "muted small", id: "export-help"});
  const error = el("div", {class: "error-box", id: "export-error", hidden: true});
  const start = el("button", {class: "button primary", id: "export-start", type: "submit"}, "Export");
  const list = el("table", {class: "artefacts", id: "export-list"});

  const field = (label, input, name) => el("label", {class: "export-field", "data-field": name}, label, input);
  const fields = {
    quantization: field("quantization ", quantization, "quantization"),
    dtype: field("dtype ", dtype, "dtype"),
    repo: field("repository ", repo, "repo"),
    token: field("token ", token, "hf_token"),
    private: field(el("span", {}, "private "), isPrivate, "private"),
    content: field("push ", content, "hub_content"),
  };
  const redraw = () => {
    const t = target.value;
    const quants = QUANTIZATIONS[t] || [];
    replaceKids(quantization, ...quants.map((q) => el("option", {value: q}, q)));
    fields.quantization.hidden = !quants.length;
    fields.dtype.hidden = !(t === "merged" || (t === "hub" && content.value === "merged"));
    for (const name of ["repo", "token", "private", "content"]) fields[name].hidden = t !== "hub";
    help.textContent = HELP[t];
  };
  target.addEventListener("change", redraw);
  content.addEventListener("change", redraw);
  redraw();

  const form = el("form", {class: "export-form", id: "export-form"},
    field("target ", target, "target"), ...Object.values(fields), start);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const t = target.value;
    const body = {target: t};
    if (QUANTIZATIONS[t]) body.quantization = quantization.value;
    if (!fields.dtype.hidden) body.dtype = dtype.value;
    if (t === "hub") Object.assign(body, {repo: repo.value.trim(), private: isPrivate.checked,
      hub_content: content.value, hf_token: token.value || null});
    start.disabled = true;
    error.hidden = true;
    try {
      await api.exportJob(job.id, body);
      token.value = "";
      await refresh();
    } catch (err) {
      error.hidden = false;
      error.textContent = errorText(err);
    } finally {
      start.disabled = false;
    }
  });

  // The exports of this job, newest first; polled while one of them runs.
  let timer = null, gone = false;
  const refresh = async () => {
    const page = await api.listJobs(200);
    const mine = page.items.filter((j) => j.kind === "export" && j.source_job === job.id);
    replaceKids(list, el("tbody", {}, mine.map((j) => {
      const pct = j.progress && j.progress.total_steps ? Math.round((100 * j.progress.step) / j.progress.total_steps) : 0;
      const what = j.config.target + (j.config.quantization ? ` ${j.config.quantization}` : "")
        + (j.config.target === "merged" ? ` ${j.config.dtype}` : "") + (j.config.repo ? ` → ${j.config.repo}` : "");
      return el("tr", {class: "export-row", "data-job-id": j.id, "data-status": j.status},
        el("td", {}, el("a", {href: `#/jobs/${j.id}`}, what)),
        el("td", {}, statusBadge(j.status)),
        el("td", {class: "num"}, j.is_terminal ? "" : `${pct}%`),
        el("td", {}, j.status === "completed" ? el("code", {class: "path"}, j.output_dir) : (j.error || "")));
    })));
    clearTimeout(timer);
    if (!gone && mine.some((j) => !j.is_terminal)) timer = setTimeout(refresh, 1000);
  };
  refresh().catch(() => {});

  const panel = el("section", {class: "results export-panel", id: "export-panel"},
    el("h2", {}, "Export"), help, form, error, list);
  panel.dispose = () => { gone = true; clearTimeout(timer); };
  panel.navigate = navigate;
  return panel;
}
