// One job's metric records, in step order, without duplicates: the data behind its charts.
//
// A record is a training record (it has `loss`) or an eval-only record (`eval_loss`, no
// `loss`). The page fills this from GET /metrics and then from the event stream; a
// record whose step is not past the last one of its kind is one it already has, and
// is dropped. That is what makes a reload neither lose nor repeat a point.

export class MetricSeries {
  constructor() {
    this.train = [];   // records with a loss, strictly increasing step
    this.evals = [];   // records with an eval_loss, strictly increasing step
    this.latest = null;
  }

  /** Add one record; returns false when it was already there. */
  add(record) {
    if (!record || record.step === undefined) return false;
    const list = record.loss !== null && record.loss !== undefined ? this.train
      : record.eval_loss !== null && record.eval_loss !== undefined ? this.evals : null;
    if (list === null) return false;
    const last = list.length ? list[list.length - 1].step : -Infinity;
    if (record.step <= last) return false;
    list.push(record);
    if (!this.latest || record.step >= this.latest.step) this.latest = record;
    return true;
  }

  addAll(records) {
    let added = 0;
    for (const r of records) if (this.add(r)) added++;
    return added;
  }

  get lastTrain() { return this.train.length ? this.train[this.train.length - 1] : null; }

  /** Steps of the loss points, for tests and for the page's own checks. */
  lossSteps() { return this.train.map((r) => r.step); }

  /** Trailing moving average of the loss; the window grows with the run (1/10 of it, 2..50 points). */
  movingAverage() {
    const n = this.train.length;
    const window = Math.max(2, Math.min(50, Math.ceil(n / 10)));
    const out = new Array(n);
    let sum = 0;
    for (let i = 0; i < n; i++) {
      sum += this.train[i].loss;
      if (i >= window) sum -= this.train[i - window].loss;
      out[i] = sum / Math.min(i + 1, window);
    }
    return out;
  }

  /** uPlot data: x = every step with a train or eval record; raw loss, moving average, eval loss. */
  lossData() {
    const ma = this.movingAverage();
    const xs = [], raw = [], avg = [], ev = [];
    let i = 0, j = 0;
    const t = this.train, e = this.evals;
    while (i < t.length || j < e.length) {
      const ts = i < t.length ? t[i].step : Infinity;
      const es = j < e.length ? e[j].step : Infinity;
      const step = Math.min(ts, es);
      xs.push(step);
      if (ts === step) { raw.push(t[i].loss); avg.push(ma[i]); i++; } else { raw.push(null); avg.push(null); }
      if (es === step) { ev.push(e[j].eval_loss); j++; } else { ev.push(null); }
    }
    return [xs, raw, avg, ev];
  }

  /** The keys of the method's own metrics (record.extra) the training records hold, in first-seen order. */
  extraKeys() {
    const keys = new Set();
    for (const r of this.train) for (const k of Object.keys(r.extra || {})) keys.add(k);
    return [...keys];
  }

  /** uPlot data for method metrics: x = steps of training records with any of `keys`, one series per key. */
  extraData(keys) {
    const rows = this.train.filter((r) => r.extra && keys.some((k) => r.extra[k] !== undefined));
    return [rows.map((r) => r.step), ...keys.map((k) => rows.map((r) => r.extra[k] ?? null))];
  }

  /** uPlot data of one figure of the evaluations during training (step > 0): eval_loss, or a key of `extra`. */
  evalData(key) {
    const value = (r) => (key === "eval_loss" ? r.eval_loss : (r.extra || {})[key]);
    const rows = this.evals.filter((r) => r.step > 0 && value(r) !== undefined && value(r) !== null);
    return [rows.map((r) => r.step), rows.map(value)];
  }

  seriesData(key) {
    const rows = this.train.filter((r) => r[key] !== null && r[key] !== undefined);
    return [rows.map((r) => r.step), rows.map((r) => r[key])];
  }
}
