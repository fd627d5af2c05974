// Package console serves the web console at /ui/: static ES modules and CSS embedded in the
// binary, mounted by fleetd and the gateway alike. The page calls the same Connect APIs as
// fleetctl (JSON over POST, the user's own bearer token), so it can show and do exactly what
// that token may; this handler itself holds no data and needs no authentication.
package console

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"strings"
	"time"

	"github.com/fleetstream/fleetstream/pkg/server"
)

//go:embed assets
var assets embed.FS

// Prefix is where the console is served.
const Prefix = "/ui/"

// ContentSecurityPolicy allows only this origin's scripts, styles and API calls: no inline
// script or style (every user-controlled string is also rendered as text, this is the second
// wall), no plugins, no framing (clickjacking), no <base> tricks, forms post nowhere.
const ContentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// CSP is ContentSecurityPolicy with connect-src also allowing origin (the OIDC issuer's token
// endpoint, which the page posts the authorization code to); "" adds nothing.
func CSP(origin string) string {
	if origin == "" {
		return ContentSecurityPolicy
	}
	return strings.Replace(ContentSecurityPolicy, "connect-src 'self'", "connect-src 'self' "+origin, 1)
}

// Config is the console's browser sign-in with the OIDC issuer of --oidc-issuer-url: the
// authorization code flow with PKCE (S256) as a public client, run by the page itself.
type Config struct {
	// OIDCClientID is the client the console signs in as; empty means --oidc-client-id. An ID
	// token is accepted only with --oidc-client-id among its audiences, so a different client
	// works only if the issuer adds that audience.
	OIDCClientID string
	// OIDCRedirectURL is where the issuer sends the browser back, registered with the issuer;
	// empty means the console's own /ui/ at the origin the page was loaded from.
	OIDCRedirectURL string
	// OIDCScopes are the scopes the console asks for (openid always).
	OIDCScopes string
}

// RegisterFlags adds the --console-oidc-* flags (fleetd's and the gateway's).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.OIDCClientID, "console-oidc-client-id", "", "OIDC client ID of the web console's sign-in (a public client using PKCE, no secret); default --oidc-client-id, whose value every accepted ID token must have as audience")
	fs.StringVar(&c.OIDCRedirectURL, "console-oidc-redirect-url", "", "redirect URI of the web console's OIDC sign-in, registered with the issuer, e.g. https://fleet.example.com/ui/ (default: /ui/ at the origin the console was loaded from)")
	fs.StringVar(&c.OIDCScopes, "console-oidc-scopes", "openid profile email", "space-separated scopes the web console's OIDC sign-in asks for (openid is always asked)")
}

// Validate checks the flags' values, naming the flag of a bad one.
func (c Config) Validate() error {
	if c.OIDCRedirectURL != "" {
		u, err := url.Parse(c.OIDCRedirectURL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.Fragment != "" || u.RawQuery != "" ||
			!strings.HasSuffix(u.Path, Prefix) {
			return fmt.Errorf("--console-oidc-redirect-url %q: want an absolute http(s) URL of the console, ending in %s, without user, query or fragment", c.OIDCRedirectURL, Prefix)
		}
	}
	for _, s := range strings.Fields(c.OIDCScopes) {
		if !scopeRE.MatchString(s) {
			return fmt.Errorf("--console-oidc-scopes: %q is not a scope", s)
		}
	}
	return nil
}

var scopeRE = regexp.MustCompile(`^[!#-\[\]-~]+$`) // RFC 6749's scope-token

// OIDCSource returns the issuer's endpoints, discovering them if need be; ok is false when no
// issuer is configured. (*server.Authenticator).OIDCEndpoints is one.
type OIDCSource func(ctx context.Context) (e server.OIDCEndpoints, ok bool, err error)

// Options are what Mount serves besides the assets.
type Options struct {
	Config Config
	// OIDC is nil when the server has no OIDC issuer.
	OIDC OIDCSource
}

// Mux is what the console mounts on (pkg/server.Server, http.ServeMux).
type Mux interface {
	Handle(pattern string, h http.Handler)
}

// Mount serves the console at /ui/ (and redirects /ui there), with /ui/config.json telling the
// page how it can sign in.
func Mount(m Mux, o Options) {
	h := Handler(o)
	m.Handle("GET /ui/", h)
	m.Handle("GET /ui", http.RedirectHandler(Prefix, http.StatusMovedPermanently))
}

type file struct {
	body        []byte
	contentType string
	etag        string
}

// Handler serves the embedded assets under /ui/. Paths without an asset (a reload of
// /ui/projects, say) get index.html: the page routes by its own location hash, but a wrong
// path still lands on something that works.
func Handler(o Options) http.Handler {
	files := map[string]file{}
	err := fs.WalkDir(assets, "assets", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := assets.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		files[strings.TrimPrefix(p, "assets/")] = file{body: body, contentType: contentType(p), etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	if err != nil {
		// The assets are compiled in: failing to read them is a build defect.
		panic(fmt.Sprintf("console: reading embedded assets: %v", err))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(path.Clean("/"+strings.TrimPrefix(r.URL.Path, Prefix)), "/")
		if name == "config.json" {
			o.serveConfig(w, r)
			return
		}
		f, ok := files[name]
		if !ok {
			f = files["index.html"]
		}
		h := w.Header()
		SecurityHeaders(h)
		if f.contentType == htmlType {
			// The document's policy is what counts: it lets the page post the code to the
			// issuer's token endpoint, and nowhere else.
			if c, err := o.signIn(r.Context()); err == nil && c != nil {
				h.Set("Content-Security-Policy", CSP(c.tokenOrigin))
			}
		}
		h.Set("Content-Type", f.contentType)
		// Assets change only with the binary: revalidate every load, cheaply by ETag.
		h.Set("Cache-Control", "no-cache")
		h.Set("ETag", f.etag)
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(f.body))
	})
}

// SecurityHeaders sets the headers every console response carries.
func SecurityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", ContentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
}

// contentType is set by extension, never sniffed: nosniff makes browsers refuse a module
// script served as anything but JavaScript.
func contentType(p string) string {
	switch path.Ext(p) {
	case ".html":
		return htmlType
	case ".js":
		return "text/javascript; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	case ".svg":
		return "image/svg+xml"
	}
	return "application/octet-stream"
}

const htmlType = "text/html; charset=utf-8"

// oidcSignIn is the page's OIDC settings as /ui/config.json gives them.
type oidcSignIn struct {
	Issuer                string `json:"issuer"`
	ClientID              string `json:"clientId"`
	AuthorizationEndpoint string `json:"authorizationEndpoint"`
	TokenEndpoint         string `json:"tokenEndpoint"`
	// RedirectURI is empty for "/ui/ at the page's origin".
	RedirectURI string `json:"redirectUri,omitempty"`
	Scope       string `json:"scope"`

	tokenOrigin string
}

// discoveryWait bounds how long a page load waits for the issuer's discovery document.
const discoveryWait = 5 * time.Second

// signIn returns the OIDC sign-in settings, nil without an issuer. The endpoints come from the
// issuer's discovery document, across a boundary: the page navigates to the authorization
// endpoint and posts to the token endpoint, so both must be plain https URLs (no javascript:,
// nothing that could break out of the CSP header).
func (o Options) signIn(ctx context.Context) (*oidcSignIn, error) {
	if o.OIDC == nil {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, discoveryWait)
	defer cancel()
	e, ok, err := o.OIDC(ctx)
	if err != nil || !ok {
		return nil, err
	}
	if _, err := endpointOrigin(e.AuthorizationEndpoint); err != nil {
		return nil, fmt.Errorf("authorization_endpoint: %w", err)
	}
	origin, err := endpointOrigin(e.TokenEndpoint)
	if err != nil {
		return nil, fmt.Errorf("token_endpoint: %w", err)
	}
	c := &oidcSignIn{Issuer: e.Issuer, ClientID: o.Config.OIDCClientID, AuthorizationEndpoint: e.AuthorizationEndpoint,
		TokenEndpoint: e.TokenEndpoint, RedirectURI: o.Config.OIDCRedirectURL, tokenOrigin: origin}
	if c.ClientID == "" {
		c.ClientID = e.ClientID
	}
	scopes := []string{"openid"}
	for _, s := range strings.Fields(o.Config.OIDCScopes) {
		if s != "openid" {
			scopes = append(scopes, s)
		}
	}
	c.Scope = strings.Join(scopes, " ")
	return c, nil
}

var hostRE = regexp.MustCompile(`^[A-Za-z0-9.-]+(:[0-9]{1,5})?$|^\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?$`)

// endpointOrigin checks that raw is an https URL and returns its origin.
func endpointOrigin(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	if u.Scheme != "https" || !hostRE.MatchString(u.Host) || u.User != nil || u.Fragment != "" {
		return "", fmt.Errorf("%q is not an https URL", raw)
	}
	return "https://" + u.Host, nil
}

// serveConfig answers /ui/config.json: {"oidc": {...}} when the page can sign in with the
// issuer, {"oidc": null} without one, and with "oidcError" when the issuer is configured but
// unusable right now (unreachable, or a discovery document the page must not follow).
func (o Options) serveConfig(w http.ResponseWriter, r *http.Request) {
	c, err := o.signIn(r.Context())
	out := struct {
		OIDC      *oidcSignIn `json:"oidc"`
		OIDCError string      `json:"oidcError,omitempty"`
	}{OIDC: c}
	if err != nil {
		out.OIDCError = "sign-in with the identity provider is unavailable"
		if errors.Is(err, context.DeadlineExceeded) {
			out.OIDCError += ": it did not answer"
		}
	}
	h := w.Header()
	SecurityHeaders(h)
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(out)
}

// Assets returns every embedded asset by path under /ui/, for size checks.
func Assets() map[string][]byte {
	out := map[string][]byte{}
	_ = fs.WalkDir(assets, "assets", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := assets.ReadFile(p)
			out[strings.TrimPrefix(p, "assets/")] = b
		}
		return nil
	})
	return out
}
