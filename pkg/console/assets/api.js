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

export const clusters = {
  list: (labelSelector) => call("fleetstream.cluster.v1.ClusterService/ListClusters", labelSelector ? { labelSelector } : {}),
};
export const clusterSets = {
  list: () => call("fleetstream.placement.v1.ClusterSetService/ListClusterSets"),
};
export const projects = {
  list: () => call("fleetstream.project.v1.ProjectService/ListProjects"),
  bindings: (project) => call("fleetstream.project.v1.ProjectService/ListNamespaceBindings", { project }),
};
export const placements = {
  list: (project) => call("fleetstream.placement.v1.PlacementService/ListPlacements", { project }),
  explain: (project, name) => call("fleetstream.placement.v1.PlacementService/ExplainPlacement", { project, name }),
};
export const audit = {
  list: (request) => call("fleetstream.audit.v1.AuditService/ListActivity", request),
};
