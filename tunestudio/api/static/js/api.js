// The HTTP API, as the page uses it. Every error answer is {"detail": {code, message, ...}}.

import {appendKids} from "./util.js";

export class ApiError extends Error {
  constructor(status, detail) {
    super((detail && detail.message) || `HTTP ${status}`);
    this.status = status;
    this.detail = detail || {};
  }

  /** [{field, message}]: field errors (422) or a path-confinement error, which names one field. */
  get fieldErrors() {
    if (Array.isArray(this.detail.errors)) return this.detail.errors;
    if (this.detail.field) return [{field: this.detail.field, message: this.detail.message}];
    return [];
  }
}

/** What to show for a failed request: its field errors ("field: message; ..."), else its message. */
export function errorText(err) {
  if (!(err instanceof ApiError)) return String(err);
  return err.fieldErrors.map((e) => `${e.field}: ${e.message}`).join("; ") || err.message;
}

function headers(json) {
  const out = {Accept: "application/json"};
  if (json) out["Content-Type"] = "application/json";
  const token = localStorage.getItem("tunestudio.token");
  if (token) out.Authorization = `Bearer ${token}`;
  return out;
}

export async function call(path, {method = "GET", body} = {}, retried = false) {
  // The server takes a state-changing request only as JSON (no cross-site form can send that without a
  // preflight): a bodyless POST or DELETE still goes out as application/json with a body of {}.
  const payload = body === undefined && method !== "GET" ? {} : body;
  const res = await fetch(path, {
    method, headers: headers(payload !== undefined),
    body: payload === undefined ? undefined : JSON.stringify(payload),
  });
  if (res.status === 401 && !retried) {
    // A server off loopback needs a token: ask once, keep it in this browser, and retry.
    const token = window.prompt("This tunestudio server needs its API token (TUNESTUDIO_API_TOKEN):");
    if (token) {
      localStorage.setItem("tunestudio.token", token.trim());
      return call(path, {method, body}, true);
    }
  }
  const text = await res.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = {detail: {message: text}}; }
  if (!res.ok) throw new ApiError(res.status, data && data.detail);
  return data;
}

const job = (id) => `/api/jobs/${encodeURIComponent(id)}`;

export const api = {
  defaults: () => call("/api/web/defaults"),
  preview: (body) => call("/api/web/preview", {method: "POST", body}),
  listJobs: (limit = 100) => call(`/api/jobs?limit=${limit}`),
  getJob: (id) => call(job(id)),
  createJob: (config) => call("/api/jobs", {method: "POST", body: config}),
  stopJob: (id, save) => call(`${job(id)}/stop`, {method: "POST", body: {save}}),
  cancelJob: (id) => call(`${job(id)}/cancel`, {method: "POST"}),
  resumeJob: (id) => call(`${job(id)}/resume`, {method: "POST"}),
  exportJob: (id, body) => call(`${job(id)}/exports`, {method: "POST", body}),
  benchmarks: (id) => call(`${job(id)}/benchmarks`),
  startBenchmark: (id, body) => call(`${job(id)}/benchmarks`, {method: "POST", body}),
  renameJob: (id, name, notes) => call(job(id), {method: "PATCH", body: {name, notes}}),
  deleteJob: (id, artefacts, exports = false) =>
    call(`${job(id)}?delete_artifacts=${artefacts ? "true" : "false"}&delete_exports=${exports ? "true" : "false"}`,
      {method: "DELETE"}),
  // "live" asks the server for the jobs that have not ended (it knows which statuses those are)
  listJobsByStatus: (statuses, limit = 100) =>
    call(`/api/jobs?limit=${limit}${statuses.map((s) => s === "live" ? "&live=true"
      : `&status=${encodeURIComponent(s)}`).join("")}`),
  log: (id, query) => logPart(id, query),
  samples: (id) => call(`${job(id)}/samples`),
  logUrl: (id) => `${job(id)}/log?download=true`,
  uploads: () => call("/api/uploads"),
  upload: (file) => uploadFile(file),
  deleteUpload: (name) => call(`/api/uploads/${encodeURIComponent(name)}`, {method: "DELETE"}),
  models: () => call("/api/models"),
  hubModel: (id) => call(`/api/models/hub?id=${encodeURIComponent(id)}`),
  estimate: (config) => call("/api/models/estimate", {method: "POST", body: config}),
  hardware: () => call("/api/system/hardware"),
  messages: (id, upto) => call(`${job(id)}/messages${upto !== undefined ? `?upto=${upto}` : ""}`),
  metrics: (id, maxPoints) => call(`${job(id)}/metrics${maxPoints ? `?max_points=${maxPoints}` : ""}`),
  listSweeps: () => call("/api/sweeps"),
  getSweep: (id) => call(`/api/sweeps/${encodeURIComponent(id)}`),
  stopSweep: (id) => call(`/api/sweeps/${encodeURIComponent(id)}/stop`, {method: "POST"}),
  // EventSource cannot send headers, so a token travels in the query string.
  eventsUrl: (id, after) => {
    const token = localStorage.getItem("tunestudio.token");
    return `${job(id)}/events?after=${after}` + (token ? `&access_token=${encodeURIComponent(token)}` : "");
  },
};

/**
 * POST /v1/chat/completions with stream: true; calls onDelta(text) per chunk of content, onPart(delta) per
 * chunk with reasoning_content or tool_calls, and resolves with the finish reason. Rejects with an ApiError for an error answer or an error in the stream, and an AbortError on abort.
 */
export async function chatStream(body, signal, onDelta, onPart = () => {}) {
  const res = await fetch("/v1/chat/completions", {method: "POST", headers: headers(true),
    body: JSON.stringify(body), signal});
  if (!res.ok) {
    let data = null;
    try { data = await res.json(); } catch { data = null; }
    throw new ApiError(res.status, data && (data.error || data.detail));
  }
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "", finish = null;
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("");
      if (!data || data === "[DONE]") continue;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new ApiError(500, chunk.error);
      const choice = chunk.choices && chunk.choices[0];
      if (choice && choice.delta && choice.delta.content) onDelta(choice.delta.content);
      // reasoning_content and tool_calls deltas (a model whose template thinks or calls tools)
      if (choice && choice.delta && (choice.delta.reasoning_content || choice.delta.tool_calls)) onPart(choice.delta);
      if (choice && choice.finish_reason) finish = choice.finish_reason;
    }
  }
  return finish;
}

/** A link that downloads `url` as `filename`. A plain link, so the browser streams a big file to disk; a server
 * with an API token takes it only in a header (never in a URL), so there a click fetches the file with the token
 * and hands the browser the result. onError(err) hears a refusal. */
export function downloadLink(url, filename, content, attrs = {}, onError = () => {}) {
  const a = document.createElement("a");
  a.href = url;
  a.download = filename;
  for (const [k, v] of Object.entries(attrs)) a.setAttribute(k, v);
  appendKids(a, content);
  a.addEventListener("click", async (event) => {
    const token = localStorage.getItem("tunestudio.token");
    if (!token) return;  // the browser downloads it itself
    event.preventDefault();
    try {
      const res = await fetch(url, {headers: {Authorization: `Bearer ${token}`}});
      if (!res.ok) throw await failed(res);
      const href = URL.createObjectURL(await res.blob());
      const save = document.createElement("a");
      save.href = href;
      save.download = filename;
      appendKids(document.body, save);
      save.click();
      save.remove();
      setTimeout(() => URL.revokeObjectURL(href), 60000);
    } catch (err) {
      onError(err);
    }
  });
  return a;
}

async function failed(res) {
  let detail = null;
  try { detail = (await res.json()).detail; } catch { /* not JSON */ }
  return new ApiError(res.status, detail);
}

/** Part of a job's log file: {text, start, end, size, exists}; `query` is {tail} or {offset}. */
async function logPart(id, query) {
  const params = new URLSearchParams(Object.entries(query).map(([k, v]) => [k, String(v)]));
  const res = await fetch(`${job(id)}/log?${params}`, {headers: headers(false)});
  if (!res.ok) throw await failed(res);
  const number = (name) => Number(res.headers.get(name) || 0);
  return {text: await res.text(), start: number("X-Log-Start"), end: number("X-Log-End"), size: number("X-Log-Size"),
    exists: res.headers.get("X-Log-Exists") === "true"};
}

/** A dataset file, sent as multipart/form-data (the one kind of body besides JSON the API takes). */
async function uploadFile(file) {
  const form = new FormData();
  form.set("file", file, file.name);  // FormData: one file field
  const hdrs = headers(false);
  const res = await fetch("/api/uploads", {method: "POST", headers: hdrs, body: form});
  if (!res.ok) throw await failed(res);
  return res.json();
}

/** POST /v1/audio/transcriptions (multipart, as OpenAI's clients send it): {text, language, duration, segments}.
 * Its errors come in OpenAI's shape ({"error": {message, code, param}}), made an ApiError here. */
export async function transcribe(model, blob, name) {
  const form = new FormData();
  form.set("file", blob, name);
  form.set("model", model);
  form.set("response_format", "verbose_json");
  const res = await fetch("/v1/audio/transcriptions", {method: "POST", headers: headers(false), body: form});
  if (!res.ok) {
    let error = null;
    try { error = (await res.json()).error; } catch { /* not JSON */ }
    throw new ApiError(res.status, error ? {message: error.message, code: error.code, field: error.param} : null);
  }
  return res.json();
}
