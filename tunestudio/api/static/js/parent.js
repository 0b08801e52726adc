// A resumed job's chart starts with its parent's curve, faded: the run as one story.

import {api} from "./api.js";

/** The parent's training loss as [[steps], [losses]], or null when it cannot be read (deleted, say). */
export async function loadParent(parentId) {
  try {
    const {records} = await api.metrics(parentId, 5000);
    const train = records.filter((r) => r.loss !== null && r.loss !== undefined);
    return [train.map((r) => r.step), train.map((r) => r.loss)];
  } catch {
    return null;
  }
}

/** lossData ([xs, raw, avg, eval]) with the parent's loss as series 1, on the union of both runs' steps. */
export function withParent(data, parent) {
  const [xs, ...rest] = data;
  const [pxs, pys] = parent;
  const out = [[], [], ...rest.map(() => [])];
  let i = 0, j = 0;
  while (i < xs.length || j < pxs.length) {
    const a = i < xs.length ? xs[i] : Infinity, b = j < pxs.length ? pxs[j] : Infinity;
    const step = Math.min(a, b);
    out[0].push(step);
    out[1].push(b === step ? pys[j++] : null);
    if (a === step) { rest.forEach((s, k) => out[k + 2].push(s[i])); i++; } else rest.forEach((s, k) => out[k + 2].push(null));
  }
  return out;
}
