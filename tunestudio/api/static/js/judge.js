// The Judge panel of a finished job: a pairwise judge of its answers against its base model's or another
// job's (POST /api/jobs/{id}/judgements), the judge being the endpoint the server's environment names.
// It lists the job's judgements and shows one: the rates with their 95% intervals, then every row with
// both answers, both verdicts (the job's answer first, then second) and their reasons. A running one has a
// Cancel button (POST /api/judgements/{id}/cancel: the rows judged before are kept).

import {ApiError, call} from "./api.js";
import {el, fmtWhen, replaceKids} from "./util.js";

const path = (id) => `/api/jobs/${encodeURIComponent(id)}/judgements`;
const pct = (x) => `${(100 * x).toFixed(1)}%`;
const rate = (r) => (r && r.value !== null ? `${pct(r.value)} [${pct(r.low)}, ${pct(r.high)}]` : "–");
const POLL_MS = 1500;

function verdict(v) {
  if (!v) return "–";
  if (v.error) return el("span", {class: "error-text"}, v.error);
  return el("span", {}, el("b", {}, v.choice), v.reason ? ` · ${v.reason}` : "");
}

function summaryLine(j) {
  const s = j.summary;
  return el("div", {class: "judge-summary", id: `judge-summary-${j.id}`},
    el("p", {}, el("b", {}, `${j.model} against ${j.against}`),
      ` · ${j.status} · ${s.judged} of ${j.prompts} rows judged in both orders`
      + (s.errors ? ` · ${s.errors} errors` : "") + ` · judge ${j.judge.model}`),
    el("table", {class: "compare-table judge-rates"},
      el("thead", {}, el("tr", {}, el("th", {}, "outcome"), el("th", {}, "rows"), el("th", {}, "rate [95% interval]"))),
      el("tbody", {},
        ...[["win", s.wins, s.win_rate], ["tie", s.ties, s.tie_rate], ["loss", s.losses, s.loss_rate]]
          .map(([k, n, r]) => el("tr", {}, el("td", {}, k), el("td", {}, String(n)), el("td", {}, rate(r)))),
        el("tr", {}, el("td", {}, "score (win + tie/2)"), el("td", {}), el("td", {}, rate(s.score))))),
    s.disagreements ? el("p", {class: "muted small"}, `${s.disagreements} ties because the two orders disagreed `
      + "(the judge preferred a position, not an answer)") : null,
    j.message ? el("p", {class: j.status === "failed" ? "error-text" : "muted small"}, j.message) : null);
}

function rowsTable(j) {
  return el("div", {class: "judge-rows-wrap"}, el("table", {class: "compare-table judge-rows", id: "judge-rows"},
    el("thead", {}, el("tr", {}, ...["#", "prompt", "this job", "the other", "job's answer first", "job's answer second",
      "outcome"].map((h) => el("th", {}, h)))),
    el("tbody", {}, ...j.rows.map((r) => el("tr", {class: `judge-${r.outcome}`, "data-outcome": r.outcome},
      el("td", {}, String(r.index + 1)), el("td", {}, r.prompt),
      el("td", {}, r.answer ?? "–"), el("td", {}, r.other ?? "–"),
      el("td", {}, r.error && !r.first ? el("span", {class: "error-text"}, r.error) : verdict(r.first)),
      el("td", {}, verdict(r.second)), el("td", {}, el("b", {}, r.outcome)))))));
}

/** The panel for finished job `id`; returns {node, dispose}. */
export function judgePanel(id) {
  const against = el("input", {id: "judge-against", type: "text", value: "base", size: 24,
    "aria-label": "against: base, or another job's id"});
  const limit = el("input", {id: "judge-limit", type: "number", min: 1, max: 1000, value: 20,
    "aria-label": "at most this many prompts"});
  const start = el("button", {class: "button", id: "judge-start", type: "button"}, "Judge");
  const error = el("p", {class: "error-text", id: "judge-error", hidden: true});
  const list = el("div", {id: "judge-list"});
  const shown = el("div", {id: "judge-shown"});
  let timer = null, alive = true, current = null;  // the judgement shown: an older answer never replaces it

  const cancelButton = (jid) => {
    const button = el("button", {class: "button", id: "judge-cancel", type: "button"}, "Cancel");
    button.addEventListener("click", async () => {
      clearTimeout(timer);  // no poll redraws the panel (and this button) while the cancel is under way
      button.disabled = true;
      error.hidden = true;
      try {
        await call(`/api/judgements/${encodeURIComponent(jid)}/cancel`, {method: "POST"});
      } catch (err) {  // a 409: it ended meanwhile; the next look shows how
        error.textContent = err instanceof ApiError ? err.message : String(err);
        error.hidden = false;
      }
      if (alive && current === jid) show(jid);
    });
    return button;
  };

  const show = async (jid) => {
    clearTimeout(timer);
    current = jid;
    try {
      const j = await call(`/api/judgements/${encodeURIComponent(jid)}`);
      if (!alive || current !== jid) return;
      replaceKids(shown, summaryLine(j), j.status === "running" ? cancelButton(jid) : null,
        j.rows.length ? rowsTable(j) : el("p", {class: "muted"}, "No row yet…"));
      if (j.status === "running") timer = setTimeout(() => show(jid), POLL_MS);
      else refresh(false);
    } catch (err) {
      if (alive && current === jid) replaceKids(shown, el("p", {class: "error-text"}, String(err.message || err)));
    }
  };
  const refresh = async (open) => {
    try {
      const all = await call(path(id));
      if (!alive) return;
      replaceKids(list, ...(all.length ? [el("ul", {class: "plain"}, ...all.map((j) => el("li", {},
        el("a", {href: "#", "data-judgement": j.id, onclick: (e) => { e.preventDefault(); show(j.id); }},
          `${fmtWhen(j.created_at)}: against ${j.against}`), ` · ${j.status} · score ${rate(j.summary.score)}`)))]
        : [el("p", {class: "muted small"}, "No judgement yet.")]));
      if (open && all.length && current === null) show(all[0].id);  // not over one the user started meanwhile
    } catch { /* the list is a convenience; the panel still starts one */ }
  };
  start.addEventListener("click", async () => {
    error.hidden = true;
    start.disabled = true;
    try {
      const body = {against: against.value.trim() || "base"};
      if (limit.value) body.limit = Number(limit.value);
      const j = await call(path(id), {method: "POST", body});
      await refresh(false);
      show(j.id);
    } catch (err) {
      error.textContent = err instanceof ApiError ? err.message : String(err);
      error.hidden = false;
    } finally {
      start.disabled = false;
    }
  });
  refresh(true);
  const node = el("section", {class: "judge", id: "judge-panel"},
    el("h2", {}, "Judge"),
    el("p", {class: "muted small"}, "Both models answer the job's held-out rows; a judge model (TUNESTUDIO_JUDGE_URL "
      + "and TUNESTUDIO_JUDGE_MODEL on the server) compares each pair twice, in both orders."),
    el("p", {class: "judge-form"}, el("label", {}, "against ", against), " ", el("label", {}, "rows ", limit), " ",
      start),
    error, list, shown);
  return {node, dispose() { alive = false; clearTimeout(timer); }};
}
