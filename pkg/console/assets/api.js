// The Connect protocol's JSON form: POST /<package>.<Service>/<Method> with a JSON body, the
// user's bearer token, and the error as {code, message}. The token lives in sessionStorage
// only: gone when the tab closes, never in a URL or in storage that outlives the tab.
const KEY = "fleetstream.token";

export class APIError extends Error {
  constructor(code, message) {
    super(message || code);
    this.code = code;
  }
}

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (t) => sessionStorage.setItem(KEY, t),
  clear: () => sessionStorage.removeItem(KEY),
};

export async function call(procedure, request = {}) {
  const t = token.get();
  if (!t) throw new APIError("unauthenticated", "not signed in");
  let res;
  try {
    res = await fetch("/" + procedure, {
      method: "POST",
      headers: {
        "Content-Type": "application/json",
        "Connect-Protocol-Version": "1",
        "Authorization": "Bearer " + t,
      },
      body: JSON.stringify(request),
      credentials: "omit",
      cache: "no-store",
    });
  } catch (e) {
    throw new APIError("unavailable", "the server is unreachable: " + e.message);
  }
  const text = await res.text();
  let body = {};
  try { body = text ? JSON.parse(text) : {}; } catch { /* not JSON: a proxy's page */ }
  if (!res.ok) {
    throw new APIError(body.code || "unknown", body.message || `HTTP ${res.status}`);
  }
  return body;
}

// all calls a paged List procedure (page_size, page_token, next_page_token) until the last
// page and returns every page's `field` in one list: the server pages these lists, 500 a page
// unless asked, and the pages that use them render whole lists (paged in the page itself).
async function all(procedure, request, field) {
  const out = [];
  let pageToken = "";
  for (;;) {
    const page = await call(procedure, pageToken ? { ...request, pageToken } : request);
    out.push(...(page[field] || []));
    if (!page.nextPageToken || page.nextPageToken === pageToken) return { [field]: out };
    pageToken = page.nextPageToken;
  }
}

export const clusters = {
  list: (labelSelector) => all("fleetstream.cluster.v1.ClusterService/ListClusters", labelSelector ? { labelSelector, pageSize: 1000 } : { pageSize: 1000 }, "clusters"),
  // page is one server page of the clusters a selector matches, for a list shown page by page.
  page: (labelSelector, pageSize, pageToken) => call("fleetstream.cluster.v1.ClusterService/ListClusters",
    { ...(labelSelector ? { labelSelector } : {}), pageSize, ...(pageToken ? { pageToken } : {}) }),
  // probe is the cheapest call every signed-in user may make: one cluster's page.
  probe: () => call("fleetstream.cluster.v1.ClusterService/ListClusters", { pageSize: 1 }),
  get: (name, includeInventory) => call("fleetstream.cluster.v1.ClusterService/GetCluster", { name, includeInventory }),
};
export const clusterSets = {
  list: () => call("fleetstream.placement.v1.ClusterSetService/ListClusterSets"),
};
export const projects = {
  list: () => call("fleetstream.project.v1.ProjectService/ListProjects"),
  bindings: (project) => all("fleetstream.project.v1.ProjectService/ListNamespaceBindings", { project, pageSize: 1000 }, "bindings"),
  bindingsOn: (cluster) => all("fleetstream.project.v1.ProjectService/ListNamespaceBindings", { cluster, pageSize: 1000 }, "bindings"),
};
export const placements = {
  list: (project) => call("fleetstream.placement.v1.PlacementService/ListPlacements", { project }),
  explain: (project, name) => call("fleetstream.placement.v1.PlacementService/ExplainPlacement", { project, name }),
  watchDecisions: (project, name, onMessage, signal) =>
    watch("fleetstream.placement.v1.PlacementService/WatchPlacementDecisions", { project, name }, onMessage, signal),
};
export const audit = {
  list: (request) => call("fleetstream.audit.v1.AuditService/ListActivity", request),
};

// watch calls a server-streaming procedure with Connect's streaming JSON form over fetch:
// request and response are envelopes (a flag byte, a big-endian uint32 length, the JSON); the
// flag 2 envelope ends the stream, with {error: {code, message}} when it failed. onMessage gets
// every message; the promise settles when the stream ends (rejects with an APIError, or with the
// AbortError of signal when the caller stopped it). The first message is resolved through
// onMessage, so a page can render it and let the stream run on.
export async function watch(procedure, request, onMessage, signal) {
  const t = token.get();
  if (!t) throw new APIError("unauthenticated", "not signed in");
  const json = new TextEncoder().encode(JSON.stringify(request));
  const body = new Uint8Array(5 + json.length);
  new DataView(body.buffer).setUint32(1, json.length);
  body.set(json, 5);
  let res;
  try {
    res = await fetch("/" + procedure, {
      method: "POST",
      headers: {
        "Content-Type": "application/connect+json",
        "Connect-Protocol-Version": "1",
        "Authorization": "Bearer " + t,
      },
      body, signal, credentials: "omit", cache: "no-store",
    });
  } catch (e) {
    if (signal && signal.aborted) throw e;
    throw new APIError("unavailable", "the server is unreachable: " + e.message);
  }
  if (!res.ok || !res.body) {
    let err = {};
    try { err = await res.json(); } catch { /* not JSON */ }
    throw new APIError(err.code || "unknown", err.message || `HTTP ${res.status}`);
  }
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = new Uint8Array(0);
  // Whatever ends the loop (the end message, an error, a handler that throws), the response
  // stream is cancelled: left open, the server's messages would keep arriving and buffering.
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) throw new APIError("unavailable", "the stream ended without its end message");
      const joined = new Uint8Array(buf.length + value.length);
      joined.set(buf);
      joined.set(value, buf.length);
      buf = joined;
      while (buf.length >= 5) {
        const len = new DataView(buf.buffer, buf.byteOffset, 5).getUint32(1);
        if (buf.length < 5 + len) break;
        const flags = buf[0];
        const msg = JSON.parse(decoder.decode(buf.subarray(5, 5 + len)) || "{}");
        buf = buf.slice(5 + len);
        if (flags & 2) {
          if (msg.error) throw new APIError(msg.error.code || "unknown", msg.error.message || msg.error.code);
          return;
        }
        onMessage(msg);
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

export const endpoints = {
  services: (namespace) => call("fleetstream.endpoint.v1.EndpointService/ListServices", namespace ? { namespace } : {}),
  setClusterWeight: (namespace, name, cluster, weight) =>
    call("fleetstream.endpoint.v1.EndpointService/SetClusterWeight", { namespace, name, cluster, weight }),
  watch: (namespace, name, onMessage, signal) =>
    watch("fleetstream.endpoint.v1.EndpointService/WatchServiceEndpoints", { namespace, name, filter: "ENDPOINT_FILTER_ALL" }, onMessage, signal),
};

const RBAC = "fleetstream.rbac.v1.RBACService/";
export const rbac = {
  templates: () => call(RBAC + "ListRoleTemplates"),
  bindings: (project) => all(RBAC + "ListProjectRoleBindings", { project, pageSize: 1000 }, "bindings"),
  // bindingsPage is one server page of a project's role bindings, for a list shown page by page.
  bindingsPage: (project, pageSize, pageToken) => call(RBAC + "ListProjectRoleBindings", pageToken ? { project, pageSize, pageToken } : { project, pageSize }),
  whoCan: (cluster, namespace, verb, resource, apiGroup) => call(RBAC + "WhoCan", { cluster, namespace, verb, resource, apiGroup }),
  accessAt: (subject, time) => call(RBAC + "AccessAt", { subject, time }),
  bind: (project, subject, roleTemplate, dryRun) => call(RBAC + "BindProjectRole", { project, subject, roleTemplate, dryRun }),
  unbind: (project, subject, roleTemplate, dryRun) => call(RBAC + "UnbindProjectRole", { project, subject, roleTemplate, dryRun }),
};
