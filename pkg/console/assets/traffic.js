import { h, replace } from "./dom.js";
import { endpoints } from "./api.js";

function link(namespace, service) {
  return "#/traffic?" + new URLSearchParams({ namespace, service });
}

function pct(part, total) {
  return total > 0 ? `${(100 * part / total).toFixed(1)}%` : "0%";
}

// share works out who gets what: a proxy weighs every ready address by its weight (the
// endpoint's weight scaled by its cluster's, docs/endpoints.md), so an IP's share is its weight
// over the sum, and a cluster's the sum of its IPs'. An IP with several ports counts once.
function share(msg) {
  const clusters = (msg.clusters || []).map((c) => {
    const seen = new Set();
    let weight = 0;
    let ready = 0;
    for (const a of c.addresses || []) {
      if (!a.ready || seen.has(a.ip)) continue;
      seen.add(a.ip);
      ready++;
      weight += a.weight || 0;
    }
    return { c, weight, ready };
  });
  return { clusters, total: clusters.reduce((s, x) => s + x.weight, 0) };
}

function draw(live, ns, name, msg) {
  const { clusters, total } = share(msg);
  live.dataset.version = String(msg.version || 0);
  if (!msg.exists && !clusters.length) {
    return [h("p", { class: "muted", id: "no-endpoints" }, `${ns}/${name} has no endpoint slice in any cluster.`)];
  }
  const seen = new Set();
  const rows = [];
  for (const { c } of clusters) {
    for (const a of c.addresses || []) {
      const first = !seen.has(c.clusterName + "/" + a.ip);
      seen.add(c.clusterName + "/" + a.ip);
      const counted = a.ready && first;
      rows.push(h("tr", { "data-address": `${c.clusterName}/${a.ip}:${a.port || 0}` },
        h("td", {}, c.clusterName),
        h("td", {}, `${a.ip}:${a.port || 0}`, a.portName ? ` (${a.portName})` : ""),
        h("td", {}, a.ready ? "Ready" : a.terminating ? "Terminating" : "Not ready"),
        h("td", { class: "num" }, String(a.endpointWeight ?? 0)),
        h("td", { class: "num" }, String(a.weight ?? 0)),
        h("td", { class: "num" }, counted ? pct(a.weight || 0, total) : "–"),
        h("td", {}, a.zone || ""),
        h("td", {}, a.node || ""),
        h("td", {}, a.target || "")));
    }
  }
  return [
    h("table", { id: "traffic-clusters" },
      h("caption", { class: "muted" }, "Traffic share by cluster (ready endpoints, weighted)"),
      h("thead", {}, h("tr", {}, ["Cluster", "Cluster weight", "Ready endpoints", "Weight", "Share", "Agent"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, clusters.map(({ c, weight, ready }) => h("tr", { "data-cluster": c.clusterName },
        h("th", { scope: "row" }, c.clusterName),
        h("td", { class: "num" }, String(c.weight ?? 0), c.weight === 0 ? " (drained)" : ""),
        h("td", { class: "num" }, String(ready)),
        h("td", { class: "num" }, String(weight)),
        h("td", { class: "share" }, h("meter", { min: "0", max: "100", value: total ? (100 * weight / total).toFixed(1) : "0",
          "aria-label": `Share of ${c.clusterName}` }), " ", pct(weight, total)),
        h("td", { class: c.stale ? "st-unknown" : "" }, c.stale ? "stale" : "reporting",
          c.lastSeen ? h("span", { class: "muted" }, ` (seen ${new Date(c.lastSeen).toLocaleTimeString()})`) : ""))))),
    h("table", { id: "traffic-endpoints" },
      h("caption", { class: "muted" }, "Endpoints"),
      h("thead", {}, h("tr", {}, ["Cluster", "Address", "State", "Endpoint weight", "Weight", "Share", "Zone", "Node", "Target"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, rows)),
  ];
}

export async function trafficPage(main, params, fail, signal) {
  const body = h("div", { id: "traffic-body" }, h("p", { class: "muted" }, "Loading…"));
  replace(main, h("h1", {}, "Traffic"), body);
  const error = (el, e) => { if (!fail(e)) replace(el, h("p", { class: "error", role: "alert", id: "traffic-error" }, e.message)); };
  let list;
  try {
    list = (await endpoints.services()).services || [];
  } catch (e) {
    error(body, e);
    return;
  }
  let ns = params.get("namespace") || "";
  let name = params.get("service") || "";
  if ((!ns || !name) && list.length) [ns, name] = [list[0].namespace, list[0].name];
  const services = list.length
    ? h("table", { id: "services" },
      h("caption", { class: "muted" }, "Services you can read"),
      h("thead", {}, h("tr", {}, ["Service", "Clusters", "Ready / all endpoints"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, list.map((s) => h("tr", { "data-service": `${s.namespace}/${s.name}` },
        h("th", { scope: "row" }, h("a", { href: link(s.namespace, s.name),
          "aria-current": s.namespace === ns && s.name === name ? "true" : false }, `${s.namespace}/${s.name}`)),
        h("td", {}, (s.clusters || []).map((c) => h("span", { class: "chip" }, c))),
        h("td", { class: "num" }, `${s.readyEndpoints || 0} / ${s.totalEndpoints || 0}`)))))
    : h("p", { class: "muted", id: "no-services" }, "No service you can read has endpoints.");
  if (!ns || !name) {
    replace(body, services);
    return;
  }
  const status = h("p", { class: "count", role: "status", id: "traffic-status" }, "Connecting…");
  const view = h("div", { id: "traffic-view" });
  const live = h("section", { id: "traffic-live", "aria-labelledby": "traffic-h" },
    h("h2", { id: "traffic-h" }, `${ns}/${name}`), status, view);
  replace(body, services, live);

  // The page is ready at the first message (or the stream's refusal); the watch runs on until
  // the user leaves the page (signal) and each message redraws the view.
  let ready;
  const first = new Promise((r) => { ready = r; });
  endpoints.watch(ns, name, (msg) => {
    replace(view, draw(live, ns, name, msg));
    replace(status, `Live: version ${msg.version || 0}, updated ${new Date().toLocaleTimeString()}`);
    ready();
  }, signal).then(() => {
    replace(status, "The server ended the stream; reload for the current state.");
  }, (e) => {
    if (signal.aborted) return;
    if (fail(e)) return;
    replace(status, h("span", { class: "error", role: "alert", id: "traffic-error" }, e.message));
  }).finally(ready);
  await first;
}
