// One job: its status, progress, live charts, controls and results.
//
// Loading (first visit or a reload in the middle of a job): GET the job (its
// last_seq), then GET its metrics, then open the event stream after that
// last_seq. Every event after the snapshot comes from the stream; progress
// records the snapshot already holds are dropped by MetricSeries. EventSource's
// own reconnects send Last-Event-ID, so a dropped connection resumes the same way.

import {api, ApiError} from "./api.js";
import {lossChart, methodChart, singleChart, watchChart} from "./charts.js";
import {downloadsPanel} from "./downloads.js";
import {estimateVersus} from "./estimate.js";
import {mountJobFile} from "./jobfile.js";
import {mountJobInfo} from "./jobinfo.js";
import {mountLog} from "./log.js";
import {MetricSeries} from "./metrics.js";
import {resourcesPanel} from "./resources.js";
import {loadParent, withParent} from "./parent.js";
import {jobSections, METRIC_LABELS, metricCell} from "./sections.js";
import {
  appendKids, basename, confirmAction, datasetLabel, el, fmtBytes, fmtDuration, fmtNumber, fmtWhen, jobActivity,
  jobBadge, ranFor, replaceKids,
} from "./util.js";

const MAX_POINTS = 100000;
// The metric each training method is watched by, as config.METHOD_MAIN_METRIC names it (sft, pretrain: the loss),
// the chart's title, the other headline figures it draws when the records hold them, and the stat's label.
const METHOD_CHART = {
  dpo: ["rewards/margins", "Reward margin (chosen − rejected) and accuracy", /^rewards\/accuracies$/,
    "reward margin"],
  orpo: ["rewards/margins", "Reward margin (chosen − rejected) and accuracy", /^rewards\/accuracies$/,
    "reward margin"],
  kto: ["rewards/margins", "Rewards and KL", /^(rewards\/(chosen|rejected)|kl)$/, "reward margin"],
  // GRPO learns from the spread of rewards within a group: the spread, and the share of groups without any.
  grpo: ["reward", "Reward (mean, spread, per function) and groups without spread",
    /^(reward_std|frac_reward_zero_std|rewards\/[^/]+\/mean)$/, "reward"],
};

function stat(name, labelText) {
  return el("div", {class: "stat"}, el("span", {class: "stat-label"}, labelText),
    el("span", {class: "stat-value", id: `stat-${name}`}, "–"));
}

export async function showJob(main, id, {onChange, navigate}) {
  let job = await api.getJob(id);
  const series = new MetricSeries();
  let source = null, closed = false, lastSeq = job.last_seq;
  let phaseCount = null;  // {done, total} of the step the last phase event named

  // --- the page -----------------------------------------------------------------
  const status = el("span", {id: "job-status"});
  const phase = el("span", {class: "muted", id: "job-phase"});
  const message = el("p", {class: "job-message", id: "job-message"});
  const bar = el("div", {class: "bar-fill", id: "progress-fill"});
  const barText = el("span", {class: "bar-text", id: "progress-text"}, "");
  const live = el("span", {class: "live-dot", id: "live", title: "live stream"});
  const stopBtn = el("button", {class: "button", id: "stop"}, "Stop & save");
  const cancelBtn = el("button", {class: "button danger", id: "cancel"}, "Cancel");
  const resumeBtn = el("button", {class: "button primary", id: "resume"}, "Resume");
  const errorBox = el("div", {class: "error-box", id: "job-error", hidden: true});
  // The job's warnings (rows its dataset dropped, a converter's doubts...): in sight, not only in the logs.
  const warningList = el("ul", {});
  const warningsBox = el("div", {class: "warning-box", id: "job-warnings", hidden: true},
    el("b", {}, "Warnings"), warningList);
  const logBox = el("div", {class: "log", id: "events-log"});
  const fileLogBox = el("div", {class: "log-file", id: "log-file"});
  const infoBox = el("div", {class: "job-info", id: "job-info"});
  const lossBox = el("div", {class: "chart", id: "loss-chart"});
  const lrBox = el("div", {class: "chart", id: "lr-chart"});
  const gradBox = el("div", {class: "chart", id: "grad-chart"});
  const cfg = job.config;
  const methodSpec = METHOD_CHART[cfg.method];
  const methodBox = el("div", {class: "chart", id: "method-chart"});
  const isBench = job.kind === "bench";  // a benchmark of its source job: like an export, no training figures
  const isExport = job.kind === "export" || isBench;
  // Early stopping: the metric it watches (as the eval records name it), charted with its best step marked.
  const stopping = isExport ? null : cfg.early_stopping;
  const watchKey = stopping && (stopping.metric.startsWith("eval_") ? stopping.metric : `eval_${stopping.metric}`);
  const watchBox = el("div", {class: "chart", id: "watch-chart"});
  const bestLine = el("p", {class: "muted small", id: "best-step"});
  const versus = estimateVersus(job);  // the estimate before Start against the measured step time
  // The evaluation (before/after) for the top; output, samples, held-out rows, chat, judge, export, benchmarks
  // folding away below the charts (sections.js).
  const sections = jobSections(job, {navigate});
  const downloads = downloadsPanel(job);  // the adapter or model, files, metrics CSV, log (downloads.js)
  const resources = resourcesPanel(job);  // CPU, memory and GPU of the job's processes over time (resources.js)

  replaceKids(main, el("article", {class: "job-view", "data-job-id": id},
    el("div", {class: "job-head"},
      el("div", {},
        el("h1", {}, el("span", {id: "job-title"}, job.name || "Job"), " ", el("code", {}, id), " ", live),
        isBench
          ? el("p", {class: "muted"}, "benchmark of job ", el("a", {href: `#/jobs/${job.source_job}`}, job.source_job),
            ` · ${[...(cfg.tasks || []), ...(cfg.eval_file ? [cfg.eval_file] : [])].join(", ")}`
            + ` · created ${fmtWhen(job.created_at)}`)
          : isExport
          ? el("p", {class: "muted"}, `export as ${cfg.target}${cfg.quantization ? ` ${cfg.quantization}` : ""} of job `,
            el("a", {href: `#/jobs/${job.source_job}`}, job.source_job), ` · created ${fmtWhen(job.created_at)}`)
          : el("p", {class: "muted"}, `${basename(cfg.model_name)} · ${datasetLabel(cfg)} · ${cfg.method || "sft"}`
            + ` · ${cfg.training_type}`
            + ` · created ${fmtWhen(job.created_at)}`,
            job.resumed_from ? el("span", {}, " · resumed from ",
              el("a", {href: `#/jobs/${job.resumed_from}`}, job.resumed_from)) : null,
            job.resumed_by ? el("span", {id: "resumed-by"}, " · resumed as ",
              el("a", {href: `#/jobs/${job.resumed_by}`}, job.resumed_by)) : null)),
      el("div", {class: "actions"}, stopBtn, cancelBtn, resumeBtn)),
    el("div", {class: "status-line"}, status, phase, message),
    el("div", {class: "bar-head"}, el("span", {class: "muted"}, "progress"), barText),
    el("div", {class: "bar", role: "progressbar", id: "progress", "aria-label": "training progress",
      "aria-valuemin": "0", "aria-valuemax": "100"}, bar),
    // An export has no training figures: its progress, the time it took and its memory.
    isExport ? el("div", {class: "stats"}, stat("eta", "ETA"), stat("elapsed", "elapsed"), stat("peak", "peak memory"))
      : el("div", {class: "stats"}, stat("eta", "ETA"), stat("tps", "tokens/s"), stat("loss", "loss"),
        methodSpec ? stat("method", methodSpec[3]) : null,
        stat("lr", "learning rate"), stat("grad", "grad norm"), stat("epoch", "epoch"), stat("elapsed", "elapsed"),
        stat("peak", "peak memory")),
    isExport ? null : versus.node,
    errorBox, warningsBox,
    // What a user comes back for, at the top: the loss (and the method's own figures), then before/after.
    el("section", {class: "chart-card wide", hidden: isExport}, el("h2", {}, "Loss"), lossBox),
    methodSpec && !isExport ? el("section", {class: "chart-card wide"}, el("h2", {}, methodSpec[1]), methodBox) : null,
    stopping ? el("section", {class: "chart-card wide"},
      el("h2", {}, `Early stopping: ${METRIC_LABELS[stopping.metric] || stopping.metric}`), watchBox, bestLine) : null,
    sections.figures, sections.folds, infoBox,
    resources.node,
    el("div", {class: "chart-row", hidden: isExport},
      el("section", {class: "chart-card"}, el("h2", {}, "Learning rate"), lrBox),
      el("section", {class: "chart-card"}, el("h2", {}, "Gradient norm"), gradBox)),
    downloads.node,
    el("details", {class: "log-card", id: "log-card"}, el("summary", {}, "Worker log"), fileLogBox),
    el("details", {class: "log-card"}, el("summary", {}, "Events"), logBox)));

  const parent = job.resumed_from ? await loadParent(job.resumed_from) : null;
  const charts = {loss: lossChart(lossBox, {parent: Boolean(parent)}), lr: singleChart(lrBox, "learning rate", "--c2"),
    grad: singleChart(gradBox, "grad norm", "--c4")};
  if (stopping) charts.watch = watchChart(watchBox, METRIC_LABELS[stopping.metric] || stopping.metric);

  // --- rendering ----------------------------------------------------------------
  const setStat = (name, text) => {
    const node = document.getElementById(`stat-${name}`);
    if (node) node.textContent = text;  // an export shows only some of them
  };
  // The method chart's lines are known once records arrive (GRPO: one per reward function).
  let methodKeys = [];
  const drawMethodChart = () => {
    if (!methodSpec) return;
    const keys = series.extraKeys();
    const wanted = [methodSpec[0], ...keys.filter((k) => methodSpec[2].test(k))].filter((k) => keys.includes(k));
    if (wanted.join() !== methodKeys.join()) {
      if (charts.method) charts.method.destroy();
      methodKeys = wanted;
      charts.method = methodChart(methodBox, wanted);
    }
    if (charts.method) charts.method.setData(series.extraData(methodKeys));
    methodBox.dataset.series = methodKeys.join(",");
  };
  const drawCharts = () => {
    charts.loss.setData(parent ? withParent(series.lossData(), parent) : series.lossData());
    drawMethodChart();
    charts.lr.setData(series.seriesData("learning_rate"));
    charts.grad.setData(series.seriesData("grad_norm"));
    lossBox.dataset.steps = String(series.train.length);
    drawBest();
  };
  // The best step: the job's own once it has ended (GET /api/jobs/{id} best), the best evaluation so far before.
  const drawBest = () => {
    if (!stopping) return;
    const [steps, values] = series.evalData(watchKey);
    charts.watch.setData([steps, values]);
    let best = job.best ? {...job.best, final: true} : null;
    if (!best) {
      const lower = stopping.mode === "min" || (stopping.mode === "auto" && stopping.metric === "eval_loss");
      steps.forEach((step, i) => {
        if (!best || (lower ? values[i] < best.value : values[i] > best.value)) best = {step, value: values[i]};
      });
    }
    const marks = best ? [{step: best.step, label: `best: step ${best.step}`}] : [];
    charts.loss.setMarks(marks);
    charts.watch.setMarks(marks);
    bestLine.textContent = !best ? "No evaluation yet."
      : `Best at step ${best.step}: ${METRIC_LABELS[stopping.metric] || stopping.metric} `
        + `${metricCell(stopping.metric, best.value)}${best.final ? "" : " (so far)"}`
        + (best.final && best.checkpoint ? " — the job's artefacts are this step's weights." : "");
  };
  const drawProgress = () => {
    const p = series.latest || job.progress || {};
    const last = series.lastTrain || {};
    // Every metric record carries total_steps; the job's own progress covers a view opened between events.
    const total = p.total_steps || job.progress?.total_steps || 0, step = p.step || job.progress?.step || 0;
    const pct = total ? Math.min(100, (100 * step) / total) : (job.status === "completed" ? 100 : 0);
    bar.style.width = `${pct}%`;
    bar.parentElement.classList.toggle("indeterminate", !total && !job.is_terminal && job.status !== "queued");
    // A completed export is 100% as its bar is, even drawn before its progress (or series) reached the page.
    barText.textContent = total ? (isExport ? `${step}%` : `step ${step} / ${total}`)
      : isExport && job.status === "completed" ? "100%" : job.is_terminal ? ""
      : job.status === "queued" ? `queued${job.queue_position ? `, #${job.queue_position} in line` : ""}`
        : "waiting for the first step";
    bar.parentElement.setAttribute("aria-valuenow", String(Math.round(pct)));
    setStat("eta", job.is_terminal ? "–" : fmtDuration(p.eta_seconds));
    // An eval-only record (the last one of a job with evals) has no throughput: take the last that has.
    const tps = [p, last].find((r) => r.tokens_per_second)?.tokens_per_second;
    setStat("tps", tps ? fmtNumber(tps, 3) : "–");
    setStat("loss", fmtNumber(last.loss));
    if (methodSpec) setStat("method", fmtNumber((last.extra || {})[methodSpec[0]]));
    setStat("lr", fmtNumber(last.learning_rate, 3));
    setStat("grad", fmtNumber(last.grad_norm, 3));
    setStat("epoch", p.epoch !== undefined && p.epoch !== null ? fmtNumber(p.epoch, 3) : "–");
    setStat("elapsed", fmtDuration(p.elapsed_seconds ?? ranFor(job)));
    const peak = last.peak_memory_mb ?? p.peak_memory_mb;
    setStat("peak", peak ? fmtBytes(peak * 2 ** 20) : "–");
    if (!isExport) versus.update(last.step ? last : p);
  };
  const drawStatus = () => {
    replaceKids(status, jobBadge(job));
    // A step inside the status (evaluating the base model, generating its answers...), with how far it is: the
    // badge names the step (jobActivity); a step the badge does not name (the job is stopping) is named here.
    const count = phaseCount ? `${phaseCount.done} / ${phaseCount.total}` : "";
    const step = job.phase && job.phase !== job.status && !job.is_terminal ? job.phase : null;
    phase.textContent = !step ? "" : jobActivity(job) === step ? count
      : `phase: ${step.replaceAll("_", " ")}${count ? ` ${count}` : ""}`;
    document.title = `${job.status.replaceAll("_", " ")} · ${job.name || id} · tunestudio`;
    message.textContent = job.message && job.message !== job.status && job.message !== job.phase ? job.message : "";
    // What the job allows comes from the API (stoppable, cancellable, resumable): no status sets here.
    // An export keeps nothing when stopped: it is only cancelled.
    stopBtn.hidden = isExport || !job.stoppable || job.status === "queued";
    cancelBtn.hidden = !job.cancellable;
    resumeBtn.hidden = !job.resumable;
    info.update(job);
    downloads.update(job);
    resources.update(job);
    live.hidden = !source;
    errorBox.hidden = !job.error;
    replaceKids(errorBox, el("b", {}, "Error: "), job.error || "");
    sections.update(job);
    drawBest();
  };
  const log = (kind, text) => {
    appendKids(logBox, el("div", {class: `log-line ${kind}`}, text));
    if (logBox.childElementCount > 500) logBox.firstElementChild.remove();
  };
  /** One event that says something (log, warning, failed, completed): into Events, a warning also on top. */
  const said = (kind, data) => {
    log(kind, data.message || (kind === "completed" ? (isExport ? "export finished" : "training finished")
      : JSON.stringify(data)));
    if (kind === "warning") {
      appendKids(warningList, el("li", {}, data.message));
      warningsBox.hidden = false;
    }
  };

  // --- data -------------------------------------------------------------------------
  const refreshJob = async () => {
    job = await api.getJob(id);
    drawStatus();
    drawProgress();
    onChange();
  };

  const openStream = () => {
    source = new EventSource(api.eventsUrl(id, lastSeq));
    const seen = (event) => { if (event.lastEventId) lastSeq = Number(event.lastEventId); };
    source.addEventListener("progress", (event) => {
      seen(event);
      if (series.add(JSON.parse(event.data))) drawCharts();
      drawProgress();
    });
    source.addEventListener("status", (event) => {
      seen(event);
      const data = JSON.parse(event.data);
      job = {...job, status: data.status, phase: data.status, message: data.message, error: data.error,
        is_terminal: !!data.terminal};
      phaseCount = null;
      if (data.terminal) {
        // The server ends the stream here; without close() EventSource would reconnect for ever.
        source.close();
        source = null;
      }
      refreshJob();  // what the job allows now (stoppable, resumable...) comes with the job
      drawStatus();
      drawProgress();
      onChange();
    });
    source.addEventListener("phase", (event) => {
      seen(event);
      const data = JSON.parse(event.data);
      phaseCount = data.total ? {done: data.done, total: data.total} : null;
      job = {...job, phase: data.phase, message: data.message || job.message};
      drawStatus();
    });
    source.addEventListener("resources", (event) => {
      seen(event);
      resources.add({...JSON.parse(event.data), seq: Number(event.lastEventId)});
    });
    for (const kind of ["log", "warning", "failed", "completed"]) {
      source.addEventListener(kind, (event) => {
        seen(event);
        said(kind, JSON.parse(event.data));
      });
    }
    source.onopen = () => live.classList.remove("stale");
    source.onerror = () => { if (source) live.classList.add("stale"); };  // EventSource reconnects by itself
    drawStatus();
  };

  const info = mountJobInfo(infoBox, job, {navigate, onChange, onTitle: (t) => {
    document.getElementById("job-title").textContent = t || "Job";
  }});
  // Copy as job file / as CLI command, beside Clone to form (jobfile.js)
  if (job.kind === "train") mountJobFile(infoBox.querySelector("#config-card .actions"), id);
  const fileLog = mountLog(fileLogBox, id, () => job.is_terminal);
  const snapshot = await api.metrics(id, MAX_POINTS);
  series.addAll(snapshot.records);
  // What the job said before this view opened (all of it, for a finished job); the stream goes on after it.
  try {
    for (const m of (await api.messages(id, lastSeq)).items) said(m.kind, m);
  } catch (err) {
    log("failed", `the job's earlier events could not be read: ${err.message}`);
  }
  await resources.load(lastSeq);
  drawCharts();
  drawStatus();
  drawProgress();
  if (!job.is_terminal && !closed) openStream();
  const ticker = setInterval(() => { if (!job.is_terminal) drawProgress(); }, 1000);

  // --- controls -------------------------------------------------------------------------
  const act = async (button, action) => {
    button.disabled = true;
    try {
      await action();
    } catch (err) {
      alertError(err);
    } finally {
      button.disabled = false;
    }
  };
  const alertError = (err) => {
    errorBox.hidden = false;
    replaceKids(errorBox, el("b", {}, "Error: "), err instanceof ApiError ? err.message : String(err));
  };
  stopBtn.addEventListener("click", () => act(stopBtn, async () => {
    if (!await confirmAction("Stop this job?", "Training stops at the next step and saves a checkpoint you can "
      + "resume from, plus the model trained so far.", "Stop and save")) return;
    job = await api.stopJob(id, true);
    drawStatus();
  }));
  cancelBtn.addEventListener("click", () => act(cancelBtn, async () => {
    if (!await confirmAction("Cancel this job?", "Training stops at once and nothing is saved. This cannot be "
      + "undone.", "Cancel the job")) return;
    job = await api.cancelJob(id);
    drawStatus();
  }));
  resumeBtn.addEventListener("click", () => act(resumeBtn, async () => {
    const next = await api.resumeJob(id);
    onChange();
    navigate(`#/jobs/${next.id}`);
  }));

  // For tests and the curious: what the charts hold.
  window.tunestudio = {jobId: id, series, lastSeq: () => lastSeq};

  return () => {
    closed = true;
    document.title = "tunestudio";
    clearInterval(ticker);
    fileLog.dispose();
    if (source) source.close();
    sections.dispose();
    downloads.dispose();
    resources.dispose();
    Object.values(charts).forEach((c) => c && c.destroy());
  };
}
