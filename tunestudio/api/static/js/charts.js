import {fmtNumber} from "./util.js";

// Charts, drawn by uPlot (served from node_modules at /vendor/uplot). Colours come
// from the theme's CSS variables, so a theme switch rebuilds every live chart.

const live = new Set();

function css(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

export const PALETTE = ["--c1", "--c2", "--c3", "--c4", "--c5", "--c6", "--c7", "--c8"];
export const colour = (i) => css(PALETTE[i % PALETTE.length]);

function axis(extra = {}) {
  return {
    stroke: css("--muted"), grid: {stroke: css("--grid"), width: 1}, ticks: {stroke: css("--grid"), width: 1},
    font: `11px ${css("--font-mono") || "monospace"}`, ...extra,
  };
}

/**
 * A chart in `container`. `spec()` returns {series: [uPlot series after x], scales?, axes?, legend?, sparkline?};
 * `setData(data)` redraws at most once per animation frame, however often it is called.
 */
export class Chart {
  constructor(container, spec, {height = 220} = {}) {
    this.container = container;
    this.spec = spec;
    this.height = height;
    this.data = null;
    this.plot = null;
    this.pending = false;
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
      axes: [axis({label: spec.xLabel || "step", labelSize: 18, labelFont: `11px ${css("--font")}`}),
        ...(spec.axes || [axis({size: 60, values: (u, splits) => splits.map((v) => fmtNumber(v, 3))})])],
      legend: {live: true},
      cursor: {drag: {x: true, y: false}},
      series: [{label: "step"}, ...spec.series],
    };
  }

  build() {
    if (this.plot) this.plot.destroy();
    this.container.replaceChildren();
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
export function lossChart(container) {
  return new Chart(container, () => ({
    series: [
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

/** A training method's own metrics (reward margin, rewards per function, ...): one line per label. */
export function methodChart(container, labels) {
  return new Chart(container, () => ({
    series: labels.map((label, i) => ({label, stroke: colour(i), width: i === 0 ? 2 : 1.5, spanGaps: true,
      points: {show: false}})),
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
