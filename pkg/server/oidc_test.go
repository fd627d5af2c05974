package server

import (
	"context"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/go-jose/go-jose/v4"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	"github.com/fleetstream/fleetstream/pkg/identity"
	"github.com/fleetstream/fleetstream/pkg/server/oidctest"
)

const testClientID = "fleetstream-test"

// testIssuer is the shared test issuer (oidctest): discovery document and JWKS over HTTPS.
type testIssuer struct{ *oidctest.Issuer }

func newTestIssuer(t testing.TB) *testIssuer { return &testIssuer{oidctest.New(t)} }

func (is *testIssuer) url() string                           { return is.URL() }
func (is *testIssuer) setDown(down bool)                     { is.SetDown(down) }
func (is *testIssuer) publish(k *rsa.PrivateKey, kid string) { is.Publish(k, kid) }

func newRSAKey(t testing.TB) *rsa.PrivateKey { return oidctest.NewRSAKey(t) }

// sign returns a compact JWS of claims signed with key (any key go-jose takes) under kid.
func sign(t testing.TB, alg jose.SignatureAlgorithm, key any, kid string, claims map[string]any) string {
	t.Helper()
	return oidctest.Sign(t, alg, key, kid, claims)
}

// unsigned returns a JWT with alg "none" and no signature.
func unsigned(t *testing.T, claims map[string]any) string {
	t.Helper()
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + enc(payload) + "."
}

// whoAmI answers GetCluster with the identity the server put into the context, in response
// headers, and streams it once from WatchClusters.
type whoAmI struct {
	clusterv1connect.UnimplementedClusterServiceHandler
}

func (whoAmI) GetCluster(ctx context.Context, _ *connect.Request[clusterv1.GetClusterRequest]) (*connect.Response[clusterv1.GetClusterResponse], error) {
	resp := connect.NewResponse(&clusterv1.GetClusterResponse{})
	resp.Header().Set("X-Actor", identity.ActorFrom(ctx))
	for _, g := range identity.GroupsFrom(ctx) {
		resp.Header().Add("X-Group", g)
	}
	return resp, nil
}

func (whoAmI) WatchClusters(ctx context.Context, _ *connect.Request[clusterv1.WatchClustersRequest], st *connect.ServerStream[clusterv1.WatchClustersResponse]) error {
	st.ResponseHeader().Set("X-Actor", identity.ActorFrom(ctx))
	return st.Send(&clusterv1.WatchClustersResponse{})
}

// allowAll is an authorizer that allows every call.
type allowAll struct{}

func (allowAll) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc { return next }
func (allowAll) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}
func (allowAll) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// startServer runs a server.Server with cfg and the whoAmI service and returns a client of it.
func startServer(t *testing.T, cfg Config) clusterv1connect.ClusterServiceClient {
	t.Helper()
	s, err := New(cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	// Authorization (pkg/authz) is not what this test is about: every authenticated call passes.
	s.Authorize(allowAll{})
	s.Handle(clusterv1connect.NewClusterServiceHandler(whoAmI{}, s.HandlerOptions()...))
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	return clusterv1connect.NewClusterServiceClient(hs.Client(), hs.URL)
}

func callWithToken(ctx context.Context, c clusterv1connect.ClusterServiceClient, token string) (*connect.Response[clusterv1.GetClusterResponse], error) {
	req := connect.NewRequest(&clusterv1.GetClusterRequest{Name: "c1"})
	if token != "" {
		req.Header().Set("Authorization", "Bearer "+token)
	}
	return c.GetCluster(ctx, req)
}

func writeTokenFile(t testing.TB, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestOIDCAuthentication(t *testing.T) {
	is := newTestIssuer(t)
	key, otherKey := newRSAKey(t), newRSAKey(t)
	is.publish(key, "k1")
	tokenFile := writeTokenFile(t, "file-token,dev-admin,uid-1,\"admins\"\n")

	now := time.Now()
	claims := func(mod func(c map[string]any)) map[string]any {
		c := map[string]any{
			"iss": is.url(), "aud": testClientID, "sub": "u-123",
			"email": "alice@example.com", "email_verified": true,
			"groups": []string{"team-a", "ops"},
			"iat":    now.Unix(), "exp": now.Add(time.Hour).Unix(),
		}
		if mod != nil {
			mod(c)
		}
		return c
	}
	good := func(mod func(c map[string]any)) string { return sign(t, jose.RS256, key, "k1", claims(mod)) }

	base := OIDCConfig{IssuerURL: is.url(), ClientID: testClientID, GroupsClaim: "groups", CAFile: is.CAFile}
	emailCfg := base
	emailCfg.UsernameClaim, emailCfg.UsernamePrefix, emailCfg.GroupsPrefix = "email", "oidc:", "oidc:"
	noGroups := base
	noGroups.GroupsClaim = ""

	cases := []struct {
		name       string
		oidc       OIDCConfig
		token      string
		wantUser   string
		wantGroups []string
		wantCode   connect.Code // 0: accepted
		wantMsg    string
	}{
		{name: "valid: sub and a list of groups", oidc: base, token: good(nil), wantUser: "u-123", wantGroups: []string{"team-a", "ops"}},
		{name: "valid: email with prefixes", oidc: emailCfg, token: good(nil), wantUser: "oidc:alice@example.com", wantGroups: []string{"oidc:team-a", "oidc:ops"}},
		{name: "groups claim as a single string", oidc: base, token: good(func(c map[string]any) { c["groups"] = "team-a" }), wantUser: "u-123", wantGroups: []string{"team-a"}},
		{name: "groups claim absent", oidc: base, token: good(func(c map[string]any) { delete(c, "groups") }), wantUser: "u-123"},
		{name: "groups claim not configured", oidc: noGroups, token: good(nil), wantUser: "u-123"},
		{name: "reserved system: groups dropped", oidc: base, token: good(func(c map[string]any) { c["groups"] = []string{"system:masters", "ops"} }), wantUser: "u-123", wantGroups: []string{"ops"}},
		{name: "audience list containing the client id", oidc: base, token: good(func(c map[string]any) { c["aud"] = []string{"other", testClientID} }), wantUser: "u-123", wantGroups: []string{"team-a", "ops"}},
		{name: "email_verified absent", oidc: emailCfg, token: good(func(c map[string]any) { delete(c, "email_verified") }), wantUser: "oidc:alice@example.com", wantGroups: []string{"oidc:team-a", "oidc:ops"}},
		{name: "token file still works", oidc: base, token: "file-token", wantUser: "dev-admin", wantGroups: []string{"admins"}},

		{name: "expired", oidc: base, token: good(func(c map[string]any) { c["exp"] = now.Add(-time.Minute).Unix() }), wantCode: connect.CodeUnauthenticated, wantMsg: "expired"},
		{name: "no expiry", oidc: base, token: good(func(c map[string]any) { delete(c, "exp") }), wantCode: connect.CodeUnauthenticated},
		{name: "wrong audience", oidc: base, token: good(func(c map[string]any) { c["aud"] = "someone-else" }), wantCode: connect.CodeUnauthenticated},
		{name: "wrong signature: another key under the same kid", oidc: base, token: sign(t, jose.RS256, otherKey, "k1", claims(nil)), wantCode: connect.CodeUnauthenticated},
		{name: "wrong signature: unknown kid", oidc: base, token: sign(t, jose.RS256, otherKey, "k9", claims(nil)), wantCode: connect.CodeUnauthenticated},
		{name: "wrong issuer", oidc: base, token: good(func(c map[string]any) { c["iss"] = "https://evil.example.com" }), wantCode: connect.CodeUnauthenticated},
		{name: "alg none", oidc: base, token: unsigned(t, claims(nil)), wantCode: connect.CodeUnauthenticated},
		{name: "HS256 keyed with the public key", oidc: base, token: sign(t, jose.HS256, []byte(key.PublicKey.N.Bytes()), "k1", claims(nil)), wantCode: connect.CodeUnauthenticated},
		{name: "email not verified", oidc: emailCfg, token: good(func(c map[string]any) { c["email_verified"] = false }), wantCode: connect.CodeUnauthenticated},
		{name: "email_verified not a bool", oidc: emailCfg, token: good(func(c map[string]any) { c["email_verified"] = "true" }), wantCode: connect.CodeUnauthenticated},
		{name: "username claim missing", oidc: emailCfg, token: good(func(c map[string]any) { delete(c, "email") }), wantCode: connect.CodeUnauthenticated},
		{name: "reserved system: user", oidc: base, token: good(func(c map[string]any) { c["sub"] = "system:rbac-sync" }), wantCode: connect.CodeUnauthenticated},
		{name: "groups claim of another type", oidc: base, token: good(func(c map[string]any) { c["groups"] = 7 }), wantCode: connect.CodeUnauthenticated},
		{name: "garbage", oidc: base, token: "not-a-token", wantCode: connect.CodeUnauthenticated},
		{name: "no token", oidc: base, token: "", wantCode: connect.CodeUnauthenticated},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := startServer(t, Config{TokenFile: tokenFile, OIDC: tc.oidc})
			resp, err := callWithToken(t.Context(), c, tc.token)
			if tc.wantCode != 0 {
				if connect.CodeOf(err) != tc.wantCode {
					t.Fatalf("got %v, want %v", err, tc.wantCode)
				}
				msg := err.Error()
				if tc.token != "" && strings.Contains(msg, tc.token) {
					t.Fatal("error echoes the token")
				}
				if tc.wantMsg != "" && !strings.Contains(msg, tc.wantMsg) {
					t.Fatalf("error %q does not say %q", msg, tc.wantMsg)
				}
				return
			}
			if err != nil {
				t.Fatalf("call: %v", err)
			}
			if got := resp.Header().Get("X-Actor"); got != tc.wantUser {
				t.Errorf("actor %q, want %q", got, tc.wantUser)
			}
			if got := resp.Header().Values("X-Group"); !slices.Equal(got, tc.wantGroups) {
				t.Errorf("groups %q, want %q", got, tc.wantGroups)
			}
		})
	}
}

// A streaming RPC is authenticated the same way, and OIDC alone turns authentication on.
func TestOIDCStreamingWithoutTokenFile(t *testing.T) {
	is := newTestIssuer(t)
	key := newRSAKey(t)
	is.publish(key, "k1")
	c := startServer(t, Config{OIDC: OIDCConfig{IssuerURL: is.url(), ClientID: testClientID, CAFile: is.CAFile}})
	tok := sign(t, jose.RS256, key, "k1", map[string]any{"iss": is.url(), "aud": testClientID, "sub": "bob", "exp": time.Now().Add(time.Hour).Unix()})
	for _, tc := range []struct {
		name, token string
		wantErr     bool
	}{{"valid", tok, false}, {"missing", "", true}, {"token-file style", "file-token", true}} {
		t.Run(tc.name, func(t *testing.T) {
			req := connect.NewRequest(&clusterv1.WatchClustersRequest{})
			if tc.token != "" {
				req.Header().Set("Authorization", "Bearer "+tc.token)
			}
			st, err := c.WatchClusters(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			got := st.Receive()
			if tc.wantErr {
				if got || connect.CodeOf(st.Err()) != connect.CodeUnauthenticated {
					t.Fatalf("received %v, err %v; want Unauthenticated", got, st.Err())
				}
				return
			}
			if !got {
				t.Fatalf("no message: %v", st.Err())
			}
			if a := st.ResponseHeader().Get("X-Actor"); a != "bob" {
				t.Fatalf("actor %q, want bob", a)
			}
		})
	}
}

// Keys are fetched once and cached; a token signed with a key the issuer added later makes the
// key set refresh (rotation).
func TestOIDCKeyCacheAndRotation(t *testing.T) {
	is := newTestIssuer(t)
	k1, k2 := newRSAKey(t), newRSAKey(t)
	is.publish(k1, "k1")
	c := startServer(t, Config{OIDC: OIDCConfig{IssuerURL: is.url(), ClientID: testClientID, CAFile: is.CAFile}})
	claims := map[string]any{"iss": is.url(), "aud": testClientID, "sub": "carol", "exp": time.Now().Add(time.Hour).Unix()}
	for range 5 {
		if _, err := callWithToken(t.Context(), c, sign(t, jose.RS256, k1, "k1", claims)); err != nil {
			t.Fatal(err)
		}
	}
	if d, j := is.DiscoveryHits.Load(), is.JWKSHits.Load(); d != 1 || j != 1 {
		t.Fatalf("discovery fetched %d times, JWKS %d times; want once each", d, j)
	}
	is.publish(k2, "k2")
	if _, err := callWithToken(t.Context(), c, sign(t, jose.RS256, k2, "k2", claims)); err != nil {
		t.Fatalf("token of the rotated-in key: %v", err)
	}
	if j := is.JWKSHits.Load(); j != 2 {
		t.Fatalf("JWKS fetched %d times, want 2", j)
	}
}

// A server whose issuer is down starts, keeps serving token-file callers, answers ID tokens
// with Unavailable, and accepts them once discovery succeeds.
func TestOIDCIssuerDownAtStart(t *testing.T) {
	is := newTestIssuer(t)
	key := newRSAKey(t)
	is.publish(key, "k1")
	is.setDown(true)
	claims := map[string]any{"iss": is.url(), "aud": testClientID, "sub": "dave", "exp": time.Now().Add(time.Hour).Unix()}
	idToken := sign(t, jose.RS256, key, "k1", claims)
	cfg := OIDCConfig{IssuerURL: is.url(), ClientID: testClientID, CAFile: is.CAFile}

	t.Run("through the server", func(t *testing.T) {
		c := startServer(t, Config{TokenFile: writeTokenFile(t, "file-token,eve\n"), OIDC: cfg})
		if _, err := callWithToken(t.Context(), c, idToken); connect.CodeOf(err) != connect.CodeUnavailable {
			t.Fatalf("ID token while the issuer is down: %v, want Unavailable", err)
		}
		if _, err := callWithToken(t.Context(), c, "file-token"); err != nil {
			t.Fatalf("token-file caller while the issuer is down: %v", err)
		}
		// Garbage and other issuers' tokens never wait for discovery.
		if _, err := callWithToken(t.Context(), c, "garbage"); connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("garbage: %v, want Unauthenticated", err)
		}
	})

	t.Run("retry", func(t *testing.T) {
		is.setDown(true)
		a, err := newOIDCAuthenticator(cfg, zaptest.NewLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		clock := time.Now()
		a.now = func() time.Time { return clock }
		before := is.DiscoveryHits.Load()
		for range 3 {
			if _, err := a.authenticate(t.Context(), idToken); !errors.Is(err, errIssuerUnavailable) {
				t.Fatalf("got %v, want errIssuerUnavailable", err)
			}
		}
		if n := is.DiscoveryHits.Load() - before; n != 1 {
			t.Fatalf("%d discovery attempts within the retry interval, want 1", n)
		}
		is.setDown(false)
		if _, err := a.authenticate(t.Context(), idToken); !errors.Is(err, errIssuerUnavailable) {
			t.Fatalf("before the retry interval: %v, want errIssuerUnavailable", err)
		}
		clock = clock.Add(a.retryAfter)
		id, err := a.authenticate(t.Context(), idToken)
		if err != nil || id.User != "dave" {
			t.Fatalf("after the issuer came back: %+v, %v", id, err)
		}
	})
}

func TestAuthConfig(t *testing.T) {
	is := newTestIssuer(t)
	tokenFile := writeTokenFile(t, "t,u\n")
	cases := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{name: "OIDC alone", cfg: Config{OIDC: OIDCConfig{IssuerURL: is.url(), ClientID: "x"}}},
		{name: "token file and OIDC", cfg: Config{TokenFile: tokenFile, OIDC: OIDCConfig{IssuerURL: is.url(), ClientID: "x", CAFile: is.CAFile}}},
		{name: "insecure dev", cfg: Config{InsecureDev: true}},
		{name: "nothing", cfg: Config{}, wantErr: "--insecure-dev"},
		{name: "issuer without client id", cfg: Config{OIDC: OIDCConfig{IssuerURL: is.url()}}, wantErr: "--oidc-client-id"},
		{name: "client id without issuer", cfg: Config{TokenFile: tokenFile, OIDC: OIDCConfig{ClientID: "x"}}, wantErr: "--oidc-issuer-url"},
		{name: "http issuer", cfg: Config{OIDC: OIDCConfig{IssuerURL: "http://idp.example.com", ClientID: "x"}}, wantErr: "https"},
		{name: "missing CA file", cfg: Config{OIDC: OIDCConfig{IssuerURL: is.url(), ClientID: "x", CAFile: filepath.Join(t.TempDir(), "nope")}}, wantErr: "--oidc-ca-file"},
		{name: "CA file without a certificate", cfg: Config{OIDC: OIDCConfig{IssuerURL: is.url(), ClientID: "x", CAFile: tokenFile}}, wantErr: "no PEM"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg, zaptest.NewLogger(t))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got %v, want an error naming %q", err, tc.wantErr)
			}
		})
	}
}

// A verified ID token is remembered for verifiedTTL, never past its expiry, and the memory is
// bounded.
func TestOIDCVerifiedTokenCache(t *testing.T) {
	is := newTestIssuer(t)
	key, otherKey := newRSAKey(t), newRSAKey(t)
	is.publish(key, "k1")
	a, err := newAuthenticator(Config{OIDC: OIDCConfig{IssuerURL: is.url(), ClientID: testClientID, CAFile: is.CAFile}}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	clock := time.Now()
	a.oidc.now = func() time.Time { return clock }
	token := func(k *rsa.PrivateKey, sub string, exp time.Duration) string {
		return sign(t, jose.RS256, k, "k1", map[string]any{"iss": is.url(), "aud": testClientID, "sub": sub, "exp": clock.Add(exp).Unix()})
	}
	auth := func(tok string) error {
		_, err := a.Authenticate(t.Context(), http.Header{"Authorization": {"Bearer " + tok}})
		return err
	}

	long := token(key, "long", time.Hour)
	if err := auth(long); err != nil || a.oidc.verified.len() != 1 {
		t.Fatalf("valid token: %v, %d remembered", err, a.oidc.verified.len())
	}
	// Failures are never remembered, whatever the token.
	forged := token(otherKey, "long", time.Hour)
	if err := auth(forged); connect.CodeOf(err) != connect.CodeUnauthenticated || a.oidc.verified.len() != 1 {
		t.Fatalf("forged token: %v, %d remembered", err, a.oidc.verified.len())
	}
	if err := auth(long); err != nil {
		t.Fatalf("remembered token: %v", err)
	}

	// A token expiring before verifiedTTL is remembered only until it expires: then the
	// verifier sees it again and refuses it as expired.
	short := token(key, "short", 3*time.Second)
	if err := auth(short); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(4 * time.Second)
	if err := auth(short); connect.CodeOf(err) != connect.CodeUnauthenticated || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("token expired while remembered: %v, want unauthenticated expired", err)
	}
	// After verifiedTTL a still-valid token is verified again (and passes).
	clock = clock.Add(verifiedTTL)
	if _, ok := a.oidc.verified.get(sha256.Sum256([]byte(long)), clock); ok {
		t.Fatal("a token remembered past verifiedTTL")
	}
	if err := auth(long); err != nil {
		t.Fatal(err)
	}

	// Bounded.
	for i := range maxVerified + 10 {
		var k [sha256.Size]byte
		k[0], k[1] = byte(i), byte(i>>8)
		a.oidc.verified.put(k, Identity{User: "u"}, clock.Add(time.Minute), clock)
	}
	if n := a.oidc.verified.len(); n > maxVerified {
		t.Errorf("%d tokens remembered, bound %d", n, maxVerified)
	}
}
