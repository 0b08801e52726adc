// Make data (#/data, issue 43): a recipe (JSON, which is also YAML: copied, it is a file for `tunestudio data make`),
// Preview (POST /api/data/preview: the first rows, made in a child, and what the gates removed), Run (POST
// /api/data/make: a job of kind make_data, whose rows made and rejected show here while it runs), and once it has
// rows, "Train on this data": the new-job form pre-filled with the output file (form.js's clone).

import {call, errorText} from "./api.js";
import {CLONE_KEY} from "./form.js";
import {el, replaceKids, statusBadge} from "./util.js";

const RECIPE_KEY = "tunestudio.recipe";  // the recipe the user last wrote, kept in this browser
const POLL_MS = 1000;

function starter(defaults) {
  const root = (defaults.dataset_roots || [])[0] || "~/.tunestudio";
  return {sources: [`${root}/docs`], task: "qa", rows: 20, chunk_size: 1500, chunk_overlap: 150,
    teacher: {base_url: `${location.origin}/v1`, model: "JOB_ID or a model your endpoint serves", api_key_env: null},
    output: `${root}/made/qa.jsonl`};
}

function turnView(m, label) {
  const calls = (m.tool_calls || []).map((c) => el("code", {class: "tool-call"},
    `${c.function.name}(${c.function.arguments})`));
  return el("p", {}, el("strong", {}, `${label || m.role}: `), m.content || "", ...calls);
}

// A made row: its messages (tool calls shown as name(arguments)), or a preference pair's prompt, chosen and rejected.
function rowView(row) {
  const turns = row.messages ? row.messages.map((m) => turnView(m))
    : [...(row.prompt || []).map((m) => turnView(m)), ...(row.chosen || []).map((m) => turnView(m, "chosen")),
      ...(row.rejected || []).map((m) => turnView(m, "rejected"))];
  return el("div", {class: "made-row"}, el("div", {class: "muted"}, row.provenance ? row.provenance.key : ""), ...turns);
}

function removedView(row) {
  return el("div", {class: "made-row removed"}, el("div", {class: "muted"}, `removed by ${row.removed_by}: ${row.why}`),
    el("pre", {}, row.text));
}

export async function showMakeData(main, {navigate}) {
  const defaults = await call("/api/web/defaults").catch(() => ({}));
  const saved = localStorage.getItem(RECIPE_KEY);
  const recipe = el("textarea", {id: "recipe", rows: 16, spellcheck: "false", class: "code",
    "aria-label": "the recipe (JSON or YAML's JSON form)"});
  recipe.value = saved || JSON.stringify(starter(defaults), null, 2);
  const rows = el("input", {type: "number", id: "preview-count", min: 1, max: 20, value: 3});
  const copy = el("button", {type: "button", class: "button ghost", id: "recipe-copy"}, "Copy recipe");
  const previewBtn = el("button", {type: "button", class: "button", id: "preview-data"}, "Preview");
  const run = el("button", {type: "button", class: "button primary", id: "run-data"}, "Run");
  const error = el("div", {class: "error-box", id: "make-error", hidden: true});
  const shown = el("div", {id: "preview-rows"});
  const job = el("div", {id: "make-job"});
  let timer = null, closed = false;

  const fail = (err) => { error.hidden = false; error.textContent = errorText(err); };
  const parsed = () => {
    error.hidden = true;
    localStorage.setItem(RECIPE_KEY, recipe.value);
    try { return JSON.parse(recipe.value); } catch (err) { throw new Error(`the recipe is not JSON: ${err.message}`); }
  };
  copy.addEventListener("click", () => navigator.clipboard?.writeText(recipe.value));
  previewBtn.addEventListener("click", async () => {
    previewBtn.disabled = true;
    replaceKids(shown, el("p", {class: "muted"}, "Asking the teacher…"));
    try {
      const answer = await call("/api/data/preview", {method: "POST", body: {recipe: parsed(), rows: Number(rows.value)}});
      replaceKids(shown, el("p", {class: "muted", id: "preview-summary"},
        `${answer.rows.length} kept, ${answer.removed.length} removed by the gates`),
        ...answer.rows.map(rowView), ...answer.removed.map(removedView));
    } catch (err) { replaceKids(shown); fail(err); } finally { previewBtn.disabled = false; }
  });
  const watch = async (id) => {
    if (closed) return;
    const j = await call(`/api/jobs/${encodeURIComponent(id)}`).catch(() => null);
    if (j) showJob(j);
    if (!j || !j.is_terminal) timer = setTimeout(() => watch(id), POLL_MS);
  };
  const showJob = (j) => {
    const m = j.progress || {};
    const made = j.final_metrics || m;
    // A make_data job trains nothing (has_result is false): it has data once it ended with rows in its file.
    const hasRows = ["completed", "stopped"].includes(j.status) && (made.rows_made || 0) + (made.rows_existing || 0) > 0;
    const train = el("button", {type: "button", class: "button primary", id: "train-on-output"}, "Train on this data");
    train.addEventListener("click", () => {
      sessionStorage.setItem(CLONE_KEY, JSON.stringify({local_datasets: [j.config.output]}));
      navigate("#/new");
    });
    replaceKids(job, el("p", {}, el("a", {href: `#/jobs/${j.id}`}, j.id), " ", statusBadge(j.status), " ",
      el("span", {id: "make-progress"}, `${m.step ?? 0} / ${m.total_steps ?? j.config.rows} rows`,
        made.rows_rejected ? `, ${made.rows_rejected} rejected` : "")),
      j.error ? el("p", {class: "error-box"}, j.error) : null,
      hasRows ? el("p", {}, el("code", {class: "path", id: "made-output"}, j.config.output), " ", train) : null);
  };
  run.addEventListener("click", async () => {
    run.disabled = true;
    try {
      const j = await call("/api/data/make", {method: "POST", body: parsed()});
      showJob(j);
      watch(j.id);
    } catch (err) { fail(err); } finally { run.disabled = false; }
  });
  replaceKids(main, el("article", {class: "make-data"},
    el("h1", {}, "Make data"),
    el("p", {class: "muted"}, "Documents (or your prompts) and a teacher model write a training set. The recipe is ",
      "what ", el("code", {}, "tunestudio data make RECIPE.yaml"), " reads; a key is never written here: name ",
      "the server's environment variable that holds it in teacher.api_key_env."),
    recipe, el("div", {class: "actions"}, copy, el("label", {}, "rows to preview ", rows), previewBtn, run),
    error, job, shown));
  return () => { closed = true; clearTimeout(timer); };
}
