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

	"github.com/fleetstream/fleetstream/pkg/events"
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

// authInterceptor requires a valid bearer token on every RPC and records the caller as the
// actor of the events the call appends. With tokens nil (--insecure-dev) every caller is
// "anonymous".
type authInterceptor struct{ tokens *Tokens }

var errUnauthenticated = errors.New("missing or invalid bearer token")

func (a authInterceptor) authenticate(ctx context.Context, h http.Header) (context.Context, error) {
	if a.tokens == nil {
		return events.WithActor(ctx, "anonymous"), nil
	}
	auth := h.Get("Authorization")
	token, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok || token == "" {
		return ctx, connect.NewError(connect.CodeUnauthenticated, errUnauthenticated)
	}
	id, ok := a.tokens.Lookup(token)
	if !ok {
		return ctx, connect.NewError(connect.CodeUnauthenticated, errUnauthenticated)
	}
	return events.WithGroups(events.WithActor(ctx, id.User), id.Groups), nil
}

func (a authInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		ctx, err := a.authenticate(ctx, req.Header())
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
		ctx, err := a.authenticate(ctx, conn.RequestHeader())
		if err != nil {
			return err
		}
		return next(ctx, conn)
	}
}
