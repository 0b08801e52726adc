// The worker's log file (GET /api/jobs/ID/log): its tail at once, then new bytes while the job runs,
// and a download link. It reads the file on disk, so a job opened after a server restart shows it too.

import {api, downloadLink} from "./api.js";
import {el, fmtBytes, replaceKids} from "./util.js";

const TAIL_BYTES = 64 * 1024;
const POLL_MS = 1500;
const KEEP_CHARS = 256 * 1024;  // what the page holds at most; the download has everything

export function mountLog(container, jobId, finished) {
  const pre = el("pre", {class: "log-text", id: "log-text", tabindex: "0", "aria-label": "worker log"});
  const head = el("p", {class: "muted small", id: "log-head"}, "Reading the log…");
  const download = downloadLink(api.logUrl(jobId), `${jobId}-worker.log`, "Download",
    {id: "log-download", class: "button ghost"}, (err) => { head.textContent = `Download failed: ${err.message}`; });
  replaceKids(container, el("div", {class: "log-bar"}, head, download), pre);
  let offset = null, timer = null, stopped = false;

  const append = (text) => {
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.textContent = (pre.textContent + text).slice(-KEEP_CHARS);
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  };
  const poll = async () => {
    if (stopped) return;
    const done = finished();  // read before the request: a last read after the end gets the end
    try {
      const part = offset === null ? await api.log(jobId, {tail: TAIL_BYTES}) : await api.log(jobId, {offset});
      if (stopped) return;
      if (offset === null && part.start > 0) append(`… (${fmtBytes(part.start)} before this; download for all)\n`);
      append(part.text);
      offset = part.end;
      head.textContent = part.size === 0 && !part.exists ? "No log yet: the worker has not started."
        : `${fmtBytes(part.size)}${done ? "" : " · live"}`;
    } catch (err) {
      head.textContent = `Cannot read the log: ${err.message}`;
    }
    if (!done && !stopped) timer = setTimeout(poll, POLL_MS);
  };
  poll();
  return {dispose() { stopped = true; clearTimeout(timer); }};
}
