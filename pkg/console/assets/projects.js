import { h, replace } from "./dom.js";
import { projects } from "./api.js";

export const PHASE = { BINDING_PHASE_PENDING: "Pending", BINDING_PHASE_AVAILABLE: "Available", BINDING_PHASE_FAILED: "Failed", BINDING_PHASE_TERMINATING: "Terminating" };

// quota shows "used / hard" per resource of the namespace's quota.
export function quota(b) {
  const hard = b.hard || {};
  const used = b.used || {};
  const keys = Object.keys(hard).sort();
  if (!keys.length) return h("span", { class: "muted" }, "no quota");
  return keys.map((k) => h("div", {}, `${k}: ${used[k] ?? "?"} / ${hard[k]}`));
}

function budgets(p) {
  const bs = p.budgets || [];
  if (!bs.length) return null;
  return h("section", { "aria-labelledby": "budgets-h" },
    h("h2", { id: "budgets-h" }, "Budgets"),
    h("table", { id: "budgets" },
      h("thead", {}, h("tr", {}, ["Cluster", "Resource", "Allocated / budget"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, bs.flatMap((b) => Object.keys(b.hard || {}).sort().map((k) =>
        h("tr", {}, h("td", {}, b.cluster), h("td", {}, k), h("td", {}, `${(b.allocated || {})[k] ?? "0"} / ${b.hard[k]}`)))))));
}

export async function projectsPage(main, params, fail) {
  const body = h("div", { id: "projects-body" });
  replace(main, h("h1", {}, "Projects"), body);
  let list;
  try {
    list = await projects.list();
  } catch (e) {
    if (!fail(e)) replace(body, h("p", { class: "error", role: "alert" }, e.message));
    return;
  }
  const ps = list.projects || [];
  if (!ps.length) {
    replace(body, h("p", { class: "muted", id: "no-projects" }, "No project you can read."));
    return;
  }
  const name = ps.some((p) => p.name === params.get("project")) ? params.get("project") : ps[0].name;
  const select = h("select", { id: "project", name: "project" },
    ps.map((p) => h("option", { value: p.name, selected: p.name === name }, p.displayName ? `${p.name} — ${p.displayName}` : p.name)));
  select.addEventListener("change", () => { location.hash = "#/projects?" + new URLSearchParams({ project: select.value }); });
  const detail = h("div", { id: "project-detail" }, h("p", { class: "muted" }, "Loading…"));
  replace(body, h("div", { class: "toolbar" }, h("div", {}, h("label", { for: "project" }, "Project"), select)), detail);

  const p = ps.find((x) => x.name === name);
  let res;
  try {
    res = await projects.bindings(name);
  } catch (e) {
    if (!fail(e)) replace(detail, h("p", { class: "error", role: "alert" }, e.message));
    return;
  }
  const bs = (res.bindings || []).slice().sort((a, b) => (a.cluster + "/" + a.namespace).localeCompare(b.cluster + "/" + b.namespace));
  const byCluster = new Map();
  for (const b of bs) {
    if (!byCluster.has(b.cluster)) byCluster.set(b.cluster, []);
    byCluster.get(b.cluster).push(b);
  }
  const st = p.status || {};
  replace(detail,
    h("h2", { id: "project-title" }, p.displayName || p.name),
    h("p", { class: "count", role: "status" },
      `${st.namespaceCount || 0} namespaces: ${st.availableCount || 0} available, ${st.pendingCount || 0} pending, ${st.failedCount || 0} failed, ${st.terminatingCount || 0} terminating`),
    h("table", { id: "bindings" },
      h("caption", { class: "muted" }, "Namespaces per cluster"),
      h("thead", {}, h("tr", {}, ["Cluster", "Namespace", "Phase", "Reason", "Quota used / hard"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, [...byCluster].flatMap(([cluster, list]) => list.map((b, i) => {
        const phase = PHASE[b.phase] || "Unknown";
        return h("tr", { "data-binding": `${b.cluster}/${b.namespace}` },
          i === 0 ? h("th", { scope: "rowgroup", rowspan: list.length }, cluster) : null,
          h("td", {}, b.namespace),
          h("td", { class: "ph-" + phase.toLowerCase() }, phase),
          h("td", { title: b.message || "" }, b.reason || ""),
          h("td", {}, quota(b)));
      })))),
    budgets(p));
}
