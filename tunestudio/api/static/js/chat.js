// Chat with a finished job through the server's OpenAI-compatible API (/v1/chat/completions, streamed).
//
// One conversation per side: the fine-tuned model, and in "compare with base" mode the base model
// beside it, each sent the same prompts and keeping its own replies. Stop aborts the requests; the
// server sees the client go and stops generating. The system prompt, the weights (final, best, a saved step)
// and the chat template with the prompt the model saw are chatsettings.js's.

import {chatStream} from "./api.js";
import {chatSettings} from "./chatsettings.js";
import {appendKids, el, insertAfter, replaceKids} from "./util.js";


function setting(name, label, attrs) {
  return el("label", {class: "chat-setting"}, el("span", {}, label),
    el("input", {type: "number", id: `chat-${name}`, ...attrs}));
}

/** The panel for job `id`; returns {node, dispose}. */
export function chatPanel(id) {
  const sides = [{model: id, label: "fine-tuned", history: [], box: null}];
  const base = {model: `${id}:base`, label: "base model", history: [], box: null};
  let controllers = [];
  // Other weights start a fresh conversation (forget and layout are below; they run only on a change).
  const settings = chatSettings(id, {onModel: (model) => { sides[0].model = model; forget(); layout(); }});

  const compare = el("input", {type: "checkbox", id: "chat-compare"});
  const temperature = setting("temperature", "temperature", {min: 0, max: 2, step: 0.1, value: 0});
  const maxTokens = setting("max-tokens", "max tokens", {min: 1, max: 4096, step: 1, value: 128});
  const topP = setting("top-p", "top p", {min: 0.01, max: 1, step: 0.05, value: 1});
  const seed = setting("seed", "seed", {min: 0, step: 1, placeholder: "random"});
  const input = el("textarea", {id: "chat-input", rows: 3,
    placeholder: "Ask something… (Enter sends, Shift+Enter for a new line)"});
  const send = el("button", {class: "button primary", id: "chat-send", type: "submit"}, "Send");
  const stop = el("button", {class: "button danger", id: "chat-stop", type: "button", hidden: true}, "Stop");
  const clear = el("button", {class: "button ghost", id: "chat-clear", type: "button"}, "Clear");
  const error = el("div", {class: "form-error", id: "chat-error", hidden: true});
  const columns = el("div", {class: "chat-columns", id: "chat-columns"});

  const value = (label) => label.querySelector("input").value;
  const active = () => (compare.checked ? [base, ...sides] : sides);
  const layout = () => {
    for (const side of [base, ...sides]) {
      side.box ||= el("div", {class: "chat-log"});
      side.box.dataset.model = side.model;
    }
    columns.classList.toggle("two", compare.checked);
    replaceKids(columns, ...active().map((side) => el("section", {class: "chat-side"},
      el("h3", {}, side.label, " ", el("code", {class: "muted small"}, side.model)), side.box)));
  };

  const bubble = (side, role, text) => {
    const node = el("div", {class: `chat-msg ${role}`}, el("b", {}, role === "user" ? "you" : side.label),
      el("span", {class: "chat-text"}, text));
    appendKids(side.box, node);
    side.box.scrollTop = side.box.scrollHeight;
    return node.querySelector(".chat-text");
  };

  const busy = (on) => {
    send.disabled = on;
    stop.hidden = !on;
    compare.disabled = on;
    settings.lock(on);
  };

  // One side's turn; false when the server refused it before answering (a bad setting: temperature -3): the
  // turn is taken back (no "you" left without an answer, nothing in the history) and the error shown.
  const ask = async (side, prompt, params) => {
    const said = bubble(side, "user", prompt);
    const out = bubble(side, "assistant", "");
    out.classList.add("streaming");
    const controller = new AbortController();
    controllers.push(controller);
    let text = "", refused = false;
    const messages = settings.messages([...side.history, {role: "user", content: prompt}]);
    try {
      const done = await chatStream({model: side.model, messages, stream: true, ...params},
        controller.signal, (delta) => {
          text += delta;
          out.textContent = text;
          side.box.scrollTop = side.box.scrollHeight;
        });
      if (done === "length") insertAfter(out, el("span", {class: "muted small"}, " (cut at max tokens)"));
    } catch (err) {
      if (err.name === "AbortError") insertAfter(out, el("span", {class: "muted small"}, " (stopped)"));
      else {
        error.hidden = false;
        error.textContent = `${side.label}: ${err.message}`;
        refused = text === "";
      }
    } finally {
      out.classList.remove("streaming");
    }
    if (refused) {
      said.parentNode.remove();
      out.parentNode.remove();
      return false;
    }
    side.history.push({role: "user", content: prompt}, {role: "assistant", content: text});
    if (side === sides[0]) settings.show(side.model, messages);  // not awaited: the next side answers meanwhile
    return true;
  };

  const submit = async () => {
    const prompt = input.value;
    if (!prompt.trim() || send.disabled) return;
    input.value = "";
    error.hidden = true;
    const params = {temperature: Number(value(temperature)), max_tokens: Number(value(maxTokens)),
      top_p: Number(value(topP))};
    if (value(seed) !== "") params.seed = Number(value(seed));
    busy(true);
    controllers = [];
    try {
      // The worker answers one request at a time: the two sides stream one after the other. A refusal stops
      // there (the other side would be refused the same); unanswered anywhere, the prompt goes back in the box.
      let answered = 0;
      for (const side of active()) {
        if (!(await ask(side, prompt, params))) {
          if (!answered && !input.value) input.value = prompt;
          break;
        }
        answered += 1;
      }
    } finally {
      busy(false);
      input.focus();
    }
  };

  const form = el("form", {class: "chat-form", id: "chat-form"}, input,
    el("div", {class: "actions"}, send, stop, clear));
  form.addEventListener("submit", (event) => { event.preventDefault(); submit(); });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); submit(); }
  });
  stop.addEventListener("click", () => controllers.forEach((c) => c.abort()));
  const forget = () => {
    for (const side of [base, ...sides]) { side.history = []; if (side.box) replaceKids(side.box); }
    error.hidden = true;
  };
  clear.addEventListener("click", forget);
  // A comparison starts afresh, so that both sides answer the same conversation.
  compare.addEventListener("change", () => { forget(); layout(); });

  const node = el("section", {class: "chat-card", id: "chat"},
    el("div", {class: "chat-head"}, el("h2", {}, "Chat"),
      el("label", {class: "chat-compare"}, compare, " compare with base")),
    el("div", {class: "chat-settings"}, temperature, maxTokens, topP, seed),
    settings.options, settings.details,
    columns, error, form);
  layout();
  return {node, dispose: () => controllers.forEach((c) => c.abort())};
}
