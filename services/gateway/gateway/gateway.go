// Package gateway is Fleetstream's one API front door: it routes Connect, gRPC and gRPC-Web
// calls by procedure path (/<package>.<Service>/<Method>) to the service that serves them,
// refuses unauthenticated calls before they reach a service, refuses calls to services whose
// upstream is not ready, and gives every request an id and one access-log line.
//
// It proxies with net/http/httputil.ReverseProxy: gRPC, gRPC-Web and streams over cleartext
// HTTP/2 (h2c) to the upstreams, so trailers and server streams pass through unchanged, and
// Connect unary calls over HTTP/1.1 keep-alive connections, their small bodies and answers
// read whole first so that each leaves in one write. It never parses a message. The
// services still authenticate and authorize every call themselves: the gateway only rejects
// early what they would reject anyway.
package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/fleetstream/fleetstream/pkg/console"
	"github.com/fleetstream/fleetstream/pkg/identity"
	"github.com/fleetstream/fleetstream/pkg/server"
)

// RequestIDHeader carries the request id to the upstream and back to the client.
const RequestIDHeader = "X-Request-Id"

// DefaultPollInterval is how often each upstream's /readyz is polled.
const DefaultPollInterval = 2 * time.Second

// maxBufferedBody is the largest Connect unary request body the gateway reads whole before
// forwarding it (see ServeHTTP); larger ones, and bodies of unknown length, are streamed.
const maxBufferedBody = 64 << 10

// copyBuffers are the ReverseProxy's response copy buffers (32 KiB, its default size):
// without a pool it allocates and zeroes one per call.
var copyBuffers = &bufferPool{sync.Pool{New: func() any { return new([copyBufferSize]byte) }}}

const copyBufferSize = 32 << 10

// bufferPool holds array pointers, so that neither Get nor Put allocates.
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte { return b.p.Get().(*[copyBufferSize]byte)[:] }

func (b *bufferPool) Put(x []byte) {
	if cap(x) >= copyBufferSize {
		b.p.Put((*[copyBufferSize]byte)(x[:copyBufferSize]))
	}
}

// Config is what the gateway's flags set.
type Config struct {
	// Routes maps a fully-qualified service name (fleetstream.cluster.v1.ClusterService) to the
	// base URL of its upstream (http://cluster-import:8080). Several services may share one
	// upstream; it is then polled once.
	Routes map[string]string
	// MaxRequestBytes bounds a request body; 0 means server.DefaultMaxRequestBytes, the bound of
	// the services themselves.
	MaxRequestBytes int64
	// PollInterval is how often each upstream's /readyz is polled; 0 means DefaultPollInterval.
	PollInterval time.Duration
	// AccessLog receives the access log, one line per request; nil means the gateway's logger.
	AccessLog *zap.Logger
	// Console configures the web console's OIDC sign-in (--console-oidc-*).
	Console console.Config
}

// ParseRoute parses one --route value, service=url.
func ParseRoute(s string) (service, upstream string, err error) {
	service, upstream, ok := strings.Cut(s, "=")
	if !ok || service == "" || upstream == "" {
		return "", "", fmt.Errorf("route %q: want <package>.<Service>=http://host:port", s)
	}
	return service, upstream, nil
}

// serviceName is a fully-qualified protobuf service name: dot-separated identifiers, at least
// a package and a service.
var serviceName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$`)

// Gateway is the proxy. Build it with New, serve Handler (or Mount it on a server.Server) and
// run Run to keep the upstreams' health current.
type Gateway struct {
	log       *zap.Logger
	accessLog *zap.Logger
	authn     *server.Authenticator
	console   console.Config
	maxBytes  int64
	poll      time.Duration
	// routes and upstreams are fixed after New; only each upstream's health changes.
	routes    map[string]*upstream
	upstreams []*upstream
	requests  *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	ids       *requestIDs
}

// requestIDs hands out request ids: random (version 4) UUIDs, as uuid.NewString makes, cut
// from 4 KiB of crypto/rand at a time instead of a getrandom system call per request.
type requestIDs struct {
	mu   sync.Mutex
	rand *bufio.Reader
}

func newRequestIDs() *requestIDs {
	return &requestIDs{rand: bufio.NewReaderSize(rand.Reader, 4096)}
}

func (r *requestIDs) next() string {
	r.mu.Lock()
	id, err := uuid.NewRandomFromReader(r.rand)
	r.mu.Unlock()
	if err != nil {
		// crypto/rand does not fail on Linux; should it, an id from a fresh read is as good.
		return uuid.NewString()
	}
	return id.String()
}

// upstream is one service process (or load balancer) behind the gateway.
type upstream struct {
	name  string // host:port, as /readyz lists it
	base  *url.URL
	proxy *httputil.ReverseProxy
	// unaryProxy carries Connect unary calls (see New).
	unaryProxy *httputil.ReverseProxy
	client     *http.Client

	mu  sync.Mutex
	err error // nil when ready; the reason otherwise
}

func (u *upstream) health() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.err
}

func (u *upstream) setHealth(err error) (changed bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	changed = (u.err == nil) != (err == nil)
	u.err = err
	return changed
}

// New validates cfg and builds the gateway. authn is the authenticator of the services (the
// same token file and OIDC settings); reg receives the gateway's metrics.
func New(cfg Config, authn *server.Authenticator, reg prometheus.Registerer, log *zap.Logger) (*Gateway, error) {
	if authn == nil {
		return nil, errors.New("gateway: no authenticator")
	}
	if len(cfg.Routes) == 0 {
		return nil, errors.New("gateway: no routes: pass --route <package>.<Service>=http://host:port for every service")
	}
	g := &Gateway{
		log:       log,
		accessLog: cfg.AccessLog,
		authn:     authn,
		console:   cfg.Console,
		maxBytes:  cfg.MaxRequestBytes,
		poll:      cfg.PollInterval,
		routes:    map[string]*upstream{},
		ids:       newRequestIDs(),
	}
	if g.maxBytes <= 0 {
		g.maxBytes = server.DefaultMaxRequestBytes
	}
	if g.poll <= 0 {
		g.poll = DefaultPollInterval
	}
	if g.accessLog == nil {
		g.accessLog = log
	}
	// One transport for every upstream: cleartext HTTP/2 only (prior knowledge), so gRPC's
	// trailers and long server streams work and many calls share a few connections.
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	transport := &http.Transport{
		Protocols:           &protocols,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
	}
	// Connect's unary calls (JSON or protobuf bodies) need neither trailers nor streams: they go
	// over HTTP/1.1 keep-alive connections, which cost a loopback hop about half of what the
	// HTTP/2 framing and its extra goroutines do (BenchmarkGatewayLatency, BenchmarkProcessLatency).
	unaryTransport := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	byURL := map[string]*upstream{}
	services := make([]string, 0, len(cfg.Routes))
	for s := range cfg.Routes {
		services = append(services, s)
	}
	sort.Strings(services)
	for _, svc := range services {
		raw := cfg.Routes[svc]
		if !serviceName.MatchString(svc) {
			return nil, fmt.Errorf("route %s: not a fully-qualified service name like fleetstream.cluster.v1.ClusterService", svc)
		}
		base, err := url.Parse(raw)
		if err != nil {
			return nil, fmt.Errorf("route %s: upstream %q: %w", svc, raw, err)
		}
		// h2c only: TLS to the upstreams is out of scope (a private network), and a path
		// would silently change every procedure's URL.
		if base.Scheme != "http" || base.Host == "" || (base.Path != "" && base.Path != "/") || base.RawQuery != "" || base.User != nil {
			return nil, fmt.Errorf("route %s: upstream %q: want http://host:port", svc, raw)
		}
		base.Path = ""
		key := base.String()
		u, ok := byURL[key]
		if !ok {
			u = g.newUpstream(base, transport, unaryTransport)
			byURL[key] = u
			g.upstreams = append(g.upstreams, u)
		}
		g.routes[svc] = u
	}
	g.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetstream_gateway_requests_total", Help: "Requests through the gateway, by upstream and HTTP status.",
	}, []string{"upstream", "status"})
	g.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "fleetstream_gateway_request_duration_seconds", Help: "Time from request to the end of the response, by upstream (streams included).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	}, []string{"upstream"})
	if reg != nil {
		if err := reg.Register(g.requests); err != nil {
			return nil, fmt.Errorf("register gateway metrics: %w", err)
		}
		if err := reg.Register(g.duration); err != nil {
			return nil, fmt.Errorf("register gateway metrics: %w", err)
		}
	}
	return g, nil
}

func (g *Gateway) newUpstream(base *url.URL, transport *http.Transport, unaryTransport http.RoundTripper) *upstream {
	u := &upstream{
		name:   base.Host,
		base:   base,
		client: &http.Client{Transport: transport, Timeout: 2 * time.Second},
		err:    errors.New("not checked yet"),
	}
	u.proxy = g.reverseProxy(u, base, transport)
	u.unaryProxy = g.reverseProxy(u, base, unaryTransport)
	u.unaryProxy.ModifyResponse = bufferUnaryAnswer
	return u
}

// bufferUnaryAnswer reads a Connect unary answer that came without a Content-Length (a Go
// server chunks every answer above 2 KiB that its handler did not give a length, as connect-go
// does not) whole when it fits in a copy buffer, and gives it its length. Streamed,
// ReverseProxy would treat it as a stream: a timer goroutine per call flushing the headers on
// their own, then a write per chunk, where with a length the headers and the body leave in one
// write (ServeHTTP's final flush). A longer answer is streamed after what was read.
func bufferUnaryAnswer(res *http.Response) error {
	if res.ContentLength != -1 || len(res.Trailer) > 0 || res.Body == nil || res.Body == http.NoBody {
		return nil
	}
	buf := copyBuffers.Get()
	n, err := io.ReadFull(res.Body, buf)
	switch err {
	case io.EOF, io.ErrUnexpectedEOF:
		// All of it: the body is done, and its connection back in the pool.
		_ = res.Body.Close()
		res.Body = &bufferedBody{Reader: bytes.NewReader(buf[:n]), buf: buf}
		res.ContentLength = int64(n)
		res.TransferEncoding = nil
		res.Header.Set("Content-Length", strconv.Itoa(n))
	case nil:
		res.Body = &bufferedBody{Reader: io.MultiReader(bytes.NewReader(buf), res.Body), buf: buf, rest: res.Body}
	default:
		copyBuffers.Put(buf)
		return fmt.Errorf("read answer: %w", err)
	}
	return nil
}

// bufferedBody is an answer read (at least partly) into a pooled copy buffer, which Close
// returns; rest is the unread remainder, if any.
type bufferedBody struct {
	io.Reader
	buf  []byte
	rest io.ReadCloser
}

func (b *bufferedBody) Close() error {
	var err error
	if b.rest != nil {
		err = b.rest.Close()
	}
	if b.buf != nil {
		copyBuffers.Put(b.buf)
		b.buf = nil
	}
	return err
}

func (g *Gateway) reverseProxy(u *upstream, base *url.URL, transport http.RoundTripper) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(base)
			pr.SetXForwarded()
			c := callOf(pr.In.Context())
			pr.Out.Header.Set(RequestIDHeader, c.id)
			if c.body != nil {
				// An in-memory body (the type matters: net/http recognizes it), so the
				// transport writes the headers and the body in one write instead of flushing
				// the headers first; and, as it can be replayed, a POST that finds its
				// keep-alive connection closed before anything was written is retried.
				body := c.body
				pr.Out.Body = io.NopCloser(bytes.NewReader(body))
				pr.Out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
			}
		},
		Transport:  transport,
		BufferPool: copyBuffers,
		// No periodic flushing: ReverseProxy flushes every write of an answer without a
		// Content-Length by itself, and every stream (Connect, gRPC, gRPC-Web) is one, so
		// Watch* events still reach the client as they are produced. A unary answer has a
		// length: ServeHTTP flushes it whole at the end. (-1 here, "flush at once", made
		// ReverseProxy start a timer goroutine per call to flush the headers on their own.)
		FlushInterval: 0,
		ErrorLog:      zap.NewStdLog(g.log.Named("proxy")),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				writeError(w, r, codeResourceExhausted, fmt.Sprintf("request body larger than %d bytes", tooBig.Limit))
				return
			}
			if r.Context().Err() != nil {
				// The client went away; nobody reads an answer.
				return
			}
			g.log.Warn("upstream call failed", zap.String("upstream", u.name), zap.String("procedure", r.URL.Path),
				zap.String("request_id", callOf(r.Context()).id), zap.Error(err))
			writeError(w, r, codeUnavailable, fmt.Sprintf("upstream %s is unreachable", u.name))
		},
	}
}

// Mount serves the gateway on srv for every path srv does not serve itself (/healthz, /readyz,
// /metrics, the console at /ui/) and makes srv's /readyz list each upstream.
func (g *Gateway) Mount(srv *server.Server) {
	console.Mount(srv, console.Options{Config: g.console, OIDC: srv.Authenticator().OIDCEndpoints})
	srv.Handle("/", g)
	for _, u := range g.upstreams {
		srv.AddCheck("upstream "+u.name, func(context.Context) error { return u.health() })
	}
}

// Run polls every upstream's /readyz until ctx ends.
func (g *Gateway) Run(ctx context.Context) error {
	eg, ctx := errgroup.WithContext(ctx)
	for _, u := range g.upstreams {
		eg.Go(func() error {
			g.watch(ctx, u)
			return nil
		})
	}
	return eg.Wait()
}

func (g *Gateway) watch(ctx context.Context, u *upstream) {
	t := time.NewTicker(g.poll)
	defer t.Stop()
	for {
		err := g.check(ctx, u)
		if ctx.Err() != nil {
			return
		}
		if u.setHealth(err) {
			if err != nil {
				g.log.Warn("upstream not ready", zap.String("upstream", u.name), zap.Error(err))
			} else {
				g.log.Info("upstream ready", zap.String("upstream", u.name))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (g *Gateway) check(ctx context.Context, u *upstream) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.base.String()+"/readyz", nil)
	if err != nil {
		return fmt.Errorf("build readiness request: %w", err)
	}
	res, err := u.client.Do(req)
	if err != nil {
		return fmt.Errorf("GET /readyz: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /readyz: HTTP %d", res.StatusCode)
	}
	return nil
}

// call is what ServeHTTP hands the proxy's Rewrite through the request context.
type call struct {
	id   string // request id
	body []byte // the whole request body, when ServeHTTP read it; nil when it streams
}

type callKey struct{}

func callOf(ctx context.Context) *call {
	c, _ := ctx.Value(callKey{}).(*call)
	if c == nil {
		return &call{}
	}
	return c
}

// validRequestID is what a client-sent request id must look like: short and safe to log and to
// put in a header.
var validRequestID = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// ServeHTTP routes one call.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rw := &recorder{ResponseWriter: w}
	id := r.Header.Get(RequestIDHeader)
	badID := id != "" && !validRequestID.MatchString(id)
	if id == "" || badID {
		id = g.ids.next()
	}
	rw.Header().Set(RequestIDHeader, id)
	var (
		user, upstreamName = "", "-"
		service            = serviceOf(r.URL.Path)
	)
	defer func() {
		g.requests.WithLabelValues(upstreamName, strconv.Itoa(rw.status())).Inc()
		g.duration.WithLabelValues(upstreamName).Observe(time.Since(start).Seconds())
		// Never the Authorization header, nor any other header: they may carry secrets.
		g.accessLog.Info("request",
			zap.String("method", r.Method),
			zap.String("procedure", r.URL.Path),
			zap.String("upstream", upstreamName),
			zap.Int("status", rw.status()),
			zap.Int64("bytes", rw.bytes),
			zap.Duration("duration", time.Since(start)),
			zap.String("request_id", id),
			zap.String("user", user))
	}()
	if badID {
		writeError(rw, r, codeInvalidArgument, "X-Request-Id: want 1 to 64 characters of [A-Za-z0-9._-]")
		return
	}
	u, ok := g.routes[service]
	if !ok {
		writeError(rw, r, codeUnimplemented, fmt.Sprintf("%s is not served here", r.URL.Path))
		return
	}
	upstreamName = u.name
	// Authentication first: who is not signed in learns nothing about the upstreams' health.
	ctx, err := g.authn.Authenticate(r.Context(), r.Header)
	if err != nil {
		writeConnectError(rw, r, err)
		return
	}
	user = identity.ActorFrom(ctx)
	if err := u.health(); err != nil {
		writeError(rw, r, codeUnavailable, fmt.Sprintf("%s: upstream %s is not ready, retry later", service, u.name))
		return
	}
	if r.ContentLength > g.maxBytes {
		writeError(rw, r, codeResourceExhausted, fmt.Sprintf("request body larger than %d bytes", g.maxBytes))
		return
	}
	// The proxy copies the request (and its headers) itself; Rewrite sets the request id on
	// that copy.
	c := &call{id: id}
	out := r.WithContext(context.WithValue(ctx, callKey{}, c))
	if !connectUnary(r) {
		// Chunked bodies have no length up front: the reader fails at the bound, and the
		// proxy's ErrorHandler answers resource_exhausted.
		out.Body = http.MaxBytesReader(rw, r.Body, g.maxBytes)
		u.proxy.ServeHTTP(rw, out)
		return
	}
	if r.ContentLength > 0 && r.ContentLength <= maxBufferedBody {
		// A small unary body of known length (within maxBytes, checked above) is read whole
		// first, so that it goes upstream in the same write as the headers: streamed, it
		// would cost a second write here and a second read (often a wait) upstream.
		c.body = make([]byte, r.ContentLength)
		if _, err := io.ReadFull(r.Body, c.body); err != nil {
			// Most likely the client went away (then its context is done too); the answer is
			// for the access log more than for it.
			code := codeInvalidArgument
			if r.Context().Err() != nil {
				code = codeCanceled
			}
			writeError(rw, r, code, "request body shorter than its Content-Length")
			return
		}
	} else {
		out.Body = http.MaxBytesReader(rw, r.Body, g.maxBytes)
	}
	u.unaryProxy.ServeHTTP(rw, out)
	// The answer (headers and body, in one write when it is small) leaves before the access
	// log line is written, not after.
	rw.Flush()
}

// serviceOf returns the service of a procedure path /<package>.<Service>/<Method>, or "" when
// the path is not one.
func serviceOf(path string) string {
	rest, ok := strings.CutPrefix(path, "/")
	if !ok {
		return ""
	}
	svc, method, ok := strings.Cut(rest, "/")
	if !ok || method == "" || strings.Contains(method, "/") {
		return ""
	}
	return svc
}

// recorder keeps the status and size of a response for the access log. It forwards Flush
// (through Unwrap, which http.ResponseController uses), so streams are not buffered.
type recorder struct {
	http.ResponseWriter
	code  int
	bytes int64
}

func (r *recorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	n, err := r.ResponseWriter.Write(b)
	r.bytes += int64(n)
	return n, err
}

func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (r *recorder) status() int {
	if r.code == 0 {
		return http.StatusOK
	}
	return r.code
}

// connectUnary reports a Connect unary call: a POST whose body is a bare JSON or protobuf
// message (streams use application/connect+…, gRPC application/grpc…).
func connectUnary(r *http.Request) bool {
	if r.Method != http.MethodPost {
		return false
	}
	ct := r.Header.Get("Content-Type")
	return ct == "application/json" || ct == "application/proto" || strings.HasPrefix(ct, "application/json;")
}
