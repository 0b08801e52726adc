// Resource charts of a job's page: CPU utilisation and resident memory of its processes (the worker and its
// children) over time and, when the job uses CUDA, GPU utilisation and memory. The worker samples them every few
// seconds (worker/resources.py); GET /api/jobs/{id}/resources gives the history up to the page's snapshot, the
// event stream's "resources" events the rest.

import {call} from "./api.js";
import {Chart, axis, css, tickLabels} from "./charts.js";
import {el, fmtDuration, fmtNumber} from "./util.js";

const MAX_SAMPLES = 20000;  // the worker sends far fewer (its interval doubles); a bound all the same

function twoAxes(container, [left, leftLabel, leftColour], [right, rightLabel, rightColour]) {
  const values = (u, splits, ax, space, incr) => tickLabels(splits, incr);
  return new Chart(container, () => ({
    xLabel: "time",
    xAxis: {values: (u, splits) => splits.map((v) => fmtDuration(v))},
    scales: {y: {range: (u, min, max) => [0, Math.max(100, max)]}, mem: {range: (u, min, max) => [0, max * 1.1 || 1]}},
    axes: [axis({size: 48, label: leftLabel, labelSize: 18, labelFont: `11px ${css("--font")}`, values}),
      axis({scale: "mem", side: 1, size: 60, grid: {show: false}, label: rightLabel, labelSize: 18,
        labelFont: `11px ${css("--font")}`, values})],
    series: [{label: left, stroke: css(leftColour), width: 1.5, spanGaps: true, points: {show: false}},
      {label: right, scale: "mem", stroke: css(rightColour), width: 1.5, spanGaps: true, points: {show: false}}],
  }), {height: 180});
}

export function resourcesPanel(job) {
  const cpuBox = el("div", {class: "chart", id: "resources-chart"});
  const gpuBox = el("div", {class: "chart", id: "gpu-chart"});
  const gpuPart = el("div", {hidden: true}, el("h3", {}, "GPU"), gpuBox);
  const note = el("p", {class: "muted small", id: "resources-note"}, "No samples yet.");
  const node = el("section", {class: "chart-card wide", id: "resources"},
    el("h2", {}, "CPU and memory"), cpuBox, gpuPart, note);
  const charts = {cpu: twoAxes(cpuBox, ["CPU %", "% of a core", "--c1"], ["RSS MiB", "MiB", "--c3"])};
  const samples = [];
  let lastSeq = 0;

  const draw = () => {
    const t0 = job.started_at || (samples[0] && samples[0].ts) || 0;
    const xs = samples.map((s) => s.ts - t0);
    charts.cpu.setData([xs, samples.map((s) => s.cpu_percent), samples.map((s) => s.rss_mb)]);
    cpuBox.dataset.samples = String(samples.length);
    const gpu = samples.some((s) => s.gpu_memory_mb !== null && s.gpu_memory_mb !== undefined);
    if (gpu && !charts.gpu) {
      gpuPart.hidden = false;
      charts.gpu = twoAxes(gpuBox, ["GPU %", "% busy", "--c2"], ["GPU MiB", "MiB", "--c4"]);
    }
    if (charts.gpu) charts.gpu.setData([xs, samples.map((s) => s.gpu_percent ?? null),
      samples.map((s) => s.gpu_memory_mb ?? null)]);
    const last = samples[samples.length - 1];
    note.textContent = !last ? "No samples yet."
      : `now: CPU ${fmtNumber(last.cpu_percent, 3)}% of a core, ${fmtNumber(last.rss_mb, 4)} MiB resident in `
        + `${last.processes} process${last.processes === 1 ? "" : "es"}`
        + (last.gpu_memory_mb !== null && last.gpu_memory_mb !== undefined
          ? `; GPU ${last.gpu_percent ?? "–"}%, ${fmtNumber(last.gpu_memory_mb, 4)} MiB` : "");
  };

  /** One sample ({seq, ts, cpu_percent, rss_mb, ...}); one the page has already is ignored. */
  const add = (sample, redraw = true) => {
    if (sample.seq <= lastSeq) return;
    lastSeq = sample.seq;
    samples.push(sample);
    if (samples.length > MAX_SAMPLES) samples.splice(0, samples.length - MAX_SAMPLES);
    if (redraw) draw();
  };

  return {
    node,
    add,
    /** The history up to the page's snapshot (the job's last_seq); the stream brings what follows. */
    async load(upto) {
      try {
        const page = await call(`/api/jobs/${encodeURIComponent(job.id)}/resources?upto=${upto}`);
        for (const s of page.samples) add(s, false);
      } catch (err) {
        note.textContent = `The resource history could not be read: ${err.message}`;
        return;
      }
      draw();
    },
    update(next) { job = next; },
    dispose() { Object.values(charts).forEach((c) => c.destroy()); },
  };
}
