// This machine, live, in the header: CPU use, memory, and each GPU's memory and utilisation
// (GET /api/system/hardware, polled while the page is visible).

import {api} from "./api.js";
import {el, replaceKids} from "./util.js";

const POLL_MS = 3000;
const gb = (mb) => `${(mb / 1024).toFixed(1)} GB`;

export function mountHardware(box) {
  let timer = null;
  const poll = async () => {
    clearTimeout(timer);
    if (!document.hidden) {
      try {
        const hw = await api.hardware();
        const parts = [
          el("span", {class: "hw", id: "hw-cpu", title: hw.cpu.name}, `CPU ${Math.round(hw.cpu.percent ?? 0)}%`),
          el("span", {class: "hw", id: "hw-memory", title: "memory in use"},
            `RAM ${gb(hw.memory.used_mb ?? hw.memory.total_mb - hw.memory.available_mb)} / ${gb(hw.memory.total_mb)}`),
          ...hw.gpus.map((g) => el("span", {class: "hw", title: g.name},
            `${g.name.replace(/^NVIDIA /, "")} ${gb(g.memory_used_mb)} / ${gb(g.memory_total_mb)}`
            + (g.utilization_percent !== null ? ` · ${Math.round(g.utilization_percent)}%` : ""))),
        ];
        if (!hw.gpus.length) parts.push(el("span", {class: "hw muted"}, "no GPU"));
        replaceKids(box, ...parts);
      } catch {
        replaceKids(box, el("span", {class: "hw muted"}, "hardware: –"));
      }
    }
    timer = setTimeout(poll, POLL_MS);
  };
  document.addEventListener("visibilitychange", () => { if (!document.hidden) poll(); });
  poll();
}
