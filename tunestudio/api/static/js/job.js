// One job: its status, progress, live charts, controls and results.
//
// Loading (first visit or a reload in the middle of a job): GET the job (its
// last_seq), then GET its metrics, then open the event stream after that
// last_seq. Every event after the snapshot comes from the stream; progress
// records the snapshot already holds are dropped by MetricSeries. EventSource's
// own reconnects send Last-Event-ID, so a dropped connection resumes the same way.

import {api, ApiError} from "./api.js";
import {lossChart, singleChart} from "./charts.js";
import {mountJobInfo} from "./jobinfo.js";
import {mountLog} from "./log.js";
import {MetricSeries} from "./metrics.js";
import {loadParent, withParent} from "./parent.js";
import {
  basename, confirmAction, datasetLabel, el, fmtBytes, fmtDuration, fmtNumber, fmtWhen, ranFor,
  statusBadge, TERMINAL,
} from "./util.js";

const MAX_POINTS = 100000;

function stat(name, labelText) {
  return el("div", {class: "stat"}, el("span", {class: "stat-label"}, labelText),
    el("span", {class: "stat-value", id: `stat-${name}`}, "–"));
}

export async function showJob(main, id, {onChange, navigate}) {
  let job = await api.getJob(id);
  const series = new MetricSeries();
  let source = null, closed = false, lastSeq = job.last_seq;

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
  const results = el("div", {class: "results", id: "results", hidden: true});
  const logBox = el("div", {class: "log", id: "events-log"});
  const fileLogBox = el("div", {class: "log-file", id: "log-file"});
  const infoBox = el("div", {class: "job-info", id: "job-info"});
  const lossBox = el("div", {class: "chart", id: "loss-chart"});
  const lrBox = el("div", {class: "chart", id: "lr-chart"});
  const gradBox = el("div", {class: "chart", id: "grad-chart"});
  const cfg = job.config;

  main.replaceChildren(el("article", {class: "job-view", "data-job-id": id},
    el("div", {class: "job-head"},
      el("div", {},
        el("h1", {}, el("span", {id: "job-title"}, job.name || "Job"), " ", el("code", {}, id), " ", live),
        el("p", {class: "muted"}, `${basename(cfg.model_name)} · ${datasetLabel(cfg)} · ${cfg.training_type}`
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
    el("div", {class: "stats"}, stat("eta", "ETA"), stat("tps", "tokens/s"), stat("loss", "loss"),
      stat("lr", "learning rate"), stat("grad", "grad norm"), stat("epoch", "epoch"), stat("elapsed", "elapsed"),
      stat("peak", "peak memory")),
    errorBox, results, infoBox,
    el("section", {class: "chart-card wide"}, el("h3", {}, "Loss"), lossBox),
    el("div", {class: "chart-row"},
      el("section", {class: "chart-card"}, el("h3", {}, "Learning rate"), lrBox),
      el("section", {class: "chart-card"}, el("h3", {}, "Gradient norm"), gradBox)),
    el("details", {class: "log-card", id: "log-card"}, el("summary", {}, "Worker log"), fileLogBox),
    el("details", {class: "log-card"}, el("summary", {}, "Events"), logBox)));

  const parent = job.resumed_from ? await loadParent(job.resumed_from) : null;
  const charts = {loss: lossChart(lossBox, {parent: Boolean(parent)}), lr: singleChart(lrBox, "learning rate", "--c2"),
    grad: singleChart(gradBox, "grad norm", "--c4")};

  // --- rendering ----------------------------------------------------------------
  const setStat = (name, text) => { document.getElementById(`stat-${name}`).textContent = text; };
  const drawCharts = () => {
    charts.loss.setData(parent ? withParent(series.lossData(), parent) : series.lossData());
    charts.lr.setData(series.seriesData("learning_rate"));
    charts.grad.setData(series.seriesData("grad_norm"));
    lossBox.dataset.steps = String(series.train.length);
  };
  const drawProgress = () => {
    const p = series.latest || job.progress || {};
    const last = series.lastTrain || {};
    // Every metric record carries total_steps; the job's own progress covers a view opened between events.
    const total = p.total_steps || job.progress?.total_steps || 0, step = p.step || job.progress?.step || 0;
    const pct = total ? Math.min(100, (100 * step) / total) : (job.status === "completed" ? 100 : 0);
    bar.style.width = `${pct}%`;
    bar.parentElement.classList.toggle("indeterminate", !total && !TERMINAL.has(job.status) && job.status !== "queued");
    barText.textContent = total ? `step ${step} / ${total}` : TERMINAL.has(job.status) ? ""
      : job.status === "queued" ? `queued${job.queue_position ? `, #${job.queue_position} in line` : ""}`
        : "waiting for the first step";
    bar.parentElement.setAttribute("aria-valuenow", String(Math.round(pct)));
    setStat("eta", TERMINAL.has(job.status) ? "–" : fmtDuration(p.eta_seconds));
    // An eval-only record (the last one of a job with evals) has no throughput: take the last that has.
    const tps = [p, last].find((r) => r.tokens_per_second)?.tokens_per_second;
    setStat("tps", tps ? fmtNumber(tps, 3) : "–");
    setStat("loss", fmtNumber(last.loss));
    setStat("lr", fmtNumber(last.learning_rate, 3));
    setStat("grad", fmtNumber(last.grad_norm, 3));
    setStat("epoch", p.epoch !== undefined && p.epoch !== null ? fmtNumber(p.epoch, 3) : "–");
    setStat("elapsed", fmtDuration(p.elapsed_seconds ?? ranFor(job)));
    const peak = last.peak_memory_mb ?? p.peak_memory_mb;
    setStat("peak", peak ? fmtBytes(peak * 2 ** 20) : "–");
  };
  const drawStatus = () => {
    status.replaceChildren(statusBadge(job.status));
    phase.textContent = job.phase && job.phase !== job.status && !TERMINAL.has(job.status)
      ? `phase: ${job.phase.replace("_", " ")}` : "";
    message.textContent = job.message && job.message !== job.status && job.message !== job.phase ? job.message : "";
    // What the job allows comes from the API (stoppable, cancellable, resumable): no status sets here.
    stopBtn.hidden = !job.stoppable || job.status === "queued";
    cancelBtn.hidden = !job.cancellable;
    resumeBtn.hidden = !job.resumable;
    info.update(job);
    live.hidden = !source;
    errorBox.hidden = !job.error;
    errorBox.replaceChildren(el("b", {}, "Error: "), job.error || "");
    drawResults();
  };
  const drawResults = () => {
    // Only what exists on disk: a failed or cancelled job has no output folder to point at.
    const finished = TERMINAL.has(job.status) && job.artefacts.length > 0;
    results.hidden = !finished;
    if (!finished) return;
    const complete = job.status === "completed" || job.status === "stopped";
    results.classList.toggle("partial", !complete);
    const metrics = Object.entries(job.final_metrics || {});
    results.replaceChildren(...[
      el("h3", {}, complete ? "Output" : "Left on disk"),
      el("p", {}, el("code", {id: "output-dir", class: "path"}, job.output_dir || "–")),
      job.checkpoint ? el("p", {class: "muted"}, "checkpoint: ", el("code", {class: "path"}, job.checkpoint)) : null,
      job.artefacts.length ? el("table", {class: "artefacts", id: "artefacts"},
        el("tbody", {}, job.artefacts.map((a) => el("tr", {},
          el("td", {}, el("code", {}, a.name + (a.is_dir ? "/" : ""))), el("td", {class: "num"}, fmtBytes(a.bytes))))))
        : null,
      metrics.length ? el("p", {class: "muted small"}, metrics.map(([k, v]) => `${k} ${fmtNumber(v)}`).join(" · ")) : null,
    ].filter(Boolean));
  };
  const log = (kind, text) => {
    logBox.append(el("div", {class: `log-line ${kind}`}, text));
    if (logBox.childElementCount > 500) logBox.firstElementChild.remove();
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
      job = {...job, status: data.status, message: data.message, error: data.error};
      if (TERMINAL.has(data.status)) {
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
      job = {...job, phase: JSON.parse(event.data).phase};
      drawStatus();
    });
    for (const kind of ["log", "warning", "failed", "completed"]) {
      source.addEventListener(kind, (event) => {
        seen(event);
        const data = JSON.parse(event.data);
        log(kind, data.message || (kind === "completed" ? "training finished" : JSON.stringify(data)));
      });
    }
    source.onopen = () => live.classList.remove("stale");
    source.onerror = () => { if (source) live.classList.add("stale"); };  // EventSource reconnects by itself
    drawStatus();
  };

  const info = mountJobInfo(infoBox, job, {navigate, onChange, onTitle: (t) => {
    document.getElementById("job-title").textContent = t || "Job";
  }});
  const fileLog = mountLog(fileLogBox, id, () => TERMINAL.has(job.status));
  const snapshot = await api.metrics(id, MAX_POINTS);
  series.addAll(snapshot.records);
  drawCharts();
  drawStatus();
  drawProgress();
  if (!TERMINAL.has(job.status) && !closed) openStream();
  const ticker = setInterval(() => { if (!TERMINAL.has(job.status)) drawProgress(); }, 1000);

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
    errorBox.replaceChildren(el("b", {}, "Error: "), err instanceof ApiError ? err.message : String(err));
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
    clearInterval(ticker);
    fileLog.dispose();
    if (source) source.close();
    Object.values(charts).forEach((c) => c.destroy());
  };
}
