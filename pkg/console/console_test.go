package console_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/fleetstream/fleetstream/pkg/console"
	"github.com/fleetstream/fleetstream/pkg/server"
)

func TestServesAssetsWithStrictHeaders(t *testing.T) {
	mux := http.NewServeMux()
	console.Mount(mux, console.Options{})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for _, tc := range []struct {
		path, contentType, contains string
	}{
		{"/ui/", "text/html; charset=utf-8", `<script type="module" src="/ui/app.js">`},
		{"/ui/api.js", "text/javascript; charset=utf-8", "sessionStorage"},
		{"/ui/style.css", "text/css; charset=utf-8", ":focus-visible"},
		// A reload of a path the page made up still gets the page.
		{"/ui/projects/x", "text/html; charset=utf-8", "<title>"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			res, err := http.Get(srv.URL + tc.path)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			var b bytes.Buffer
			if _, err := b.ReadFrom(res.Body); err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != http.StatusOK {
				t.Fatalf("HTTP %d", res.StatusCode)
			}
			for k, want := range map[string]string{
				"Content-Type":            tc.contentType,
				"Content-Security-Policy": console.ContentSecurityPolicy,
				"X-Content-Type-Options":  "nosniff",
				"Referrer-Policy":         "no-referrer",
			} {
				if got := res.Header.Get(k); got != want {
					t.Errorf("%s: %q, want %q", k, got, want)
				}
			}
			if !strings.Contains(b.String(), tc.contains) {
				t.Errorf("body lacks %q", tc.contains)
			}
			// A second load with the ETag costs no body.
			req, _ := http.NewRequest(http.MethodGet, srv.URL+tc.path, nil)
			req.Header.Set("If-None-Match", res.Header.Get("ETag"))
			res2, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res2.Body.Close()
			if res2.StatusCode != http.StatusNotModified {
				t.Errorf("revalidation: HTTP %d, want 304", res2.StatusCode)
			}
		})
	}
	res, err := http.Post(srv.URL+"/ui/", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /ui/: HTTP %d, want 405", res.StatusCode)
	}
}

// The CSP already refuses inline script and style; the assets must not need them, and no
// script may parse markup (every string is rendered as text).
func TestAssetsNeedNoInlineCodeAndParseNoMarkup(t *testing.T) {
	forbidden := map[string]*regexp.Regexp{
		"inline script":      regexp.MustCompile(`<script(?:\s+type="module")?>`),
		"inline style":       regexp.MustCompile(`<style|\sstyle="`),
		"inline handler":     regexp.MustCompile(`\son[a-z]+="`),
		"markup parsing":     regexp.MustCompile(`innerHTML|outerHTML|insertAdjacentHTML|document\.write|DOMParser|createContextualFragment`),
		"eval":               regexp.MustCompile(`\beval\(|new Function\(`),
		"persistent storage": regexp.MustCompile(`localStorage|document\.cookie`),
		"external resource":  regexp.MustCompile(`https?://`),
	}
	for name, body := range console.Assets() {
		for what, re := range forbidden {
			if m := re.FindString(string(body)); m != "" {
				t.Errorf("%s: %s (%q)", name, what, m)
			}
		}
	}
}

// /ui/config.json tells the page how to sign in, and the page's CSP lets it post to the
// issuer's token endpoint only. The endpoints come from the issuer's discovery document, across
// a boundary: the page navigates to one and posts to the other, so anything but a plain https
// URL (a javascript: URL would run in the console's origin; a quote or semicolon would rewrite
// the CSP) turns the issuer's sign-in off rather than reaching the page.
func TestOIDCSignInConfig(t *testing.T) {
	good := server.OIDCEndpoints{Issuer: "https://idp.example.com", ClientID: "fleet",
		AuthorizationEndpoint: "https://idp.example.com/auth", TokenEndpoint: "https://tokens.example.com:8443/token"}
	with := func(mod func(*server.OIDCEndpoints)) console.OIDCSource {
		return func(context.Context) (server.OIDCEndpoints, bool, error) {
			e := good
			mod(&e)
			return e, true, nil
		}
	}
	unchanged := func(*server.OIDCEndpoints) {}
	for _, tc := range []struct {
		name    string
		opts    console.Options
		wantCSP string
		want    string // in config.json
	}{
		{name: "no issuer", opts: console.Options{}, wantCSP: console.ContentSecurityPolicy, want: `{"oidc":null}`},
		{name: "issuer", opts: console.Options{OIDC: with(unchanged), Config: console.Config{OIDCScopes: "email openid groups"}},
			wantCSP: console.CSP("https://tokens.example.com:8443"),
			want:    `{"oidc":{"issuer":"https://idp.example.com","clientId":"fleet","authorizationEndpoint":"https://idp.example.com/auth","tokenEndpoint":"https://tokens.example.com:8443/token","scope":"openid email groups"}}`},
		{name: "own client and redirect", opts: console.Options{OIDC: with(unchanged), Config: console.Config{OIDCClientID: "console", OIDCRedirectURL: "https://fleet.example.com/ui/"}},
			wantCSP: console.CSP("https://tokens.example.com:8443"), want: `"clientId":"console",`},
		{name: "redirect", opts: console.Options{OIDC: with(unchanged), Config: console.Config{OIDCRedirectURL: "https://fleet.example.com/ui/"}},
			wantCSP: console.CSP("https://tokens.example.com:8443"), want: `"redirectUri":"https://fleet.example.com/ui/"`},
		{name: "issuer down", opts: console.Options{OIDC: func(context.Context) (server.OIDCEndpoints, bool, error) {
			return server.OIDCEndpoints{}, true, errors.New("connection refused")
		}}, wantCSP: console.ContentSecurityPolicy, want: `{"oidc":null,"oidcError":"sign-in with the identity provider is unavailable"}`},
		{name: "javascript authorization endpoint", opts: console.Options{OIDC: with(func(e *server.OIDCEndpoints) { e.AuthorizationEndpoint = "javascript:alert(1)" })},
			wantCSP: console.ContentSecurityPolicy, want: `{"oidc":null,"oidcError"`},
		{name: "http token endpoint", opts: console.Options{OIDC: with(func(e *server.OIDCEndpoints) { e.TokenEndpoint = "http://tokens.example.com/token" })},
			wantCSP: console.ContentSecurityPolicy, want: `{"oidc":null,"oidcError"`},
		{name: "token endpoint rewriting the CSP", opts: console.Options{OIDC: with(func(e *server.OIDCEndpoints) { e.TokenEndpoint = "https://a.example.com;script-src*/token" })},
			wantCSP: console.ContentSecurityPolicy, want: `{"oidc":null,"oidcError"`},
		{name: "token endpoint with user", opts: console.Options{OIDC: with(func(e *server.OIDCEndpoints) { e.TokenEndpoint = "https://u@tokens.example.com/token" })},
			wantCSP: console.ContentSecurityPolicy, want: `{"oidc":null,"oidcError"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mux := http.NewServeMux()
			console.Mount(mux, tc.opts)
			srv := httptest.NewServer(mux)
			defer srv.Close()
			res, err := http.Get(srv.URL + "/ui/")
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if got := res.Header.Get("Content-Security-Policy"); got != tc.wantCSP {
				t.Errorf("CSP %q, want %q", got, tc.wantCSP)
			}
			res, err = http.Get(srv.URL + "/ui/config.json")
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			var b bytes.Buffer
			_, _ = b.ReadFrom(res.Body)
			if ct, cc := res.Header.Get("Content-Type"), res.Header.Get("Cache-Control"); ct != "application/json" || cc != "no-store" {
				t.Errorf("config.json: Content-Type %q, Cache-Control %q", ct, cc)
			}
			if !strings.Contains(b.String(), tc.want) {
				t.Errorf("config.json %s, want %s in it", b.String(), tc.want)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  console.Config
		want string
	}{
		{cfg: console.Config{}},
		{cfg: console.Config{OIDCRedirectURL: "https://fleet.example.com/ui/", OIDCScopes: "openid email groups"}},
		{cfg: console.Config{OIDCRedirectURL: "http://127.0.0.1:8080/console/ui/"}},
		{cfg: console.Config{OIDCRedirectURL: "/ui/"}, want: "--console-oidc-redirect-url"},
		{cfg: console.Config{OIDCRedirectURL: "https://fleet.example.com/"}, want: "--console-oidc-redirect-url"},
		{cfg: console.Config{OIDCRedirectURL: "https://fleet.example.com/ui/?x=1"}, want: "--console-oidc-redirect-url"},
		{cfg: console.Config{OIDCRedirectURL: "javascript://x/ui/"}, want: "--console-oidc-redirect-url"},
		{cfg: console.Config{OIDCScopes: `openid a"b`}, want: "--console-oidc-scopes"},
	} {
		err := tc.cfg.Validate()
		if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: Validate = %v, want %q", tc.cfg, err, tc.want)
		}
	}
}
