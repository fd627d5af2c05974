// Package oidctest is a real OpenID Connect issuer over HTTPS for tests: discovery document and
// JWKS (what the API's ID-token authentication reads), and, for the web console's browser
// sign-in, a minimal authorization endpoint that approves a fixed test user at once and a token
// endpoint that redeems its codes under PKCE (S256) with CORS for the console's origin. It is
// the issuer pkg/server's OIDC tests and fleetd's browser test both sign against.
package oidctest

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// Issuer is the test issuer. Its URL is https://127.0.0.1:<port>; CAFile verifies its
// certificate (--oidc-ca-file).
type Issuer struct {
	srv *httptest.Server
	// CAFile is a PEM file with the issuer's certificate.
	CAFile string

	// DiscoveryHits and JWKSHits count requests of the discovery document and the key set.
	DiscoveryHits atomic.Int32
	JWKSHits      atomic.Int32
	// TokenHits counts token endpoint requests (redeemed or refused).
	TokenHits atomic.Int32

	mu   sync.Mutex
	keys []jose.JSONWebKey // public keys served in the JWKS
	// down makes discovery answer 503, an issuer that is briefly unavailable.
	down bool
	// clients are the registered public clients of the login flow, by client id.
	clients map[string]Client
	// login is who the authorization endpoint signs in; signer signs its ID tokens.
	login  map[string]any
	signer *rsa.PrivateKey
	codes  map[string]grant
}

// Client is a registered public client (no secret; PKCE): the redirect URIs its authorization
// requests may name and the browser origins its token requests may come from (CORS).
type Client struct {
	RedirectURIs []string
	Origins      []string
}

// grant is an authorization code not yet redeemed.
type grant struct {
	clientID, redirectURI, challenge, nonce string
	expires                                 time.Time
}

// New starts an issuer, stopped when the test ends.
func New(t testing.TB) *Issuer {
	t.Helper()
	is := &Issuer{clients: map[string]Client{}, codes: map[string]grant{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, _ *http.Request) {
		is.DiscoveryHits.Add(1)
		is.mu.Lock()
		down := is.down
		is.mu.Unlock()
		if down {
			http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{
			"issuer":                                is.URL(),
			"jwks_uri":                              is.URL() + "/keys",
			"authorization_endpoint":                is.URL() + "/auth",
			"token_endpoint":                        is.URL() + "/token",
			"response_types_supported":              []string{"code", "id_token"},
			"subject_types_supported":               []string{"public"},
			"id_token_signing_alg_values_supported": []string{"RS256"},
			"code_challenge_methods_supported":      []string{"S256"},
		})
	})
	mux.HandleFunc("GET /keys", func(w http.ResponseWriter, _ *http.Request) {
		is.JWKSHits.Add(1)
		is.mu.Lock()
		defer is.mu.Unlock()
		writeJSON(w, http.StatusOK, jose.JSONWebKeySet{Keys: slices.Clone(is.keys)})
	})
	mux.HandleFunc("GET /auth", is.authorize)
	mux.HandleFunc("/token", is.token)
	is.srv = httptest.NewTLSServer(mux)
	t.Cleanup(is.srv.Close)
	is.CAFile = filepath.Join(t.TempDir(), "issuer-ca.pem")
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: is.srv.Certificate().Raw})
	if err := os.WriteFile(is.CAFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return is
}

// URL is the issuer URL (--oidc-issuer-url).
func (is *Issuer) URL() string { return is.srv.URL }

// SetDown makes discovery fail (503) or work again.
func (is *Issuer) SetDown(down bool) {
	is.mu.Lock()
	defer is.mu.Unlock()
	is.down = down
}

// Publish adds key's public half to the JWKS under kid.
func (is *Issuer) Publish(key *rsa.PrivateKey, kid string) {
	is.mu.Lock()
	defer is.mu.Unlock()
	is.keys = append(is.keys, jose.JSONWebKey{Key: &key.PublicKey, KeyID: kid, Algorithm: string(jose.RS256), Use: "sig"})
}

// AddClient registers a public client of the login flow.
func (is *Issuer) AddClient(id string, c Client) {
	is.mu.Lock()
	defer is.mu.Unlock()
	is.clients[id] = c
}

// SetLogin makes the authorization endpoint sign in the user with these claims (sub and any
// others, such as groups) without asking anything; the ID tokens of the codes it issues are
// signed with a key of its own, published in the JWKS. A nonce among the claims replaces the
// authorization request's (an ID token of another sign-in); nil claims make the authorization
// endpoint answer access_denied.
func (is *Issuer) SetLogin(t testing.TB, claims map[string]any) {
	t.Helper()
	is.mu.Lock()
	needKey := is.signer == nil
	is.mu.Unlock()
	if needKey {
		k := NewRSAKey(t)
		is.Publish(k, "login")
		is.mu.Lock()
		is.signer = k
		is.mu.Unlock()
	}
	is.mu.Lock()
	defer is.mu.Unlock()
	is.login = claims
}

// authorize is the authorization endpoint: response_type=code with a registered client and
// redirect URI and an S256 code challenge, approved at once for the login user; the browser
// is sent back to the redirect URI with the code and the client's state. A request it cannot
// trust with a redirect (unknown client or redirect URI) gets a 400 page, as the spec asks.
func (is *Issuer) authorize(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	is.mu.Lock()
	c, known := is.clients[q.Get("client_id")]
	login := is.login
	is.mu.Unlock()
	redirect := q.Get("redirect_uri")
	if !known || !slices.Contains(c.RedirectURIs, redirect) {
		http.Error(w, "unknown client_id or unregistered redirect_uri", http.StatusBadRequest)
		return
	}
	back, _ := url.Parse(redirect)
	out := back.Query()
	out.Set("state", q.Get("state"))
	switch {
	case q.Get("response_type") != "code":
		out.Set("error", "unsupported_response_type")
	case q.Get("code_challenge_method") != "S256" || len(q.Get("code_challenge")) != 43:
		out.Set("error", "invalid_request")
		out.Set("error_description", "PKCE with S256 is required")
	case login == nil:
		out.Set("error", "access_denied")
	default:
		code := randomString()
		is.mu.Lock()
		is.codes[code] = grant{clientID: q.Get("client_id"), redirectURI: redirect, challenge: q.Get("code_challenge"),
			nonce: q.Get("nonce"), expires: time.Now().Add(time.Minute)}
		is.mu.Unlock()
		out.Set("code", code)
	}
	back.RawQuery = out.Encode()
	http.Redirect(w, r, back.String(), http.StatusFound)
}

// token is the token endpoint: grant_type=authorization_code for a code issued to this client
// and redirect URI, redeemed once, whose challenge the code_verifier matches. It answers a
// registered origin's browser with CORS headers, as an identity provider does for a
// single-page app.
func (is *Issuer) token(w http.ResponseWriter, r *http.Request) {
	is.TokenHits.Add(1)
	if origin := r.Header.Get("Origin"); origin != "" && is.originAllowed(origin) {
		w.Header().Set("Access-Control-Allow-Origin", origin)
		w.Header().Set("Vary", "Origin")
	}
	switch r.Method {
	case http.MethodOptions:
		w.Header().Set("Access-Control-Allow-Methods", "POST")
		w.Header().Set("Access-Control-Allow-Headers", "Content-Type")
		w.WriteHeader(http.StatusNoContent)
		return
	case http.MethodPost:
	default:
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	if err := r.ParseForm(); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_request"})
		return
	}
	f := r.PostForm
	is.mu.Lock()
	g, ok := is.codes[f.Get("code")]
	delete(is.codes, f.Get("code")) // once, whatever the outcome
	login, signer := is.login, is.signer
	is.mu.Unlock()
	sum := sha256.Sum256([]byte(f.Get("code_verifier")))
	if f.Get("grant_type") != "authorization_code" || !ok || time.Now().After(g.expires) ||
		f.Get("client_id") != g.clientID || f.Get("redirect_uri") != g.redirectURI ||
		base64.RawURLEncoding.EncodeToString(sum[:]) != g.challenge {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_grant"})
		return
	}
	claims := map[string]any{}
	for k, v := range login {
		claims[k] = v
	}
	now := time.Now()
	claims["iss"], claims["aud"], claims["iat"], claims["exp"] = is.URL(), g.clientID, now.Unix(), now.Add(time.Hour).Unix()
	if _, forced := login["nonce"]; !forced && g.nonce != "" {
		claims["nonce"] = g.nonce
	}
	idToken, err := signJWT(jose.RS256, signer, "login", claims)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "server_error"})
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, map[string]any{"id_token": idToken, "access_token": randomString(), "token_type": "Bearer", "expires_in": 3600})
}

func (is *Issuer) originAllowed(origin string) bool {
	is.mu.Lock()
	defer is.mu.Unlock()
	for _, c := range is.clients {
		if slices.Contains(c.Origins, origin) {
			return true
		}
	}
	return false
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func randomString() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// NewRSAKey returns a new 2048-bit RSA key.
func NewRSAKey(t testing.TB) *rsa.PrivateKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Sign returns a compact JWS of claims signed with key (any key go-jose takes) under kid.
func Sign(t testing.TB, alg jose.SignatureAlgorithm, key any, kid string, claims map[string]any) string {
	t.Helper()
	s, err := signJWT(alg, key, kid, claims)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func signJWT(alg jose.SignatureAlgorithm, key any, kid string, claims map[string]any) (string, error) {
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: jose.JSONWebKey{Key: key, KeyID: kid}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		return "", err
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", err
	}
	jws, err := signer.Sign(payload)
	if err != nil {
		return "", err
	}
	return jws.CompactSerialize()
}
