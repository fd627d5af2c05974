package server

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"go.uber.org/zap"
)

// BenchmarkAuthenticate: the cost of authenticating one call, per source of tokens. The
// gateway and the service it forwards to each pay it. An ID token is verified on its first
// call and then remembered for verifiedTTL.
func BenchmarkAuthenticate(b *testing.B) {
	is := newTestIssuer(b)
	key := newRSAKey(b)
	is.publish(key, "k1")
	now := time.Now()
	idToken := sign(b, jose.RS256, key, "k1", map[string]any{
		"iss": is.url(), "aud": testClientID, "sub": "u-123", "groups": []string{"team-a", "ops"},
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix(),
	})
	a, err := newAuthenticator(Config{
		TokenFile: writeTokenFile(b, "file-token,dev-admin,uid-1,\"admins\"\n"),
		OIDC:      OIDCConfig{IssuerURL: is.url(), ClientID: testClientID, GroupsClaim: "groups", CAFile: is.CAFile},
	}, zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name, token string
		forget      bool // each call verifies the ID token again
	}{{"token-file", "file-token", false}, {"oidc-RS256-verified", idToken, true}, {"oidc-RS256-remembered", idToken, false}} {
		b.Run(tc.name, func(b *testing.B) {
			h := http.Header{"Authorization": {"Bearer " + tc.token}}
			if _, err := a.Authenticate(context.Background(), h); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if tc.forget {
					a.oidc.verified.mu.Lock()
					clear(a.oidc.verified.m)
					a.oidc.verified.mu.Unlock()
				}
				if _, err := a.Authenticate(context.Background(), h); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
