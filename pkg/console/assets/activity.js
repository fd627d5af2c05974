import { h, replace } from "./dom.js";
import { audit } from "./api.js";

// The filters live in the location (#/activity?actor=…&kind=…), so a link shows the same rows;
// page is the server's page token for the page after the first (opaque, checked by the server
// against the same filters). The time inputs are local time, sent as RFC 3339 instants.
const TEXT = [
  ["actor", "Actor", "alice or system:namespace-binding (exact)"],
  ["kind", "Object kind", "project, cluster, rolebinding, …"],
  ["name", "Object name", ""],
  ["project", "Project", ""],
  ["cluster", "Cluster", ""],
];
const SIZES = ["25", "100", "500"];

function hashOf(filters, page) {
  const q = {};
  for (const [k, v] of Object.entries(filters)) if (v) q[k] = v;
  if (page) q.page = page;
  const s = new URLSearchParams(q).toString();
  return "#/activity" + (s ? "?" + s : "");
}

function instant(local) {
  const d = new Date(local);
  return Number.isNaN(d.getTime()) ? null : d.toISOString();
}

// short drops the package of a type or procedure: fleetstream.project.v1.NamespaceBound →
// NamespaceBound, /fleetstream.x.v1.S/Method → S/Method.
function short(s) {
  return (s || "").replace(/^\/?([a-z0-9_]+\.)+/, "");
}

function row(a, filters) {
  const denied = a.type === "Denied";
  const filterLink = (extra, text, label) => h("a", { href: hashOf({ ...filters, ...extra }), "aria-label": label }, text);
  const obj = a.kind || a.name ? `${a.kind || ""}${a.name ? "/" + a.name : ""}` : "";
  return h("tr", { "data-activity": a.id || "0", class: denied ? "denied" : "" },
    h("td", {}, a.time ? h("time", { datetime: a.time }, new Date(a.time).toLocaleString()) : ""),
    h("td", { class: "actor" }, a.actor ? filterLink({ actor: a.actor }, a.actor, `Only the activity of ${a.actor}`) : ""),
    h("td", { title: denied ? a.procedure || "" : a.type || "" }, denied ? `Denied ${short(a.procedure)}` : short(a.type)),
    h("td", {}, obj ? filterLink({ kind: a.kind || "", name: a.name || "", project: a.project || "" }, obj, `Only the activity of ${obj}`) : ""),
    h("td", {}, a.project || ""),
    h("td", {}, a.cluster || ""),
    h("td", {}, denied
      ? [a.reason || "", a.count > 1 ? h("span", { class: "muted" }, ` (${a.count} calls)`) : ""]
      : h("span", { class: "muted" }, a.stream ? `${a.stream} #${a.sequence || 0}` : "")));
}

export async function activityPage(main, params, fail) {
  const filters = {};
  for (const [k] of TEXT) filters[k] = params.get(k) || "";
  filters.since = params.get("since") || "";
  filters.until = params.get("until") || "";
  filters.denied = params.get("denied") === "1" ? "1" : "";
  // Any size the server takes (1 to 1000) may come in a link; the menu offers a few.
  const size = Number(params.get("size"));
  filters.size = Number.isInteger(size) && size >= 1 && size <= 1000 ? String(size) : "";
  const page = params.get("page") || "";

  const inputs = {};
  const fields = TEXT.map(([k, label, hint]) => {
    inputs[k] = h("input", { id: "f-" + k, name: k, type: "search", value: filters[k], placeholder: hint, autocomplete: "off" });
    return h("div", {}, h("label", { for: "f-" + k }, label), inputs[k]);
  });
  for (const [k, label] of [["since", "From"], ["until", "Until"]]) {
    inputs[k] = h("input", { id: "f-" + k, name: k, type: "datetime-local", step: "1", value: filters[k] });
    fields.push(h("div", {}, h("label", { for: "f-" + k }, label), inputs[k]));
  }
  const sizes = SIZES.includes(filters.size || "100") ? SIZES : [filters.size, ...SIZES];
  inputs.size = h("select", { id: "f-size", name: "size" }, sizes.map((s) => h("option", { value: s, selected: (filters.size || "100") === s }, s)));
  fields.push(h("div", {}, h("label", { for: "f-size" }, "Rows per page"), inputs.size));
  inputs.denied = h("input", { id: "f-denied", name: "denied", type: "checkbox", checked: filters.denied === "1" });
  fields.push(h("div", { class: "check" }, h("label", { for: "f-denied" }, "Denied calls only"), inputs.denied));
  const form = h("form", { class: "toolbar", role: "search", "aria-label": "Filter activity" }, fields,
    h("button", { type: "submit", id: "apply" }, "Apply"),
    h("a", { href: "#/activity", id: "clear" }, "Clear filters"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const f = {};
    for (const [k] of TEXT) f[k] = inputs[k].value.trim();
    f.since = inputs.since.value;
    f.until = inputs.until.value;
    f.denied = inputs.denied.checked ? "1" : "";
    f.size = inputs.size.value === "100" ? "" : inputs.size.value;
    location.hash = hashOf(f);
  });
  const body = h("div", { id: "activity-body" }, h("p", { class: "muted" }, "Loading…"));
  replace(main, h("h1", {}, "Activity"), form, body);

  const req = { pageSize: Number(filters.size || "100") };
  for (const [k] of TEXT) if (filters[k]) req[k] = filters[k];
  for (const k of ["since", "until"]) {
    if (!filters[k]) continue;
    const t = instant(filters[k]);
    if (!t) {
      replace(body, h("p", { class: "error", role: "alert", id: "activity-error" }, `${k === "since" ? "From" : "Until"}: not a time: `, filters[k]));
      return;
    }
    req[k] = t;
  }
  if (filters.denied) req.deniedOnly = true;
  if (page) req.pageToken = page;

  let res;
  try {
    res = await audit.list(req);
  } catch (e) {
    if (!fail(e)) replace(body, h("p", { class: "error", role: "alert", id: "activity-error" }, e.message));
    return;
  }
  const rows = res.activities || [];
  const next = res.nextPageToken || "";
  const pager = h("nav", { class: "pager", "aria-label": "Activity pages" },
    page ? h("a", { href: hashOf(filters), id: "first-page" }, "First page") : null,
    next ? h("a", { href: hashOf(filters, next), id: "next-page", rel: "next" }, "Next page") : h("span", { class: "muted", id: "last-page" }, "No more activity"));
  replace(body,
    h("p", { class: "count", role: "status", id: "activity-count" },
      `${rows.length} row${rows.length === 1 ? "" : "s"} on this page, oldest first`,
      next ? " (a page may be short: each call reads a bounded part of the index)" : ""),
    h("table", { id: "activity" },
      h("caption", { class: "muted" }, "Who did what to which object, when"),
      h("thead", {}, h("tr", {}, ["Time", "Actor", "What", "Object", "Project", "Cluster", "Detail"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, rows.map((a) => row(a, filters)))),
    rows.length || next || page ? null : h("p", { class: "muted", id: "no-activity" },
      "No activity matches. Platform admins see every row; project owners the rows of their projects."),
    pager);
}
