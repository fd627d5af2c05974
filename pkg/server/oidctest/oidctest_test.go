package oidctest_test

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/fleetstream/fleetstream/pkg/server/oidctest"
)

// The issuer's login flow must be as strict as a real one, or the console's browser test would
// pass against an issuer that accepts anything: a code is redeemed once, by the client and
// redirect URI it was issued to, with the verifier of its challenge; an unregistered redirect
// URI gets no redirect at all; the token endpoint's CORS header names registered origins only.
func TestLoginFlow(t *testing.T) {
	is := oidctest.New(t)
	const redirect = "http://127.0.0.1:1/ui/"
	is.AddClient("console", oidctest.Client{RedirectURIs: []string{redirect}, Origins: []string{"http://127.0.0.1:1"}})
	is.SetLogin(t, map[string]any{"sub": "erin"})
	pem, err := os.ReadFile(is.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	c := &http.Client{
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	const verifier = "0123456789012345678901234567890123456789abc"
	sum := sha256.Sum256([]byte(verifier))
	challenge := base64.RawURLEncoding.EncodeToString(sum[:])
	authorize := func(redirectURI, method string) (int, url.Values) {
		t.Helper()
		q := url.Values{"response_type": {"code"}, "client_id": {"console"}, "redirect_uri": {redirectURI}, "state": {"s1"},
			"nonce": {"n1"}, "code_challenge": {challenge}, "code_challenge_method": {method}}
		res, err := c.Get(is.URL() + "/auth?" + q.Encode())
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		loc, _ := url.Parse(res.Header.Get("Location"))
		return res.StatusCode, loc.Query()
	}
	redeem := func(code, verifier, origin string) (int, map[string]any, string) {
		t.Helper()
		form := url.Values{"grant_type": {"authorization_code"}, "code": {code}, "redirect_uri": {redirect}, "client_id": {"console"}, "code_verifier": {verifier}}
		req, _ := http.NewRequest(http.MethodPost, is.URL()+"/token", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", origin)
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var body map[string]any
		_ = json.NewDecoder(res.Body).Decode(&body)
		return res.StatusCode, body, res.Header.Get("Access-Control-Allow-Origin")
	}

	if code, _ := authorize("https://evil.example.com/ui/", "S256"); code != http.StatusBadRequest {
		t.Errorf("unregistered redirect URI: HTTP %d, want 400 and no redirect", code)
	}
	if _, q := authorize(redirect, "plain"); q.Get("error") != "invalid_request" || q.Get("code") != "" {
		t.Errorf("plain PKCE: %v, want invalid_request", q)
	}
	_, q := authorize(redirect, "S256")
	if q.Get("state") != "s1" || q.Get("code") == "" {
		t.Fatalf("authorization answer %v", q)
	}
	if status, body, _ := redeem(q.Get("code"), verifier[:42]+"x", "http://127.0.0.1:1"); status != http.StatusBadRequest || body["error"] != "invalid_grant" {
		t.Errorf("wrong verifier: HTTP %d %v", status, body)
	}
	// The wrong verifier used the code up.
	if status, body, _ := redeem(q.Get("code"), verifier, "http://127.0.0.1:1"); status != http.StatusBadRequest {
		t.Errorf("code after a wrong verifier: HTTP %d %v, want 400", status, body)
	}
	_, q = authorize(redirect, "S256")
	status, body, cors := redeem(q.Get("code"), verifier, "https://evil.example.com")
	if status != http.StatusOK || body["id_token"] == nil {
		t.Fatalf("redeem: HTTP %d %v", status, body)
	}
	if cors != "" {
		t.Errorf("CORS header %q for an unregistered origin", cors)
	}
	if status, _, _ := redeem(q.Get("code"), verifier, "http://127.0.0.1:1"); status != http.StatusBadRequest {
		t.Errorf("second redemption: HTTP %d, want 400", status)
	}
	_, q = authorize(redirect, "S256")
	if _, _, cors := redeem(q.Get("code"), verifier, "http://127.0.0.1:1"); cors != "http://127.0.0.1:1" {
		t.Errorf("CORS header %q for the registered origin", cors)
	}
}
