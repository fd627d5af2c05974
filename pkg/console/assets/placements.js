import { h, replace } from "./dom.js";
import { placements, projects } from "./api.js";

// REASON names each NotSelectedReasonKind for people; the server's message says the rest.
const REASON = {
  NOT_SELECTED_REASON_KIND_NOT_IN_CLUSTER_SETS: "Not in a bound set",
  NOT_SELECTED_REASON_KIND_PREDICATE_NOT_MATCHED: "No predicate matched",
  NOT_SELECTED_REASON_KIND_TAINT_NOT_TOLERATED: "Taint not tolerated",
  NOT_SELECTED_REASON_KIND_CUT_BY_NUMBER_OF_CLUSTERS: "Cut by numberOfClusters",
  NOT_SELECTED_REASON_KIND_MISCONFIGURED: "Misconfigured",
};

function link(project, placement) {
  return "#/placements?" + new URLSearchParams(placement ? { project, placement } : { project });
}

function condition(p, type) {
  return (((p.status || {}).conditions) || []).find((c) => c.type === type);
}

function placementRows(project, ps, chosen) {
  return ps.map((p) => {
    const sat = condition(p, "PlacementSatisfied");
    const mis = condition(p, "PlacementMisconfigured");
    const state = mis && mis.status === "True" ? `Misconfigured (${mis.reason || ""})` : sat ? `${sat.status === "True" ? "Satisfied" : "Not satisfied"}${sat.reason ? " (" + sat.reason + ")" : ""}` : "Not decided yet";
    return h("tr", { "data-placement": p.name },
      h("th", { scope: "row" }, h("a", { href: link(project, p.name), "aria-current": p.name === chosen ? "true" : false }, p.name)),
      h("td", {}, String((p.status || {}).numberOfSelectedClusters || 0), p.numberOfClusters !== undefined ? ` of ${p.numberOfClusters} wanted` : ""),
      h("td", { title: (sat || mis || {}).message || "" }, state),
      h("td", {}, (p.clusterSets || []).length ? (p.clusterSets).map((s) => h("span", { class: "chip" }, s)) : h("span", { class: "muted" }, "every bound set")));
  });
}

// reason renders why a cluster is not selected: the kind, the server's sentence, and the
// structured detail the sentence summarises.
function reason(c) {
  const r = c.reason;
  if (c.selected || !r) return "";
  return [
    h("strong", {}, REASON[r.kind] || "Not selected"),
    r.message ? h("div", { class: "reason-msg" }, r.message) : null,
    (r.eligibleClusterSets || []).length ? h("div", {}, "Eligible sets: ", r.eligibleClusterSets.map((s) => h("span", { class: "chip" }, s))) : null,
  ];
}

function explanation(ex) {
  const prios = ex.prioritizers || [];
  const cs = ex.clusters || [];
  const selected = cs.filter((c) => c.selected).length;
  return [
    ex.misconfigured ? h("p", { class: "error", role: "alert", id: "misconfigured" }, "The placement is misconfigured: ", ex.misconfigured) : null,
    h("p", { class: "count", role: "status", id: "explain-summary" },
      `${selected} selected, ${cs.length - selected} not selected of ${cs.length} cluster${cs.length === 1 ? "" : "s"}`,
      ex.evaluatedAt ? `; evaluated ${new Date(ex.evaluatedAt).toLocaleString()}` : ""),
    h("table", { id: "explanation" },
      h("caption", { class: "muted" }, "Every cluster: selected ones by rank, then the others with the reason"),
      h("thead", {}, h("tr", {},
        ["Cluster", "Selected", "Rank"].map((t) => h("th", { scope: "col" }, t)),
        prios.map((p) => h("th", { scope: "col", class: "num", "data-prioritizer": p.name }, p.name, h("span", { class: "muted" }, ` ×${p.weight ?? 0}`))),
        ["Total", "Why not"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, cs.map((c) => {
        const scored = (c.rank || 0) > 0;
        return h("tr", { "data-cluster": c.clusterName, class: c.selected ? "selected" : "not-selected" },
          h("th", { scope: "row" }, c.clusterName),
          h("td", {}, c.selected ? "Yes" : "No"),
          h("td", { class: "num" }, scored ? String(c.rank) : "–"),
          prios.map((_, i) => h("td", { class: "num" }, scored ? String((c.scores || [])[i] ?? "0") : "–")),
          h("td", { class: "num" }, scored ? String(c.total ?? "0") : "–"),
          h("td", {}, reason(c)));
      }))),
  ];
}

export async function placementsPage(main, params, fail, signal) {
  const body = h("div", { id: "placements-body" });
  replace(main, h("h1", {}, "Placements"), body);
  const error = (el, e) => { if (!fail(e)) replace(el, h("p", { class: "error", role: "alert" }, e.message)); };
  let list;
  try {
    list = await projects.list();
  } catch (e) {
    error(body, e);
    return;
  }
  const projs = list.projects || [];
  if (!projs.length) {
    replace(body, h("p", { class: "muted", id: "no-projects" }, "No project you can read."));
    return;
  }
  const project = projs.some((p) => p.name === params.get("project")) ? params.get("project") : projs[0].name;
  const select = h("select", { id: "project", name: "project" },
    projs.map((p) => h("option", { value: p.name, selected: p.name === project }, p.displayName ? `${p.name} — ${p.displayName}` : p.name)));
  select.addEventListener("change", () => { location.hash = link(select.value); });
  const detail = h("div", { id: "placements-detail" }, h("p", { class: "muted" }, "Loading…"));
  replace(body, h("div", { class: "toolbar" }, h("div", {}, h("label", { for: "project" }, "Project"), select)), detail);

  let ps;
  try {
    ps = (await placements.list(project)).placements || [];
  } catch (e) {
    error(detail, e);
    return;
  }
  if (!ps.length) {
    replace(detail, h("p", { class: "muted", id: "no-placements" }, "No placement in this project."));
    return;
  }
  const chosen = ps.some((p) => p.name === params.get("placement")) ? params.get("placement") : ps[0].name;
  const decision = h("section", { id: "decision", "aria-labelledby": "decision-h" },
    h("h2", { id: "decision-h" }, `Decision of ${chosen}`), h("p", { class: "muted" }, "Loading…"));
  replace(detail,
    h("table", { id: "placements" },
      h("caption", { class: "muted" }, "Placements of the project"),
      h("thead", {}, h("tr", {}, ["Name", "Selected clusters", "State", "Cluster sets"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, placementRows(project, ps, chosen))),
    decision);
  let ex;
  try {
    ex = await placements.explain(project, chosen);
  } catch (e) {
    error(decision, e);
    return;
  }
  const live = h("p", { class: "muted", id: "decision-live", role: "status" }, "Following the decision…");
  const view = h("div", { id: "decision-view" }, explanation(ex));
  replace(decision, h("h2", { id: "decision-h" }, `Decision of ${chosen}`), live, view);

  // Live: WatchPlacementDecisions sends the current decision, then each change; on each the
  // explanation is asked for again (it is not streamed), the latest answer winning. The first
  // message is the decision as the stream opened, which may be newer than the explanation above
  // (a change between the two calls would otherwise never show), so it is asked for again too.
  let first = true;
  let asked = 0;
  placements.watchDecisions(project, chosen, async (msg) => {
    const n = ++asked;
    const opened = first;
    first = false;
    const what = [(msg.added || []).length ? `added ${msg.added.join(", ")}` : "", (msg.removed || []).length ? `removed ${msg.removed.join(", ")}` : ""]
      .filter(Boolean).join("; ") || "scores changed";
    try {
      const next = await placements.explain(project, chosen);
      if (n !== asked || signal.aborted) return;
      replace(view, explanation(next));
      replace(live, opened ? "Live: the explanation is asked for again when the decision changes."
        : `Live: the decision changed at ${new Date().toLocaleTimeString()} (${what}).`);
    } catch (e) {
      if (!signal.aborted && !fail(e)) replace(live, h("span", { class: "error", role: "alert" }, e.message));
    }
  }, signal).then(() => {
    replace(live, "The placement was deleted, or the server ended the stream; reload for the current state.");
  }, (e) => {
    if (signal.aborted || fail(e)) return;
    replace(live, h("span", { class: "error", role: "alert" }, "Not following the decision: ", e.message));
  });
}
