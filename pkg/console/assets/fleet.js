import { h, replace, chips } from "./dom.js";
import { clusters, clusterSets } from "./api.js";

export const STATUS = { CONDITION_STATUS_TRUE: "True", CONDITION_STATUS_FALSE: "False", CONDITION_STATUS_UNKNOWN: "Unknown" };
export const EFFECT = { TAINT_EFFECT_NO_SELECT: "NoSelect", TAINT_EFFECT_NO_SELECT_IF_NEW: "NoSelectIfNew", TAINT_EFFECT_PREFER_NO_SELECT: "PreferNoSelect" };
const SET_LABEL = "fleetstream.io/clusterset";

// inSet mirrors the registry's set membership (placement.v1 SelectorType) for display.
export function inSet(set, labels) {
  const sel = set.selector || {};
  if (sel.type === "SELECTOR_TYPE_LABEL_SELECTOR") {
    if (!sel.labelSelector) return false;
    const ls = sel.labelSelector;
    for (const [k, v] of Object.entries(ls.matchLabels || {})) if (labels[k] !== v) return false;
    for (const r of ls.matchExpressions || []) {
      const has = Object.prototype.hasOwnProperty.call(labels, r.key);
      const vals = r.values || [];
      if (r.operator === "In" && !(has && vals.includes(labels[r.key]))) return false;
      if (r.operator === "NotIn" && has && vals.includes(labels[r.key])) return false;
      if (r.operator === "Exists" && !has) return false;
      if (r.operator === "DoesNotExist" && has) return false;
    }
    return true;
  }
  const v = labels[SET_LABEL] || "";
  return v === set.name || (set.name === "default" && v === "");
}

export function agentKind(c) {
  const st = c.status || {};
  const connected = (st.conditions || []).some((x) => x.type === "AgentConnected" && x.status === "CONDITION_STATUS_TRUE");
  if (!connected) return "none connected";
  return st.agentHosted ? "hosted" : "in-cluster";
}

export function conditions(c) {
  return ((c.status || {}).conditions || []).map((x) => {
    const s = STATUS[x.status] || "Unknown";
    return h("div", { class: "st-" + s.toLowerCase(), title: x.message || "" },
      `${x.type}: ${s}`, x.reason ? ` (${x.reason})` : "");
  });
}

export function taints(c) {
  return (c.taints || []).map((t) => h("span", { class: "chip" }, `${t.key}${t.value ? "=" + t.value : ""}:${EFFECT[t.effect] || t.effect}`));
}

function resources(c) {
  const r = ((c.status || {}).resources || {});
  const a = r.allocatable || {};
  if (!Object.keys(a).length) return "";
  return `${a.cpu || "?"} CPU, ${a.memory || "?"} memory, ${r.nodeCount || 0} nodes`;
}

// FLEET_PAGE is how many clusters a server page brings: the first shows at once however many
// the fleet has (issue 32: 1,000 clusters took 0.5-0.9 s to render whole), "More clusters"
// brings the next, in the server's order (by name).
const FLEET_PAGE = 200;

export async function fleetPage(main, params, fail) {
  const selector = params.get("selector") || "";
  const input = h("input", { id: "selector", name: "selector", type: "search", value: selector,
    placeholder: "env=prod,tier!=edge", "aria-describedby": "selector-help" });
  const form = h("form", { class: "toolbar", role: "search", "aria-label": "Filter clusters" },
    h("div", {}, h("label", { for: "selector" }, "Label selector"), input),
    h("button", { type: "submit", id: "filter" }, "Filter"),
    h("span", { class: "muted", id: "selector-help" }, "Kubernetes label selector syntax, filtered by the server."));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = input.value.trim();
    location.hash = "#/fleet" + (q ? "?" + new URLSearchParams({ selector: q }) : "");
  });
  const body = h("div", { id: "fleet-body" }, h("p", { class: "muted" }, "Loading…"));
  replace(main, h("h1", {}, "Fleet"), form, body);

  let list, sets;
  try {
    [list, sets] = await Promise.all([clusters.page(selector, FLEET_PAGE), clusterSets.list()]);
  } catch (e) {
    // The selector comes from the location, which anyone can put in a link: text only.
    if (!fail(e)) replace(body, h("p", { class: "error", role: "alert", id: "fleet-error" }, selector ? `Label selector ${selector}: ` : "", e.message));
    return;
  }
  const cs = list.clusters || [];
  const ss = sets.clusterSets || [];
  const row = (c) => {
    const labels = c.labels || {};
    return h("tr", { "data-cluster": c.name },
      h("th", { scope: "row" }, h("a", { href: "#/clusters/" + encodeURIComponent(c.name) }, c.name)),
      h("td", {}, conditions(c)),
      h("td", {}, agentKind(c)),
      h("td", {}, (c.status || {}).kubernetesVersion || ""),
      h("td", {}, taints(c)),
      h("td", {}, chips(labels)),
      h("td", {}, ss.filter((s) => inSet(s, labels)).map((s) => h("span", { class: "chip" }, s.name))),
      h("td", {}, resources(c)));
  };
  const tbody = h("tbody", {}, cs.map(row));
  const count = h("p", { class: "count", role: "status", id: "fleet-count", tabindex: "-1" });
  const more = h("button", { type: "button", class: "secondary", id: "fleet-more" }, "More clusters");
  let token = list.nextPageToken || "";
  const shown = () => {
    const n = tbody.children.length;
    // The selector comes from the location: text only (textContent).
    count.textContent = `${n} cluster${n === 1 ? "" : "s"}` + (token ? " shown; more on the server" : "") + (selector ? ` matching ${selector}` : "");
    more.hidden = !token;
  };
  more.addEventListener("click", async () => {
    more.disabled = true;
    try {
      const next = await clusters.page(selector, FLEET_PAGE, token);
      tbody.append(...(next.clusters || []).map(row));
      token = next.nextPageToken || "";
    } catch (e) {
      if (!fail(e)) count.after(h("p", { class: "error", role: "alert", id: "fleet-error" }, e.message));
    } finally {
      more.disabled = false;
    }
    shown();
    if (!token) count.focus();
  });
  shown();
  replace(body,
    count,
    h("table", { id: "clusters" },
      h("caption", { class: "muted" }, "Clusters"),
      h("thead", {}, h("tr", {}, ["Name", "Conditions", "Agent", "Kubernetes", "Taints", "Labels", "Sets", "Resources"].map((t) => h("th", { scope: "col" }, t)))),
      tbody),
    more);
}
