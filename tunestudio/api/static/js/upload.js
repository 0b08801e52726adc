// Upload a dataset from the browser (a file input or drag-and-drop) into the data directory's
// data/uploads (POST /api/uploads, multipart); uploaded files are listed for reuse and can be deleted.
// Choosing one puts its server path in the dataset field, so the job reads it like any local file.

import {api, ApiError} from "./api.js";
import {appendKids, confirmAction, el, fmtBytes, fmtWhen, replaceKids} from "./util.js";

const KINDS = ".jsonl,.json,.csv,.parquet";

export function mountUpload(box, {local, onChosen}) {
  const input = el("input", {type: "file", id: "upload-input", accept: KINDS, class: "visually-hidden"});
  const status = el("span", {class: "muted small", id: "upload-status", role: "status"});
  const zone = el("div", {class: "dropzone", id: "dropzone"},
    el("label", {for: "upload-input", class: "button ghost"}, "Upload a file…"), input,
    el("span", {class: "muted small"}, " or drop one here (JSONL, JSON, CSV, Parquet)"), " ", status);
  const list = el("ul", {class: "uploads", id: "uploads"});
  const details = el("details", {class: "uploads-card"}, el("summary", {}, "Uploaded datasets"), list);
  appendKids(box, zone, details);

  // What happened to the last upload; a refusal in the error colour, not as a grey hint.
  const say = (text, failed = false) => {
    status.textContent = text;
    status.className = failed ? "small upload-error" : "muted small";
  };
  const use = (path) => {
    local.value = path;
    onChosen();
  };
  const refresh = async () => {
    try {
      const {items, max_bytes: max} = await api.uploads();
      zone.dataset.max = String(max);
      details.hidden = items.length === 0;
      replaceKids(list, ...items.map((u) => el("li", {"data-upload": u.name},
        el("button", {type: "button", class: "link", title: u.path, onclick: () => use(u.path)}, u.name),
        el("span", {class: "muted small"}, ` ${fmtBytes(u.bytes)} · ${fmtWhen(u.modified)} `),
        el("button", {type: "button", class: "link danger", "aria-label": `delete ${u.name}`, onclick: async () => {
          if (!await confirmAction(`Delete ${u.name}?`, "The uploaded file is removed from the data directory. "
            + "Jobs that used it keep their results.", "Delete", "Keep it")) return;
          try { await api.deleteUpload(u.name); } catch (err) { say(err.message, true); }
          refresh();
        }}, "delete"))));
    } catch (err) {
      say(`Cannot list uploads: ${err.message}`, true);
    }
  };

  const send = async (file) => {
    const max = Number(zone.dataset.max || 0);
    if (max && file.size > max) {
      say(`${file.name} is ${fmtBytes(file.size)}; the limit is ${fmtBytes(max)} (TUNESTUDIO_MAX_UPLOAD_BYTES)`, true);
      return;
    }
    say(`Uploading ${file.name}…`);
    try {
      const stored = await api.upload(file);
      say(`Stored as ${stored.name} (${fmtBytes(stored.bytes)})`);
      use(stored.path);
      refresh();
    } catch (err) {
      say(err instanceof ApiError ? err.message : String(err), true);
    }
  };
  input.addEventListener("change", () => { if (input.files.length) send(input.files[0]); input.value = ""; });
  zone.addEventListener("dragover", (event) => { event.preventDefault(); zone.classList.add("over"); });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (event) => {
    event.preventDefault();
    zone.classList.remove("over");
    if (event.dataTransfer.files.length) send(event.dataTransfer.files[0]);
  });
  refresh();
}
