// The chat panel's settings (chat.js): a system prompt, tools (OpenAI's JSON list), which of the job's weights
// answer (its final weights, its best step, any saved step: GET /api/jobs/{id}/chat), and its chat template, read-only, with the exact
// prompt the model saw for the last message (POST /api/chat/prompt: the inference worker renders it with the
// tokenizer it answers with; nothing is generated).

import {ApiError, call} from "./api.js";
import {appendKids, el, replaceKids} from "./util.js";

const message = (err) => (err instanceof ApiError ? err.message : String(err));

/** {options, details, model(), messages(history), lock(on), show(model, messages)} for job `id`;
 * `onModel(modelId)` is called when the user picks other weights, `onImages(true)` once the settings say the
 * model reads images (an image job's). */
export function chatSettings(id, {onModel, onImages = () => {}}) {
  const weights = el("select", {id: "chat-weights"}, el("option", {value: id}, "final weights"));
  const system = el("textarea", {id: "chat-system", rows: "2",
    placeholder: "none: the conversation starts with your message"});
  // OpenAI's tools: a JSON list of {type: "function", function: {name, description, parameters}}.
  const tools = el("textarea", {id: "chat-tools", rows: "2", spellcheck: "false",
    placeholder: 'none; or a JSON list: [{"type": "function", "function": {"name": …, "parameters": {…}}}]'});
  const templateFile = el("p", {class: "muted small", id: "chat-template-file"});
  // Scrollable boxes are focusable, so a keyboard reaches what they hold.
  const template = el("pre", {class: "chat-pre", id: "chat-template", tabindex: "0"}, "reading…");
  const prompt = el("pre", {class: "chat-pre", id: "chat-prompt", tabindex: "0"},
    "Send a message: the prompt it gave the model shows here.");
  const promptNote = el("p", {class: "muted small", id: "chat-prompt-note", role: "status"});

  const options = el("div", {class: "chat-options"},
    el("label", {class: "chat-option"}, el("span", {}, "weights"), weights),
    el("label", {class: "chat-option grow"}, el("span", {}, "system prompt"), system),
    el("label", {class: "chat-option grow"}, el("span", {}, "tools (JSON)"), tools));
  const details = el("details", {class: "chat-template-card", id: "chat-template-card"},
    el("summary", {}, "Chat template and the prompt the model saw"),
    templateFile, template,
    el("h3", {}, "The last message's prompt, as the model read it"), promptNote, prompt);

  const showTemplate = (text, file) => {
    template.textContent = text || "(none: the turns' text is joined by new lines)";
    templateFile.textContent = file ? `from ${file}` : "";
  };
  call(`/api/jobs/${encodeURIComponent(id)}/chat`).then((settings) => {
    replaceKids(weights, ...settings.models.map((m) => el("option", {value: m.id}, m.label)));
    if (!settings.models.length) appendKids(weights, el("option", {value: id}, "final weights"));
    showTemplate(settings.template, settings.template_file);
    if (settings.images) onImages(true);
  }).catch((err) => { template.textContent = `the chat settings could not be read: ${message(err)}`; });
  weights.addEventListener("change", () => onModel(weights.value));

  let shown = 0;  // a later message's prompt is never replaced by an earlier one's
  return {
    options, details,
    model: () => weights.value,
    /** The messages to send: the system prompt first when there is one. */
    messages: (history) => (system.value.trim() ? [{role: "system", content: system.value}, ...history]
      : [...history]),
    /** The tools to send (null: none); an Error when the box holds no JSON list. */
    tools: () => {
      if (!tools.value.trim()) return null;
      let parsed;
      try { parsed = JSON.parse(tools.value); } catch (err) { throw new Error(`tools: not JSON (${err.message})`); }
      if (!Array.isArray(parsed)) throw new Error("tools: a JSON list of functions, as OpenAI's tools");
      return parsed;
    },
    lock: (on) => { weights.disabled = on; system.disabled = on; tools.disabled = on; },
    async show(model, messages, tools) {
      const mine = ++shown;
      try {
        const rendered = await call("/api/chat/prompt", {method: "POST", body: {model, messages, tools}});
        if (mine !== shown) return;
        prompt.textContent = rendered.prompt;
        promptNote.textContent = `${rendered.prompt_tokens} tokens, for ${model}`;
        showTemplate(rendered.template, templateFile.textContent.replace(/^from /, ""));
      } catch (err) {
        if (mine === shown) promptNote.textContent = `the prompt could not be shown: ${message(err)}`;
      }
    },
  };
}
