// The job list: status, model, dataset, when, how long, final loss and a loss sparkline
// per job; ticking two or more jobs overlays their loss curves (see compare.js).

import {api} from "./api.js";
import {sparkline} from "./charts.js";
import {
  appendKids, basename, datasetLabel, el, fmtDuration, fmtNumber, fmtWhen, jobBadge, ranFor, replaceKids,
} from "./util.js";

const POLL_MS = 2500;
const SPARK_POINTS = 80;
const NAME_CHARS = 48, NAME_TAIL = 16;  // a longer name keeps its first and last characters

/** A job's name in its row, on up to two lines: a longer one loses its middle, not its end (jobs named alike,
 * "stop and resume 1", "... 2", differ there); all of it on hover. */
function nameCell(cell, name, about) {
  const shown = name.length <= NAME_CHARS ? name
    : `${name.slice(0, NAME_CHARS - NAME_TAIL - 1).trimEnd()}…${name.slice(-NAME_TAIL).trimStart()}`;
  if (cell.textContent !== shown) cell.textContent = shown;
  cell.title = about.filter(Boolean).join(" · ");
}

export class JobList {
  constructor(container, {onSelect}) {
    this.container = container;
    this.onSelect = onSelect;   // called with the ticked ids
    this.rows = new Map();      // id -> {row, cells, spark, sparkFor}
    this.selected = new Set();
    this.activeId = null;
    this.timer = null;
    this.statuses = [];         // the status filter ("live": the server's own set); empty: every job
    this.table = el("div", {class: "jobs", id: "job-rows"});
    this.empty = el("p", {class: "muted empty"}, "No jobs yet. Start one with the form.");
    replaceKids(container, this.empty, this.table);
  }

  start() { this.refresh(); }

  async refresh() {
    clearTimeout(this.timer);
    try {
      const page = this.statuses.length ? await api.listJobsByStatus(this.statuses) : await api.listJobs();
      this.render(page.items);
    } catch (err) {
      this.empty.textContent = `Cannot list the jobs: ${err.message}`;
      this.empty.hidden = false;
    }
    this.timer = setTimeout(() => this.refresh(), POLL_MS);
  }

  /** "live", a comma-separated list of statuses, or "" for every job. */
  setFilter(value) {
    this.statuses = value === "live" ? ["live"] : value ? value.split(",") : [];
    this.empty.textContent = this.statuses.length ? "No jobs with this status." : "No jobs yet. Start one with the form.";
    this.refresh();
  }

  setActive(id) {
    this.activeId = id;
    for (const [jobId, r] of this.rows) r.row.classList.toggle("active", jobId === id);
  }

  setSelection(ids) {
    this.selected = new Set(ids);
    for (const [jobId, r] of this.rows) r.check.checked = this.selected.has(jobId);
  }

  render(items) {
    this.empty.hidden = items.length > 0;
    const ids = new Set(items.map((j) => j.id));
    for (const [id, r] of this.rows) {
      if (!ids.has(id)) { r.spark.destroy(); r.row.remove(); this.rows.delete(id); }
    }
    items.forEach((job, index) => {
      let r = this.rows.get(job.id);
      if (!r) r = this.addRow(job);
      const at = this.table.children[index];
      if (at !== r.row) this.table.insertBefore(r.row, at || null);
      this.update(r, job);
    });
  }

  addRow(job) {
    const check = el("input", {type: "checkbox", class: "pick", title: "compare", "aria-label": `compare ${job.id}`});
    check.addEventListener("click", (event) => event.stopPropagation());
    check.addEventListener("change", () => {
      if (check.checked) this.selected.add(job.id); else this.selected.delete(job.id);
      this.onSelect([...this.selected]);
    });
    const cells = {
      status: el("span", {class: "cell-status"}), model: el("span", {class: "cell-model"}),
      dataset: el("span", {class: "cell-dataset muted"}), when: el("span", {class: "cell-when muted"}),
      ran: el("span", {class: "cell-ran muted"}), loss: el("span", {class: "cell-loss"}),
    };
    const sparkBox = el("div", {class: "spark"});
    const row = el("a", {class: "job-row", href: `#/jobs/${job.id}`, "data-job-id": job.id},
      check,
      el("div", {class: "job-row-main"},
        // The name has a line of its own (two if it needs them): beside the badge it was cut to "stop and resum…".
        el("div", {class: "line"}, cells.model),
        el("div", {class: "line small"}, cells.status, cells.dataset, cells.when, cells.ran)),
      el("div", {class: "spark-col"}, sparkBox, cells.loss));
    const r = {row, check, cells, spark: sparkline(sparkBox), sparkFor: null, finalLoss: null};
    this.rows.set(job.id, r);
    appendKids(this.table, row);
    return r;
  }

  update(r, job) {
    replaceKids(r.cells.status, jobBadge(job));
    if (job.kind === "export") {
      const name = job.name || `export → ${job.config.target}`;
      nameCell(r.cells.model, name, [name, job.output_dir]);
      r.cells.dataset.textContent = `of ${job.source_job}`;
    } else if (job.kind === "bench") {  // a benchmark (bench.js): its tasks, of its source job
      const tasks = [...(job.config.tasks || []), ...(job.config.eval_file ? [basename(job.config.eval_file)] : [])];
      const name = job.name || `benchmark: ${tasks.join(", ")}`;
      nameCell(r.cells.model, name, [name, job.output_dir]);
      r.cells.dataset.textContent = `of ${job.source_job}`;
    } else {
      nameCell(r.cells.model, job.name || basename(job.config.model_name), [job.name, job.config.model_name]);
      r.cells.dataset.textContent = datasetLabel(job.config);
    }
    r.cells.when.textContent = fmtWhen(job.created_at);
    r.cells.ran.textContent = job.started_at ? `ran ${fmtDuration(ranFor(job))}`
      : job.queue_position ? `#${job.queue_position} in queue` : "";
    r.check.checked = this.selected.has(job.id);
    r.row.classList.toggle("active", job.id === this.activeId);
    // The sparkline (and the last loss it ends on) is fetched while a job lives, and once after it ends.
    const key = job.is_terminal ? `done:${job.status}` : `live:${job.last_seq}`;
    if (r.sparkFor !== key) {
      r.sparkFor = key;
      api.metrics(job.id, SPARK_POINTS).then(({records}) => {
        const train = records.filter((x) => x.loss !== null && x.loss !== undefined);
        r.spark.setData([train.map((x) => x.step), train.map((x) => x.loss)]);
        r.finalLoss = train.length ? train[train.length - 1].loss : null;
        r.cells.loss.textContent = r.finalLoss === null ? "" : fmtNumber(r.finalLoss);
        r.cells.loss.title = job.is_terminal ? "final loss" : "latest loss";
      }).catch(() => { r.sparkFor = null; });
    }
  }
}
