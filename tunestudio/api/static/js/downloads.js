// The Downloads section of a job's page: its adapter or model as a zip, the files of its output folder (an export's
// result) or of its exports, with sizes, its metrics as CSV and its worker log (GET /api/jobs/{id}/downloads says
// what there is; routes/downloads.py serves each).
//
// Each is api.js's downloadLink: a plain link (the browser streams a big zip straight to disk), fetched with the
// token on a server that has one.

import {ApiError, call, downloadLink} from "./api.js";
import {el, fmtBytes, replaceKids} from "./util.js";

const base = (id) => `/api/jobs/${encodeURIComponent(id)}`;
const fileUrl = (id, name) => `${base(id)}/files/${name.split("/").map(encodeURIComponent).join("/")}`;

export function downloadsPanel(job) {
  const id = job.id;
  const body = el("div", {id: "downloads-body"}, el("p", {class: "muted small"}, "Looking for files…"));
  const error = el("div", {class: "error-box", id: "downloads-error", hidden: true});
  const node = el("section", {class: "chart-card wide downloads", id: "downloads"},
    el("h2", {}, "Downloads"), error, body);
  let shown = null, disposed = false;  // the status the listing was made for

  const link = (url, filename, text, attrs = {}) => downloadLink(url, filename, text, attrs, say);
  const say = (err) => {
    error.hidden = false;
    replaceKids(error, el("b", {}, "Error: "), err instanceof ApiError ? err.message : String(err));
  };
  const fileTable = (owner, files, tableId) => el("table", {class: "artefacts", id: tableId},
    el("tbody", {}, files.map((f) => el("tr", {},
      el("td", {}, link(fileUrl(owner, f.name), f.name.split("/").pop(), el("code", {}, f.name),
        {"data-file": f.name})),
      el("td", {class: "num"}, fmtBytes(f.bytes))))));

  const draw = (found) => {
    const items = [];
    if (found.weights) {
      const w = found.weights;
      items.push(el("p", {}, link(`${base(id)}/download`, w.filename,
        w.kind === "adapter" ? "Adapter (zip)" : "Model (zip)", {id: "download-weights", class: "button ghost"}),
      el("span", {class: "muted small"}, ` ${w.files.length} files, ${fmtBytes(w.bytes)}`)));
    } else if (job.kind === "train") {
      items.push(el("p", {class: "muted small", id: "download-weights-note"}, found.weights_note));
    }
    if (found.metrics) {
      items.push(el("p", {}, link(`${base(id)}/metrics.csv`, `${id}-metrics.csv`, "Metrics (CSV)",
        {id: "download-metrics", class: "button ghost"}),
      el("span", {class: "muted small"}, ` ${found.metrics} records`)));
    }
    if (found.log) {
      items.push(el("p", {}, link(`${base(id)}/log?download=true`, `${id}-worker.log`, "Worker log",
        {id: "download-log", class: "button ghost"})));
    }
    const parts = [el("div", {class: "download-list"}, items)];
    // An export's (or a benchmark's) result is its files; a training job's files are in the zip above.
    if (job.kind !== "train" && found.files.length) {
      parts.push(el("h3", {}, "Files"), fileTable(id, found.files, "download-files"));
    } else if (job.kind !== "train" && job.is_terminal) {
      parts.push(el("p", {class: "muted small"}, "No files in its output folder."));
    }
    for (const exp of found.exports) {
      const what = `${exp.target || "export"}${exp.quantization ? ` ${exp.quantization}` : ""}`;
      parts.push(el("h3", {}, "Export ", el("a", {href: `#/jobs/${exp.id}`}, exp.id), ` (${what}, ${exp.status})`),
        exp.files.length ? fileTable(exp.id, exp.files, `download-export-${exp.id}`)
          : el("p", {class: "muted small"}, "No files (yet)."));
    }
    replaceKids(body, ...parts);
  };

  const refresh = async () => {
    try {
      const found = await call(`${base(id)}/downloads`);
      if (!disposed) {
        error.hidden = true;
        draw(found);
      }
    } catch (err) {
      if (!disposed) say(err);
    }
  };

  return {
    node,
    /** The job changed: list again when its status did (its files come with its end). */
    update(next) {
      job = next;
      if (shown === job.status) return;
      shown = job.status;
      refresh();
    },
    dispose() { disposed = true; },
  };
}
