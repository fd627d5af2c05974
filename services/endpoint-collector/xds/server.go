// Package xds serves the endpoint collector's merged endpoints to proxies over xDS (Envoy,
// Istio's sidecars, proxyless gRPC): per service port a ClusterLoadAssignment, its Cluster
// (CDS, type EDS), and the Listener/RouteConfiguration pair that makes
// xds:///<service>.<namespace>:<port> resolvable for gRPC. The resources live only in
// go-control-plane's linear caches (one per type, muxed for ADS); this package turns the
// collector's change feed into cache updates. See docs/endpoints.md.
package xds

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fleetstream/fleetstream/pkg/authz"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/collector"
)

// Source is what the server serves: the collector.
type Source interface {
	Ready() <-chan struct{}
	Feed() *collector.Feed
	// ServiceEndpoints returns every endpoint of the service ref names (a project's, in an owned
	// namespace), false when it has none.
	ServiceEndpoints(ref collector.ServiceRef) (*endpointv1.GetServiceEndpointsResponse, bool)
	// ReportedAt is the stream time of the earliest agent report the service's current state
	// took in (zero: none timed), what a push of it is measured from.
	ReportedAt(ref collector.ServiceRef) time.Time
}

// Authenticator resolves a call's bearer token (pkg/server's, shared with the Connect APIs).
type Authenticator interface {
	Authenticate(ctx context.Context, h http.Header) (context.Context, error)
}

// Authorizer applies pkg/authz's table to a call.
type Authorizer interface {
	Authorize(ctx context.Context, procedure string, msg any) (*authz.Caller, error)
}

// Server is the xDS server.
type Server struct {
	src   Source
	authn Authenticator
	authz Authorizer
	log   *zap.Logger

	eds, cds, lds, rds *cachev3.LinearCache
	xds                serverv3.Server

	// What was last pushed per service, to push only what changed. Touched only by the
	// feeding goroutine.
	served map[collector.ServiceRef]map[string]*servicePort

	ready   chan struct{}
	streams prometheus.Gauge
	nacks   *prometheus.CounterVec
	pushes  prometheus.Counter
	// pushed times an agent report to its push (fleetstream_endpoint_report_pushed_seconds).
	pushed prometheus.Histogram
	// hooks, when set (benchmarks), are called with each batch's assignments: once built, and
	// once in the caches.
	hooks atomic.Pointer[hooks]
}

// New builds a server serving src; Run feeds it and Serve serves it.
func New(src Source, authn Authenticator, az Authorizer, log *zap.Logger) *Server {
	log = log.Named("xds")
	// A version prefix unique to this process: a client reconnecting to another replica, or to
	// this one restarted, never takes a version for one it already has.
	prefix := strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
	cl := cacheLogger{log.Named("cache")}
	mk := func(typ string) *cachev3.LinearCache {
		return cachev3.NewLinearCache(typ, cachev3.WithVersionPrefix(prefix), cachev3.WithLogger(cl))
	}
	s := &Server{src: src, authn: authn, authz: az, log: log,
		eds: mk(resourcev3.EndpointType), cds: mk(resourcev3.ClusterType),
		lds: mk(resourcev3.ListenerType), rds: mk(resourcev3.RouteType),
		served: map[collector.ServiceRef]map[string]*servicePort{},
		ready:  make(chan struct{}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "fleet_xds_streams",
			Help: "Open xDS streams."}),
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleet_xds_nacks_total",
			Help: "xDS responses a client rejected, by resource type."}, []string{"type"}),
		pushes: prometheus.NewCounter(prometheus.CounterOpts{Name: "fleet_xds_resource_updates_total",
			Help: "xDS resources updated or removed in the cache."}),
		pushed: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "fleetstream_endpoint_report_pushed_seconds",
			Help: "Time from an agent's EndpointSlice report (its stream time) until the xDS caches hold the endpoints it changed and have handed them to every open stream subscribed to them, " +
				"one observation per service and batch that changed an assignment; reports replayed at start, and states superseded before the xDS server took them, are not timed.",
			Buckets: collector.ReportBuckets}),
	}
	mux := &cachev3.MuxCache{
		Classify:      func(r *cachev3.Request) string { return r.GetTypeUrl() },
		ClassifyDelta: func(r *cachev3.DeltaRequest) string { return r.GetTypeUrl() },
		Caches: map[string]cachev3.Cache{resourcev3.EndpointType: s.eds, resourcev3.ClusterType: s.cds,
			resourcev3.ListenerType: s.lds, resourcev3.RouteType: s.rds},
	}
	s.xds = serverv3.NewServer(context.Background(), mux, s.callbacks())
	return s
}

// Mount registers the server's metrics and readiness on srv (the HTTP listener of the
// process: /metrics, /readyz).
func (s *Server) Mount(srv *server.Server) {
	for _, m := range []prometheus.Collector{s.streams, s.nacks, s.pushes, s.pushed} {
		_ = srv.Registry().Register(m)
	}
	srv.ReadyWhen("xds", s.ready)
}

// Ready is closed once the caches hold the collector's state.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Run keeps the caches equal to the collector's state until ctx ends: it waits until the
// collector is ready (a proxy must never see a half-loaded fleet), loads everything, then
// applies each batch of changes as the collector's feed reports them.
func (s *Server) Run(ctx context.Context) error {
	select {
	case <-s.src.Ready():
	case <-ctx.Done():
		return nil
	}
	feed := s.src.Feed()
	defer feed.Close()
	s.apply(feed.Take())
	close(s.ready)
	s.log.Info("xDS resources loaded", zap.Int("assignments", s.eds.NumResources()), zap.Int("clusters", s.cds.NumResources()))
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-feed.Changed():
			s.apply(feed.Take())
		}
	}
}

// hooks observe the feeding (benchmarks).
type hooks struct {
	built, pushed func(map[string]types.Resource)
}

// update collects one batch of changes per cache.
type update struct {
	set map[string]types.Resource
	del []string
}

func (u *update) put(name string, r types.Resource) {
	if u.set == nil {
		u.set = map[string]types.Resource{}
	}
	u.set[name] = r
}

func (u *update) apply(c *cachev3.LinearCache) (int, error) {
	if len(u.set) == 0 && len(u.del) == 0 {
		return 0, nil
	}
	return len(u.set) + len(u.del), c.UpdateResources(u.set, u.del)
}

// apply pushes the current state of the services changed into the caches: one update per
// cache, so a client gets one response per batch.
func (s *Server) apply(refs []collector.ServiceRef) {
	var eds, cds, lds, rds update
	// reported are the report times of the services whose assignments this batch changes.
	var reported []time.Time
	for _, ref := range refs {
		var ports map[string]*servicePort
		if resp, ok := s.src.ServiceEndpoints(ref); ok {
			ports = buildAssignments(ref, resp)
		}
		at := s.src.ReportedAt(ref)
		old := s.served[ref]
		for pk, sp := range ports {
			prev := old[pk]
			if prev == nil || !sameResource(prev.cla, sp.cla) {
				eds.put(sp.name, sp.cla)
				if !at.IsZero() {
					reported = append(reported, at)
					at = time.Time{} // once per service
				}
			}
			if prev != nil && prev.tcp == sp.tcp {
				continue
			}
			if sp.tcp {
				l, err := buildListener(ServiceListenerName(ref, pk), sp.name)
				if err != nil {
					s.log.Error("build listener", zap.String("resource", sp.name), zap.Error(err))
					continue
				}
				cds.put(sp.name, buildCluster(sp.name))
				lds.put(l.Name, l)
				rds.put(sp.name, buildRoute(sp.name))
			} else if prev != nil { // the port is no longer TCP: no longer a gRPC one
				s.dropRouting(&cds, &lds, &rds, ref, pk, prev.name)
			}
		}
		for pk, prev := range old {
			if _, ok := ports[pk]; ok {
				continue
			}
			// A port (or service) gone is an empty assignment rather than a deleted one: a
			// state-of-the-world EDS client cannot be told that a resource is gone, only that
			// it has no endpoints left. Its Cluster, Route and Listener are removed.
			eds.put(prev.name, &endpointv3.ClusterLoadAssignment{ClusterName: prev.name})
			if prev.tcp {
				s.dropRouting(&cds, &lds, &rds, ref, pk, prev.name)
			}
		}
		if len(ports) == 0 {
			delete(s.served, ref)
		} else {
			s.served[ref] = ports
		}
	}
	h := s.hooks.Load()
	if h != nil && h.built != nil {
		h.built(eds.set)
	}
	// Endpoints first, routes and listeners last: a client following a new listener finds its
	// route, cluster and endpoints already there.
	n := 0
	for _, step := range []struct {
		u *update
		c *cachev3.LinearCache
	}{{&eds, s.eds}, {&cds, s.cds}, {&rds, s.rds}, {&lds, s.lds}} {
		k, err := step.u.apply(step.c)
		if err != nil {
			s.log.Error("xDS cache update", zap.Error(err))
		}
		n += k
	}
	s.pushes.Add(float64(n))
	// The caches hand an update to every open watch as they take it: the streams send it next.
	now := time.Now().Round(0)
	for _, at := range reported {
		s.pushed.Observe(max(now.Sub(at), 0).Seconds())
	}
	if h != nil && h.pushed != nil {
		h.pushed(eds.set)
	}
}

func (s *Server) dropRouting(cds, lds, rds *update, ref collector.ServiceRef, port, name string) {
	cds.del = append(cds.del, name)
	lds.del = append(lds.del, ServiceListenerName(ref, port))
	rds.del = append(rds.del, name)
}

// callbacks log what a proxy rejects (a NACK: the request names the version it still runs and
// carries the reason) and count streams.
func (s *Server) callbacks() serverv3.Callbacks {
	nack := func(streamID int64, node string, typeURL, version, nonce string, names []string, reason string) {
		s.nacks.WithLabelValues(typeURL).Inc()
		s.log.Warn("xDS client rejected a response (NACK)", zap.Int64("stream", streamID), zap.String("node", node),
			zap.String("type", typeURL), zap.String("keepsVersion", version), zap.String("nonce", nonce),
			zap.Strings("resources", names), zap.String("reason", reason))
	}
	return serverv3.CallbackFuncs{
		StreamOpenFunc:        func(context.Context, int64, string) error { s.streams.Inc(); return nil },
		StreamClosedFunc:      func(int64, *corev3.Node) { s.streams.Dec() },
		DeltaStreamOpenFunc:   func(context.Context, int64, string) error { s.streams.Inc(); return nil },
		DeltaStreamClosedFunc: func(int64, *corev3.Node) { s.streams.Dec() },
		StreamRequestFunc: func(id int64, r *discoverygrpc.DiscoveryRequest) error {
			if d := r.GetErrorDetail(); d != nil {
				nack(id, r.GetNode().GetId(), r.GetTypeUrl(), r.GetVersionInfo(), r.GetResponseNonce(), r.GetResourceNames(), d.GetMessage())
			}
			return nil
		},
		StreamDeltaRequestFunc: func(id int64, r *discoverygrpc.DeltaDiscoveryRequest) error {
			if d := r.GetErrorDetail(); d != nil {
				nack(id, r.GetNode().GetId(), r.GetTypeUrl(), "", r.GetResponseNonce(), r.GetResourceNamesSubscribe(), d.GetMessage())
			}
			return nil
		},
	}
}

// GRPCServer returns a gRPC server carrying ADS and the per-type discovery services (each both
// state of the world and delta), every call authenticated and authorized as the Connect APIs
// are: a bearer token (metadata "authorization") of a platform admin or an xds-reader.
func (s *Server) GRPCServer(opts ...grpc.ServerOption) *grpc.Server {
	opts = append([]grpc.ServerOption{
		grpc.ChainStreamInterceptor(s.streamAuth),
		grpc.ChainUnaryInterceptor(s.unaryAuth),
		// Proxies keep their stream open for good; let their keepalive pings through.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.MaxConcurrentStreams(1 << 16),
	}, opts...)
	g := grpc.NewServer(opts...)
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(g, s.xds)
	endpointservice.RegisterEndpointDiscoveryServiceServer(g, s.xds)
	clusterservice.RegisterClusterDiscoveryServiceServer(g, s.xds)
	listenerservice.RegisterListenerDiscoveryServiceServer(g, s.xds)
	routeservice.RegisterRouteDiscoveryServiceServer(g, s.xds)
	return g
}

// Serve serves xDS on ln until ctx ends. Streams are accepted once the caches are loaded.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	select {
	case <-s.ready:
	case <-ctx.Done():
		_ = ln.Close()
		return nil
	}
	g := s.GRPCServer()
	errc := make(chan error, 1)
	go func() { errc <- g.Serve(ln) }()
	s.log.Info("serving xDS", zap.String("addr", ln.Addr().String()))
	select {
	case err := <-errc:
		return fmt.Errorf("xds serve: %w", err)
	case <-ctx.Done():
		// Proxies hold their streams forever: a graceful stop would wait for them.
		g.Stop()
		return nil
	}
}

func (s *Server) authorize(ctx context.Context, method string) (context.Context, error) {
	h := http.Header{}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		for _, v := range md.Get("authorization") {
			h.Add("Authorization", v)
		}
	}
	ctx, err := s.authn.Authenticate(ctx, h)
	if err != nil {
		return nil, grpcError(err)
	}
	if _, err := s.authz.Authorize(ctx, method, nil); err != nil {
		return nil, grpcError(err)
	}
	return ctx, nil
}

// grpcError carries a Connect error's code, which is gRPC's, into a gRPC status.
func grpcError(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return status.Error(codes.Code(ce.Code()), ce.Message())
	}
	return status.Error(codes.Internal, err.Error())
}

func (s *Server) streamAuth(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, err := s.authorize(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	return handler(srv, &authedStream{ServerStream: ss, ctx: ctx})
}

func (s *Server) unaryAuth(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, err := s.authorize(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

type authedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (a *authedStream) Context() context.Context { return a.ctx }

// cacheLogger sends go-control-plane's cache logs to zap, at debug below warnings (the linear
// cache reports every watch it wakes at info).
type cacheLogger struct{ l *zap.Logger }

func (c cacheLogger) Debugf(f string, a ...any) { c.debug(f, a) }
func (c cacheLogger) Infof(f string, a ...any)  { c.debug(f, a) }

func (c cacheLogger) debug(f string, a []any) {
	if c.l.Core().Enabled(zap.DebugLevel) {
		c.l.Debug(fmt.Sprintf(f, a...))
	}
}
func (c cacheLogger) Warnf(f string, a ...any)  { c.l.Warn(fmt.Sprintf(f, a...)) }
func (c cacheLogger) Errorf(f string, a ...any) { c.l.Error(fmt.Sprintf(f, a...)) }
