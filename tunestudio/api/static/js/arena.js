// The arena (#/arena, issue 44): pick the models battles draw from (completed jobs, their bases, endpoints you add),
// ask (a prompt typed or drawn from a prompt file), read two answers side by side (blind: the server names neither
// until the vote is stored), vote with 1/2/3/4 (A, B, tie, both bad), N for the next battle, U to undo the last
// vote; edit the better answer before voting if you like. Below: the leaderboard (Bradley-Terry with 95%
// intervals, pairwise win rates, the left answer's advantage, the judge's agreement), the votes as a dataset in one
// click, and a job trained on them (it joins the roster).

import {api, call, errorText} from "./api.js";
import {el, replaceKids} from "./util.js";

const POLL_MS = 300;
const CHOICES = {1: "a", 2: "b", 3: "tie", 4: "both_bad"};
const LABELS = {a: "A is better", b: "B is better", tie: "Tie", both_bad: "Both bad"};
const fmt = (v, digits = 0) => (v === null || v === undefined ? "–" : Number(v).toFixed(digits));
const pct = (rate) => (rate && rate.value !== null ? `${Math.round(rate.value * 100)}% (${Math.round(rate.low * 100)}–${Math.round(rate.high * 100)}%)` : "–");

async function candidates() {
  const [jobs, state] = await Promise.all([api.listJobsByStatus(["completed"], 100), call("/api/arena")]);
  const ids = [];
  for (const job of jobs.items || []) if (job.kind === "train") ids.push(job.id, `${job.id}:base`);
  for (const e of state.endpoints) ids.push(e.id);
  for (const r of state.roster) if (!ids.includes(r.model)) ids.push(r.model);
  return {ids, state, jobs: (jobs.items || []).filter((j) => j.kind === "train")};
}

function rosterCard(ids, state, onSaved) {
  const chosen = new Set(state.roster.map((r) => r.model));
  const why = Object.fromEntries(state.roster.map((r) => [r.model, r.unavailable]));
  const boxes = ids.map((id) => {
    const box = el("input", {type: "checkbox", value: id, checked: chosen.has(id), class: "arena-pick"});
    return el("label", {class: "arena-model"}, box, ` ${id}`, why[id] ? el("span", {class: "muted small"}, ` (${why[id]})`) : null);
  });
  const save = el("button", {type: "button", class: "button", id: "arena-save-models"}, "Use these models");
  const note = el("span", {class: "muted small", id: "arena-models-note"});
  save.addEventListener("click", async () => {
    const models = boxes.map((b) => b.querySelector("input")).filter((b) => b.checked).map((b) => b.value);
    try { await call("/api/arena/models", {method: "PUT", body: {models}}); note.textContent = `${models.length} models in the arena`; onSaved(); } catch (err) { note.textContent = errorText(err); }
  });
  const name = el("input", {id: "endpoint-name", placeholder: "name"});
  const url = el("input", {id: "endpoint-url", placeholder: "https://host/v1"});
  const model = el("input", {id: "endpoint-model", placeholder: "model"});
  const keyEnv = el("input", {id: "endpoint-key-env", placeholder: "key's environment variable (e.g. OPENAI_API_KEY)"});
  const add = el("button", {type: "button", class: "button ghost", id: "endpoint-add"}, "Add endpoint");
  add.addEventListener("click", async () => {
    try {
      await call("/api/arena/endpoints", {method: "POST", body: {name: name.value.trim(), url: url.value.trim(),
        model: model.value.trim(), key_env: keyEnv.value.trim() || null}});
      onSaved(true);
    } catch (err) { note.textContent = errorText(err); }
  });
  return el("section", {class: "card", id: "arena-models"}, el("h3", {}, "Models"),
    el("p", {class: "muted small"}, "Each battle draws two of the ticked models that can answer now; they answer one at a time (the chat worker keeps at most two base models loaded)."),
    el("div", {class: "arena-models"}, ...boxes), el("p", {}, save, " ", note),
    el("details", {}, el("summary", {}, "Add an OpenAI-compatible endpoint (its key stays in your environment, never stored)"),
      el("p", {class: "arena-inline"}, name, " ", url, " ", model, " ", keyEnv, " ", add)));
}

function answerBox(side, text, {onEdit}) {
  const body = el("div", {class: "chat-text arena-text", id: `arena-answer-${side}`}, text);
  const edit = el("textarea", {class: "arena-edit", id: `arena-edit-${side}`, rows: 5, hidden: true});
  edit.value = text;
  const toggle = el("button", {type: "button", class: "button ghost small", id: `arena-edit-toggle-${side}`}, "Edit");
  toggle.addEventListener("click", () => { edit.hidden = !edit.hidden; body.hidden = !edit.hidden; onEdit(side, edit); if (!edit.hidden) edit.focus(); });
  return el("div", {class: "arena-side", dataset: {side}}, el("h4", {}, `Answer ${side.toUpperCase()}`, " ", toggle),
    el("div", {class: "arena-name muted", id: `arena-name-${side}`}), body, edit);
}

export async function showArena(main, {navigate}) {
  let battle = null, editing = null, timer = null, closed = false;
  const prompt = el("textarea", {id: "arena-prompt", rows: 3, placeholder: "Ask both models… (Ctrl+Enter)"});
  const file = el("input", {id: "arena-prompts-file", class: "arena-wide", placeholder: "or a prompt file (.txt, .jsonl, .json) to draw from"});
  const blind = el("input", {type: "checkbox", id: "arena-blind", checked: true});
  const temperature = el("input", {type: "number", id: "arena-temperature", min: 0, max: 2, step: 0.1, value: 0.7});
  const maxTokens = el("input", {type: "number", id: "arena-max-tokens", min: 1, max: 4096, value: 256});
  const ask = el("button", {type: "button", class: "button primary", id: "arena-ask"}, "Ask (N)");
  const undo = el("button", {type: "button", class: "button ghost", id: "arena-undo"}, "Undo last vote (U)");
  const progress = el("span", {class: "muted", id: "arena-progress", "aria-live": "polite"});
  const error = el("div", {class: "error-box", id: "arena-error", hidden: true});
  const stage = el("div", {id: "arena-battle", "aria-live": "polite"});
  const votes = Object.entries(CHOICES).map(([key, choice]) => {
    const b = el("button", {type: "button", class: "button", id: `arena-vote-${choice}`, disabled: true}, `${key} · ${LABELS[choice]}`);
    b.addEventListener("click", () => vote(choice));
    return b;
  });
  const board = el("div", {id: "arena-leaderboard"});
  const data = el("div", {id: "arena-data"});
  const recentVotes = el("div", {id: "arena-recent"});
  const modelsBox = el("div");

  const fail = (err) => { error.hidden = false; error.textContent = errorText(err); };
  const setVoting = (on) => votes.forEach((b) => { b.disabled = !on; });

  async function refresh(reloadModels = false) {
    const [state, lb] = await Promise.all([call("/api/arena"), call("/api/arena/leaderboard")]);
    const p = state.progress;
    progress.textContent = `${p.votes} votes${p.ready ? `, ${p.ready} waiting for a vote` : ""}`;
    renderBoard(lb);
    const recent = await call(`/api/arena/votes?limit=10&offset=${Math.max(0, p.votes - 10)}`);
    renderVotes(recent.votes.reverse());
    if (reloadModels) {
      const c = await candidates();
      replaceKids(modelsBox, rosterCard(c.ids, c.state, (again) => refresh(again)));
      renderData(c.jobs);
    }
  }

  function renderBoard(lb) {
    const rows = lb.standings.map((s, i) => el("tr", {dataset: {model: s.model}}, el("td", {}, String(i + 1)),
      el("td", {}, s.model), el("td", {class: "num"}, fmt(s.score)), el("td", {class: "num"}, s.low === null ? "–" : `${fmt(s.low)}–${fmt(s.high)}`),
      el("td", {class: "num"}, String(s.votes)), el("td", {class: "num"}, `${s.wins} / ${s.losses} / ${s.ties + s.both_bad}`)));
    const pairs = lb.pairs.map((p) => el("tr", {}, el("td", {}, `${p.model} vs ${p.other}`), el("td", {class: "num"}, String(p.votes)),
      el("td", {class: "num"}, pct(p.win_rate))));
    replaceKids(board, el("table", {class: "table", id: "arena-standings"},
      el("thead", {}, el("tr", {}, ...["#", "model", "score", "95% interval", "votes", "won / lost / tied"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...rows)),
    lb.pairs.length ? el("table", {class: "table", id: "arena-pairs"}, el("thead", {}, el("tr", {}, el("th", {}, "pair"), el("th", {}, "votes"), el("th", {}, "first's win rate (95% Wilson)"))),
      el("tbody", {}, ...pairs)) : null,
    el("p", {class: "muted small", id: "arena-position"}, `Left answer (A) won ${pct(lb.position.left_rate)} of ${lb.position.decisive} decided votes (50% is no position bias).`),
    el("p", {class: "muted small", id: "arena-judge"}, lb.judge.compared
      ? `The judge agreed with the people on ${lb.judge.agree} of ${lb.judge.compared} (${pct(lb.judge.rate)}).`
      : "No judge verdicts yet: “Ask the judge” compares the voted pairs (TUNESTUDIO_JUDGE_URL and _MODEL)."),
    el("p", {class: "muted small"}, lb.method));
  }

  function renderVotes(list) {
    const judged = (v) => (v.judge && v.judge.choice ? LABELS[v.judge.choice] : v.judge && v.judge.error ? "no verdict" : "–");
    replaceKids(recentVotes, list.length ? el("table", {class: "table", id: "arena-votes"},
      el("thead", {}, el("tr", {}, ...["prompt", "A", "B", "people", "judge"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...list.map((v) => el("tr", {dataset: {battle: v.id}}, el("td", {}, v.prompt.slice(0, 80)),
        el("td", {}, v.models.a), el("td", {}, v.models.b),
        el("td", {}, LABELS[v.vote.choice] + (v.vote.edited ? " (edited)" : "")), el("td", {}, judged(v))))))
      : el("p", {class: "muted small"}, "No votes yet."));
  }

  function renderData(jobs) {
    const out = el("p", {class: "muted small", id: "arena-export-result"});
    const exportBtn = (format, label) => {
      const b = el("button", {type: "button", class: "button ghost", id: `arena-export-${format}`}, label);
      b.addEventListener("click", async () => {
        try {
          const r = await call("/api/arena/exports", {method: "POST", body: {format}});
          out.textContent = `${r.rows} rows written to ${r.path}; the dataset report is reading it…`;
          // the dataset report reads the new file as a job of that method would
          const report = await call("/api/datasets/report", {method: "POST", body: {local_datasets: [r.path], method: format}});
          out.textContent = `${r.rows} rows written to ${r.path}: the report reads ${report.usable} usable rows as ${report.format}` +
            (report.refused_count ? `, ${report.refused_count} refused` : "");
        } catch (err) { out.textContent = errorText(err); }
      });
      return b;
    };
    const from = el("select", {id: "arena-train-from"}, ...jobs.map((j) => el("option", {value: j.id}, j.name || j.id)));
    const method = el("select", {id: "arena-train-method"}, ...["dpo", "orpo", "kto", "reward", "sft"].map((m) => el("option", {value: m}, m)));
    const steps = el("input", {type: "number", id: "arena-train-steps", min: 1, value: 50});
    const train = el("button", {type: "button", class: "button primary", id: "arena-train"}, "Train on the votes");
    train.addEventListener("click", async () => {
      try {
        const r = await call("/api/arena/train", {method: "POST", body: {from_job: from.value, method: method.value, max_steps: Number(steps.value)}});
        navigate(`#/jobs/${r.job.id}`);
      } catch (err) { out.textContent = errorText(err); }
    });
    const judge = el("button", {type: "button", class: "button ghost", id: "arena-ask-judge"}, "Ask the judge");
    judge.addEventListener("click", async () => {
      judge.disabled = true;
      try { const r = await call("/api/arena/judge", {method: "POST", body: {}}); out.textContent = `the judge gave ${r.judged} verdicts on ${r.asked} voted pairs`; await refresh(); } catch (err) { out.textContent = errorText(err); } finally { judge.disabled = false; }
    });
    replaceKids(data, el("p", {}, exportBtn("dpo", "Export DPO pairs"), " ", exportBtn("kto", "Export KTO rows"), " ",
      exportBtn("sft", "Export edited answers (SFT)"), " ", judge),
    jobs.length ? el("p", {class: "arena-inline"}, "Start from ", from, " method ", method, " steps ", steps, " ", train) : null, out);
  }

  function renderBattle() {
    if (!battle) { replaceKids(stage); setVoting(false); return; }
    editing = null;
    if (battle.status === "answering") { replaceKids(stage, el("p", {class: "muted"}, "Both models are answering, one after the other…")); setVoting(false); return; }
    if (battle.status === "failed") { replaceKids(stage, el("div", {class: "error-box"}, `No pair to vote on: ${battle.error}`)); setVoting(false); return; }
    const onEdit = (side, box) => { editing = box.hidden ? null : {side, box}; };
    replaceKids(stage, el("p", {class: "arena-question"}, el("strong", {}, "Prompt: "), battle.prompt),
      el("div", {class: "arena-columns"}, answerBox("a", battle.answers.a, {onEdit}), answerBox("b", battle.answers.b, {onEdit})),
      battle.vote ? el("p", {id: "arena-voted"}, `You voted: ${LABELS[battle.vote.choice]}.`) : null);
    if (battle.models) for (const side of ["a", "b"]) stage.querySelector(`#arena-name-${side}`).textContent = battle.models[side];
    setVoting(battle.status === "ready");
  }

  async function poll(id) {
    clearTimeout(timer);
    try { battle = await call(`/api/arena/battles/${encodeURIComponent(id)}`); } catch (err) { fail(err); return; }
    if (closed) return;
    renderBattle();
    if (battle.status === "answering") timer = setTimeout(() => poll(id), POLL_MS);
    else refresh().catch(fail);
  }

  async function next() {
    error.hidden = true;
    const body = {blind: blind.checked, temperature: Number(temperature.value), max_tokens: Number(maxTokens.value)};
    if (prompt.value.trim()) body.prompt = prompt.value.trim(); else if (file.value.trim()) body.prompts_file = file.value.trim();
    else { fail(new Error("type a prompt, or name a prompt file to draw one from")); return; }
    try {
      battle = await call("/api/arena/battles", {method: "POST", body});
      renderBattle();
      poll(battle.id);
    } catch (err) { fail(err); }
  }

  async function vote(choice) {
    if (!battle || battle.status !== "ready") return;
    const body = {choice};
    if (editing && editing.side === choice && editing.box.value.trim()) body.edited = editing.box.value;
    setVoting(false);
    try { battle = await call(`/api/arena/battles/${battle.id}/vote`, {method: "POST", body}); renderBattle(); await refresh(); } catch (err) { fail(err); setVoting(true); }
  }

  async function takeBack() {
    try { battle = await call("/api/arena/undo", {method: "POST"}); renderBattle(); await refresh(); } catch (err) { fail(err); }
  }

  ask.addEventListener("click", next);
  undo.addEventListener("click", takeBack);
  prompt.addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); next(); } });
  const keys = (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey || /^(INPUT|TEXTAREA|SELECT)$/.test(e.target.tagName)) return;
    if (CHOICES[e.key]) { e.preventDefault(); vote(CHOICES[e.key]); } else if (e.key === "n" || e.key === "N") { e.preventDefault(); next(); } else if (e.key === "u" || e.key === "U") { e.preventDefault(); takeBack(); }
  };
  document.addEventListener("keydown", keys);

  replaceKids(main, el("h2", {}, "Arena"), modelsBox,
    el("section", {class: "card", id: "arena-ask-card"}, el("h3", {}, "Battle"), prompt, el("p", {}, file),
      el("p", {class: "arena-inline"}, el("label", {}, blind, " blind (names hidden until you vote)"), " ", el("label", {}, "temperature ", temperature), " ",
        el("label", {}, "max tokens ", maxTokens), " ", ask, " ", undo, " ", progress), error, stage,
      el("p", {class: "arena-votes"}, ...votes),
      el("p", {class: "muted small"}, "Keys: 1 A better · 2 B better · 3 tie · 4 both bad · N next · U undo. Edit the better answer, then vote for it, to save your version.")),
    el("section", {class: "card"}, el("h3", {}, "Leaderboard"), board),
    el("section", {class: "card"}, el("h3", {}, "Latest votes"), el("p", {class: "muted small"}, "The people's vote and the judge's verdict on the same pair, newest first; every vote: GET /api/arena/votes or tunestudio arena votes."), recentVotes),
    el("section", {class: "card"}, el("h3", {}, "The votes as training data"), data));
  await refresh(true);
  return () => { closed = true; clearTimeout(timer); document.removeEventListener("keydown", keys); };
}
