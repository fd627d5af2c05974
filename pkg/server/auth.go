package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/csv"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"connectrpc.com/connect"
	"go.uber.org/zap"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/identity"
)

// Tokens authenticates bearer tokens read from a token file. The file has the format of
// kube-apiserver's --token-auth-file: one `token,user[,uid[,"group1,group2"]]` per line (CSV);
// blank lines and lines starting with # are ignored. Tokens are kept only as SHA-256 digests.
type Tokens struct {
	users map[[sha256.Size]byte]Identity
}

// Identity is who a token belongs to.
type Identity struct {
	User   string
	Groups []string
}

// LoadTokens reads a token file.
func LoadTokens(path string) (*Tokens, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read token file: %w", err)
	}
	t := &Tokens{users: map[[sha256.Size]byte]Identity{}}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		r := csv.NewReader(strings.NewReader(line))
		r.FieldsPerRecord = -1
		parts, err := r.Read()
		if err != nil || len(parts) < 2 || parts[0] == "" || parts[1] == "" {
			// The line is not echoed: it holds a secret.
			return nil, fmt.Errorf("token file %s line %d: want token,user[,uid[,\"group1,group2\"]]", path, n)
		}
		id := Identity{User: parts[1]}
		if len(parts) > 3 {
			for _, g := range strings.Split(parts[3], ",") {
				if g = strings.TrimSpace(g); g != "" {
					id.Groups = append(id.Groups, g)
				}
			}
		}
		t.users[sha256.Sum256([]byte(parts[0]))] = id
	}
	if len(t.users) == 0 {
		return nil, fmt.Errorf("token file %s: no tokens", path)
	}
	return t, nil
}

// Lookup returns who a token belongs to.
func (t *Tokens) Lookup(token string) (Identity, bool) {
	// Looked up by digest, so lookup timing reveals nothing about stored tokens.
	id, ok := t.users[sha256.Sum256([]byte(token))]
	return id, ok
}

// Authenticator resolves a request's bearer token to the caller. A token is looked up in the
// token file first (a digest lookup) and then, if configured, verified as an OIDC ID token;
// either source alone turns authentication on. With neither (--insecure-dev) every caller is
// "anonymous". It is exported so that a proxy in front of the services (the gateway) can refuse
// unauthenticated calls exactly as the services would, before forwarding them.
type Authenticator struct {
	tokens *Tokens
	oidc   *oidcAuthenticator
	log    *zap.Logger
}

// newAuthenticator builds the authenticator cfg asks for. Without a token file or OIDC it
// refuses unless InsecureDev is set, and then it says so loudly.
func newAuthenticator(cfg Config, log *zap.Logger) (*Authenticator, error) {
	a := &Authenticator{log: log}
	if cfg.TokenFile != "" {
		t, err := LoadTokens(cfg.TokenFile)
		if err != nil {
			return nil, err
		}
		a.tokens = t
	}
	if cfg.OIDC.enabled() {
		o, err := newOIDCAuthenticator(cfg.OIDC, log.Named("oidc"))
		if err != nil {
			return nil, err
		}
		a.oidc = o
		// Discovery waits for the first ID token (see oidcAuthenticator), so say where it will go.
		log.Info("OIDC sign-in on", zap.String("issuer", cfg.OIDC.IssuerURL), zap.String("client_id", cfg.OIDC.ClientID),
			zap.String("username_claim", o.cfg.UsernameClaim), zap.String("groups_claim", cfg.OIDC.GroupsClaim))
	}
	switch {
	case a.tokens != nil || a.oidc != nil:
	case cfg.InsecureDev:
		log.Warn("INSECURE: serving APIs without authentication (--insecure-dev); never do this in production")
	default:
		return nil, errors.New("no --token-file or --oidc-issuer-url given: pass one, or --insecure-dev to run without authentication on a laptop")
	}
	return a, nil
}

// OIDCEndpoints returns the OIDC issuer's endpoints for the console's sign-in, running
// discovery if it has not succeeded yet (at most every oidcDiscoveryRetry while the issuer is
// down). ok is false without --oidc-issuer-url.
func (a *Authenticator) OIDCEndpoints(ctx context.Context) (e OIDCEndpoints, ok bool, err error) {
	if a.oidc == nil {
		return OIDCEndpoints{}, false, nil
	}
	e, err = a.oidc.endpointsOf(ctx)
	return e, true, err
}

// Client-facing messages are short and fixed: they never echo the token or say which check
// failed, except expiry, which tells an honest caller to fetch a new token.
var (
	errUnauthenticated = errors.New("missing or invalid bearer token")
	errExpired         = errors.New("bearer token expired")
	errIdPUnavailable  = errors.New("cannot verify ID tokens: identity provider unreachable, retry later")
)

// Authenticate checks the Authorization header of a request and returns ctx carrying the
// caller (identity.ActorFrom, identity.GroupsFrom), or a *connect.Error: Unauthenticated, or
// Unavailable while the OIDC issuer cannot be reached.
func (a *Authenticator) Authenticate(ctx context.Context, h http.Header) (context.Context, error) {
	return a.authenticate(ctx, "", h)
}

// authenticate is Authenticate with the procedure for the debug log (empty when unknown).
func (a *Authenticator) authenticate(ctx context.Context, procedure string, h http.Header) (context.Context, error) {
	if a.tokens == nil && a.oidc == nil {
		setCallerKind(ctx, callerAnonymous)
		return identity.WithActor(ctx, "anonymous"), nil
	}
	auth := h.Get("Authorization")
	token, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok || token == "" {
		a.log.Debug("unauthenticated: no bearer token", zap.String("procedure", procedure))
		return ctx, apierr.Unauthenticated(errUnauthenticated)
	}
	if a.tokens != nil {
		if id, ok := a.tokens.Lookup(token); ok {
			return withIdentity(ctx, id), nil
		}
	}
	if a.oidc == nil {
		a.log.Debug("unauthenticated: token not in the token file", zap.String("procedure", procedure))
		return ctx, apierr.Unauthenticated(errUnauthenticated)
	}
	id, err := a.oidc.authenticate(ctx, token)
	if err != nil {
		// The reason is logged, never the token.
		a.log.Debug("unauthenticated: token not in the token file (if any) and not a valid ID token",
			zap.String("procedure", procedure), zap.Error(err))
		switch {
		case errors.Is(err, errIssuerUnavailable):
			// The token may well be valid: Unavailable tells the caller to retry, not to sign in again.
			return ctx, apierr.Unavailable(errIdPUnavailable)
		case errors.Is(err, errTokenExpired):
			return ctx, apierr.Unauthenticated(errExpired)
		}
		return ctx, apierr.Unauthenticated(errUnauthenticated)
	}
	return withIdentity(ctx, id), nil
}

func withIdentity(ctx context.Context, id Identity) context.Context {
	setCallerKind(ctx, callerKindOf(id.User))
	return identity.WithGroups(identity.WithActor(ctx, id.User), id.Groups)
}

// authInterceptor requires a valid bearer token on every RPC and records the caller as the
// actor of the events the call appends.
type authInterceptor struct{ a *Authenticator }

func (a authInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		ctx, err := a.a.authenticate(ctx, req.Spec().Procedure, req.Header())
		if err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (a authInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (a authInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		ctx, err := a.a.authenticate(ctx, conn.Spec().Procedure, conn.RequestHeader())
		if err != nil {
			return err
		}
		return next(ctx, conn)
	}
}
