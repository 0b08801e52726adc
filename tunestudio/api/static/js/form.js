// The new-job form. Its controls, defaults, limits, labels, groups and help come from JobConfig's fields
// (GET /api/web/defaults; config/parts.py says them on each field); only values the user changed are sent,
// so JobConfig keeps owning every default. Field errors from the API are shown next to their field.

import {advancedSection} from "./advanced.js";
import {api, ApiError} from "./api.js";
import {BadInput, control, fieldBox, rangeHint} from "./controls.js";
import {mountEstimate} from "./estimate.js";
import {mountFormJobFile} from "./jobfile.js";
import {mountModelPicker} from "./models.js";
import {mountReport} from "./report.js";
import {mountUpload} from "./upload.js";
import {appendKids, basename, el, replaceKids} from "./util.js";

// A config to start from (Clone to form, see config.js): left in sessionStorage, taken once.
export const CLONE_KEY = "tunestudio.clone";

// The fields most jobs touch; every other JobConfig field is under "Advanced".
const COMMON = ["num_epochs", "max_steps", "learning_rate", "batch_size", "gradient_accumulation_steps",
  "max_seq_length", "lora_r", "lora_alpha", "lora_dropout", "eval_steps", "logging_steps"];
// The attention/MLP switches choose which layers get adapters: a full fine-tune trains them all (an image job's
// vision/language switches, which also choose what a full fine-tune freezes, stay).
const LORA_ONLY = new Set(["lora_r", "lora_alpha", "lora_dropout", "use_rslora", "use_loftq", "target_modules",
  "finetune_attention_modules", "finetune_mlp_modules"]);
// Controls of their own (model, dataset, method), or decided by the method (4-bit weights).
const OWN = new Set(["model_name", "local_datasets", "hf_dataset", "format_type", "training_type", "load_in_4bit",
  "method"]);

// Where the page's job starts from other than JobConfig's default (which CLI and API jobs keep), and why. The
// page's job is evaluated: the before/after table is its answer to "did it work?". Sent, as any changed value.
const FORM_STARTS = {
  eval_steps: [0.25, "The form starts at 0.25: the base model is evaluated, then the job at every quarter, so it "
    + "ends with a before/after table; on the eval split, or without one on a held-out 5% of the rows (16 to 128; "
    + "none when the data has under 32 rows). 0: no evaluation (faster)."],
};

function turnsView(value) {
  // The converted row: chat turns, prompt/completion or text, as training will see it.
  const turn = (role, content) => el("div", {class: `turn role-${role}`}, el("b", {}, role), el("span", {}, content));
  const part = (v, role) => (Array.isArray(v) ? v.map((m) => turn(m.role, m.content)) : turn(role, v));
  // A named part (chosen, rejected, ...) that is a conversation shows its name beside each turn's role.
  const named = (v, name) => (Array.isArray(v) ? v.map((m) => turn(`${name} · ${m.role}`, m.content)) : turn(name, v));
  if (!value) return el("span", {class: "muted"}, "–");
  if (value.messages) return el("div", {}, part(value.messages));
  if (value.text !== undefined) return el("div", {}, turn("text", value.text));
  if (value.chosen !== undefined) {
    return el("div", {}, part(value.prompt, "prompt"), named(value.chosen, "chosen"), named(value.rejected, "rejected"));
  }
  if (value.completion === undefined) {  // GRPO: the prompt, and the columns the reward functions receive
    return el("div", {}, part(value.prompt, "prompt"), Object.entries(value).filter(([k]) => k !== "prompt")
      .map(([k, v]) => turn(k, typeof v === "string" ? v : JSON.stringify(v))));
  }
  return el("div", {}, part(value.prompt, "prompt"), part(value.completion, "completion"),
    value.label !== undefined ? turn("label", value.label ? "desirable" : "undesirable") : null);
}

/** The rows read that training would drop (the preview's `problems`), each named; null when there are none. */
function problemsNote(answer) {
  if (!answer.problem_count) return null;
  const files = new Set(answer.problems.map((p) => p.source)).size > 1;
  const named = answer.problems.map((p) => `row ${p.number}${files ? ` of ${basename(p.source)}` : ""} ${p.problem}`);
  const more = answer.problem_count - answer.problems.length;
  return el("div", {class: "warning-box", id: "preview-problems"},
    el("b", {}, `${answer.problem_count} of the ${answer.checked_rows} rows read will be dropped: `),
    named.join("; ") + (more > 0 ? `; and ${more} more` : "") + ". Training skips them; fix them to keep them.");
}

export async function showForm(main, {onCreated}) {
  const defaults = await api.defaults();
  const fields = Object.fromEntries(defaults.fields.map((f) => [f.name, f]));
  const controls = {};

  const make = (name) => {
    const f = fields[name];
    const c = control(f);
    controls[name] = {...c, field: f};
    const [start, why] = FORM_STARTS[name] || [];
    if (start !== undefined) c.set(start);
    const help = [f.help, rangeHint(f), why].filter(Boolean).join(" ");
    return fieldBox(name, f.title, c.input, help);
  };

  // --- model --------------------------------------------------------------------
  const model = el("input", {type: "text", id: "f-model_name", name: "model_name", list: "model-options",
    placeholder: "a local folder or a hub id, e.g. Qwen/Qwen2.5-0.5B", autocomplete: "off"});
  model.value = defaults.model_name;  // empty while the tiny model is not built: never a value the server refuses
  const modelBox = fieldBox("model_name", fields.model_name.title, model,
    defaults.model_ready ? "The embedded tiny model is filled in; any local folder or hub id works."
      : `The embedded tiny model is not built yet: ${defaults.model_hint}.`);
  appendKids(modelBox, el("datalist", {id: "model-options"},
    defaults.model_name ? el("option", {value: defaults.model_name}, "tiny model") : null));

  // --- dataset ------------------------------------------------------------------
  const source = el("div", {class: "segmented", role: "radiogroup"},
    ...[["local", "Local files"], ["hub", "Hub dataset"]].map(([value, text], i) =>
      el("label", {}, el("input", {type: "radio", name: "dataset-source", value, checked: i === 0}), text)));
  const local = el("textarea", {id: "f-local_datasets", name: "local_datasets", rows: "2",
    placeholder: "one file or folder a line (.jsonl .json .csv .parquet)"});
  local.value = defaults.dataset;
  const hub = el("input", {type: "text", id: "f-hf_dataset", name: "hf_dataset", placeholder: "e.g. tatsu-lab/alpaca",
    autocomplete: "off"});
  const localBox = fieldBox("local_datasets", fields.local_datasets.title, local,
    `${defaults.dataset ? "The bundled example is filled in. " : ""}Files must be under `
    + `${defaults.dataset_roots.join(" or ")}.`);
  const hubBox = fieldBox("hf_dataset", fields.hf_dataset.title, hub, fields.hf_dataset.help);
  hubBox.hidden = true;
  const sourceMode = () => source.querySelector("input:checked").value;
  const formatBox = make("format_type");
  const preview = el("div", {class: "preview", id: "preview"});

  // --- method -------------------------------------------------------------------
  const method = el("div", {class: "segmented methods", role: "radiogroup", "data-field": "training_type"},
    ...fields.training_type.choices.map((value) => [value, ...fields.training_type.choice_labels[value]])
      .map(([value, text, hint]) => el("label", {title: hint},
      el("input", {type: "radio", name: "training_type", value, checked: value === fields.training_type.default}),
      el("span", {}, text), el("small", {}, hint))),
    el("div", {class: "field-error", "data-error-for": "training_type", role: "alert"}));
  const methodValue = () => method.querySelector("input:checked").value;

  // --- training method, and the options of the chosen one --------------------------------
  const training = el("div", {class: "segmented methods training-methods", role: "radiogroup", "data-field": "method"},
    // The training methods as the server's registry has them (config.METHOD_SPECS); a field whose schema
    // lists `methods` shows only for those.
    ...defaults.methods.map(({name: value, label: text, summary: hint}) => el("label", {title: hint},
      el("input", {type: "radio", name: "method", value, checked: value === fields.method.default}),
      el("span", {}, text), el("small", {}, hint))),
    el("div", {class: "field-error", "data-error-for": "method", role: "alert"}));
  const trainingValue = () => training.querySelector("input:checked").value;
  const perMethod = defaults.fields.filter((f) => f.methods && !OWN.has(f.name));
  const methodOptions = el("div", {class: "grid", id: "method-options"}, perMethod.map((f) => make(f.name)));
  const defaultFor = (name) => {
    // Defaults that depend on the method (MethodSpec.defaults: pretrain packs unless told not to).
    const own = defaults.methods.find((m) => m.name === trainingValue())?.defaults || {};
    return name in own ? own[name] : controls[name].field.default;
  };
  const applies = (name) => !controls[name]?.field.methods || controls[name].field.methods.includes(trainingValue());

  // --- hyperparameters ------------------------------------------------------------
  const common = el("div", {class: "grid"}, COMMON.filter((n) => fields[n]).map(make));
  const rest = defaults.fields.filter((f) => !COMMON.includes(f.name) && !OWN.has(f.name) && !f.hidden && !f.methods);
  const advanced = advancedSection(rest, defaults.groups, make);

  // --- name and notes (the job's, not its config's: set with PATCH once it exists) ------------------
  const jobName = el("input", {type: "text", id: "f-job-name", maxlength: "200", autocomplete: "off",
    placeholder: "e.g. tiny model, lr 3e-3"});
  const jobNotes = el("textarea", {id: "f-job-notes", rows: "2", maxlength: "10000",
    placeholder: "what this job tries"});
  const aboutBox = el("div", {class: "grid about"},
    fieldBox("job_name", "Name (optional)", jobName, "Shown in the job list instead of the model."),
    fieldBox("job_notes", "Notes (optional)", jobNotes, null));

  const formError = el("div", {class: "form-error", id: "form-error", role: "alert", hidden: true});
  const submit = el("button", {type: "submit", class: "button primary big", id: "start"}, "Start training");
  const estimateBox = el("div", {class: "estimate", id: "estimate", "aria-live": "polite"});
  const form = el("form", {id: "new-job", novalidate: true},
    el("h1", {}, "New job"),
    el("section", {}, el("h2", {}, "About"), aboutBox),
    el("section", {}, el("h2", {}, fields.model_name.title), modelBox),
    el("section", {}, el("h2", {}, "Dataset"), source, localBox, hubBox, formatBox, preview),
    el("section", {}, el("h2", {}, fields.method.title), training, methodOptions),
    el("section", {}, el("h2", {}, fields.training_type.title), method),
    el("section", {}, el("h2", {}, "Hyperparameters"), common, advanced),
    formError, el("div", {class: "actions"}, submit, estimateBox));
  replaceKids(main, form);

  const showLora = () => {
    for (const name of LORA_ONLY) {
      const box = form.querySelector(`.field[data-field="${name}"]`);
      if (box) box.hidden = methodValue() === "full";
    }
  };
  method.addEventListener("change", showLora);
  showLora();
  const showMethodOptions = () => {
    for (const f of perMethod) {
      form.querySelector(`.field[data-field="${f.name}"]`).hidden = !applies(f.name);
      const c = controls[f.name];
      if (c.input.type === "checkbox") c.input.checked = Boolean(defaultFor(f.name));
    }
  };
  training.addEventListener("change", () => { showMethodOptions(); schedulePreview(); });
  showMethodOptions();

  // --- the preview ----------------------------------------------------------------
  let previewTimer = null, previewToken = 0;
  const runPreview = async () => {
    const token = ++previewToken;
    const paths = local.value.split("\n").map((s) => s.trim()).filter(Boolean);
    if (sourceMode() !== "local" || !paths.length) {
      replaceKids(preview, el("p", {class: "muted"}, "The preview reads local files; a hub dataset is read when "
        + "the job starts."));
      return;
    }
    replaceKids(preview, el("p", {class: "muted"}, "Reading the first rows…"));
    const body = {local_datasets: paths, format_type: controls.format_type.get(), rows: 3, method: trainingValue()};
    if (applies("reward_functions")) body.reward_functions = controls.reward_functions.get();
    const mapping = controls.custom_format_mapping?.get();
    if (mapping && typeof mapping === "object") body.custom_format_mapping = mapping;
    try {
      const answer = await api.preview(body);
      if (token !== previewToken) return;
      if (answer.error) {
        replaceKids(preview, el("p", {class: "error-text"}, answer.error));
        return;
      }
      replaceKids(preview,
        el("p", {class: "preview-head"}, "Format: ", el("b", {id: "preview-format"}, answer.format),
          answer.detected ? " (detected)" : " (as chosen)", ` · ${answer.total_rows}${answer.partial ? "+" : ""} rows · ${answer.description}`),
        problemsNote(answer),
        el("table", {class: "preview-rows"},
          el("thead", {}, el("tr", {}, el("th", {}, "row"), el("th", {}, "in the file"), el("th", {}, "as training reads it"))),
          el("tbody", {}, answer.rows.map((r) => el("tr", {},
            el("td", {class: "num"}, r.number),
            el("td", {}, el("pre", {}, JSON.stringify(r.raw, null, 1))),
            el("td", {}, r.problem ? el("span", {class: "error-text"}, `dropped: ${r.problem}`) : turnsView(r.converted)))))));
    } catch (err) {
      if (token !== previewToken) return;
      const message = err instanceof ApiError ? err.message : String(err);
      replaceKids(preview, el("p", {class: "error-text"}, message));
    }
  };
  const schedulePreview = () => { clearTimeout(previewTimer); previewTimer = setTimeout(runPreview, 500); };
  source.addEventListener("change", () => {
    localBox.hidden = sourceMode() !== "local";
    hubBox.hidden = sourceMode() !== "hub";
    schedulePreview();
  });
  local.addEventListener("input", schedulePreview);
  controls.format_type.input.addEventListener("change", schedulePreview);
  controls.custom_format_mapping?.input.addEventListener("change", schedulePreview);
  runPreview();

  // --- errors and submit -------------------------------------------------------------
  const clearFieldError = (name) => {
    const slot = form.querySelector(`[data-error-for="${name}"]`);
    if (slot) slot.textContent = "";
    form.querySelector(`[data-field="${name}"]`)?.classList.remove("invalid");
  };
  const clearErrors = () => {
    form.querySelectorAll(".field-error").forEach((e) => { e.textContent = ""; });
    form.querySelectorAll(".invalid").forEach((e) => e.classList.remove("invalid"));
    formError.hidden = true;
  };
  const showErrors = (errors, summary) => {
    const loose = [];
    for (const {field, message} of errors) {
      let name = (field || "").split(".")[0];
      // "give local_datasets or hf_dataset" belongs next to the dataset control the user sees.
      if (name === "local_datasets" && sourceMode() === "hub") name = "hf_dataset";
      const slot = name && form.querySelector(`[data-error-for="${name}"]`);
      if (slot && !slot.closest("[hidden]")) {
        slot.textContent = slot.textContent ? `${slot.textContent}; ${message}` : message;
        slot.closest("[data-field]").classList.add("invalid");
        const details = slot.closest("details");
        if (details) details.open = true;
      } else {
        loose.push(field ? `${field}: ${message}` : message);
      }
    }
    if (loose.length || !errors.length) {
      formError.textContent = loose.length ? loose.join("\n") : summary;
      formError.hidden = false;
    }
    const first = form.querySelector(".invalid, .form-error:not([hidden])");
    if (first) {
      first.scrollIntoView({block: "center", behavior: "smooth"});
      // Keyboard and screen-reader users land on what needs fixing.
      (first.querySelector("input, select, textarea") || first).focus({preventScroll: true});
    }
  };

  /** The config to send, and the errors found before sending it ([{field, message}]). */
  const collect = () => {
    const config = {model_name: model.value.trim()}, errors = [];
    if (sourceMode() === "local") {
      config.local_datasets = local.value.split("\n").map((s) => s.trim()).filter(Boolean);
    } else {
      config.hf_dataset = hub.value.trim();
      if (!config.hf_dataset) errors.push({field: "hf_dataset", message: "give a hub dataset id, e.g. tatsu-lab/alpaca"});
    }
    if (methodValue() !== fields.training_type.default) config.training_type = methodValue();
    if (trainingValue() !== fields.method.default) config.method = trainingValue();
    for (const [name, c] of Object.entries(controls)) {
      if (LORA_ONLY.has(name) && methodValue() === "full") continue;
      if (!applies(name)) continue;  // another method's option: hidden, and an error if sent
      let value;
      try { value = c.get(); } catch (err) {
        if (!(err instanceof BadInput)) throw err;
        errors.push({field: err.field, message: err.message});
        continue;
      }
      if (value === undefined) continue;
      if (JSON.stringify(value) === JSON.stringify(defaultFor(name))) continue;
      config[name] = value;
    }
    return {config, errors};
  };

  // --- clone: a config to start from ------------------------------------------------------
  const fill = (config) => {
    model.value = config.model_name || model.value;
    const hubMode = Boolean(config.hf_dataset);
    source.querySelector(`input[value="${hubMode ? "hub" : "local"}"]`).checked = true;
    localBox.hidden = hubMode;
    hubBox.hidden = !hubMode;
    local.value = (config.local_datasets || []).join("\n");
    hub.value = config.hf_dataset || "";
    const methodInput = method.querySelector(`input[value="${config.training_type}"]`);
    if (methodInput) methodInput.checked = true;
    showLora();
    // The training method first: it decides which options show, and resets their switches to its defaults.
    const trainingInput = training.querySelector(`input[value="${config.method || fields.method.default}"]`);
    if (trainingInput) trainingInput.checked = true;
    showMethodOptions();
    for (const [name, c] of Object.entries(controls)) {
      if (name in config && fields[name].kind !== "secret") c.set(config[name]);
    }
  };
  const cloned = sessionStorage.getItem(CLONE_KEY);
  if (cloned) {
    sessionStorage.removeItem(CLONE_KEY);
    fill(JSON.parse(cloned));
    runPreview();
  }
  // The dataset report, below the preview: every row of the form's files, as this config would read them.
  // Its one click (drop the duplicates it found) sets a field as the user would, so the estimate follows.
  const report = mountReport(preview, () => (sourceMode() === "local" ? collect().config : null), (name, value) => {
    controls[name].set(value);
    controls[name].input.dispatchEvent(new Event("change", {bubbles: true}));
  });
  mountUpload(localBox, {local, onChosen: () => {
    source.querySelector('input[value="local"]').checked = true;
    clearFieldError("local_datasets");  // the field holds the upload now: an error about its old value is stale
    runPreview();
  }});
  mountModelPicker(modelBox, model);
  const estimate = mountEstimate(estimateBox, () => collect().config);
  form.addEventListener("change", estimate.schedule);
  form.addEventListener("input", estimate.schedule);
  // Copy as job file / as CLI command, and paste a job file (jobfile.js)
  mountFormJobFile(form, {collect, showErrors, clearErrors, jobName, fill: (config) => {
    fill(config);
    runPreview();
    estimate.schedule();
  }});

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors();
    const {config, errors} = collect();
    if (errors.length) {
      showErrors(errors, "fix the fields marked in red");
      return;
    }
    submit.disabled = true;
    try {
      const created = await api.createJob(config);
      const about = [jobName.value.trim(), jobNotes.value.trim()];
      if (about.some(Boolean)) {
        try {
          await api.renameJob(created.id, about[0], about[1]);
        } catch { /* the job runs either way; its page can name it */ }
      }
      onCreated(created.id);
    } catch (err) {
      if (err instanceof ApiError) showErrors(err.fieldErrors, err.message);
      else showErrors([], String(err));
    } finally {
      submit.disabled = false;
    }
  });
  return () => { clearTimeout(previewTimer); estimate.dispose(); report.dispose(); };
}
