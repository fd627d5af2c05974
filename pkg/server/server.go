// Package server is the scaffold every Fleetstream HTTP listener shares: Connect handlers
// (Connect, gRPC and gRPC-Web on one port, HTTP/2 without TLS), bearer-token authentication,
// /healthz, /readyz and Prometheus /metrics.
package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// Config is what the flags of every server binary set.
type Config struct {
	// Listen is host:port of the one HTTP listener.
	Listen string
	// TokenFile lists the bearer tokens allowed to call the APIs.
	TokenFile string
	// OIDC also accepts ID tokens of an OpenID Connect issuer; with TokenFile both are tried
	// (the token file first).
	OIDC OIDCConfig
	// InsecureDev serves the APIs without authentication. It must be asked for explicitly.
	InsecureDev bool
	// MaxRequestBytes bounds a request message (after decompression); a larger one is refused
	// with ResourceExhausted before it is read whole. 0 means DefaultMaxRequestBytes.
	MaxRequestBytes int
}

// DefaultMaxRequestBytes is the default bound of one request message: far above any valid
// request (the largest are cluster credentials with a kubeconfig) and far below what would
// hurt the process.
const DefaultMaxRequestBytes = 4 << 20

// Check reports whether one dependency is ready; a non-nil error makes /readyz fail.
type Check func(ctx context.Context) error

// Server is one HTTP listener carrying every Connect service of the process.
type Server struct {
	cfg      Config
	log      *zap.Logger
	mux      *http.ServeMux
	registry *Registry
	opts     []connect.HandlerOption
	authn    *Authenticator

	mu     sync.Mutex
	checks map[string]Check
	// authz enforces authorization inside authentication; until Authorize sets it every call
	// is refused, so no handler is ever reachable unauthorized.
	authz atomic.Pointer[connect.Interceptor]
}

// New validates cfg and builds a server. Without a token file or OIDC it refuses to start
// unless InsecureDev is set, and then it says so loudly.
func New(cfg Config, log *zap.Logger) (*Server, error) {
	authn, err := newAuthenticator(cfg, log)
	if err != nil {
		return nil, err
	}
	maxBytes := cfg.MaxRequestBytes
	if maxBytes <= 0 {
		maxBytes = DefaultMaxRequestBytes
	}
	reg := newRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s := &Server{cfg: cfg, log: log, mux: http.NewServeMux(), registry: reg, authn: authn, checks: map[string]Check{}}
	s.opts = append([]connect.HandlerOption{
		connect.WithInterceptors(newMetricsInterceptor(reg), authInterceptor{authn}, lateInterceptor{s}, errorInterceptor{}),
		connect.WithReadMaxBytes(maxBytes),
		// Compressing small responses costs more CPU than it saves bytes (profiles of the bind
		// path showed ~6% of CPU in gzip of responses of a few hundred bytes).
		connect.WithCompressMinBytes(1024),
	}, codecOptions()...) // strict request decoding (codec.go)
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	s.mux.HandleFunc("GET /readyz", s.readyz)
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	return s, nil
}

// Authorize installs the authorization interceptor (pkg/authz), which runs after
// authentication on every call of every handler of this server, including those mounted
// before.
func (s *Server) Authorize(i connect.Interceptor) { s.authz.Store(&i) }

// Authenticator is the authenticator every handler of this server uses, for handlers that are
// not Connect handlers (the gateway's proxy).
func (s *Server) Authenticator() *Authenticator { return s.authn }

// Registry is where the process's components register their metrics.
func (s *Server) Registry() *Registry { return s.registry }

// HandlerOptions are the options every Connect handler of this server must be built with.
func (s *Server) HandlerOptions() []connect.HandlerOption { return s.opts }

// Handle mounts a generated Connect handler (path and handler as New<Service>Handler returns).
func (s *Server) Handle(path string, h http.Handler) { s.mux.Handle(path, h) }

// AddCheck adds a readiness check.
func (s *Server) AddCheck(name string, c Check) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checks[name] = c
}

// ReadyWhen adds a readiness check that passes once ch is closed.
func (s *Server) ReadyWhen(name string, ch <-chan struct{}) {
	s.AddCheck(name, func(context.Context) error {
		select {
		case <-ch:
			return nil
		default:
			return errors.New("not ready")
		}
	})
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	s.mu.Lock()
	names := make([]string, 0, len(s.checks))
	for n := range s.checks {
		names = append(names, n)
	}
	checks := s.checks
	s.mu.Unlock()
	sort.Strings(names)
	var b strings.Builder
	failed := false
	for _, n := range names {
		if err := checks[n](ctx); err != nil {
			failed = true
			fmt.Fprintf(&b, "[-] %s: %v\n", n, err)
		} else {
			fmt.Fprintf(&b, "[+] %s\n", n)
		}
	}
	if failed {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write([]byte(b.String()))
}

// Handler returns the root handler, speaking HTTP/1.1 and cleartext HTTP/2 (for gRPC).
func (s *Server) Handler() http.Handler { return s.mux }

// Serve listens on cfg.Listen until ctx is done, then shuts down gracefully.
func (s *Server) Serve(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", s.cfg.Listen, err)
	}
	return s.ServeListener(ctx, ln)
}

// ServeListener serves on ln until ctx is done.
func (s *Server) ServeListener(ctx context.Context, ln net.Listener) error {
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	hs := &http.Server{Handler: s.mux, Protocols: &protocols, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	s.log.Info("serving", zap.String("addr", ln.Addr().String()))
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
		return nil
	}
}
