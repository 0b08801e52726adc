// Several jobs' loss curves on one chart.

import {api} from "./api.js";
import {colour, overlayChart, overlayData} from "./charts.js";
import {configDiff} from "./configdiff.js";
import {appendKids, basename, el, fmtNumber, replaceKids, statusBadge} from "./util.js";

export async function showCompare(main, ids) {
  const box = el("div", {class: "chart", id: "overlay-chart"});
  const legend = el("ul", {class: "compare-legend"});
  const view = el("article", {class: "compare"},
    el("h1", {}, `Comparing ${ids.length} jobs`),
    el("p", {class: "muted"}, "Loss by step. Untick jobs in the list to drop them; click one to open it."),
    el("section", {class: "chart-card wide"}, box), legend);
  replaceKids(main, view);

  const jobs = await Promise.all(ids.map((id) => api.getJob(id)));
  // A job by the name the user gave it; its id (and model) when it has none.
  const labels = jobs.map((j) => (j.name ? j.name : `${j.id} · ${basename(j.config.model_name)}`));
  const chart = overlayChart(box, labels);
  appendKids(view, el("section", {class: "chart-card wide"},
    el("h2", {}, "Config differences"), configDiff(jobs, labels)));
  let timer = null;

  const load = async () => {
    const all = await Promise.all(ids.map((id) => api.metrics(id, 5000)));
    const runs = all.map(({records}) => {
      const train = records.filter((r) => r.loss !== null && r.loss !== undefined);
      return {steps: train.map((r) => r.step), losses: train.map((r) => r.loss)};
    });
    chart.setData(overlayData(runs));
    replaceKids(legend, ...jobs.map((j, i) => el("li", {},
      el("span", {class: "swatch", style: `background:${colour(i)}`}),
      el("a", {href: `#/jobs/${j.id}`}, labels[i]), " ", statusBadge(j.status),
      runs[i].losses.length ? ` final loss ${fmtNumber(runs[i].losses.at(-1))}` : "")));
    const fresh = await Promise.all(ids.map((id) => api.getJob(id)));
    fresh.forEach((j, i) => { jobs[i] = j; });
    if (jobs.some((j) => !j.is_terminal)) timer = setTimeout(load, 3000);
  };
  await load();
  return () => { clearTimeout(timer); chart.destroy(); };
}
