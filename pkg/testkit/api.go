package testkit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/fleetstream/fleetstream/pkg/authz"
	"github.com/fleetstream/fleetstream/pkg/server"
)

// TokenServer returns an API server as the service binaries and fleetd build it: it
// authenticates bearer tokens from a token file of lines (what server.Config.TokenFile reads:
// "token,user[,uid,\"group,...\"]") and authorizes with cfg over js's views (Authorize).
func TokenServer(t testing.TB, js jetstream.JetStream, lines []string, cfg authz.Config, log *zap.Logger) (*server.Server, *authz.Authorizer) {
	t.Helper()
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{TokenFile: tokens}, log)
	if err != nil {
		t.Fatalf("api server: %v", err)
	}
	return srv, Authorize(t, js, srv, cfg)
}

// Serve serves srv over HTTP/1.1 and HTTP/2 (Connect's streams want either) until the test
// ends or the server is closed.
func Serve(t testing.TB, srv *server.Server) *httptest.Server {
	hs := httptest.NewUnstartedServer(srv.Handler())
	hs.EnableHTTP2 = true
	hs.Start()
	t.Cleanup(hs.Close)
	return hs
}

// BearerClient returns a copy of base that sends token on every request, unary or streaming
// ("" sends none).
func BearerClient(base *http.Client, token string) *http.Client {
	c := *base
	next := c.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	c.Transport = roundTripper(func(r *http.Request) (*http.Response, error) {
		if token != "" {
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+token)
		}
		return next.RoundTrip(r)
	})
	return &c
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// RunComponents mounts cs on srv and runs them as fleetd does until stop is called (at the
// latest when the test ends), and returns once every one is ready. A component that fails, or
// is not ready within 30 s, fails the test.
func RunComponents(t testing.TB, srv *server.Server, cs ...server.Component) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, c := range cs {
		c.Mount(srv)
		wg.Go(func() {
			if err := c.Run(ctx); err != nil {
				t.Errorf("%T stopped: %v", c, err)
			}
		})
	}
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	timeout := time.After(30 * time.Second)
	for _, c := range cs {
		select {
		case <-c.Ready():
		case <-timeout:
			t.Fatalf("%T not ready", c)
		}
	}
	return stop
}
