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
        // proto3 JSON leaves out zero: no weight is weight 0, a drained cluster.
        h("td", { class: "num" }, String(c.weight ?? 0), c.weight ? "" : " (drained)"),
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

// scaled is an address's weight under cluster weight w, as the collector computes it:
// endpoint weight × w / 100, at least 1 unless either is 0.
function scaled(endpointWeight, w) {
  if (!endpointWeight || !w) return 0;
  return Math.max(1, Math.floor(endpointWeight * w / 100));
}

// preview is the share each cluster would have with cluster's weight set to w.
function preview(msg, cluster, w) {
  const next = { ...msg, clusters: (msg.clusters || []).map((c) => c.clusterName !== cluster ? c
    : { ...c, weight: w, addresses: (c.addresses || []).map((a) => ({ ...a, weight: scaled(a.endpointWeight ?? 0, w) })) }) };
  const { clusters, total } = share(next);
  return clusters.map(({ c, weight }) => `${c.clusterName} ${pct(weight, total)}`).join(", ");
}

// weightForm sets a cluster's weight for the service, after a confirmation that says what the
// shares become. The server decides who may: a refusal shows in the form.
function weightForm(ns, name, latest, fail) {
  const select = h("select", { id: "weight-cluster", name: "cluster" });
  const input = h("input", { id: "weight-value", name: "weight", type: "number", min: "0", max: "65535", step: "1", value: "100", required: true });
  const note = h("div", { id: "weight-note", role: "status" });
  const question = h("p", { id: "confirm-text" });
  const yes = h("button", { type: "button", id: "confirm-yes" }, "Set the weight");
  const no = h("button", { type: "button", id: "confirm-no", class: "secondary" }, "Cancel");
  const dialog = h("dialog", { id: "confirm", "aria-labelledby": "confirm-h", "aria-describedby": "confirm-text" },
    h("h2", { id: "confirm-h" }, "Change the traffic split?"), question, h("div", { class: "toolbar" }, yes, no));
  let pending = null;
  const ask = (w) => {
    const cluster = select.value;
    const msg = latest();
    if (!cluster || !msg) return;
    const now = ((msg.clusters || []).find((c) => c.clusterName === cluster) || {}).weight ?? 0;
    pending = { cluster, w };
    replace(question, `Set the weight of ${ns}/${name} on ${cluster} from ${now} to ${w}${w === 0 ? " (drain: no new traffic to it)" : ""}? ` +
      `The shares become: ${preview(msg, cluster, w)}.`);
    dialog.showModal();
    no.focus();
  };
  no.addEventListener("click", () => { pending = null; dialog.close(); });
  yes.addEventListener("click", async () => {
    const p = pending;
    pending = null;
    dialog.close();
    if (!p) return;
    replace(note, h("span", { class: "muted" }, `Setting ${p.cluster} to ${p.w}…`));
    try {
      await endpoints.setClusterWeight(ns, name, p.cluster, p.w);
      replace(note, h("span", { class: "muted" }, `${p.cluster} set to ${p.w}; the shares below follow the watch.`));
    } catch (e) {
      // A session that ended (expired or revoked token) goes back to sign-in, as every call does.
      if (!fail(e)) replace(note, h("span", { class: "error", role: "alert", id: "weight-error" }, e.message));
    }
  });
  const form = h("form", { class: "toolbar", id: "weight-form", "aria-label": `Cluster weight of ${ns}/${name}` },
    h("div", {}, h("label", { for: "weight-cluster" }, "Cluster"), select),
    h("div", {}, h("label", { for: "weight-value" }, "Weight (100 is the default, 0 drains)"), input),
    h("button", { type: "submit", id: "weight-set" }, "Set weight…"),
    h("button", { type: "button", id: "weight-drain", class: "secondary" }, "Drain…"),
    note, dialog);
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const w = Number(input.value);
    if (!Number.isInteger(w) || w < 0 || w > 65535) {
      replace(note, h("span", { class: "error", role: "alert", id: "weight-error" }, "The weight is a whole number from 0 to 65535."));
      return;
    }
    ask(w);
  });
  form.querySelector("#weight-drain").addEventListener("click", () => ask(0));
  // clusters refreshes the menu only when the set of clusters changed, so a live update never
  // resets what the user picked.
  let names = "";
  form.clusters = (msg) => {
    const cs = (msg.clusters || []).map((c) => c.clusterName);
    if (cs.join("\n") === names) return;
    names = cs.join("\n");
    const keep = select.value;
    replace(select, cs.map((c) => h("option", { value: c, selected: c === keep }, c)));
  };
  return form;
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
  let last = null;
  const weights = weightForm(ns, name, () => last, fail);
  const live = h("section", { id: "traffic-live", "aria-labelledby": "traffic-h" },
    h("h2", { id: "traffic-h" }, `${ns}/${name}`), status, weights, view);
  replace(body, services, live);

  // The page is ready at the first message (or the stream's refusal); the watch runs on until
  // the user leaves the page (signal) and each message redraws the view.
  let ready;
  const first = new Promise((r) => { ready = r; });
  endpoints.watch(ns, name, (msg) => {
    last = msg;
    weights.clusters(msg);
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
