// About one job, beyond its progress: its name and notes (editable), its config (every field, the
// defaults greyed) with Clone to form, and Delete (with its artefacts or not) behind a confirmation.

import {api, ApiError} from "./api.js";
import {CLONE_KEY} from "./form.js";
import {confirmAction, el, insertAfter, replaceKids} from "./util.js";

let defaultsCache = null;
const fieldDefaults = async () => {
  defaultsCache ||= api.defaults().then((d) => Object.fromEntries(d.fields.map((f) => [f.name, f.default])));
  return defaultsCache;
};

const show = (v) => (v === null || v === undefined ? "unset" : typeof v === "object" ? JSON.stringify(v) : String(v));

export function mountJobInfo(box, job, {navigate, onChange, onTitle}) {
  const name = el("input", {type: "text", id: "job-name", maxlength: "200", placeholder: "a name for this job",
    "aria-label": "job name"});
  const notes = el("textarea", {id: "job-notes", rows: "2", maxlength: "10000", placeholder: "notes",
    "aria-label": "job notes"});
  const saved = el("span", {class: "muted small", id: "job-saved", role: "status"});
  const save = el("button", {type: "button", class: "button", id: "job-save"}, "Save");
  const clone = el("button", {type: "button", class: "button", id: "clone"}, "Clone to form");
  const del = el("button", {type: "button", class: "button danger", id: "delete"}, "Delete…");
  const delError = el("p", {class: "error-text small delete-error", id: "delete-error", role: "alert"});
  const config = el("table", {class: "config", id: "job-config"});
  // What the worker decided where the config left it a choice (the layers LoRA adapted, precision auto...).
  const resolved = el("table", {class: "config", id: "job-resolved"});
  const resolvedBox = el("div", {id: "job-resolved-box", hidden: true},
    el("h4", {}, "Decided by the worker"), resolved);
  const showResolved = () => {
    const rows = Object.entries(job.resolved || {});
    resolvedBox.hidden = rows.length === 0;
    replaceKids(resolved, el("tbody", {}, rows.map(([key, value]) => el("tr", {"data-key": key},
      el("th", {scope: "row"}, key), el("td", {}, el("code", {}, value))))));
  };
  showResolved();
  name.value = job.name || "";
  notes.value = job.notes || "";
  replaceKids(box,
    el("div", {class: "job-meta"}, el("div", {class: "grow"}, name, notes), el("div", {class: "actions"}, save, saved)),
    el("details", {class: "config-card", id: "config-card"},
      el("summary", {}, "Config"), el("div", {class: "actions"}, clone), resolvedBox, config),
    el("div", {class: "actions end"}, del, delError));
  // The samples (before/after) are the job view's (job.js), from the job's own `samples`.

  fieldDefaults().then((defaults) => {
    const rows = Object.entries(job.config).sort(([a], [b]) => a.localeCompare(b));
    replaceKids(config, el("tbody", {}, rows.map(([key, value]) => {
      const isDefault = key in defaults && JSON.stringify(defaults[key]) === JSON.stringify(value);
      return el("tr", {class: isDefault ? "default" : "set", "data-key": key},
        el("th", {scope: "row"}, key), el("td", {}, el("code", {}, show(value))),
        el("td", {class: "muted small"}, isDefault ? "default" : ""));
    })));
  });

  save.addEventListener("click", async () => {
    save.disabled = true;
    try {
      const updated = await api.renameJob(job.id, name.value, notes.value);
      saved.textContent = "saved";
      onTitle(updated.name);
      onChange();
    } catch (err) {
      saved.textContent = err instanceof ApiError ? err.message : String(err);
    } finally {
      save.disabled = false;
    }
  });
  clone.addEventListener("click", () => {
    // The worker's own choices (resume point, the output folder it was given) are not the user's, nor what a
    // sweep set for its trial's MLflow run.
    const {resume_from_checkpoint: _r, output_dir: _o, mlflow_parent_run_id: _p, mlflow_run_name: _n,
      ...rest} = job.config;
    // The rows it held out for evaluation, held out again (by content): the two evaluations compare.
    if (job.held_out) rest.held_out_rows = job.held_out.file;
    sessionStorage.setItem(CLONE_KEY, JSON.stringify(rest));
    navigate("#/new");
  });
  del.addEventListener("click", async () => {
    delError.textContent = "";
    const withArtefacts = el("input", {type: "checkbox", id: "delete-artefacts"});
    const dialog = document.getElementById("confirm");
    // Delete removes only what the job wrote (its ownership marker's list): files the user put there stay.
    const extra = el("label", {class: "check confirm-extra"}, withArtefacts,
      " also delete the files it wrote and its log (files you added to its folder stay)");
    const text = dialog.querySelector("#confirm-text");
    const ok = confirmAction(`Delete job ${job.id}?`, "The job leaves the list, with its metrics and events. "
      + "This cannot be undone.", "Delete", "Keep it");
    insertAfter(text, extra);
    const yes = await ok;
    extra.remove();
    if (!yes) return;
    try {
      try {
        await api.deleteJob(job.id, withArtefacts.checked);
      } catch (err) {
        // Its exports have files of their own: say which, and delete them too only if the user says so.
        const exports = err instanceof ApiError && err.status === 409 ? err.detail.exports : null;
        if (!exports || !exports.length) throw err;
        const also = await confirmAction(`Delete its exports too?`, `Job ${job.id} has ${exports.length} `
          + `export(s) with files: ${exports.join(", ")}. The files they wrote are deleted with it; files you `
          + "added to their folders stay.", "Delete them too", "Keep everything");
        if (!also) return;
        await api.deleteJob(job.id, true, true);
      }
      onChange();
      navigate("#/new");
    } catch (err) {
      delError.textContent = err instanceof ApiError ? err.message : String(err);
    }
  });

  return {
    update(next) {
      job = next;
      showResolved();
      del.hidden = !job.deletable;
      if (!job.deletable && job.resumed_by) del.title = `job ${job.resumed_by} was resumed from this one`;
    },
  };
}
