// The page: a hash router over three views (new job, one job, comparison), the job list, the theme.
//   #/new            the new-job form
//   #/jobs/ID        one job
//   #/compare/A,B    loss curves of several jobs
//   #/sweeps         the sweeps; #/sweeps/ID one sweep's leaderboard
//   #/arena          blind votes between models, their leaderboard, the votes as training data

import {showArena} from "./arena.js";
import {rebuildAll} from "./charts.js";
import {showCompare} from "./compare.js";
import {showForm} from "./form.js";
import {mountHardware} from "./hardware.js";
import {showJob} from "./job.js";
import {JobList} from "./list.js";
import {showMakeData} from "./makedata.js";
import {showSweeps} from "./sweep.js";
import {appendKids, el, replaceKids} from "./util.js";

const main = document.getElementById("main");
let dispose = null;
let renderCount = 0;
let focusView = false;  // move keyboard focus into the next view (after Start: onto the new job)

const navigate = (hash) => { if (location.hash === hash) route(); else location.hash = hash; };

const list = new JobList(document.getElementById("jobs"), {
  onSelect(ids) {
    if (ids.length >= 2) navigate(`#/compare/${ids.join(",")}`);
    else if (location.hash.startsWith("#/compare/")) navigate(ids.length ? `#/jobs/${ids[0]}` : "#/new");
  },
});

// A view's handle on <main>: what it writes there lands only while it is the current view. A view still loading
// when the user moved on (the form waits for its defaults) would otherwise replace the newer view when it resumes.
function slotFor(mine) {
  const current = () => mine === renderCount;
  return {
    // what util.js's replaceKids and appendKids call, with the children they kept
    replaceChildren: (...kids) => { if (current()) replaceKids(main, ...kids); },
    append: (...kids) => { if (current()) appendKids(main, ...kids); },
  };
}

async function route() {
  const mine = ++renderCount;
  const slot = slotFor(mine);
  if (dispose) { dispose(); dispose = null; }
  const hash = location.hash || "#/new";
  const [, view, arg] = hash.split("/");
  document.body.dataset.view = view;
  document.title = "tunestudio";  // a job's view says its state there
  replaceKids(main, el("p", {class: "muted"}, "Loading…"));
  try {
    let cleanup;
    if (view === "jobs" && arg) {
      list.setActive(arg);
      cleanup = await showJob(slot, decodeURIComponent(arg), {onChange: () => list.refresh(), navigate});
    } else if (view === "sweeps") {
      list.setActive(null);
      cleanup = await showSweeps(slot, arg ? decodeURIComponent(arg) : null, {navigate});
    } else if (view === "arena") {
      list.setActive(null);
      cleanup = await showArena(slot, {navigate});
    } else if (view === "data") {
      list.setActive(null);
      cleanup = await showMakeData(slot, {navigate});
    } else if (view === "compare" && arg) {
      const ids = arg.split(",").filter(Boolean);
      list.setActive(null);
      list.setSelection(ids);
      cleanup = await showCompare(slot, ids);
    } else {
      list.setActive(null);
      cleanup = await showForm(slot, {onCreated: (id) => {
        list.refresh();
        focusView = true;
        navigate(`#/jobs/${id}`);
      }});
    }
    if (mine !== renderCount) cleanup?.();  // the user moved on while this view loaded
    else dispose = cleanup;
    // On a narrow screen the list sits above the view: bring the view's top into sight (a job, or the form
    // after "+ New job", not wherever the last view was scrolled to).
    if (mine === renderCount && matchMedia("(max-width: 900px)").matches) main.scrollIntoView({block: "start"});
    if (mine === renderCount && focusView) {
      focusView = false;
      main.focus();
    }
  } catch (err) {
    if (mine === renderCount) replaceKids(main, el("div", {class: "error-box"}, `Cannot show this: ${err.message}`));
  }
}

document.getElementById("theme-toggle").addEventListener("click", () => {
  const next = document.documentElement.dataset.theme === "dark" ? "light" : "dark";
  document.documentElement.dataset.theme = next;
  localStorage.setItem("tunestudio.theme", next);
  rebuildAll();
});

// The skip link focuses the view without touching the hash (the router owns it).
document.querySelector(".skip-link").addEventListener("click", (event) => {
  event.preventDefault();
  main.focus();
});
document.getElementById("status-filter").addEventListener("change", (event) => list.setFilter(event.target.value));
mountHardware(document.getElementById("hardware"));

window.addEventListener("hashchange", route);
list.start();
route();
