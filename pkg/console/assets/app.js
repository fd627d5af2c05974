import { h, replace } from "./dom.js";
import { APIError, clusters, token } from "./api.js";
import { fleetPage } from "./fleet.js";
import { projectsPage } from "./projects.js";
import * as oidc from "./oidc.js";

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const signout = document.getElementById("signout");

// The first pages load with the console; the others on first visit, so the sign-in and the
// Fleet page do not wait for code they do not run.
const pages = {
  fleet: fleetPage,
  projects: projectsPage,
  access: async (...a) => (await import("./access.js")).accessPage(...a),
  placements: async (...a) => (await import("./placements.js")).placementsPage(...a),
  activity: async (...a) => (await import("./activity.js")).activityPage(...a),
  traffic: async (...a) => (await import("./traffic.js")).trafficPage(...a),
  clusters: async (...a) => (await import("./cluster.js")).clusterPage(...a),
};
// A page under another in the header: a cluster's page is the Fleet page's.
const navOf = { clusters: "fleet" };

// live is the current page's AbortController: a page that keeps a stream open (Traffic,
// Placements) stops it when the user moves on or signs out.
let live = null;
function stopLive() {
  if (live) live.abort();
  live = null;
}

// route parses "#/<page>[/<object>]?k=v": the page, the object it is about (a cluster's page:
// #/clusters/<name>) and its query (filters, the selected project).
function route() {
  const [path, query] = location.hash.replace(/^#\/?/, "").split("?");
  const [name, ...rest] = path.split("/");
  let object = "";
  try { object = decodeURIComponent(rest.join("/")); } catch { object = rest.join("/"); }
  return { page: pages[name] ? name : "fleet", object, params: new URLSearchParams(query || "") };
}

// How this fleetd lets the page sign in: with an OIDC issuer or not (oidc.js).
const cfg = await oidc.config();

// issuerName is what the sign-in button calls the issuer: its host.
function issuerName(issuer) {
  try { return new URL(issuer).host; } catch { return issuer; }
}

// showSignIn renders the sign-in: the issuer's button when fleetd has one, and the token form;
// error is what refused the last token or call.
function showSignIn(error) {
  stopLive();
  token.clear();
  delete document.body.dataset.ready;
  nav.hidden = true;
  signout.hidden = true;
  const input = h("textarea", { id: "token", name: "token", required: true, autocomplete: "off", spellcheck: "false",
    "aria-describedby": "token-help" });
  const form = h("form", { class: "signin", "aria-label": "Sign in" },
    h("h1", {}, "Sign in"),
    error ? h("p", { class: "error", role: "alert", id: "signin-error" }, error) : null,
    h("label", { for: "token" }, "API token"),
    input,
    h("p", { class: "muted", id: "token-help" },
      "Paste a bearer token that fleetd accepts (its token file or an OIDC ID token). It is kept in this tab only."),
    h("div", {}, h("button", { type: "submit", id: "signin" }, "Sign in")));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const t = input.value.trim();
    if (t) await signInWith(t);
  });
  let sso = null;
  if (cfg.oidc) {
    const button = h("button", { type: "button", id: "signin-oidc" }, "Sign in with " + issuerName(cfg.oidc.issuer));
    button.addEventListener("click", () => oidc.begin(cfg.oidc).catch((e) => showSignIn("Sign-in failed: " + e.message)));
    sso = h("section", { class: "signin", "aria-label": "Sign in with the identity provider" }, button);
  } else if (cfg.oidcError) {
    sso = h("p", { class: "muted", id: "signin-oidc-error" }, cfg.oidcError);
  }
  replace(main, sso, form);
  input.focus();
  // User Timing: how long from navigation until the console was usable (devtools, tests).
  performance.mark("console-ready");
}

// signInWith keeps t as this tab's token if the server accepts it.
async function signInWith(t) {
  token.set(t);
  try {
    // Any signed-in call proves the token; ListClusters is allowed to every signed-in user.
    await clusters.probe();
  } catch (e) {
    showSignIn(signInError(e));
    return;
  }
  render();
}

function signInError(e) {
  if (e instanceof APIError && e.code === "unauthenticated") return "Sign-in refused: " + e.message;
  return "Sign-in failed: " + e.message;
}

// fail is what every page calls with an error: a refused token ends the session.
function fail(e) {
  if (e instanceof APIError && e.code === "unauthenticated") {
    showSignIn(signInError(e));
    return true;
  }
  return false;
}

// renders counts render calls: a page whose data arrives after the user moved on writes into
// elements no longer on screen, and must not mark the newer page ready.
let renders = 0;

async function render() {
  const gen = ++renders;
  if (!token.get()) {
    showSignIn();
    return;
  }
  delete document.body.dataset.ready;
  nav.hidden = false;
  signout.hidden = false;
  const { page, object, params } = route();
  stopLive();
  live = new AbortController();
  for (const a of nav.querySelectorAll("a")) {
    if (a.id === "nav-" + (navOf[page] || page)) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  replace(main, h("p", { class: "muted" }, "Loading…"));
  try {
    await pages[page](main, params, fail, live.signal, object);
  } catch (e) {
    // A page's code that did not load (the server went away between pages): say so, unless
    // the user has moved on and main is another page's.
    if (gen === renders) replace(main, h("p", { class: "error", role: "alert" }, "This page failed to load: ", e.message));
  }
  // Tests and tools wait on this: the page has its data (or its error) on screen.
  if (token.get() && gen === renders) {
    document.body.dataset.ready = page;
    performance.mark("console-ready");
  }
}

signout.addEventListener("click", () => showSignIn());
window.addEventListener("hashchange", render);
// Back from the issuer with a code (or a refusal): finish that sign-in first.
let callback = null;
let refused = null;
try {
  callback = await oidc.finish();
} catch (e) {
  refused = e;
}
if (refused) showSignIn("Sign-in refused: " + refused.message);
else if (callback) await signInWith(callback);
else render();
