// Sign-in with the OIDC issuer of fleetd's --oidc-issuer-url: the authorization code flow with
// PKCE (S256) as a public client, no secret (RFC 7636, OAuth 2.0 for browser-based apps).
// fleetd tells the page the issuer's endpoints (/ui/config.json, from the discovery document it
// reads itself); the page sends the browser to the authorization endpoint and, back here with a
// code, redeems it at the token endpoint (the issuer must allow this origin there: CORS) for an
// ID token, which is then the bearer token like a pasted one. What the flow keeps between the
// two page loads (verifier, state, nonce) is in sessionStorage, this tab only, and is removed
// as the callback is read; the code leaves the address bar before anything else happens.
const FLOW = "fleetstream.oidc";

// config is fleetd's answer to /ui/config.json ({} when it cannot be read).
export async function config() {
  try {
    const res = await fetch("/ui/config.json", { credentials: "omit", cache: "no-store" });
    return res.ok ? await res.json() : {};
  } catch {
    return {};
  }
}

function b64url(bytes) {
  let s = "";
  for (const b of bytes) s += String.fromCharCode(b);
  return btoa(s).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function random(n) {
  const b = new Uint8Array(n);
  crypto.getRandomValues(b);
  return b64url(b);
}

// redirectURI is where the issuer sends the browser back: fleetd's --console-oidc-redirect-url,
// or this console's /ui/ at the origin it was loaded from.
function redirectURI(oidc) {
  return oidc.redirectUri || new URL("/ui/", location.origin).href;
}

// begin starts a sign-in: it remembers verifier, state and nonce for this tab and leaves for the
// issuer's authorization endpoint.
export async function begin(oidc) {
  const verifier = random(32); // 43 characters, RFC 7636's minimum
  const state = random(16);
  const nonce = random(16);
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier));
  const flow = { verifier, state, nonce, redirectUri: redirectURI(oidc), clientId: oidc.clientId, tokenEndpoint: oidc.tokenEndpoint };
  sessionStorage.setItem(FLOW, JSON.stringify(flow));
  const u = new URL(oidc.authorizationEndpoint);
  for (const [k, v] of Object.entries({
    response_type: "code", client_id: oidc.clientId, redirect_uri: flow.redirectUri, scope: oidc.scope || "openid",
    state, nonce, code_challenge: b64url(new Uint8Array(digest)), code_challenge_method: "S256",
  })) u.searchParams.set(k, v);
  location.assign(u.href);
}

// finish handles the issuer's redirect back to the console: null when this page load is not
// one, else the ID token; it throws (an Error saying why) when the response is refused: a state
// this tab did not send, the issuer's error, a code the token endpoint does not redeem, an ID
// token for another sign-in (nonce).
export async function finish() {
  const q = new URLSearchParams(location.search);
  if (!q.has("code") && !q.has("state") && !q.has("error")) return null;
  // Out of the address bar and the history entry first, whatever happens next.
  history.replaceState(null, "", location.pathname + location.hash);
  let flow = null;
  try { flow = JSON.parse(sessionStorage.getItem(FLOW)); } catch { /* refused below */ }
  sessionStorage.removeItem(FLOW); // one answer per sign-in
  if (!flow || !q.get("state") || q.get("state") !== flow.state) {
    throw new Error("the answer does not belong to a sign-in started in this tab (state mismatch)");
  }
  if (q.has("error")) {
    throw new Error("the identity provider refused: " + q.get("error") + (q.get("error_description") ? " (" + q.get("error_description") + ")" : ""));
  }
  const code = q.get("code");
  if (!code) throw new Error("the identity provider sent no code");
  let res;
  try {
    res = await fetch(flow.tokenEndpoint, {
      method: "POST",
      body: new URLSearchParams({ grant_type: "authorization_code", code, redirect_uri: flow.redirectUri, client_id: flow.clientId, code_verifier: flow.verifier }),
      credentials: "omit", cache: "no-store",
    });
  } catch (e) {
    throw new Error("the identity provider's token endpoint is unreachable from this page (does it allow this origin, CORS?): " + e.message);
  }
  let body = {};
  try { body = await res.json(); } catch { /* refused below */ }
  if (!res.ok || typeof body.id_token !== "string") {
    throw new Error("the identity provider did not redeem the code: " + (body.error || "HTTP " + res.status));
  }
  let claims = {};
  try { claims = JSON.parse(atob(body.id_token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/"))); } catch { /* refused below */ }
  // fleetd verifies signature, issuer, audience and expiry; the nonce ties the token to this
  // sign-in, which only the page knows.
  if (claims.nonce !== flow.nonce) throw new Error("the ID token does not belong to this sign-in (nonce mismatch)");
  return body.id_token;
}
