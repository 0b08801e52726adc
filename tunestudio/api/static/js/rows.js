// A finished job's held-out rows one by one (GET /api/jobs/{id}/rows), worst first: by loss or by a generation
// metric, with the dataset's reference and what each model answered, a page at a time. An image job's rows show
// their pictures (the rows file's thumbnails, data: URLs) beside the prompt; they have no loss of their own, so
// they are ordered by the first generation metric and the loss column goes. An audio job's rows have a player for
// their clip and its word and character error rates.

import {ApiError, call} from "./api.js";
import {appendKids, basename, el, fmtNumber, replaceKids} from "./util.js";

const PAGE = 20;
// The tool-call figures of held-out rows that come with tools (worker/train/tool_scores.py).
export const TOOL_LABELS = {tool_choice: "call or answer", tool_name: "function", tool_args: "call (name and arguments)",
  tool_arg_match: "arguments"};
const LABELS = {loss: "loss", exact_match: "exact match", token_f1: "token F1", rouge_l: "ROUGE-L", wer: "WER",
  cer: "CER", ...TOOL_LABELS};

const answer = (text) => (text === null || text === undefined ? "–" : text.trim() === "" ? "(empty)" : text);
const share = (v) => (v === null || v === undefined ? "–" : `${(100 * v).toFixed(1)}%`);
const loss = (v) => (v === null || v === undefined ? "–" : fmtNumber(v, 3));

/** The row's pictures, in its order, or null for a text row. */
function pictures(r, label) {
  const images = r.images || [];
  if (!images.length) return null;
  return el("div", {class: "row-images"}, images.map((src, n) => el("img", {src, class: "row-image",
    alt: `picture ${n + 1} of ${images.length} of row ${label}`, loading: "lazy"})));
}

export function rowsPanel(jobId, evaluation) {
  const tools = Object.keys(TOOL_LABELS).filter((k) => k in (evaluation.metrics || {}));  // a job with tool rows
  const speech = "wer" in (evaluation.metrics || {});  // an audio job's clips: error rates, lower is better
  const metrics = !evaluation.rows ? [] : speech ? ["wer", "cer"] : ["exact_match", "token_f1", "rouge_l", ...tools];
  const by = el("select", {id: "rows-by", "aria-label": "order the rows by"},
    ["loss", ...metrics].map((k) => el("option", {value: k}, LABELS[k])));
  const order = el("select", {id: "rows-order", "aria-label": "which rows first"},
    el("option", {value: "worst"}, "worst first"), el("option", {value: "best"}, "best first"));
  const body = el("tbody", {});
  const head = el("tr", {});
  const table = el("table", {class: "compare-table rows-table", id: "rows-table"}, el("thead", {}, head), body);
  const note = el("p", {class: "muted small", id: "rows-note", role: "status"});
  const more = el("button", {type: "button", class: "button", id: "rows-more", hidden: true}, "More rows");
  const node = el("section", {class: "eval-rows", id: "eval-rows"},
    el("h2", {}, "Held-out rows"),
    el("div", {class: "actions"}, el("label", {}, "by ", by), el("label", {}, "order ", order)),
    note, table, more);
  let offset = 0, token = 0, losses = true;

  const load = async (reset) => {
    const mine = ++token;
    if (reset) offset = 0;
    const query = `by=${by.value}&order=${order.value}&limit=${PAGE}&offset=${offset}`;
    let page;
    try {
      page = await call(`/api/jobs/${encodeURIComponent(jobId)}/rows?${query}`);
    } catch (err) {
      if (mine !== token) return;
      note.textContent = err instanceof ApiError ? err.message : String(err);
      more.hidden = true;
      return;
    }
    if (mine !== token) return;  // the user chose another order meanwhile
    if (losses && !page.loss && metrics.length) {  // rows without a loss of their own (an image job's)
      losses = false;
      by.querySelector('option[value="loss"]').remove();
      by.value = metrics[0];
      load(true);
      return;
    }
    const metric = by.value === "loss" ? null : by.value;
    if (reset) {
      replaceKids(head, el("th", {}, "row"), losses ? el("th", {class: "num"}, "loss (base → tuned)") : null,
        metric ? el("th", {class: "num"}, LABELS[metric]) : null,
        el("th", {}, "prompt"), el("th", {}, "reference"), el("th", {}, "fine-tuned"), el("th", {}, "base model"));
      replaceKids(body);
    }
    appendKids(body, ...page.rows.map((r) => {
      const label = r.file ? `${basename(r.file)}:${r.line}` : `#${r.index}`;
      return el("tr", {"data-index": String(r.index), "data-loss": String(r.loss ?? "")},
        el("td", {class: "muted small", title: r.file || ""}, label),
        losses ? el("td", {class: "num"}, `${loss(r.loss_before)} → `, el("b", {}, loss(r.loss))) : null,
        metric ? el("td", {class: "num"}, share(r[metric])) : null,
        el("td", {}, pictures(r, label), r.audio ? el("audio", {controls: true, preload: "none", src: r.audio,
          class: "row-audio", "aria-label": `clip of row ${label}`}) : null, el("pre", {}, r.prompt || "(plain text row)")),
        el("td", {}, el("pre", {}, r.reference)),
        el("td", {}, el("pre", {}, answer(r.answer))), el("td", {}, el("pre", {}, answer(r.answer_before))));
    }));
    offset += page.rows.length;
    const unranked = page.total - page.ranked;
    note.textContent = `${offset} of ${page.total} rows, ${order.value} ${LABELS[by.value]} first`
      + (unranked ? ` (${unranked} not answered come last)` : "") + (page.loss ? `. Loss: ${page.loss}.` : ".");
    more.hidden = offset >= page.total;
  };

  by.addEventListener("change", () => load(true));
  order.addEventListener("change", () => load(true));
  more.addEventListener("click", () => load(false));
  load(true);
  return {node, dispose() { token++; }};
}
