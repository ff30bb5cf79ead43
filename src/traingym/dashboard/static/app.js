// Entry point: picks the view from the path (docs/dashboard.md, "Pages"):
//   /                  runs list (and eval folders)
//   /run/{id}          one run; tabs by hash: #charts #samples #timeline #details
//   /compare?runs=a,b  runs overlaid;  /compare?evals=a,b  evaluations side by side

import { clear, showError } from "/static/dom.js";
import { runsView } from "/static/runs.js";
import { runView } from "/static/run.js";
import { compareView } from "/static/compare.js";

async function main() {
  const view = clear(document.getElementById("view"));
  const path = window.location.pathname;
  const params = new URLSearchParams(window.location.search);
  const runMatch = path.match(/^\/run\/([^/]+)\/?$/);
  if (runMatch) {
    await runView(view, decodeURIComponent(runMatch[1]));
  } else if (path === "/compare" || path === "/compare/") {
    await compareView(view, params);
  } else {
    await runsView(view);
  }
  document.body.dataset.ready = "1";
}

window.addEventListener("unhandledrejection", (e) => showError(e.reason));
main().catch(showError);
