// Sweeps: the list (#/sweeps) and one sweep's leaderboard (#/sweeps/ID): its trials ranked by the objective
// (GET /api/sweeps/{id} ranks them), the objective against each swept parameter, and what to do with the best
// trial (clone it to the form, export it, chat with it). Each trial is an ordinary job: its row links to it.

import {api, ApiError} from "./api.js";
import {Chart, colour, tickLabels} from "./charts.js";
import {chatPanel} from "./chat.js";
import {exportPanel} from "./export.js";
import {CLONE_KEY} from "./form.js";
import {appendKids, confirmAction, el, fmtNumber, fmtWhen, replaceKids, statusBadge} from "./util.js";

const LIVE = new Set(["running", "stopping"]);
const POLL_MS = 2000;
// What a trial's job set for the sweep, not the user: a clone starts a job of its own.
const NOT_CLONED = ["output_dir", "resume_from_checkpoint", "mlflow_parent_run_id", "mlflow_run_name",
  "mlflow_tracking_uri"];
const LABELS = {eval_loss: "eval loss", exact_match: "exact match", token_f1: "token F1", rouge_l: "ROUGE-L",
  perplexity: "perplexity"};
const label = (metric) => LABELS[metric] || metric;
const fmtParam = (v) => (typeof v === "number" ? fmtNumber(v) : v === undefined ? "–" : String(v));

export async function showSweeps(main, id, {navigate}) {
  return id ? showSweep(main, id, {navigate}) : showList(main);
}

async function showList(main) {
  const {items} = await api.listSweeps();
  replaceKids(main, el("article", {class: "sweeps"},
    el("h1", {}, "Sweeps"),
    el("p", {class: "muted"}, "Hyperparameter searches whose trials run as jobs of the queue: start one with ",
      el("code", {}, "tunestudio sweep SWEEP.yaml"), " or POST /api/sweeps."),
    items.length ? el("table", {class: "compare-table", id: "sweep-list"},
      el("thead", {}, el("tr", {}, ...["sweep", "status", "objective", "trials", "best", "created"].map(
        (h) => el("th", {}, h)))),
      el("tbody", {}, items.map((s) => el("tr", {"data-sweep": s.id},
        el("td", {}, el("a", {href: `#/sweeps/${s.id}`}, s.id)), el("td", {}, statusBadge(s.status)),
        el("td", {}, `${label(s.objective.metric)} (${s.objective.mode})`),
        el("td", {class: "num"}, `${s.trials.length} / ${s.n_trials}`),
        el("td", {class: "num"}, s.best ? fmtNumber(s.best.value) : "–"), el("td", {}, fmtWhen(s.created_at))))))
      : el("p", {class: "muted empty", id: "no-sweeps"}, "No sweep yet.")));
  return () => {};
}

async function showSweep(main, id, {navigate}) {
  let sweep = await api.getSweep(id);
  let timer = null, closed = false;
  const params = Object.keys(sweep.config.space);
  const status = el("span", {id: "sweep-status"});
  const summary = el("p", {class: "muted", id: "sweep-summary"});
  const stop = el("button", {type: "button", class: "button", id: "sweep-stop"}, "Stop sweep");
  const error = el("div", {class: "error-box", id: "sweep-error", hidden: true});
  const best = el("div", {class: "results", id: "sweep-best", hidden: true});
  const clone = el("button", {type: "button", class: "button", id: "best-clone"}, "Clone best to form");
  const exportBtn = el("button", {type: "button", class: "button", id: "best-export"}, "Export best");
  const chatBtn = el("button", {type: "button", class: "button primary", id: "best-chat"}, "Chat with best");
  const slot = el("div", {id: "best-slot"});
  const table = el("table", {class: "compare-table leaderboard", id: "leaderboard"});
  const plots = el("div", {class: "chart-row sweep-plots", id: "sweep-plots"});
  replaceKids(main, el("article", {class: "sweep-view", "data-sweep-id": id},
    el("div", {class: "job-head"},
      el("div", {}, el("h1", {}, "Sweep ", el("code", {}, id)), summary),
      el("div", {class: "actions"}, stop)),
    el("div", {class: "status-line"}, status),
    error, best, slot,
    el("section", {class: "chart-card wide"}, el("h2", {}, "Leaderboard"), table),
    el("section", {}, el("h2", {}, `${label(sweep.objective.metric)} against each parameter`), plots)));

  // One chart per swept parameter: the objective of each trial that has one (completed, or pruned at its last).
  const charts = new Map();
  for (const name of params) {
    const box = el("div", {class: "chart", id: `plot-${name}`, "data-param": name});
    appendKids(plots, el("section", {class: "chart-card"}, el("h3", {}, name), box));
    charts.set(name, {box, chart: paramChart(box, name, sweep.config.space[name], sweep.objective.metric)});
  }
  let panel = null, panelJob = null;

  const draw = () => {
    const done = sweep.trials.filter((t) => ["completed", "pruned", "failed"].includes(t.status)).length;
    replaceKids(status, statusBadge(sweep.status));
    summary.textContent = `${label(sweep.objective.metric)} (${sweep.objective.mode}) · ${sweep.sampler} sampler · `
      + `pruner ${sweep.pruner} · ${done} of ${sweep.n_trials} trials done · created ${fmtWhen(sweep.created_at)}`
      + (sweep.mlflow_run_id ? ` · MLflow run ${sweep.mlflow_run_id}` : "");
    document.title = `${sweep.status} · sweep ${id} · tunestudio`;
    stop.hidden = !["running", "needs_secrets"].includes(sweep.status);
    if (sweep.error || sweep.mlflow_error) {  // error: a restarted server's sweep must be given its secrets again
      error.hidden = false;
      error.textContent = sweep.error || sweep.mlflow_error;
    }
    drawBest();
    drawTable();
    for (const [name, {box, chart}] of charts) {
      const data = paramData(sweep, name);
      chart.setData(data.series);
      box.dataset.trials = String(data.count);
    }
  };
  const drawBest = () => {
    const top = sweep.best;
    best.hidden = !top;
    if (!top) return;
    replaceKids(best,
      el("h2", {}, "Best trial"),
      el("p", {}, `trial ${top.number}: ${label(sweep.objective.metric)} `, el("b", {id: "best-value"},
        fmtNumber(top.value)), " with ", Object.entries(top.params).map(([k, v]) => `${k}=${fmtParam(v)}`).join(", "),
      " · job ", el("a", {href: `#/jobs/${top.job_id}`, id: "best-job"}, top.job_id)),
      el("div", {class: "actions"}, clone, exportBtn, chatBtn));
  };
  const drawTable = () => {
    const metric = sweep.objective.metric;
    replaceKids(table,
      el("thead", {}, el("tr", {}, el("th", {}, "rank"), el("th", {}, "trial"),
        ...params.map((p) => el("th", {}, p)), el("th", {}, "status"), el("th", {class: "num"}, label(metric)),
        el("th", {class: "num"}, "best step"), el("th", {class: "num"}, "steps"),
        el("th", {}, "evaluation (base → trained)"), el("th", {}, "job"))),
      el("tbody", {}, sweep.trials.map((t, i) => el("tr", {"data-trial": t.number, "data-status": t.status,
        class: sweep.best && sweep.best.number === t.number ? "best" : null},
      el("td", {class: "num"}, String(i + 1)), el("td", {class: "num"}, String(t.number)),
      ...params.map((p) => el("td", {class: "num"}, fmtParam(t.params[p]))),
      el("td", {}, statusBadge(t.status), t.error ? el("span", {class: "muted small", title: t.error}, " why?") : null,
        t.pruned_at != null ? el("span", {class: "muted small"}, ` at step ${t.pruned_at}`) : null),
      el("td", {class: "num value"}, fmtNumber(t.value)), el("td", {class: "num"}, t.best_step ?? "–"),
      el("td", {class: "num"}, t.steps ?? "–"),
      el("td", {class: "evaluation"}, evaluationText(t.evaluation)),
      el("td", {}, t.job_id ? el("a", {href: `#/jobs/${t.job_id}`}, t.job_id) : "–")))));
  };

  const load = async () => {
    try {
      sweep = await api.getSweep(id);
      if (!closed) draw();
    } catch (err) {
      error.hidden = false;
      error.textContent = err instanceof ApiError ? err.message : String(err);
    }
    if (!closed && LIVE.has(sweep.status)) timer = setTimeout(load, POLL_MS);
  };

  // --- the best trial: clone it, export it, chat with it ------------------------------------------
  const bestJob = async () => api.getJob(sweep.best.job_id);
  const show = (node, dispose) => {
    if (panel) panel();
    panel = dispose;
    replaceKids(slot, node);
    node.scrollIntoView({block: "nearest"});
  };
  clone.addEventListener("click", async () => {
    const job = await bestJob();
    const config = Object.fromEntries(Object.entries(job.config).filter(([k]) => !NOT_CLONED.includes(k)));
    sessionStorage.setItem(CLONE_KEY, JSON.stringify(config));
    navigate("#/new");
  });
  exportBtn.addEventListener("click", async () => {
    panelJob = await bestJob();
    if (!panelJob.has_result) {
      show(el("p", {class: "muted", id: "best-note"}, `job ${panelJob.id} has nothing to export (${panelJob.status})`),
        null);
      return;
    }
    const box = exportPanel(panelJob, {navigate});
    show(el("section", {class: "best-panel", id: "best-export-panel"}, el("h2", {}, `Export trial ${sweep.best.number}`),
      box), () => box.dispose && box.dispose());
  });
  chatBtn.addEventListener("click", async () => {
    panelJob = await bestJob();
    if (!panelJob.chattable) {
      show(el("p", {class: "muted", id: "best-note"}, `job ${panelJob.id} has no model to chat with yet`), null);
      return;
    }
    const chat = chatPanel(panelJob.id);
    show(el("section", {class: "best-panel", id: "best-chat-panel"}, chat.node), () => chat.dispose());
  });
  stop.addEventListener("click", async () => {
    if (!await confirmAction("Stop this sweep?", "No new trials start; the running ones stop and save.",
      "Stop the sweep")) return;
    try {
      sweep = await api.stopSweep(id);
      draw();
    } catch (err) {
      error.hidden = false;
      error.textContent = err instanceof ApiError ? err.message : String(err);
    }
  });

  draw();
  if (LIVE.has(sweep.status)) timer = setTimeout(load, POLL_MS);
  window.tunestudio = {sweepId: id, sweep: () => sweep};
  return () => {
    closed = true;
    clearTimeout(timer);
    if (panel) panel();
    for (const {chart} of charts.values()) chart.destroy();
  };
}

function evaluationText(evaluation) {
  if (!evaluation) return "–";
  return Object.entries(evaluation).filter(([, m]) => m.before !== null || m.after !== null)
    .map(([name, m]) => `${label(name)} ${fmtNumber(m.before)} → ${fmtNumber(m.after)}`).join(" · ");
}

// --- the objective against one parameter --------------------------------------------------------
/** How a dimension lies on the x axis: its values at 0..n-1 (categorical), or its range (log or linear). */
function xOf(dim) {
  if (dim.values) return {categories: dim.values.map((v) => JSON.stringify(v)), place: (v) => dim.values.indexOf(v)};
  return {log: Boolean(dim.log), place: (v) => v};
}

function paramChart(box, name, dim, metric) {
  const x = xOf(dim);
  return new Chart(box, () => ({
    xLabel: name,
    scales: x.categories ? {x: {time: false, range: [-0.5, x.categories.length - 0.5]}}
      : x.log ? {x: {time: false, distr: 3}} : {},
    xAxis: x.categories
      ? {splits: () => x.categories.map((_, i) => i), values: (u, splits) => splits.map((i) => x.categories[i] ?? "")}
      : {values: (u, splits, ax, space, incr) => (x.log ? splits.map((v) => fmtNumber(v, 3)) : tickLabels(splits, incr))},
    series: [
      {label: `${label(metric)} (completed)`, stroke: colour(0), width: 0, paths: () => null,
        points: {show: true, size: 9}},
      {label: "pruned (last value)", stroke: colour(3), width: 0, paths: () => null, points: {show: true, size: 7}},
      {label: "best", stroke: colour(2), width: 0, paths: () => null, points: {show: true, size: 13, width: 3}},
    ],
  }), {height: 220});
}

/** [x, completed, pruned, best] for uPlot: one x per trial with a value, sorted; null where a series has none. */
function paramData(sweep, name) {
  const x = xOf(sweep.config.space[name]);
  const bestNumber = sweep.best ? sweep.best.number : null;
  const points = sweep.trials.filter((t) => t.value !== null && t.value !== undefined && name in t.params)
    .map((t) => ({x: x.place(t.params[name]), t})).filter((p) => Number.isFinite(p.x))
    .sort((a, b) => a.x - b.x);
  const pick = (test) => points.map(({t}) => (test(t) ? t.value : null));
  return {count: points.length, series: [points.map((p) => p.x), pick((t) => t.status === "completed"),
    pick((t) => t.status !== "completed"), pick((t) => t.number === bestNumber)]};
}
