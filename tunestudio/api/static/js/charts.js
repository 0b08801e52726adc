import {fmtNumber, replaceKids} from "./util.js";

// Charts, drawn by uPlot (served from node_modules at /vendor/uplot). Colours come
// from the theme's CSS variables, so a theme switch rebuilds every live chart.

const live = new Set();

export function css(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

export const PALETTE = ["--c1", "--c2", "--c3", "--c4", "--c5", "--c6", "--c7", "--c8"];
export const colour = (i) => css(PALETTE[i % PALETTE.length]);

// Steps are whole numbers: ticks at 1, 2, 5 × 10^k only (never 2.5).
const STEP_INCRS = Array.from({length: 10}, (_, k) => [1, 2, 5].map((m) => m * 10 ** k)).flat();

/** Tick labels with as many decimals as the tick spacing needs, so no two ticks read the same. */
export function tickLabels(splits, incr) {
  if (!incr || !Number.isFinite(incr)) return splits.map((v) => fmtNumber(v, 3));
  const big = splits.some((v) => v !== 0 && (Math.abs(v) >= 1e5 || Math.abs(v) < 1e-3));
  if (big) {
    const digits = Math.max(1, Math.ceil(Math.log10(Math.max(...splits.map(Math.abs)) / incr)) + 1);
    return splits.map((v) => (v === 0 ? "0" : v.toExponential(Math.min(6, digits - 1))));
  }
  const decimals = Math.max(0, Math.min(10, -Math.floor(Math.log10(incr) + 1e-9)));
  return splits.map((v) => v.toFixed(decimals));
}

export function axis(extra = {}) {
  return {
    stroke: css("--muted"), grid: {stroke: css("--grid"), width: 1}, ticks: {stroke: css("--grid"), width: 1},
    font: `11px ${css("--font-mono") || "monospace"}`, ...extra,
  };
}

/** Draw each mark ({step, label}) as a dashed vertical line across the plot, its label at the top. */
function drawMarks(u, marks) {
  if (!marks.length) return;
  const ctx = u.ctx, dpr = devicePixelRatio || 1, {left, top, width, height} = u.bbox;
  ctx.save();
  ctx.strokeStyle = ctx.fillStyle = css("--ok");
  ctx.lineWidth = 1.5 * dpr;
  ctx.font = `${11 * dpr}px ${css("--font") || "sans-serif"}`;
  for (const {step, label} of marks) {
    const x = u.valToPos(step, "x", true);
    if (!Number.isFinite(x) || x < left - 1 || x > left + width + 1) continue;
    ctx.setLineDash([4 * dpr, 3 * dpr]);
    ctx.beginPath();
    ctx.moveTo(x, top);
    ctx.lineTo(x, top + height);
    ctx.stroke();
    ctx.setLineDash([]);
    const right = x > left + width / 2;  // the label on the side with room
    ctx.textAlign = right ? "right" : "left";
    ctx.fillText(label, x + (right ? -7 : 7) * dpr, top + 12 * dpr);  // clear of a point on the line
  }
  ctx.restore();
}

/**
 * A chart in `container`. `spec()` returns {series: [uPlot series after x], scales?, axes?, legend?, sparkline?};
 * `setData(data)` redraws at most once per animation frame, however often it is called; `setMarks(marks)`
 * draws [{step, label}] as vertical lines (the best step of early stopping).
 */
export class Chart {
  constructor(container, spec, {height = 220} = {}) {
    this.container = container;
    this.spec = spec;
    this.height = height;
    this.data = null;
    this.plot = null;
    this.pending = false;
    this.marks = [];
    this.observer = new ResizeObserver(() => this.resize());
    this.observer.observe(container);
    live.add(this);
  }

  options() {
    const spec = this.spec();
    const width = Math.max(this.container.clientWidth, 40);
    if (spec.sparkline) {
      return {
        width, height: this.height, pxAlign: false, cursor: {show: false}, select: {show: false},
        legend: {show: false}, scales: {x: {time: false}}, axes: [{show: false}, {show: false}],
        series: [{}, ...spec.series],
      };
    }
    return {
      width, height: this.height, pxAlign: false,
      scales: {x: {time: false}, ...(spec.scales || {})},
      // spec.xAxis: the x axis's own ticks (a sweep's parameter), else whole steps
      axes: [axis({label: spec.xLabel || "step", labelSize: 18, labelFont: `11px ${css("--font")}`,
        ...(spec.xAxis || {incrs: STEP_INCRS, values: (u, splits) => splits.map((v) => String(Math.round(v)))})}),
      ...(spec.axes || [axis({size: 60, values: (u, splits, ax, space, incr) => tickLabels(splits, incr)})])],
      legend: {live: true},
      // The legend shows each series' value at the hovered step, or nothing: uPlot's default would
      // show the nearest non-null value of a series with a gap there (another step's value).
      cursor: {drag: {x: true, y: false}, dataIdx: (u, seriesIdx, hoveredIdx) => hoveredIdx},
      series: [{label: spec.xLabel || "step"}, ...spec.series],
      hooks: {draw: [(u) => drawMarks(u, this.marks)]},
    };
  }

  setMarks(marks) {
    const key = JSON.stringify(marks);
    if (key === JSON.stringify(this.marks)) return;
    this.marks = marks;
    this.container.dataset.marks = marks.map((m) => m.step).join(",");
    if (this.plot) this.plot.redraw(false);
  }

  build() {
    if (this.plot) this.plot.destroy();
    replaceKids(this.container);
    this.plot = new uPlot(this.options(), this.data || [[]], this.container);
  }

  setData(data) {
    this.data = data;
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      if (!this.plot) this.build();
      else if (this.data[0].length === 0) this.build();
      else this.plot.setData(this.data);
      this.container.dataset.points = String(this.data[0].length);
    });
  }

  resize() {
    if (!this.plot) return;
    const width = Math.max(this.container.clientWidth, 40);
    if (Math.abs(width - this.plot.width) > 1) this.plot.setSize({width, height: this.height});
  }

  destroy() {
    this.observer.disconnect();
    if (this.plot) this.plot.destroy();
    this.plot = null;
    live.delete(this);
  }
}

export function rebuildAll() {
  for (const chart of live) if (chart.plot) chart.build();
}

// --- the job view's charts -------------------------------------------------------
export function lossChart(container, {parent = false} = {}) {
  return new Chart(container, () => ({
    series: [
      // The job this one resumed, before it, faded (see parent.js).
      ...(parent ? [{label: "before resume", stroke: css("--muted"), width: 1, dash: [4, 3], spanGaps: true,
        alpha: 0.6, points: {show: false}}] : []),
      {label: "loss", stroke: css("--c1-soft"), width: 1, points: {show: true, size: 4, fill: css("--c1-soft")}},
      {label: "moving avg", stroke: css("--c1"), width: 2, points: {show: false}},
      {label: "eval loss", stroke: css("--c3"), width: 2, spanGaps: true, points: {show: true, size: 6}},
    ],
  }), {height: 260});
}

export function singleChart(container, label, cssColour, {log = false} = {}) {
  return new Chart(container, () => ({
    series: [{label, stroke: css(cssColour), width: 1.5, points: {show: false}}],
    scales: log ? {y: {distr: 3}} : undefined,
  }), {height: 160});
}

/** The metric early stopping watches, one point per evaluation. */
export function watchChart(container, label) {
  return new Chart(container, () => ({
    series: [{label, stroke: css("--c5"), width: 2, spanGaps: true, points: {show: true, size: 6}}],
  }), {height: 200});
}

// TRL's metric names, as the page says them.
const METRIC_NAMES = {"rewards/margins": "reward margin", "rewards/accuracies": "accuracy (chosen > rejected)",
  "rewards/chosen": "reward of chosen", "rewards/rejected": "reward of rejected", kl: "KL", reward: "reward (mean)",
  reward_std: "reward spread (std)", frac_reward_zero_std: "groups with no spread"};

/** A method metric's name for people: "rewards/margins" → "reward margin",
 * "rewards/exact_match/mean" → "exact match reward". */
export function metricName(key) {
  return METRIC_NAMES[key] || key.replace(/^rewards\/(.+)\/mean$/, "$1 reward").replaceAll("_", " ");
}

// A share of rows or groups, 0..1: drawn on an axis of its own, in %.
const isShare = (key) => /accurac|^frac_/.test(key);

/** A training method's own metrics (reward margin, rewards per function, ...): one line per metric, a share
 * (DPO's accuracy) on a right-hand axis in % so that it does not flatten the rewards beside it. */
export function methodChart(container, keys) {
  const shares = keys.some(isShare);
  return new Chart(container, () => ({
    scales: shares ? {share: {range: [0, 1]}} : {},
    axes: shares ? [axis({size: 60, values: (u, splits, ax, space, incr) => tickLabels(splits, incr)}),
      axis({scale: "share", side: 1, size: 48, grid: {show: false},
        values: (u, splits) => splits.map((v) => `${Math.round(v * 100)}%`)})] : undefined,
    series: keys.map((key, i) => ({label: metricName(key), scale: isShare(key) ? "share" : "y", stroke: colour(i),
      width: i === 0 ? 2 : 1.5, spanGaps: true, points: {show: false}})),
  }), {height: 220});
}

export function sparkline(container) {
  return new Chart(container, () => ({
    sparkline: true, series: [{stroke: css("--c1"), width: 1.25, points: {show: false}}],
  }), {height: 26});
}

/** Loss curves of several jobs on one chart: `runs` = [{label, steps, losses}]. */
export function overlayChart(container, labels) {
  return new Chart(container, () => ({
    series: labels.map((label, i) => ({label, stroke: colour(i), width: 1.5, spanGaps: true, points: {show: false}})),
  }), {height: 360});
}

export function overlayData(runs) {
  if (!runs.length) return [[]];
  return uPlot.join(runs.map((r) => [r.steps, r.losses]));
}
