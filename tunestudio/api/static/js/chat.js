// Chat with a finished job through the server's OpenAI-compatible API (/v1/chat/completions, streamed).
//
// One conversation per side: the fine-tuned model, and in "compare with base" mode the base model
// beside it, each sent the same prompts and keeping its own replies. Stop aborts the requests; the
// server sees the client go and stops generating. With tools (a JSON list), a reply's calls show as bubbles of
// their own and the next message is a call's result (a `tool` turn); a reply's reasoning (reasoning_content)
// is folded above it. The system prompt, the tools, the weights (final, best, a saved step) and the chat template
// with the prompt the model saw are chatsettings.js's. An image job's model can be shown a picture: "attach image"
// reads a file into a data: URL, sent as the next user message's image_url part and shown in its bubble.

import {chatStream} from "./api.js";
import {chatSettings} from "./chatsettings.js";
import {appendKids, el, insertAfter, replaceKids} from "./util.js";


function setting(name, label, attrs) {
  return el("label", {class: "chat-setting"}, el("span", {}, label),
    el("input", {type: "number", id: `chat-${name}`, ...attrs}));
}

/** The panel for job `id`; returns {node, dispose}. */
export function chatPanel(id) {
  // pending: the calls of a side's last reply not answered yet (the next messages are their results)
  const sides = [{model: id, label: "fine-tuned", history: [], pending: [], box: null}];
  const base = {model: `${id}:base`, label: "base model", history: [], pending: [], box: null};
  let controllers = [];
  // Other weights start a fresh conversation (forget and layout are below; they run only on a change).
  const image = imageAttachment();
  const settings = chatSettings(id, {onModel: (model) => { sides[0].model = model; forget(); layout(); },
    onImages: (on) => { image.node.hidden = !on; }});

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

  const who = {user: () => "you", tool: () => "tool result", call: () => "calls"};
  const bubble = (side, role, text, picture = null) => {
    const node = el("div", {class: `chat-msg ${role}`}, el("b", {}, (who[role] || (() => side.label))()),
      picture ? el("img", {class: "chat-image", src: picture.url, alt: picture.name}) : null,
      el("span", {class: "chat-text"}, text));
    appendKids(side.box, node);
    side.box.scrollTop = side.box.scrollHeight;
    return node.querySelector(".chat-text");
  };

  // The reply's reasoning, folded above its text, and its calls, each a bubble of its own, as they stream.
  const parts = (side, out) => {
    const calls = [];
    let reasoning = "", fold = null;
    const show = (call) => { call.node.textContent = `${call.name}(${call.arguments})`; };
    return {calls, reasoning: () => reasoning, add: (delta) => {
      if (delta.reasoning_content) {
        reasoning += delta.reasoning_content;
        fold ||= el("details", {class: "chat-reasoning"}, el("summary", {}, "reasoning"), el("pre", {}));
        if (!fold.parentNode) {
          insertAfter(out.previousElementSibling, fold);  // between the name and the text
          out.parentNode.classList.add("thinking");
        }
        fold.querySelector("pre").textContent = reasoning;
      }
      for (const piece of delta.tool_calls || []) {
        if (!calls[piece.index]) {
          calls[piece.index] = {id: piece.id, name: piece.function.name, arguments: "",
            node: bubble(side, "call", "")};
        }
        calls[piece.index].arguments += piece.function.arguments || "";
        show(calls[piece.index]);
      }
    }};
  };

  const busy = (on) => {
    send.disabled = on;
    image.lock(on);
    stop.hidden = !on;
    compare.disabled = on;
    settings.lock(on);
  };

  // One side's turn; false when the server refused it before answering (a bad setting: temperature -3): the
  // turn is taken back (no "you" left without an answer, nothing in the history) and the error shown.
  // A side whose last reply called tools takes the next message as the first unanswered call's result.
  // A user turn with a picture holds it as OpenAI's image_url part, before the text.
  const ask = async (side, prompt, params, picture) => {
    const answering = side.pending.shift();
    const content = picture && !answering
      ? [{type: "image_url", image_url: {url: picture.url}}, {type: "text", text: prompt}] : prompt;
    const turn = answering ? {role: "tool", tool_call_id: answering.id, content: prompt}
      : {role: "user", content};
    const said = bubble(side, answering ? "tool" : "user", prompt, answering ? null : picture);
    if (side.pending.length) {  // more calls to answer before the model speaks again
      side.history.push(turn);
      return true;
    }
    const out = bubble(side, "assistant", "");
    out.classList.add("streaming");
    const controller = new AbortController();
    controllers.push(controller);
    let text = "", refused = false;
    const messages = settings.messages([...side.history, turn]);
    const reply = parts(side, out);
    try {
      const done = await chatStream({model: side.model, messages, stream: true, ...params},
        controller.signal, (delta) => {
          text += delta;
          out.textContent = text;
          side.box.scrollTop = side.box.scrollHeight;
        }, reply.add);
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
      if (answering) side.pending.unshift(answering);
      return false;
    }
    if (!text && !reply.reasoning() && reply.calls.length) out.parentNode.remove();  // their bubbles say it
    const calls = reply.calls.map((c) => ({id: c.id, type: "function",
      function: {name: c.name, arguments: c.arguments}}));
    side.history.push(turn, {role: "assistant", content: calls.length && !text ? null : text,
      ...(calls.length ? {tool_calls: calls} : {}),
      ...(reply.reasoning() ? {reasoning_content: reply.reasoning()} : {})});
    side.pending = [...calls];
    // not awaited: the next side answers meanwhile
    if (side === sides[0]) settings.show(side.model, messages, params.tools);
    return true;
  };

  const submit = async () => {
    const prompt = input.value;
    const picture = image.picture();
    if ((!prompt.trim() && !picture) || send.disabled) return;
    input.value = "";
    error.hidden = true;
    const params = {temperature: Number(value(temperature)), max_tokens: Number(value(maxTokens)),
      top_p: Number(value(topP))};
    if (value(seed) !== "") params.seed = Number(value(seed));
    try {
      const tools = settings.tools();
      if (tools) params.tools = tools;
    } catch (err) {
      input.value = prompt;
      error.hidden = false;
      error.textContent = err.message;
      return;
    }
    busy(true);
    controllers = [];
    try {
      // The worker answers one request at a time: the two sides stream one after the other. A refusal stops
      // there (the other side would be refused the same); unanswered anywhere, the prompt goes back in the box.
      let answered = 0;
      for (const side of active()) {
        if (!(await ask(side, prompt, params, picture))) {
          if (!answered && !input.value) input.value = prompt;
          break;
        }
        answered += 1;
      }
      if (answered) image.clear();  // sent; a refused one stays attached, as its text goes back in the box
    } finally {
      busy(false);
      input.focus();
    }
  };

  const form = el("form", {class: "chat-form", id: "chat-form"}, input,
    el("div", {class: "actions"}, image.node, send, stop, clear));
  form.addEventListener("submit", (event) => { event.preventDefault(); submit(); });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); submit(); }
  });
  stop.addEventListener("click", () => controllers.forEach((c) => c.abort()));
  const forget = () => {
    for (const side of [base, ...sides]) {
      side.history = [];
      side.pending = [];
      if (side.box) replaceKids(side.box);
    }
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

const MAX_IMAGE_BYTES = 20_000_000;  // the server's limit for one image (api/chat_images.py)

/** The "attach image" control (hidden until the model reads images): {node, picture(), clear(), lock(on)};
 * picture() is {name, url} (a data: URL) or null. */
function imageAttachment() {
  const file = el("input", {type: "file", id: "chat-image", accept: "image/*", hidden: true});
  const pick = el("button", {class: "button ghost", id: "chat-attach", type: "button"}, "Attach image");
  const shown = el("span", {class: "chat-attached", id: "chat-attached", hidden: true});
  const note = el("span", {class: "form-error small", id: "chat-image-error", hidden: true});
  let picture = null;
  const clear = () => {
    picture = null;
    file.value = "";
    shown.hidden = true;
    replaceKids(shown);
  };
  pick.addEventListener("click", () => file.click());
  file.addEventListener("change", () => {
    const chosen = file.files[0];
    note.hidden = true;
    if (!chosen) return;
    if (chosen.size > MAX_IMAGE_BYTES) {
      note.hidden = false;
      note.textContent = `${chosen.name} is over ${MAX_IMAGE_BYTES / 1e6} MB`;
      file.value = "";
      return;
    }
    const reader = new FileReader();
    reader.addEventListener("load", () => {
      picture = {name: chosen.name, url: reader.result};
      replaceKids(shown, el("img", {class: "chat-thumb", src: picture.url, alt: chosen.name}), chosen.name,
        el("button", {class: "button ghost small", type: "button", title: "remove the image", "aria-label":
          "remove the image", onclick: clear}, "×"));
      shown.hidden = false;
    });
    reader.readAsDataURL(chosen);
  });
  const node = el("span", {class: "chat-image-pick", hidden: true}, file, pick, shown, note);
  return {node, picture: () => picture, clear,
    lock: (on) => { pick.disabled = on; shown.querySelectorAll("button").forEach((b) => { b.disabled = on; }); }};
}
