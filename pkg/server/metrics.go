package server

import (
	"context"
	"errors"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
)

// metricsInterceptor counts RPCs by procedure, code and caller kind and times them.
type metricsInterceptor struct {
	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// The caller kinds of the rpc metrics' caller label: never the caller's name, which is user
// input and unbounded. A system: user is one of Fleetstream's own services (the prefix is
// reserved: an identity provider cannot issue it, only the token file can).
const (
	callerUser            = "user"
	callerService         = "service"
	callerAnonymous       = "anonymous"       // --insecure-dev: nobody is authenticated
	callerUnauthenticated = "unauthenticated" // refused before the caller was known
)

// callerKindOf is the caller label of an authenticated user name.
func callerKindOf(user string) string {
	if strings.HasPrefix(user, "system:") {
		return callerService
	}
	return callerUser
}

// callerKey carries, from the metrics interceptor down to authentication, where to record the
// kind of caller authentication found: the metrics interceptor runs first (it times and counts
// refused calls too), so it cannot read the identity from its own context.
type callerKey struct{}

// setCallerKind records kind for the metrics interceptor of the call ctx belongs to, if any.
func setCallerKind(ctx context.Context, kind string) {
	if p, ok := ctx.Value(callerKey{}).(*string); ok {
		*p = kind
	}
}

func withCallerSlot(ctx context.Context) (context.Context, *string) {
	kind := new(string)
	return context.WithValue(ctx, callerKey{}, kind), kind
}

func callerLabel(kind *string) string {
	if *kind == "" {
		return callerUnauthenticated
	}
	return *kind
}

func newMetricsInterceptor(reg prometheus.Registerer) *metricsInterceptor {
	m := &metricsInterceptor{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetstream_rpc_requests_total",
			Help: "RPCs handled, by procedure, Connect code and kind of caller (user, service: a system: identity, anonymous under --insecure-dev, unauthenticated).",
		}, []string{"procedure", "code", "caller"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "fleetstream_rpc_duration_seconds", Help: "RPC handling time, by procedure and kind of caller (as fleetstream_rpc_requests_total).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}, []string{"procedure", "caller"}),
	}
	reg.MustRegister(m.calls, m.duration)
	return m
}

func codeOf(err error) string {
	if err == nil {
		return "ok"
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code().String()
	}
	return connect.CodeUnknown.String()
}

func (m *metricsInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		start := time.Now()
		ctx, kind := withCallerSlot(ctx)
		res, err := next(ctx, req)
		p, caller := req.Spec().Procedure, callerLabel(kind)
		m.calls.WithLabelValues(p, codeOf(err), caller).Inc()
		m.duration.WithLabelValues(p, caller).Observe(time.Since(start).Seconds())
		return res, err
	}
}

func (m *metricsInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (m *metricsInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		ctx, kind := withCallerSlot(ctx)
		err := next(ctx, conn)
		m.calls.WithLabelValues(conn.Spec().Procedure, codeOf(err), callerLabel(kind)).Inc()
		return err
	}
}
