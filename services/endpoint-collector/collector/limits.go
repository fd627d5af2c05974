package collector

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// An agent is trusted with its own cluster's endpoints, not with the hub's memory: what one
// cluster's reports may make the collector hold is bounded, so that a compromised agent costs
// the hub at most its limits and the other clusters nothing. A report past a limit is not
// applied (a slice it would replace is dropped: its last accepted state is no longer the
// agent's), counted in fleet_endpoint_agent_reports_refused_total and shown as the cluster's
// AgentWithinLimits condition (bucket agent-limits) until a relist of the agent completes
// within the limits.

// Limits bound what one cluster's agent may make the collector hold.
type Limits struct {
	// MaxEndpointSlicesPerCluster is the most EndpointSlices held per cluster (default
	// DefaultMaxEndpointSlicesPerCluster).
	MaxEndpointSlicesPerCluster int
	// MaxEndpointsPerCluster is the most endpoints held per cluster, over all its slices
	// (default DefaultMaxEndpointsPerCluster).
	MaxEndpointsPerCluster int
}

// The defaults fit a cluster at Kubernetes' own scalability thresholds (10,000 Services, each
// with one slice per address family; 150,000 pods, some in several Services) with room to
// spare, and a fleet of 1,000,000 endpoints (docs/benchmarks.md) spread over any number of
// clusters. A fleet of small clusters should lower them: the collector's memory is bounded by
// clusters × MaxEndpointsPerCluster (about 250 bytes an endpoint).
const (
	DefaultMaxEndpointSlicesPerCluster = 25_000
	DefaultMaxEndpointsPerCluster      = 250_000
)

func (l *Limits) defaults() {
	if l.MaxEndpointSlicesPerCluster <= 0 {
		l.MaxEndpointSlicesPerCluster = DefaultMaxEndpointSlicesPerCluster
	}
	if l.MaxEndpointsPerCluster <= 0 {
		l.MaxEndpointsPerCluster = DefaultMaxEndpointsPerCluster
	}
}

// RegisterFlags adds the limits' flags to fs (endpoint-collector and fleetd).
func (l *Limits) RegisterFlags(fs *flag.FlagSet) {
	fs.IntVar(&l.MaxEndpointSlicesPerCluster, "max-endpoint-slices-per-cluster", DefaultMaxEndpointSlicesPerCluster,
		"most EndpointSlices held per cluster; an agent reporting more is refused the excess and its cluster shows condition AgentWithinLimits=False")
	fs.IntVar(&l.MaxEndpointsPerCluster, "max-endpoints-per-cluster", DefaultMaxEndpointsPerCluster,
		"most endpoints held per cluster, over all its EndpointSlices; past it, as --max-endpoint-slices-per-cluster")
}

// The limits a report can exceed (the metric's label and the condition's reason).
const (
	limitSlices    = "EndpointSlicesPerCluster"
	limitEndpoints = "EndpointsPerCluster"
)

// limitsReader is the collector's name in bucket agent-limits' keys.
const limitsReader = "endpoint-collector"

// exceeded returns the limit that a cluster holding slices slices with endpoints endpoints in
// all would be over, or "".
func (l *Limits) exceeded(slices, endpoints int) string {
	switch {
	case slices > l.MaxEndpointSlicesPerCluster:
		return limitSlices
	case endpoints > l.MaxEndpointsPerCluster:
		return limitEndpoints
	}
	return ""
}

func newRefusedMetric() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleet_endpoint_agent_reports_refused_total",
		Help: "EndpointSlice reports not applied because their cluster was over a limit, by cluster and limit."}, []string{"cluster", "limit"})
}

// refuse records that a report of ci was not applied for being over limit (ingest goroutine, under
// in.mu). ci stays over its limits until a relist completes without a refusal.
func (in *ingester) refuse(ci *clusterIngest, limit string) {
	in.c.refused.WithLabelValues(ci.info.name, limit).Inc()
	ci.refusedIn = ci.cur
	if ci.overLimit == limit {
		return
	}
	ci.overLimit = limit
	l := &in.c.cfg.Limits
	msg := fmt.Sprintf("the agent reported more than %d EndpointSlices or %d endpoints (--max-endpoint-slices-per-cluster, --max-endpoints-per-cluster): what is past the limit is not served",
		l.MaxEndpointSlicesPerCluster, l.MaxEndpointsPerCluster)
	in.c.log.Warn("cluster agent over its endpoint limits: refusing its excess reports", zap.String("cluster", ci.info.name),
		zap.String("limit", limit), zap.Int("slices", ci.n), zap.Int("endpoints", ci.endpoints))
	in.c.limitStatus.Set(ci.info.name, &clusterv1.Condition{Type: subjects.ConditionAgentWithinLimits,
		Status: clusterv1.ConditionStatus_CONDITION_STATUS_FALSE, Reason: limit, Message: msg, LastTransitionTime: timestamppb.New(in.c.now())})
}

// withinLimits clears ci's refusal once a relist (session, gen) completed without one.
func (in *ingester) withinLimits(ci *clusterIngest, session string, gen uint64) {
	if ci.overLimit == "" || (ci.refusedIn != nil && ci.refusedIn.is(session, gen)) {
		return
	}
	in.c.log.Info("cluster agent back within its endpoint limits", zap.String("cluster", ci.info.name))
	ci.overLimit, ci.refusedIn = "", nil
	in.c.limitStatus.Set(ci.info.name, nil)
}

// runLimitStatus keeps bucket agent-limits' entries of this reader as the ingester judged them,
// from when the replay is applied (so a cluster that was over its limits before a restart and no
// longer is gets its entry removed).
func (c *Collector) runLimitStatus(ctx context.Context) error {
	select {
	case <-c.caughtUp:
	case <-ctx.Done():
		return nil
	}
	return c.limitStatus.Run(ctx, c.js, max(c.cfg.ViewFlushInterval, time.Second), c.log)
}
