// What a finished job shows besides its charts, in the order a user reads it. The before/after figures (the
// evaluation; a benchmark job's scores) sit under the charts at the top of the page; the long sections fold away
// below them (util.js fold), each as the user last left it: samples, output, held-out rows (folded at first: 20
// rows of text), chat, judge, export, benchmarks. Before, they stood above the loss chart and pushed it about
// 2,900 px down the page (issue 38, finding 7).

import {api} from "./api.js";
import {benchPanel, benchTable} from "./bench.js";
import {chatPanel} from "./chat.js";
import {exportPanel} from "./export.js";
import {judgePanel} from "./judge.js";
import {TOOL_LABELS, rowsPanel} from "./rows.js";
import {transcribePanel} from "./transcribe.js";
import {el, fmtBytes, fmtNumber, fold, replaceKids} from "./util.js";

export const METRIC_LABELS = {exact_match: "exact match", token_f1: "token F1", rouge_l: "ROUGE-L",
  eval_loss: "eval loss", perplexity: "perplexity", wer: "word error rate (lower is better)",
  cer: "character error rate (lower is better)", ...TOOL_LABELS};
const SHARES = new Set(["exact_match", "token_f1", "rouge_l", "wer", "cer", ...Object.keys(TOOL_LABELS)]);

/** A model's answer as shown: "–" when there is none yet, "(empty)" when the model said nothing. */
function answerText(text) {
  return text === null || text === undefined ? "–" : text.trim() === "" ? "(empty)" : text;
}

export function metricCell(name, v) {
  return v === null || v === undefined ? "–" : SHARES.has(name) ? `${(100 * v).toFixed(1)}%` : fmtNumber(v);
}

function evaluationTable(evaluation) {
  const cell = metricCell;
  const rows = Object.entries(evaluation.metrics).filter(([, m]) => m.before !== null || m.after !== null);
  return el("section", {class: "evaluation", id: "evaluation"},
    el("h2", {}, evaluation.rows ? `Evaluation on ${evaluation.rows} held-out rows` : "Evaluation"),
    el("table", {class: "compare-table metrics-table"},
      el("thead", {}, el("tr", {}, el("th", {}, "metric"), el("th", {class: "num"}, "base model"),
        el("th", {class: "num"}, "fine-tuned"))),
      el("tbody", {}, rows.map(([name, m]) => el("tr", {"data-metric": name}, el("td", {}, METRIC_LABELS[name] || name),
        el("td", {class: "num"}, cell(name, m.before)), el("td", {class: "num after"}, cell(name, m.after)))))),
    evaluation.examples.length ? el("details", {class: "examples"}, el("summary", {}, "Examples"),
      el("table", {class: "compare-table"}, el("thead", {}, el("tr", {}, el("th", {}, "prompt"),
        el("th", {}, "reference"), el("th", {}, "base model"), el("th", {}, "fine-tuned"))),
      el("tbody", {}, evaluation.examples.map((x) => el("tr", {}, el("td", {}, el("pre", {}, x.prompt)),
        el("td", {}, el("pre", {}, x.reference)), el("td", {}, el("pre", {}, answerText(x.before))),
        el("td", {}, el("pre", {}, answerText(x.after))))))))
      : null);
}

function samplesSection(samples) {
  return el("section", {class: "samples", id: "samples"}, el("h2", {}, "Samples"),
    el("table", {class: "compare-table"}, el("thead", {}, el("tr", {}, el("th", {}, "prompt"),
      el("th", {}, "base model"), el("th", {}, "fine-tuned"))),
    el("tbody", {}, samples.map((s) => el("tr", {}, el("td", {}, el("pre", {}, s.prompt)),
      el("td", {}, el("pre", {}, answerText(s.before))), el("td", {}, el("pre", {}, answerText(s.after))))))));
}

/** Where the job's files are: only what exists on disk (a failed or cancelled job has no output folder). */
function outputParts(job) {
  const metrics = Object.entries(job.final_metrics || {});
  return [
    el("p", {}, el("code", {id: "output-dir", class: "path"}, job.output_dir || "–")),
    job.checkpoint ? el("p", {class: "muted"}, "checkpoint: ", el("code", {class: "path"}, job.checkpoint)) : null,
    el("table", {class: "artefacts", id: "artefacts"},
      el("tbody", {}, job.artefacts.map((a) => el("tr", {},
        el("td", {}, el("code", {}, a.name + (a.is_dir ? "/" : ""))), el("td", {class: "num"}, fmtBytes(a.bytes)))))),
    metrics.length ? el("p", {class: "muted small"}, metrics.map(([k, v]) => `${k} ${fmtNumber(v)}`).join(" · ")) : null,
  ];
}

/** The job's sections: {figures (for the top), folds (below the charts), update(job), dispose()}. */
export function jobSections(job, {navigate}) {
  const isBench = job.kind === "bench", isExport = job.kind === "export" || isBench;
  const figures = el("div", {class: "judged", id: "judged", hidden: true});
  const slot = (name) => el("div", {id: `${name}-slot`});
  const slots = {samples: slot("samples"), rows: slot("rows"), chat: slot("chat"), judge: slot("judge"),
    export: el("div", {id: "export-box"}), bench: el("div", {id: "bench-box"})};
  const outputTitle = el("h2", {}, "Output");
  const results = el("div", {class: "results", id: "results"});
  const output = fold("output", el("section", {class: "output"}, outputTitle, results));
  output.hidden = true;
  const folds = el("div", {class: "folds"}, slots.samples, output, slots.rows, slots.chat, slots.judge, slots.export,
    slots.bench);
  const views = {};  // the panels made so far, made once each: rows, chat, judge, export, bench
  let samplesShown = false, benchShown = false, evaluationShown = "";

  const make = (name, build) => {
    if (views[name]) return;
    views[name] = build();
    replaceKids(slots[name], fold(name, views[name].node, name !== "rows"));
  };
  const drawFigures = () => {
    const evaluation = job.evaluation ? JSON.stringify(job.evaluation) : "";
    if (evaluation && evaluation !== evaluationShown) {  // drawn again only when it changed: keeps Examples open
      evaluationShown = evaluation;
      replaceKids(figures, evaluationTable(job.evaluation));
      figures.hidden = false;
    }
    if (!samplesShown && (job.samples || []).length) {
      samplesShown = true;
      replaceKids(slots.samples, fold("samples", samplesSection(job.samples)));
    }
  };
  const drawOutput = () => {
    const finished = job.is_terminal && job.artefacts.length > 0;
    output.hidden = !finished;
    if (!finished) return;
    const complete = job.status === "completed" || job.status === "stopped";
    results.classList.toggle("partial", !complete);
    outputTitle.textContent = complete ? "Output" : "Left on disk";
    replaceKids(results, outputParts(job));
    drawFigures();
    if (job.evaluation && job.evaluation.rows_file) make("rows", () => rowsPanel(job.id, job.evaluation));
    if (job.chattable && job.config && job.config.is_dataset_audio) {
      make("chat", () => transcribePanel(job.id));  // a speech model transcribes; it does not chat
    } else if (job.chattable) {
      make("chat", () => chatPanel(job.id));
      make("judge", () => judgePanel(job.id));
    }
  };
  const drawBenchResult = () => {
    benchShown = true;
    api.benchmarks(job.source_job).then((page) => {
      const mine = page.benchmarks.find((b) => b.id === job.id);
      if (!mine || !mine.result) return;
      replaceKids(figures, el("section", {class: "results", id: "bench-result"}, el("h2", {}, "Benchmark"),
        benchTable(mine.result)));
      figures.hidden = false;
    }).catch(() => {});
  };
  const update = (next) => {
    job = next;
    drawOutput();
    // A finished training job with a result gets the Export and Benchmarks panels; a benchmark shows its figures.
    if (!isExport && job.has_result) {
      make("export", () => {
        const panel = exportPanel(job, {navigate});
        return {node: panel, dispose: () => panel.dispose()};
      });
      make("bench", () => {
        const panel = benchPanel(job);
        return {node: panel, dispose: () => panel.dispose()};
      });
    }
    if (isBench && job.is_terminal && !benchShown) drawBenchResult();
  };
  return {figures, folds, update, dispose: () => Object.values(views).forEach((v) => v.dispose())};
}
