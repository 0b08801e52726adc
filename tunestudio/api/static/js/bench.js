// The Benchmarks panel of a finished training job: run lm-evaluation-harness on the job and its base model
// (standard tasks whose data is cached here, and/or your own eval file), and read each run's figures: per task
// and metric, before, after, and the difference with its error bar (± one standard error). A benchmark is a job
// of its own (kind "bench", source_job this job), run against this server's /v1/completions.

import {api, errorText} from "./api.js";
import {el, fmtNumber, replaceKids, statusBadge} from "./util.js";

const SVG = "http://www.w3.org/2000/svg";

// The difference as a bar from zero, its ± stderr as a whisker; the scale is the largest |difference| + stderr.
function errorBar(difference, stderr, scale) {
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", "0 0 120 14");
  svg.setAttribute("class", "bench-bar");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `difference ${fmtNumber(difference)} ± ${fmtNumber(stderr || 0)}`);
  const x = (v) => 60 + (55 * v) / (scale || 1);
  const line = (x1, y1, x2, y2, cls) => {
    const node = document.createElementNS(SVG, "line");
    Object.entries({x1, y1, x2, y2, class: cls}).forEach(([k, v]) => node.setAttribute(k, v));
    svg.appendChild(node);
  };
  const rect = document.createElementNS(SVG, "rect");
  const left = Math.min(x(0), x(difference));
  Object.entries({x: left, y: 3, width: Math.abs(x(difference) - x(0)), height: 8,
    class: difference >= 0 ? "bench-up" : "bench-down"}).forEach(([k, v]) => rect.setAttribute(k, v));
  svg.appendChild(rect);
  line(60, 0, 60, 14, "bench-zero");
  if (stderr) {
    line(x(difference - stderr), 7, x(difference + stderr), 7, "bench-whisker");
    line(x(difference - stderr), 4, x(difference - stderr), 10, "bench-whisker");
    line(x(difference + stderr), 4, x(difference + stderr), 10, "bench-whisker");
  }
  return svg;
}

const pm = (value, stderr) => value == null ? "–"
  : stderr == null ? fmtNumber(value) : `${fmtNumber(value)} ± ${fmtNumber(stderr)}`;

// The figures of one finished benchmark (its result: {harness, models, tasks: {task: {version, samples, metrics}}}).
export function benchTable(result) {
  const rows = [];
  let scale = 0;
  for (const figures of Object.values(result.tasks || {})) {
    for (const m of Object.values(figures.metrics || {})) {
      if (m.difference != null) scale = Math.max(scale, Math.abs(m.difference) + (m.stderr || 0));
    }
  }
  for (const [task, figures] of Object.entries(result.tasks || {})) {
    for (const [metric, m] of Object.entries(figures.metrics || {})) {
      rows.push(el("tr", {"data-task": task, "data-metric": metric},
        el("td", {}, task), el("td", {class: "num"}, String(figures.version ?? "–")),
        el("td", {class: "num"}, String(figures.samples ?? "–")), el("td", {}, metric),
        el("td", {class: "num bench-before"}, pm(m.before, m.stderr_before)),
        el("td", {class: "num bench-after"}, pm(m.after, m.stderr_after)),
        el("td", {class: "num bench-difference"},
          m.difference == null ? "–" : `${m.difference >= 0 ? "+" : ""}${fmtNumber(m.difference)}`
            + (m.stderr != null ? ` ± ${fmtNumber(m.stderr)}` : "")),
        el("td", {}, m.difference == null ? "" : errorBar(m.difference, m.stderr, scale))));
    }
  }
  const models = result.models || {};
  return el("div", {class: "bench-result"},
    el("p", {class: "muted small"}, `${result.harness || "lm-eval"} · before: ${models.before} · after: `
      + `${models.after}${result.limit ? ` · limit ${result.limit}` : ""}`
      + `${result.chat_template ? " · chat template" : ""}`),
    el("table", {class: "config bench-table"},
      el("thead", {}, el("tr", {}, ...["task", "version", "n", "metric", "before", "after", "difference", ""]
        .map((h) => el("th", {}, h)))),
      el("tbody", {}, rows)));
}

export function benchPanel(job) {
  const tasks = el("input", {id: "bench-tasks", placeholder: "e.g. hellaswag,arc_easy", autocomplete: "off"});
  const evalFile = el("input", {id: "bench-eval-file", placeholder: "/path/to/questions.jsonl", autocomplete: "off"});
  const limit = el("input", {id: "bench-limit", inputmode: "numeric", placeholder: "all", size: 6,
    autocomplete: "off"});
  const error = el("div", {class: "error-box", id: "bench-error", hidden: true});
  const start = el("button", {class: "button primary", id: "bench-start", type: "submit"}, "Run benchmark");
  const list = el("div", {id: "bench-list"});
  const field = (label, input, name) => el("label", {class: "export-field", "data-field": name}, label, input);
  const form = el("form", {class: "export-form", id: "bench-form"},
    field("tasks ", tasks, "tasks"), field("eval file ", evalFile, "eval_file"), field("limit ", limit, "limit"),
    start);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = {tasks: tasks.value.split(",").map((t) => t.trim()).filter(Boolean)};
    if (evalFile.value.trim()) body.eval_file = evalFile.value.trim();
    if (limit.value.trim()) body.limit = /^\d+$/.test(limit.value.trim()) ? Number(limit.value.trim()) : limit.value;
    start.disabled = true;
    error.hidden = true;
    try {
      await api.startBenchmark(job.id, body);
      await refresh();
    } catch (err) {
      error.hidden = false;
      error.textContent = errorText(err);
    } finally {
      start.disabled = false;
    }
  });

  // This job's benchmarks, newest first; polled while one of them runs.
  let timer = null, gone = false;
  const refresh = async () => {
    const page = await api.benchmarks(job.id);
    replaceKids(list, ...page.benchmarks.map((b) => el("div", {class: "bench-run", "data-job-id": b.id,
      "data-status": b.status},
    el("p", {}, el("a", {href: `#/jobs/${b.id}`}, [...b.tasks, ...(b.eval_file ? [b.eval_file] : [])].join(", ")),
      " ", statusBadge(b.status), " ", el("span", {class: "muted small"}, b.phase && !b.result ? b.message : "")),
    b.error ? el("p", {class: "error-box"}, b.error) : null,
    b.result ? benchTable(b.result) : null)));
    clearTimeout(timer);
    if (!gone && page.benchmarks.some((b) => !b.is_terminal)) timer = setTimeout(refresh, 1500);
  };
  refresh().catch(() => {});

  const panel = el("section", {class: "results export-panel bench-panel", id: "bench-panel"},
    el("h2", {}, "Benchmarks"),
    el("p", {class: "muted small"}, "lm-evaluation-harness on this job and its base model, through this "
      + "server's /v1/completions. Standard tasks need their data in the local HF datasets cache; an eval file "
      + "is JSON lines of {question, choices, answer} (multiple choice) or {question, answer} (exact match)."),
    form, error, list);
  panel.dispose = () => { gone = true; clearTimeout(timer); };
  return panel;
}
