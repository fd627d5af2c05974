import { h, replace, chips } from "./dom.js";
import { APIError, audit, clusters, clusterSets, projects } from "./api.js";
import { EFFECT, STATUS, agentKind, inSet } from "./fleet.js";
import { PHASE, quota } from "./projects.js";

// A cluster's page (#/clusters/<name>): what the registry holds about it (GetCluster), the
// namespaces its agent last reported (the inventory, platform admins only), and the namespace
// bindings on it the user may read, per project, with phase and reason.

const when = (t) => (t ? new Date(t).toLocaleString() : "");

function section(id, title, ...content) {
  return h("section", { "aria-labelledby": id + "-h" }, h("h2", { id: id + "-h" }, title), content);
}

function table(id, caption, cols, rows) {
  return h("table", { id },
    h("caption", { class: "muted" }, caption),
    h("thead", {}, h("tr", {}, cols.map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, rows));
}

// getCluster asks with the inventory first; a caller who may not read it (it is the platform's)
// gets the cluster without it, and the page says why the inventory is missing.
async function getCluster(name) {
  try {
    return { ...(await clusters.get(name, true)), inventoryAllowed: true };
  } catch (e) {
    if (!(e instanceof APIError) || e.code !== "permission_denied") throw e;
  }
  return { ...(await clusters.get(name, false)), inventoryAllowed: false };
}

// recent is the cluster's last events of the past day, newest first: the audit trail
// (ListActivity {cluster}) is read oldest first, so the page asks for the day's first 100 and
// shows the last ten of them; the Activity page has them all. Who may not read the trail
// (it is for platform admins and the owners of the projects concerned) is told so.
async function recent(name, fail) {
  const since = new Date(Date.now() - 24 * 3600 * 1000);
  const all = h("a", { href: "#/activity?" + new URLSearchParams({ cluster: name }), id: "cluster-activity" }, `All activity on ${name}`);
  let res;
  try {
    res = await audit.list({ cluster: name, since: since.toISOString(), pageSize: 100 });
  } catch (e) {
    if (fail(e)) return null;
    return [h("p", { class: "muted", id: "cluster-events-refused" }, "The server does not show you this cluster's activity: ", e.message), all];
  }
  const rows = (res.activities || []).slice(-10).reverse();
  if (!rows.length) return [h("p", { class: "muted", id: "no-cluster-events" }, "Nothing you may read happened on it in the last 24 hours. "), all];
  const short = (t) => (t || "").replace(/^\/?([a-z0-9_]+\.)+/, "");
  return [
    table("cluster-events", res.nextPageToken ? "The last ten of the day's first events (more on the Activity page)" : "The last ten events of the past 24 hours, newest first",
      ["Time", "Actor", "What", "Object"], rows.map((a) => h("tr", {},
        h("td", {}, when(a.time)), h("td", {}, a.actor || ""),
        h("td", {}, a.type === "Denied" ? `Denied ${short(a.procedure)}` : short(a.type)),
        h("td", {}, a.kind || a.name ? `${a.kind || ""}${a.name ? "/" + a.name : ""}` : "")))),
    all,
  ];
}

export async function clusterPage(main, params, fail, signal, name) {
  const body = h("div", { id: "cluster-body" }, h("p", { class: "muted" }, "Loading…"));
  replace(main, h("p", {}, h("a", { href: "#/fleet", id: "back-fleet" }, "Fleet")), h("h1", { id: "cluster-title" }, "Cluster ", name), body);
  if (!name) {
    replace(body, h("p", { class: "error", role: "alert", id: "cluster-error" }, "No cluster named: the location is #/clusters/<name>."));
    return;
  }
  let got, sets, bindings, events;
  try {
    [got, sets, bindings, events] = await Promise.all([getCluster(name), clusterSets.list(), projects.bindingsOn(name), recent(name, fail)]);
  } catch (e) {
    // The name comes from the location, which anyone can put in a link: text only.
    if (!fail(e)) replace(body, h("p", { class: "error", role: "alert", id: "cluster-error" }, `Cluster ${name}: `, e.message));
    return;
  }
  const c = got.cluster || {};
  const st = c.status || {};
  const labels = c.labels || {};
  const res = st.resources || {};
  const inv = got.inventory;
  const invNames = new Map(((inv && inv.namespaces) || []).map((n) => [n.name, n]));
  const bs = (bindings.bindings || []).slice().sort((a, b) => (a.project + "/" + a.namespace).localeCompare(b.project + "/" + b.namespace));
  const byProject = new Map();
  for (const b of bs) {
    if (!byProject.has(b.project)) byProject.set(b.project, []);
    byProject.get(b.project).push(b);
  }
  const bound = new Set(bs.map((b) => b.namespace));
  const unbound = [...invNames.values()].filter((n) => !bound.has(n.name)).sort((a, b) => a.name.localeCompare(b.name));
  const inInventory = (ns) => (!got.inventoryAllowed || !inv ? "?" : invNames.has(ns) ? invNames.get(ns).phase || "yes" : "not reported");
  const resourceNames = [...new Set([...Object.keys(res.allocatable || {}), ...Object.keys(res.capacity || {})])].sort();

  replace(body,
    h("dl", { class: "facts", id: "cluster-facts" },
      h("dt", {}, "Agent"), h("dd", {}, agentKind(c), st.agentVersion ? ` (${st.agentVersion})` : ""),
      h("dt", {}, "Kubernetes"), h("dd", {}, st.kubernetesVersion || "not reported"),
      h("dt", {}, "Last seen"), h("dd", {}, when(st.lastSeen) || "never"),
      h("dt", {}, "Registered"), h("dd", {}, when(c.createTime))),
    section("conditions", "Conditions", table("cluster-conditions", "Conditions", ["Type", "Status", "Reason", "Message", "Since"],
      (st.conditions || []).map((x) => {
        const s = STATUS[x.status] || "Unknown";
        return h("tr", { "data-condition": x.type },
          h("th", { scope: "row" }, x.type), h("td", { class: "st-" + s.toLowerCase() }, s),
          h("td", {}, x.reason || ""), h("td", {}, x.message || ""), h("td", {}, when(x.lastTransitionTime)));
      }))),
    section("labels", "Labels, claims and sets",
      h("dl", { class: "facts" },
        h("dt", {}, "Labels"), h("dd", { id: "cluster-labels" }, Object.keys(labels).length ? chips(labels) : h("span", { class: "muted" }, "none")),
        h("dt", {}, "Claims"), h("dd", { id: "cluster-claims" }, Object.keys(c.claims || {}).length ? chips(c.claims) : h("span", { class: "muted" }, "none")),
        h("dt", {}, "Cluster sets"), h("dd", { id: "cluster-sets" },
          (sets.clusterSets || []).filter((s) => inSet(s, labels)).map((s) => h("span", { class: "chip" }, s.name))))),
    section("taints", "Taints", (c.taints || []).length
      ? table("cluster-taints", "Taints", ["Key", "Value", "Effect", "Added"], c.taints.map((t) => h("tr", {},
        h("th", { scope: "row" }, t.key), h("td", {}, t.value || ""), h("td", {}, EFFECT[t.effect] || t.effect || ""), h("td", {}, when(t.timeAdded)))))
      : h("p", { class: "muted", id: "no-taints" }, "No taints.")),
    section("resources", "Resources", resourceNames.length
      ? [table("cluster-resources", "Summed over Ready nodes", ["Resource", "Allocatable", "Capacity"], resourceNames.map((k) => h("tr", {},
        h("th", { scope: "row" }, k), h("td", {}, (res.allocatable || {})[k] || ""), h("td", {}, (res.capacity || {})[k] || "")))),
      h("p", { class: "muted" }, `${res.nodeCount || 0} Ready nodes, reported ${when(res.reportTime)}`)]
      : h("p", { class: "muted", id: "no-resources" }, "The agent has not reported resources.")),
    section("namespaces", "Namespaces and bindings",
      h("p", { class: "count", role: "status", id: "cluster-ns-status" },
        `${bs.length} namespace binding${bs.length === 1 ? "" : "s"} you can read`,
        got.inventoryAllowed
          ? (inv ? `; the agent reported ${invNames.size} namespaces ${when(inv.observedTime)}` : "; the agent has reported no namespaces")
          : "; the namespace inventory is for platform admins"),
      table("cluster-bindings", "Namespaces per project", ["Project", "Namespace", "Phase", "Reason", "Quota used / hard", "On the cluster"],
        [...[...byProject].flatMap(([project, list]) => list.map((b, i) => {
          const phase = PHASE[b.phase] || "Unknown";
          return h("tr", { "data-binding": `${project}/${b.namespace}` },
            i === 0 ? h("th", { scope: "rowgroup", rowspan: list.length },
              h("a", { href: "#/projects?" + new URLSearchParams({ project }) }, project)) : null,
            h("td", {}, b.namespace),
            h("td", { class: "ph-" + phase.toLowerCase() }, phase),
            h("td", {}, b.reason || "", b.message ? h("div", { class: "reason-msg" }, b.message) : null),
            h("td", {}, quota(b)),
            h("td", {}, inInventory(b.namespace)));
        })),
        ...unbound.map((n, i) => h("tr", { "data-namespace": n.name },
          i === 0 ? h("th", { scope: "rowgroup", rowspan: unbound.length }, h("span", { class: "muted" }, "no project")) : null,
          h("td", {}, n.name), h("td", {}, "–"), h("td", {}, "not bound to a project"), h("td", {}, ""), h("td", {}, n.phase || "")))])),
    section("events", "Recent events", events));
}
