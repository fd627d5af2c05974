package server

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"go.uber.org/zap"
)

// OIDCConfig lets the APIs accept ID tokens of one OpenID Connect issuer as bearer tokens,
// besides (or instead of) the token file. The field names follow kube-apiserver's --oidc-* flags.
type OIDCConfig struct {
	// IssuerURL is the issuer (https). Its discovery document is read from
	// <IssuerURL>/.well-known/openid-configuration and must name the same issuer.
	IssuerURL string
	// ClientID must be one of a token's audiences.
	ClientID string
	// UsernameClaim is the claim whose value is the user ("sub" when empty). With "email", a
	// present email_verified claim must be true.
	UsernameClaim string
	// UsernamePrefix is prepended to the username claim's value. Empty by default (unlike
	// kube-apiserver, which prefixes non-email claims with the issuer URL): set it, for example
	// to "oidc:", when token-file users and OIDC users could otherwise share a name.
	UsernamePrefix string
	// GroupsClaim is the claim holding the user's groups, a string or a list of strings; empty
	// means no groups from OIDC.
	GroupsClaim string
	// GroupsPrefix is prepended to every group.
	GroupsPrefix string
	// CAFile is a PEM bundle that verifies the issuer's TLS certificate instead of the system
	// roots (a private identity provider).
	CAFile string
}

// RegisterFlags adds the --oidc-* flags. Every server binary registers them through this one
// function, so the flags are the same everywhere.
func (c *OIDCConfig) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.IssuerURL, "oidc-issuer-url", "", "https URL of an OpenID Connect issuer whose ID tokens are accepted as bearer tokens (besides --token-file)")
	fs.StringVar(&c.ClientID, "oidc-client-id", "", "client ID that every accepted ID token must have as audience (required with --oidc-issuer-url)")
	fs.StringVar(&c.UsernameClaim, "oidc-username-claim", "sub", "ID token claim used as the user name (with \"email\", email_verified must be true when present)")
	fs.StringVar(&c.UsernamePrefix, "oidc-username-prefix", "", "prefix added to OIDC user names, e.g. \"oidc:\" (default none)")
	fs.StringVar(&c.GroupsClaim, "oidc-groups-claim", "", "ID token claim holding the user's groups, a string or a list of strings (default: no groups)")
	fs.StringVar(&c.GroupsPrefix, "oidc-groups-prefix", "", "prefix added to OIDC group names (default none)")
	fs.StringVar(&c.CAFile, "oidc-ca-file", "", "PEM CA bundle that verifies the issuer's TLS certificate instead of the system roots")
}

// enabled reports whether any OIDC setting was given; validate then insists on a complete one.
func (c OIDCConfig) enabled() bool { return c.IssuerURL != "" || c.ClientID != "" }

func (c OIDCConfig) validate() error {
	if c.IssuerURL == "" {
		return errors.New("--oidc-client-id needs --oidc-issuer-url")
	}
	if c.ClientID == "" {
		return errors.New("--oidc-issuer-url needs --oidc-client-id")
	}
	u, err := url.Parse(c.IssuerURL)
	if err != nil {
		return fmt.Errorf("--oidc-issuer-url: %w", err)
	}
	// Plain http would let anyone on the path swap the signing keys.
	if u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("--oidc-issuer-url %q: want an https:// URL without user, query or fragment", c.IssuerURL)
	}
	return nil
}

const (
	// oidcHTTPTimeout bounds one discovery or JWKS request, so a hung issuer cannot hold a
	// request (or the library's background key refresh) forever.
	oidcHTTPTimeout = 10 * time.Second
	// oidcDiscoveryRetry is how long a failed discovery is remembered before the next ID token
	// triggers another attempt: while the issuer is down, requests fail fast instead of each
	// waiting for a timeout.
	oidcDiscoveryRetry = 10 * time.Second
	// verifiedTTL is how long an ID token, once verified, is accepted on its digest without
	// verifying its signature again (never past its own expiry). Verifying one costs ~80 µs of
	// CPU (RS256 and the claims' JSON; BenchmarkAuthenticate), paid by the gateway and again by
	// the service behind it on every call; 10 s is kube-apiserver's token cache TTL. It adds
	// nothing a JWT could be revoked by: go-oidc keeps a key until a token names an unknown one.
	verifiedTTL = 10 * time.Second
	// maxVerified bounds the cache of verified tokens.
	maxVerified = 4096
)

var (
	errIssuerUnavailable = errors.New("OIDC issuer discovery failed")
	errTokenExpired      = errors.New("token expired")
)

// oidcAuthenticator verifies ID tokens with go-oidc. Discovery is lazy: a server whose issuer is
// down at start-up still starts and serves token-file callers, and ID tokens are refused
// (Unavailable) until discovery succeeds; it is retried at most every retryAfter. Signature
// keys come from the issuer's JWKS through go-oidc's remote key set, which caches them and
// re-fetches when a token names a key it does not know (key rotation).
type oidcAuthenticator struct {
	cfg        OIDCConfig
	client     *http.Client
	log        *zap.Logger
	now        func() time.Time
	retryAfter time.Duration

	verifier atomic.Pointer[oidc.IDTokenVerifier]
	// endpoints are the discovery document's, set with verifier.
	endpoints atomic.Pointer[OIDCEndpoints]
	mu        sync.Mutex // serializes discovery
	lastTry   time.Time
	lastErr   error

	verified verifiedTokens
}

// verifiedTokens remembers the identity of recently verified ID tokens by their SHA-256 digest
// (not the token: lookup timing reveals nothing, and memory holds no bearer token).
type verifiedTokens struct {
	mu sync.Mutex
	m  map[[sha256.Size]byte]verifiedToken
}

type verifiedToken struct {
	id    Identity
	until time.Time // min(token expiry, verified + verifiedTTL)
}

func (v *verifiedTokens) get(key [sha256.Size]byte, now time.Time) (Identity, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	e, ok := v.m[key]
	if !ok {
		return Identity{}, false
	}
	if !now.Before(e.until) {
		delete(v.m, key)
		return Identity{}, false
	}
	return e.id, true
}

func (v *verifiedTokens) put(key [sha256.Size]byte, id Identity, until, now time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.m == nil {
		v.m = map[[sha256.Size]byte]verifiedToken{}
	}
	if len(v.m) >= maxVerified {
		for k, e := range v.m {
			if !now.Before(e.until) {
				delete(v.m, k)
			}
		}
		// Still full of live entries (as many signed-in callers within verifiedTTL): forget
		// arbitrary ones; they are verified again on their next call.
		for k := range v.m {
			if len(v.m) < maxVerified {
				break
			}
			delete(v.m, k)
		}
	}
	// Clipped: callers share the slice, and an append must not write into it.
	id.Groups = slices.Clip(id.Groups)
	v.m[key] = verifiedToken{id: id, until: until}
}

func (v *verifiedTokens) len() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.m)
}

func newOIDCAuthenticator(cfg OIDCConfig, log *zap.Logger) (*oidcAuthenticator, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.UsernameClaim == "" {
		cfg.UsernameClaim = "sub"
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("--oidc-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--oidc-ca-file %s: no PEM certificate", cfg.CAFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &oidcAuthenticator{
		cfg:        cfg,
		client:     &http.Client{Transport: tr, Timeout: oidcHTTPTimeout},
		log:        log,
		now:        time.Now,
		retryAfter: oidcDiscoveryRetry,
	}, nil
}

// getVerifier returns the verifier, running discovery first if it has not succeeded yet.
func (a *oidcAuthenticator) getVerifier(ctx context.Context) (*oidc.IDTokenVerifier, error) {
	if v := a.verifier.Load(); v != nil {
		return v, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if v := a.verifier.Load(); v != nil {
		return v, nil
	}
	now := a.now()
	if !a.lastTry.IsZero() && now.Sub(a.lastTry) < a.retryAfter {
		return nil, fmt.Errorf("%w (retrying after %s): %w", errIssuerUnavailable, a.retryAfter, a.lastErr)
	}
	a.lastTry = now
	// Not cancelled with the request: a caller hanging up should not waste the attempt that
	// every other caller is waiting for.
	dctx, cancel := context.WithTimeout(oidc.ClientContext(context.WithoutCancel(ctx), a.client), oidcHTTPTimeout)
	defer cancel()
	p, err := oidc.NewProvider(dctx, a.cfg.IssuerURL)
	if err != nil {
		a.lastErr = err
		a.log.Warn("OIDC discovery failed; ID tokens are refused until it succeeds",
			zap.String("issuer", a.cfg.IssuerURL), zap.Duration("retry_after", a.retryAfter), zap.Error(err))
		return nil, fmt.Errorf("%w: %w", errIssuerUnavailable, err)
	}
	// The provider keeps a.client (taken from dctx) for its JWKS requests. Signing algorithms
	// default to those the discovery document lists that go-oidc supports (never "none" or HMAC).
	v := p.Verifier(&oidc.Config{ClientID: a.cfg.ClientID, Now: a.now})
	var doc struct {
		Authorization string `json:"authorization_endpoint"`
		Token         string `json:"token_endpoint"`
	}
	if err := p.Claims(&doc); err != nil {
		// NewProvider decoded the same document: cannot happen.
		a.lastErr = err
		return nil, fmt.Errorf("%w: %w", errIssuerUnavailable, err)
	}
	a.endpoints.Store(&OIDCEndpoints{Issuer: a.cfg.IssuerURL, ClientID: a.cfg.ClientID,
		AuthorizationEndpoint: doc.Authorization, TokenEndpoint: doc.Token})
	a.verifier.Store(v)
	a.log.Info("OIDC discovery done", zap.String("issuer", a.cfg.IssuerURL))
	return v, nil
}

// OIDCEndpoints is what a browser needs for the authorization code flow against the issuer:
// from its discovery document, read by the server (the browser need not be allowed to read it
// cross-origin).
type OIDCEndpoints struct {
	Issuer, ClientID                     string
	AuthorizationEndpoint, TokenEndpoint string
}

// endpointsOf runs discovery if it has not succeeded yet and returns the issuer's endpoints.
func (a *oidcAuthenticator) endpointsOf(ctx context.Context) (OIDCEndpoints, error) {
	if _, err := a.getVerifier(ctx); err != nil {
		return OIDCEndpoints{}, err
	}
	return *a.endpoints.Load(), nil
}

// authenticate returns the identity of ID token raw: remembered if raw was verified in the
// last verifiedTTL and has not expired since, verified otherwise. Errors never contain the
// token; failures are not remembered.
func (a *oidcAuthenticator) authenticate(ctx context.Context, raw string) (Identity, error) {
	key := sha256.Sum256([]byte(raw))
	if id, ok := a.verified.get(key, a.now()); ok {
		return id, nil
	}
	id, expiry, err := a.verify(ctx, raw)
	if err != nil {
		return Identity{}, err
	}
	now := a.now()
	until := now.Add(verifiedTTL)
	if !expiry.IsZero() && expiry.Before(until) {
		until = expiry
	}
	a.verified.put(key, id, until, now)
	return id, nil
}

// verify verifies raw as an ID token and maps its claims to an identity; it also returns the
// token's expiry.
func (a *oidcAuthenticator) verify(ctx context.Context, raw string) (Identity, time.Time, error) {
	// A cheap look at the unverified issuer first: tokens of other issuers (and non-JWTs) are
	// refused without network traffic. The verifier checks the issuer again after the signature.
	iss, ok := unverifiedIssuer(raw)
	if !ok {
		return Identity{}, time.Time{}, errors.New("not a JWT")
	}
	if iss != a.cfg.IssuerURL {
		return Identity{}, time.Time{}, fmt.Errorf("issued by %q, not by the configured issuer", iss)
	}
	v, err := a.getVerifier(ctx)
	if err != nil {
		return Identity{}, time.Time{}, err
	}
	tok, err := v.Verify(ctx, raw)
	if err != nil {
		// go-oidc checks signature, issuer and audience before expiry, so an expired token
		// was otherwise genuine and saying so to the client reveals nothing.
		if _, expired := errors.AsType[*oidc.TokenExpiredError](err); expired {
			return Identity{}, time.Time{}, fmt.Errorf("%w: %w", errTokenExpired, err)
		}
		return Identity{}, time.Time{}, fmt.Errorf("verify ID token: %w", err)
	}
	var claims map[string]json.RawMessage
	if err := tok.Claims(&claims); err != nil {
		return Identity{}, time.Time{}, fmt.Errorf("decode ID token claims: %w", err)
	}
	id, err := a.identity(claims)
	return id, tok.Expiry, err
}

// identity applies kube-apiserver's claim rules.
func (a *oidcAuthenticator) identity(claims map[string]json.RawMessage) (Identity, error) {
	var user string
	if err := json.Unmarshal(claims[a.cfg.UsernameClaim], &user); err != nil || user == "" {
		return Identity{}, fmt.Errorf("username claim %q missing or not a non-empty string", a.cfg.UsernameClaim)
	}
	if a.cfg.UsernameClaim == "email" {
		if raw, ok := claims["email_verified"]; ok {
			var verified bool
			if err := json.Unmarshal(raw, &verified); err != nil || !verified {
				return Identity{}, errors.New("email_verified is not true")
			}
		}
	}
	id := Identity{User: a.cfg.UsernamePrefix + user}
	// system: names are Fleetstream's own service identities; an identity provider must not
	// be able to speak for them.
	if strings.HasPrefix(id.User, "system:") {
		return Identity{}, fmt.Errorf("user %q: the system: prefix is reserved", id.User)
	}
	if a.cfg.GroupsClaim == "" {
		return id, nil
	}
	raw, ok := claims[a.cfg.GroupsClaim]
	if !ok || string(raw) == "null" {
		return id, nil
	}
	var groups []string
	var one string
	if err := json.Unmarshal(raw, &groups); err != nil {
		if err := json.Unmarshal(raw, &one); err != nil {
			return Identity{}, fmt.Errorf("groups claim %q: want a string or a list of strings", a.cfg.GroupsClaim)
		}
		groups = []string{one}
	}
	for _, g := range groups {
		if g == "" {
			continue
		}
		g = a.cfg.GroupsPrefix + g
		if strings.HasPrefix(g, "system:") {
			a.log.Debug("dropping reserved OIDC group", zap.String("user", id.User), zap.String("group", g))
			continue
		}
		id.Groups = append(id.Groups, g)
	}
	return id, nil
}

// unverifiedIssuer returns the iss claim of a compact JWS without verifying anything.
func unverifiedIssuer(raw string) (string, bool) {
	parts := strings.Split(raw, ".")
	if len(parts) != 3 {
		return "", false
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", false
	}
	var c struct {
		Issuer string `json:"iss"`
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		return "", false
	}
	return c.Issuer, true
}
