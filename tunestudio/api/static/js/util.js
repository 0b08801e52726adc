// Small DOM and formatting helpers shared by the page's views.

/** el("div", {class: "x", onclick: fn}, child, "text", ...) */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (value === true) node.setAttribute(key, "");
    else node.setAttribute(key, value);
  }
  return appendKids(node, ...children);
}

// The DOM writes a null, undefined or false handed to replaceChildren/append/before/after as the text "null"
// (a heading row once read "row | loss | null | prompt"): the page puts children only through these, which drop
// them as el() does. tests/api/test_static_js.py finds any raw call left.
const kept = (kids) => kids.flat().filter((kid) => kid !== null && kid !== undefined && kid !== false);

/** Replaces the children of `parent` with `kids`, less the nulls. */
export function replaceKids(parent, ...kids) {
  parent.replaceChildren(...kept(kids));
  return parent;
}

/** Appends `kids` to `parent`, less the nulls. */
export function appendKids(parent, ...kids) {
  parent.append(...kept(kids));
  return parent;
}

/** Puts `kids` right after `node`, less the nulls. */
export function insertAfter(node, ...kids) {
  node.after(...kept(kids));
}

export function basename(path) {
  if (!path) return "";
  const parts = String(path).replace(/\/+$/, "").split("/");
  return parts[parts.length - 1];
}

export function fmtNumber(value, digits = 4) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  if (value !== 0 && (Math.abs(value) < 1e-3 || Math.abs(value) >= 1e5)) return value.toExponential(2);
  return Number(value.toPrecision(digits)).toString();
}

export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "–";
  const s = Math.max(0, Math.round(seconds));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
  if (h) return `${h}h ${String(m).padStart(2, "0")}m`;
  if (m) return `${m}m ${String(r).padStart(2, "0")}s`;
  return `${r}s`;
}

export function fmtBytes(bytes) {
  const units = ["B", "KB", "MB", "GB", "TB"];
  let value = bytes, i = 0;
  while (value >= 1024 && i < units.length - 1) { value /= 1024; i++; }
  return `${i ? value.toFixed(1) : value} ${units[i]}`;
}

export function fmtWhen(ts) {
  if (!ts) return "–";
  const date = new Date(ts * 1000);
  const today = new Date().toDateString() === date.toDateString();
  return today ? date.toLocaleTimeString([], {hour: "2-digit", minute: "2-digit"})
    : date.toLocaleString([], {month: "short", day: "numeric", hour: "2-digit", minute: "2-digit"});
}

/** How long a job ran (or has been running). */
export function ranFor(job) {
  if (!job.started_at) return null;
  return (job.finished_at || Date.now() / 1000) - job.started_at;
}

export function datasetLabel(config) {
  if (config.hf_dataset) return config.hf_dataset;
  const paths = config.local_datasets || [];
  if (!paths.length) return "–";
  return basename(paths[0]) + (paths.length > 1 ? ` +${paths.length - 1}` : "");
}

export function statusBadge(status) {
  return el("span", {class: `badge status-${status}`, "data-status": status}, status.replaceAll("_", " "));
}

// A running job's status moves only at the worker's big phases; the steps inside one (evaluating_base,
// generating_base: the base model judged before training, the result after it) are its `phase` alone.
const RUNNING = new Set(["starting", "loading_model", "loading_dataset", "training", "saving"]);

/** What a job is doing: the step it is in while it runs (not "loading dataset" while it evaluates the base
 * model), else its status. */
export function jobActivity(job) {
  return RUNNING.has(job.status) && job.phase && !RUNNING.has(job.phase) ? job.phase : job.status;
}

/** A job's badge: coloured by its status, saying what it is doing (jobActivity). */
export function jobBadge(job) {
  const badge = statusBadge(job.status);
  badge.textContent = jobActivity(job).replaceAll("_", " ");
  return badge;
}

/** A section that folds away: a <details> whose summary is the section's own first h2 (moved there), opened as
 * the user last left this kind of section (kept in the browser), else as `open` says. */
export function fold(key, section, open = true) {
  const stored = localStorage.getItem(`tunestudio.fold.${key}`);
  const details = el("details", {class: "fold", id: `fold-${key}`, open: stored === null ? open : stored === "open"},
    el("summary", {}, section.querySelector("h2")), section);
  details.addEventListener("toggle", () => {  // a choice is kept only where it differs from the default
    if (details.open === open) localStorage.removeItem(`tunestudio.fold.${key}`);
    else localStorage.setItem(`tunestudio.fold.${key}`, details.open ? "open" : "closed");
  });
  return details;
}

/** A confirmation in the page's own dialog; resolves true when the user says yes. */
export function confirmAction(title, text, yesLabel, noLabel = "Keep it running") {
  const dialog = document.getElementById("confirm");
  dialog.querySelector("#confirm-no").textContent = noLabel;
  dialog.querySelector("#confirm-title").textContent = title;
  dialog.querySelector("#confirm-text").textContent = text;
  dialog.querySelector("#confirm-yes").textContent = yesLabel;
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), {once: true});
    dialog.showModal();
  });
}
