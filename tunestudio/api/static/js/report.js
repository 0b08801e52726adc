// The dataset report panel, beside the preview (POST /api/datasets/report): the form's files as a job would
// read them, every row: refused rows, duplicates, token lengths (a histogram, the rows max_seq_length cuts),
// the eval rows that repeat training rows, columns and roles; for rows with images, their sizes and formats, the
// unreadable ones and the pictures shown twice. It reads the whole dataset and tokenises it in a child process, so
// it runs when asked, not on every keystroke.

import {ApiError, call} from "./api.js";
import {Chart, colour} from "./charts.js";
import {basename, el, insertAfter, replaceKids} from "./util.js";

// The form's fields the report reads as a job does (unset: JobConfig's defaults, as for a job).
const FIELDS = ["max_seq_length", "method", "format_type", "custom_format_mapping", "reward_functions", "train_split",
  "eval_split", "eval_fraction", "held_out_rows", "random_seed", "dataset_slice_start", "dataset_slice_end", "train_on_completions", "dedupe",
  "image_splitting", "max_image_size"];
const SHOWN = 12;

/** The request for the form's config (only the fields the user changed are in it), or null for a hub dataset. */
export function reportRequest(config) {
  if (!config || !config.local_datasets || !config.local_datasets.length) return null;
  const body = {local_datasets: config.local_datasets};
  if (config.model_name) body.model_name = config.model_name;
  for (const name of FIELDS) if (config[name] !== undefined) body[name] = config[name];
  // A job holds rows out when it evaluates without an eval split: the report shows the same rows.
  body.held_out = Boolean(config.eval_steps) && !config.eval_split;
  return body;
}

// The last report's figures the estimate reads (rows, their mean tokens cut at max_seq_length, eval rows), kept
// with the request they answer: the estimate uses them only while the form still asks the same.
let lastFigures = null;

/** The figures of the last report for this config's request, or null. */
export function reportFigures(config) {
  const body = reportRequest(config);
  return body && lastFigures && lastFigures.key === JSON.stringify(body) ? lastFigures.figures : null;
}

function figures(report) {
  const lengths = report.lengths || {};
  const overlap = report.eval_overlap || {};
  const out = {rows: report.usable};
  if (lengths.rows) out.tokens_per_row = Math.max(0, (lengths.mean * lengths.rows - (lengths.cut_tokens || 0)) / lengths.rows);
  if (overlap.source) {
    out.eval_rows = overlap.eval_rows;
    if (overlap.source.startsWith("held-out")) out.held_out = overlap.eval_rows;
  }
  return out;
}

const where = (place) => `${basename(place.file)}:${place.line}`;
const count = (n) => Number(n).toLocaleString("en");

/** Mounts the panel after `anchor`; `currentConfig()` gives the form's config, `setField(name, value)` sets one
 * of its fields (the report's one click: drop the duplicates it found). Returns {dispose}. */
export function mountReport(anchor, currentConfig, setField) {
  const button = el("button", {type: "button", class: "button", id: "report-run"}, "Report on every row");
  const hint = el("span", {class: "muted small"}, " duplicates, lengths with the model's tokenizer, eval overlap");
  const out = el("div", {class: "report", id: "report", "aria-live": "polite"});
  const panel = el("div", {class: "preview report-panel", id: "report-panel"}, el("p", {}, button, hint), out);
  insertAfter(anchor, panel);
  let token = 0;
  let chart = null;

  const run = async () => {
    const mine = ++token;
    const body = reportRequest(currentConfig());
    if (!body) {
      replaceKids(out, el("p", {class: "muted"}, "The report reads local files; a hub dataset is read when the "
        + "job starts."));
      return;
    }
    button.disabled = true;
    replaceKids(out, el("p", {class: "muted"}, "Reading and tokenising every row…"));
    try {
      const report = await call("/api/datasets/report", {method: "POST", body});
      if (mine !== token) return;
      lastFigures = {key: JSON.stringify(body), figures: figures(report)};
      document.dispatchEvent(new CustomEvent("tunestudio:report"));  // the estimate counts the real rows now
      if (chart) chart.destroy();
      chart = null;
      replaceKids(out, ...render(report, setField));
      const box = out.querySelector("#report-histogram");
      if (box && report.lengths && report.lengths.rows) {
        chart = histogram(box, report.lengths);
      }
    } catch (err) {
      if (mine !== token) return;
      replaceKids(out, el("p", {class: "error-text"}, err instanceof ApiError ? err.message : String(err)));
    } finally {
      if (mine === token) button.disabled = false;
    }
  };
  button.addEventListener("click", run);
  return {dispose() { token++; if (chart) chart.destroy(); }};
}

function render(r, setField) {
  const parts = [el("p", {class: "preview-head", id: "report-summary"},
    `${count(r.rows)} rows read · ${count(r.usable)} usable · `,
    el("b", {id: "report-refused-count"}, `${count(r.refused_count)} refused`),
    ` · format ${r.format}${r.detected ? " (detected)" : ""} · ${r.description}`)];
  if (r.refused.length) {
    parts.push(table("report-refused", ["row", "why it is dropped"],
      r.refused.slice(0, SHOWN).map((x) => [where(x), x.reason]), r.refused_count));
  }
  if (r.images) parts.push(...images(r.images));
  const d = r.duplicates;
  parts.push(el("p", {id: "report-duplicates"}, el("b", {}, "Duplicates: "),
    `${count(d.exact)} exact${r.images ? "" : " (after normalising whitespace)"}, ${count(d.near)} near (${d.method})`,
    d.dedupe !== "off" ? ` · dedupe ${d.dedupe} removes ${count(d.removed)}` : "",
    dedupeOffer(r, setField)));
  if (d.examples.length) {
    parts.push(table("report-duplicate-examples", ["kind", "rows", "text"], d.examples.slice(0, SHOWN).map((x) => [
      x.kind === "exact" ? `exact ×${x.count}` : `near ${x.similarity}`,
      x.rows.slice(0, 4).map(where).join(", ") + (x.rows.length > 4 ? ", …" : ""), x.text])));
  }
  const l = r.lengths;
  if (!l) {
    parts.push(el("p", {class: "muted"}, "Token lengths need a model: fill in the model to measure the rows."));
  } else if (l.rows) {
    parts.push(el("p", {id: "report-lengths"}, el("b", {}, "Lengths "), `(tokens, ${basename(r.model)}): `,
      `min ${count(l.min)}, median ${count(l.median)}, max ${count(l.max)} · max_seq_length ${count(l.max_seq_length)} `,
      l.never_cut ? "refuses " : "cuts ", el("b", {id: "report-cut-rows"}, `${count(l.cut_rows)} rows`),
      l.never_cut ? " (image rows are never cut) · " : ` (${count(l.cut_tokens)} tokens lost) · `,
      `${count(l.keep_95)} keeps 95 % of rows whole, ${count(l.keep_99)} keeps 99 %`),
    el("div", {class: "chart", id: "report-histogram", role: "img",
      "aria-label": `histogram of row lengths in tokens, ${l.rows} rows`}));
  }
  const o = r.eval_overlap;
  parts.push(el("p", {id: "report-overlap"}, el("b", {}, "Eval overlap: "), o.source
    ? `${count(o.eval_rows)} eval rows (${o.source}): ${count(o.exact)} exact and ${count(o.near)} near copies of `
      + "training rows" + (o.images ? `; ${count(o.images)} more show a training row's picture` : "") : o.note));
  if (o.rows.length) {
    parts.push(table("report-overlap-rows", ["eval row", "training row", "kind"],
      o.rows.slice(0, SHOWN).map((x) => [where(x.eval), where(x.train), x.kind === "exact" ? "exact"
        : x.kind === "image" ? "same picture" : `near ${x.similarity}`]), o.exact + o.near + (o.images || 0)));
  }
  const columns = Object.entries(r.columns).map(([name, c]) => [name, count(c.rows), count(c.empty)]);
  const roles = Object.entries(r.roles).map(([name, c]) => [`${name} (role)`, count(c.turns), count(c.empty)]);
  parts.push(table("report-columns", ["column / role", "rows / turns", "empty"], [...columns, ...roles]));
  const t = r.tools;
  if (t && (t.tools_per_row.rows || t.calls_per_conversation.rows || t.reasoning_turns)) {
    const share = t.reasoning_share === null ? "" : ` (${(100 * t.reasoning_share).toFixed(1)} % of the tokens)`;
    parts.push(el("p", {id: "report-tools"}, el("b", {}, "Tool calls: "),
      `${count(t.tools_per_row.rows)} rows with tools (at most ${t.tools_per_row.max}) · `,
      `${count(t.calls_per_conversation.rows)} conversations with calls (${t.calls_per_conversation.mean} each) · `,
      `refused: ${count(t.undeclared_call_rows)} calling undeclared functions, `,
      `${count(t.arguments_not_json_rows)} with arguments not JSON · `,
      `${count(t.reasoning_turns)} turns with reasoning${share}`));
  }
  for (const note of r.notes) parts.push(el("p", {class: "muted small"}, note));
  return parts;
}

/** An image dataset's part (the report's `images`): counts, sizes and formats, the unreadable or missing images by
 * row, the pictures shown more than once, the image tokens. */
function images(m) {
  const size = (s) => (s ? `${s.min}–${s.max} px (median ${s.median})` : "–");
  const formats = Object.entries(m.formats).map(([f, n]) => `${f} ${count(n)}`).join(", ");
  const t = m.tokens && m.tokens.per_row;
  const parts = [el("p", {id: "report-images"}, el("b", {}, "Images: "),
    `${count(m.count)} named, ${count(m.read)} read, `, el("b", {id: "report-unreadable-count"},
      `${count(m.unreadable_count)} unreadable or missing`),
    ` · width ${size(m.width)}, height ${size(m.height)}${formats ? ` · ${formats}` : ""}`,
    ` · ${count(m.repeated)} showings repeat a picture (${count(m.distinct)} distinct)`,
    t ? ` · image tokens a row: median ${count(t.median)}, max ${count(t.max)} (${(100 * m.tokens.share).toFixed(1)} % `
      + "of the tokens)" : "")];
  if (m.unreadable.length) {
    parts.push(table("report-unreadable", ["row", "image", "why"],
      m.unreadable.slice(0, SHOWN).map((x) => [where(x), x.image, x.reason]), m.unreadable_count));
  }
  if (m.repeats.length) {
    parts.push(table("report-image-repeats", ["picture", "shown", "rows"], m.repeats.slice(0, SHOWN).map((x) => [
      x.image, `×${x.count}`, x.rows.slice(0, 4).map(where).join(", ") + (x.count > 4 ? ", …" : "")])));
  }
  return parts;
}

/** The one click for the duplicates found: set the form's dedupe (near when near duplicates were found, else exact)
 * and say how many rows are left, from the report's own counts. null when there is nothing (more) to drop. */
function dedupeOffer(r, setField) {
  const d = r.duplicates;
  const mode = d.near ? "near" : "exact";
  const drops = d.exact + (mode === "near" ? d.near : 0);
  if (!setField || !drops || d.removed >= drops) return null;
  const said = el("span", {id: "report-dedupe-left", role: "status"});
  const button = el("button", {type: "button", class: "button", id: "report-dedupe"}, "Drop duplicates in this job");
  button.addEventListener("click", () => {
    setField("dedupe", mode);
    button.disabled = true;
    const what = mode === "near" ? `${count(d.exact)} exact and ${count(d.near)} near duplicates`
      : `${count(d.exact)} exact duplicates`;
    said.textContent = ` Dedupe ${mode} is set (Advanced › Data): ${count(r.usable - drops)} of ${count(r.usable)} `
      + `rows are left for this job once ${what} go, the first of each kept.`;
  });
  return el("span", {}, " ", button, said);
}

function table(id, head, rows, total = rows.length) {
  return el("div", {},
    el("table", {class: "preview-rows", id},
      el("thead", {}, el("tr", {}, head.map((h) => el("th", {}, h)))),
      el("tbody", {}, rows.map((cells) => el("tr", {}, cells.map((c) => el("td", {}, String(c))))))),
    total > rows.length ? el("p", {class: "muted small"}, `… and ${count(total - rows.length)} more`) : null);
}

/** Rows per length bin as bars; the bins past max_seq_length in a second colour: a bin [start, next start) holds
 * only cut rows exactly when start > max_seq_length (a row of max_seq_length tokens fits; as the CLI marks them). */
function histogram(box, lengths) {
  const {edges, counts} = lengths.histogram;
  const cut = lengths.max_seq_length;
  const bars = () => uPlot.paths.bars({size: [0.9, 100], align: 1});
  const chart = new Chart(box, () => ({
    xLabel: "tokens",
    series: [
      {label: "rows", stroke: colour(0), fill: colour(0), paths: bars(), points: {show: false}},
      {label: `${lengths.never_cut ? "refused over" : "cut at"} ${cut}`, stroke: colour(3), fill: colour(3),
        paths: bars(), points: {show: false}},
    ],
  }), {height: 180});
  const starts = edges.slice(0, -1);
  chart.setData([starts, counts.map((c, i) => (starts[i] > cut ? null : c)),
    counts.map((c, i) => (starts[i] > cut ? c : null))]);
  return chart;
}
