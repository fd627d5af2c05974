import { h, replace } from "./dom.js";
import { projects, rbac } from "./api.js";

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
  let res, grants;
  try {
    // The members' section's code loads with the page's data, not with the console.
    [res, grants] = await Promise.all([projects.bindings(name), import("./grants.js")]);
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
    budgets(p),
    await members(name, grants, fail));
}

// MEMBERS_PAGE is how many members a server page brings: the first shows at once however many
// the project has (issue 32: 50,000 project role bindings), "More members" brings the next.
const MEMBERS_PAGE = 100;

// members is the project's role bindings (ListProjectRoleBindings) with a Revoke… each, and
// the grant form; both preview the change with the server's dry run and ask before writing
// (grants.js, as on the Access page). A change redraws the list from its first page. The rows
// are in the server's order (subject kind, name, role), not sorted here: a page sorted on its
// own would interleave with the next one's rows.
async function members(project, g, fail) {
  const section = h("section", { "aria-labelledby": "members-h", id: "members-section" });
  const note = h("div", { id: "members-note", role: "status" });
  const list = h("div", { id: "members-list" });
  const dialog = g.confirmDialog();
  const row = (b) => {
    const t = byName.get(b.roleTemplate);
    return h("tr", { "data-member": `${g.subjectID(b.subject)}|${b.roleTemplate}` },
      h("th", { scope: "row" }, g.subjectText(b.subject)),
      h("td", {}, b.roleTemplate, t && t.displayName ? h("div", { class: "muted" }, t.displayName) : null),
      h("td", {}, b.createTime ? new Date(b.createTime).toLocaleString() : "", b.creator ? ` by ${b.creator}` : ""),
      h("td", {}, h("button", { type: "button", class: "secondary", "data-revoke": `${g.subjectID(b.subject)}|${b.roleTemplate}`,
        "aria-label": `Revoke ${b.roleTemplate} from ${g.subjectText(b.subject)}`,
        onclick: () => g.revoke(project, b.subject, b.roleTemplate, dialog, note, draw, fail) }, "Revoke…")));
  };
  const draw = async () => {
    let page;
    try {
      page = await rbac.bindingsPage(project, MEMBERS_PAGE);
    } catch (e) {
      if (!fail(e)) replace(list, h("p", { class: "error", role: "alert", id: "members-error" }, e.message));
      return;
    }
    const bs = page.bindings || [];
    if (!bs.length) {
      replace(list, h("p", { class: "muted", id: "no-members" }, "No one holds a role in this project."));
      return;
    }
    const tbody = h("tbody", {}, bs.map(row));
    const count = h("p", { class: "muted", id: "members-count", role: "status" });
    const more = h("button", { type: "button", class: "secondary", id: "members-more" }, "More members");
    let token = page.nextPageToken || "";
    const shown = () => {
      const n = tbody.children.length;
      count.textContent = token ? `${n} members shown; more on the server.` : `${n} member${n === 1 ? "" : "s"}.`;
      more.hidden = !token;
    };
    more.addEventListener("click", async () => {
      more.disabled = true;
      try {
        const next = await rbac.bindingsPage(project, MEMBERS_PAGE, token);
        tbody.append(...(next.bindings || []).map(row));
        token = next.nextPageToken || "";
      } catch (e) {
        if (!fail(e)) replace(note, h("p", { class: "error", role: "alert", id: "members-error" }, e.message));
      } finally {
        more.disabled = false;
      }
      shown();
      // The focus stays on the button while there is more, else goes to the count.
      if (!token) count.focus();
    });
    count.tabIndex = -1;
    shown();
    replace(list,
      h("table", { id: "members" },
        h("caption", { class: "muted" }, "Members: who holds which role in every namespace of the project"),
        h("thead", {}, h("tr", {}, ["Subject", "Role", "Bound", "Change"].map((t) => h("th", { scope: "col" }, t)))),
        tbody),
      count, more);
  };
  let templates = [];
  try {
    templates = (await rbac.templates()).templates || [];
  } catch (e) {
    if (!fail(e)) replace(note, h("p", { class: "error", role: "alert", id: "members-error" }, e.message));
  }
  const byName = new Map(templates.map((t) => [t.name, t]));
  await draw();
  replace(section, h("h2", { id: "members-h" }, "Members and roles"), note, list,
    h("h3", {}, "Grant a role"), g.grantForm(project, templates, dialog, draw, fail), dialog.el);
  return section;
}
