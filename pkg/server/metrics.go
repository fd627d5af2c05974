package server

import (
	"context"
	"errors"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
)

// metricsInterceptor counts RPCs by procedure and code and times them.
type metricsInterceptor struct {
	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newMetricsInterceptor(reg prometheus.Registerer) *metricsInterceptor {
	m := &metricsInterceptor{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetstream_rpc_requests_total", Help: "RPCs handled, by procedure and Connect code.",
		}, []string{"procedure", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "fleetstream_rpc_duration_seconds", Help: "RPC handling time.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}, []string{"procedure"}),
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
		res, err := next(ctx, req)
		p := req.Spec().Procedure
		m.calls.WithLabelValues(p, codeOf(err)).Inc()
		m.duration.WithLabelValues(p).Observe(time.Since(start).Seconds())
		return res, err
	}
}

func (m *metricsInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (m *metricsInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		err := next(ctx, conn)
		m.calls.WithLabelValues(conn.Spec().Procedure, codeOf(err)).Inc()
		return err
	}
}
