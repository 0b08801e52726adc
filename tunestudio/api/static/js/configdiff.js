// The compare view's config diff: the fields on which the selected jobs differ, one column per job.

import {el} from "./util.js";

const show = (v) => (v === undefined ? "–" : v === null ? "unset" : typeof v === "object" ? JSON.stringify(v) : String(v));

export function configDiff(jobs, labels) {
  const keys = [...new Set(jobs.flatMap((j) => Object.keys(j.config)))].sort();
  // output_dir always differs (each job has its own folder): not a difference a user chose.
  const differing = keys.filter((k) => k !== "output_dir"
    && new Set(jobs.map((j) => JSON.stringify(j.config[k]))).size > 1);
  if (!differing.length) return el("p", {class: "muted", id: "config-diff"}, "The configs are the same.");
  return el("table", {class: "config", id: "config-diff"},
    el("thead", {}, el("tr", {}, el("th", {}, "field"), labels.map((l) => el("th", {scope: "col"}, l)))),
    el("tbody", {}, differing.map((k) => el("tr", {"data-key": k}, el("th", {scope: "row"}, k),
      jobs.map((j) => el("td", {}, el("code", {}, show(j.config[k]))))))));
}
