package clusterimport

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/util/version"

	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// An agent is trusted with its own cluster's facts, within bounds: every string of a heartbeat
// has a length and a form, since what a heartbeat says ends up in the cluster-status bucket and,
// when the cluster's connection or resources change, in permanent events. A field that is out
// of bounds is dropped, never stored; the heartbeat still counts for liveness (refusing it
// would let a bad field make a healthy cluster look lost), and the drop is reported: metric
// fleet_cluster_agent_heartbeat_fields_refused_total and the cluster's AgentWithinLimits
// condition, until a heartbeat arrives with every field valid.

// Bounds of heartbeat fields. Kubernetes versions ("v1.34.4", "v1.30.2+k3s1",
// "v1.29.1-eks-5e0fdde") and agent versions (git describe) are far shorter.
const (
	maxKubernetesVersionLen = 64
	maxAgentVersionLen      = 128
	maxSessionIDLen         = 128
	maxQuantityLen          = 64
)

// agentVersionRE is what `git describe --always --dirty` and release tags print.
var agentVersionRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]*$`)

// checkHeartbeat returns hb without its invalid fields (hb itself when every field is valid),
// and what is wrong with each dropped one, by its JSON field path. It says how long a bad value
// was, never what it was: the problems are shown to every reader of the cluster.
func checkHeartbeat(hb *agentv1.Heartbeat) (*agentv1.Heartbeat, []string) {
	var problems []string
	out := hb
	drop := func(field, problem string, clear func(*agentv1.Heartbeat)) {
		if out == hb {
			out = proto.CloneOf(hb)
		}
		clear(out)
		problems = append(problems, field+": "+problem)
	}
	if v := hb.KubernetesVersion; v != "" {
		if p := kubernetesVersionProblem(v); p != "" {
			drop("kubernetesVersion", p, func(h *agentv1.Heartbeat) { h.KubernetesVersion = "" })
		}
	}
	if v := hb.AgentVersion; v != "" {
		switch {
		case len(v) > maxAgentVersionLen:
			drop("agentVersion", fmt.Sprintf("%d bytes, more than %d", len(v), maxAgentVersionLen), func(h *agentv1.Heartbeat) { h.AgentVersion = "" })
		case !agentVersionRE.MatchString(v):
			drop("agentVersion", "not a version (letters, digits and . _ + - only)", func(h *agentv1.Heartbeat) { h.AgentVersion = "" })
		}
	}
	if v := hb.SessionId; v != "" {
		switch {
		case len(v) > maxSessionIDLen:
			drop("sessionId", fmt.Sprintf("%d bytes, more than %d", len(v), maxSessionIDLen), func(h *agentv1.Heartbeat) { h.SessionId = "" })
		case !agentVersionRE.MatchString(v):
			drop("sessionId", "letters, digits and . _ + - only", func(h *agentv1.Heartbeat) { h.SessionId = "" })
		}
	}
	if hb.Resources != nil {
		if _, err := normalizeResources(hb.Resources); err != nil {
			drop("resources", "not cpu and memory as Kubernetes quantities of at most 64 bytes", func(h *agentv1.Heartbeat) { h.Resources = nil })
		}
	}
	return out, problems
}

// kubernetesVersionProblem says what is wrong with v as a Kubernetes version, "" if nothing.
func kubernetesVersionProblem(v string) string {
	if len(v) > maxKubernetesVersionLen {
		return fmt.Sprintf("%d bytes, more than %d", len(v), maxKubernetesVersionLen)
	}
	// ParseSemantic allows what a server's gitVersion holds (pre-release and build metadata
	// in [0-9A-Za-z-.]) and, around it, white space, which no server reports.
	if _, err := version.ParseSemantic(v); err != nil || strings.TrimSpace(v) != v {
		return "not a Kubernetes version (like v1.34.4)"
	}
	return ""
}

// The readers of cluster-import in bucket agent-limits' keys.
const (
	limitsReaderHeartbeat = "cluster-import-heartbeat"
	limitsReaderReports   = "cluster-import-reports"
)

// Reasons of the AgentWithinLimits conditions cluster-import reports.
const reasonInvalidHeartbeat = "InvalidHeartbeat"

type limitMetrics struct {
	heartbeatFields *prometheus.CounterVec
	reportsPurged   *prometheus.CounterVec
}

func newLimitMetrics() limitMetrics {
	return limitMetrics{
		heartbeatFields: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleet_cluster_agent_heartbeat_fields_refused_total",
			Help: "Heartbeat fields dropped for being out of bounds or malformed, by cluster and field."}, []string{"cluster", "field"}),
		reportsPurged: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleet_cluster_agent_reports_purged_total",
			Help: "Agent report subjects purged from FLEET_AGENT for being over their cluster's limits, by cluster and limit."}, []string{"cluster", "limit"}),
	}
}

func (m limitMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.heartbeatFields, m.reportsPurged}
}

// reportHeartbeat records what checkHeartbeat found in the newest heartbeat of cluster name.
func (s *Registry) reportHeartbeat(ctx context.Context, name string, problems []string) error {
	for _, p := range problems {
		field, _, _ := strings.Cut(p, ":")
		s.metrics.heartbeatFields.WithLabelValues(name, field).Inc()
	}
	var cond *clusterv1.Condition
	if len(problems) > 0 {
		cond = &clusterv1.Condition{Type: subjects.ConditionAgentWithinLimits, Status: clusterv1.ConditionStatus_CONDITION_STATUS_FALSE,
			Reason: reasonInvalidHeartbeat, Message: "heartbeat fields dropped: " + strings.Join(problems, "; "), LastTransitionTime: timestamppb.New(s.now())}
	}
	return s.setLimitCondition(ctx, name, limitsReaderHeartbeat, cond)
}

// setLimitCondition records cond (nil: within limits) as reader's judgement of cluster name,
// unless bucket agent-limits says the same already.
func (s *Registry) setLimitCondition(ctx context.Context, name, reader string, cond *clusterv1.Condition) error {
	key := subjects.AgentLimitsKey(name, reader)
	cur, ok := s.limits.Get(key)
	switch {
	case cond == nil && !ok:
		return nil
	case cond == nil:
		if err := s.limitsKV.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("clear agent limits of %s: %w", name, err)
		}
		s.log.Info("cluster agent back within its limits", zap.String("cluster", name), zap.String("reader", reader))
		return nil
	case ok && cur.Reason == cond.Reason && cur.Message == cond.Message:
		return nil
	}
	if ok {
		cond.LastTransitionTime = cur.LastTransitionTime
	}
	data, err := proto.Marshal(cond)
	if err != nil {
		return err
	}
	if _, err := s.limitsKV.Put(ctx, key, data); err != nil {
		return fmt.Errorf("record agent limits of %s: %w", name, err)
	}
	s.log.Warn("cluster agent over its limits", zap.String("cluster", name), zap.String("reason", cond.Reason), zap.String("message", cond.Message))
	return nil
}

// limitsIndex lists an agent-limits entry under its cluster's token.
func limitsIndex(key string, _ *clusterv1.Condition) []string {
	return []string{subjects.AgentLimitsKeyCluster(key)}
}

// limitCondition merges what every hub reader reports of cluster name's agent into one
// condition, nil when none refuses anything.
func (s *Registry) limitCondition(name string) *clusterv1.Condition {
	if s.limits == nil {
		return nil
	}
	conds := s.limits.Lookup(keys.Encode(name))
	if len(conds) == 0 {
		return nil
	}
	out := &clusterv1.Condition{Type: subjects.ConditionAgentWithinLimits, Status: clusterv1.ConditionStatus_CONDITION_STATUS_FALSE}
	var reasons, msgs []string
	for _, c := range conds {
		if !slices.Contains(reasons, c.Reason) {
			reasons = append(reasons, c.Reason)
		}
		msgs = append(msgs, c.Message)
		if out.LastTransitionTime == nil || c.GetLastTransitionTime().AsTime().Before(out.LastTransitionTime.AsTime()) {
			out.LastTransitionTime = c.LastTransitionTime
		}
	}
	out.Reason, out.Message = strings.Join(reasons, ","), strings.Join(msgs, "; ")
	return out
}
