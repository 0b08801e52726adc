// Settings as a job file: "Copy as job file" (the YAML `tunestudio train` reads) and "Copy as CLI command" (a
// shell command that writes that file and runs it) for a job's page and for the form, and "Paste a job file…"
// into the form. The server renders and reads the YAML (GET /api/jobs/{id}/jobfile, POST /api/jobfile,
// POST /api/jobfile/parse), so what is copied is exactly what the CLI reads; secrets never leave it.

import {ApiError, call} from "./api.js";
import {appendKids, el, insertAfter, replaceKids} from "./util.js";

const WHAT = {yaml: "job file", command: "CLI command"};

/**
 * The text copied: to the clipboard where the page may use it (a secure context that lets it), and always shown
 * in a read-only box below, selected when the clipboard could not take it, so Ctrl+C copies it.
 */
async function copyInto(out, text, kind) {
  const box = el("textarea", {class: "copy-text", id: "copy-text", readonly: true, spellcheck: "false",
    rows: String(Math.min(16, text.split("\n").length + 1)), "aria-label": `the ${WHAT[kind]}`});
  box.value = text;
  const said = el("p", {class: "small copy-said", id: "copy-said", role: "status"});
  replaceKids(out, said, box);
  out.hidden = false;
  out.dataset.kind = kind;
  let copied = false;
  if (window.isSecureContext && navigator.clipboard && navigator.clipboard.writeText) {
    try {
      await navigator.clipboard.writeText(text);
      copied = true;
    } catch { /* refused (no permission, page not focused): the box below is the way */ }
  }
  said.textContent = copied ? `Copied the ${WHAT[kind]} to the clipboard.`
    : `The clipboard is not open to this page: the ${WHAT[kind]} is selected below, copy it with Ctrl+C (⌘C).`;
  if (!copied) {
    box.focus();
    box.select();
  }
}

function copyButtons(prefix) {
  return {
    yaml: el("button", {type: "button", class: "button", id: `${prefix}copy-jobfile`}, "Copy as job file"),
    command: el("button", {type: "button", class: "button", id: `${prefix}copy-command`}, "Copy as CLI command"),
  };
}

/** A job's page: the two copy buttons beside `actions` (its config card's), the copied text after them. */
export function mountJobFile(actions, jobId) {
  const buttons = copyButtons("");
  const out = el("div", {class: "copy-out", id: "jobfile-out", hidden: true});
  appendKids(actions, buttons.yaml, buttons.command);
  insertAfter(actions, out);
  let file = null;
  for (const [kind, button] of Object.entries(buttons)) {
    button.addEventListener("click", async () => {
      button.disabled = true;
      try {
        file ||= await call(`/api/jobs/${encodeURIComponent(jobId)}/jobfile`);
        await copyInto(out, file[kind], kind);
      } catch (err) {
        out.hidden = false;
        replaceKids(out, el("p", {class: "error-text", role: "alert"},
          err instanceof ApiError ? err.message : String(err)));
      } finally {
        button.disabled = false;
      }
    });
  }
}

/**
 * The form's bar: copy what the form would send (checked as a submit checks it: errors go to their fields) and
 * paste a job file into it. `collect()` gives {config, errors}; `fill(config)` sets every field from a config;
 * `showErrors(errors, summary)` and `clearErrors()` are the form's own; `jobName` is the form's name input (the
 * job's, not its config's: the file's `name`).
 */
export function mountFormJobFile(form, {collect, fill, showErrors, clearErrors, jobName}) {
  const buttons = copyButtons("form-");
  const paste = el("button", {type: "button", class: "button", id: "paste-jobfile"}, "Paste a job file…");
  const out = el("div", {class: "copy-out", id: "form-jobfile-out", hidden: true});
  const bar = el("div", {class: "actions jobfile-bar", id: "jobfile-bar"}, buttons.yaml, buttons.command, paste);
  insertAfter(form.querySelector("h1"), bar, out);

  for (const [kind, button] of Object.entries(buttons)) {
    button.addEventListener("click", async () => {
      clearErrors();
      const {config, errors} = collect();
      if (errors.length) {
        showErrors(errors, "fix the fields marked in red");
        return;
      }
      button.disabled = true;
      try {
        const name = jobName.value.trim();
        const file = await call(`/api/jobfile${name ? `?name=${encodeURIComponent(name)}` : ""}`,
          {method: "POST", body: config});
        await copyInto(out, file[kind], kind);
      } catch (err) {
        out.hidden = true;
        if (err instanceof ApiError) showErrors(err.fieldErrors, err.message);
        else showErrors([], String(err));
      } finally {
        button.disabled = false;
      }
    });
  }

  // --- paste: a dialog whose text is read as `tunestudio train` reads a job file --------------------------
  const text = el("textarea", {id: "jobfile-text", rows: "12", spellcheck: "false",
    placeholder: "model_name: ./models/tiny-llama\nlocal_datasets:\n- examples/data/alpaca.jsonl\nmax_steps: 60"});
  const problems = el("ul", {class: "error-text jobfile-errors", id: "jobfile-errors"});
  const read = el("button", {type: "button", class: "button primary", id: "jobfile-fill"}, "Fill the form");
  const cancel = el("button", {type: "button", class: "button ghost", id: "jobfile-cancel"}, "Cancel");
  const dialog = el("dialog", {id: "jobfile-dialog", "aria-labelledby": "jobfile-title"},
    el("h2", {id: "jobfile-title"}, "Paste a job file"),
    el("label", {for: "jobfile-text"}, "The YAML (or JSON) that ", el("code", {}, "tunestudio train"),
      " reads; its fields replace the form's."),
    text, el("div", {role: "alert"}, problems), el("div", {class: "actions"}, cancel, read));
  insertAfter(form, dialog);
  paste.addEventListener("click", () => {
    replaceKids(problems);
    dialog.showModal();
    text.focus();
  });
  cancel.addEventListener("click", () => dialog.close());
  read.addEventListener("click", async () => {
    replaceKids(problems);
    read.disabled = true;
    try {
      const parsed = await call("/api/jobfile/parse", {method: "POST", body: {text: text.value}});
      clearErrors();
      fill(parsed.config);
      if (parsed.name) jobName.value = parsed.name;
      dialog.close();
      const left = parsed.secrets_left_out;
      // The form's list fields hold one item a line: an item with line breaks in it comes apart there.
      const split = Object.entries(parsed.config).filter(([, v]) => Array.isArray(v)
        && v.some((item) => typeof item === "string" && item.includes("\n"))).map(([k]) => k);
      out.hidden = false;
      replaceKids(out, el("p", {class: "small copy-said", id: "jobfile-filled", role: "status"},
        "The form holds the pasted job file's settings.",
        left.length ? ` Its ${left.join(", ")} is not filled in (secrets never travel back): type it in.` : "",
        split.length ? ` ${split.join(", ")}: the form keeps one item a line, so an item with line breaks became `
          + "several; run the file itself (Copy as CLI command) to keep them." : ""));
    } catch (err) {
      const errors = err instanceof ApiError && err.fieldErrors.length ? err.fieldErrors
        : [{field: "", message: err instanceof ApiError ? err.message : String(err)}];
      replaceKids(problems, ...errors.map(({field, message}) =>
        el("li", {"data-field": field || ""}, field ? el("b", {}, field) : null, field ? `: ${message}` : message)));
    } finally {
      read.disabled = false;
    }
  });
}
