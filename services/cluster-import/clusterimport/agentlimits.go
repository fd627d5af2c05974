package clusterimport

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/util/validation"
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
	heartbeats       *prometheus.CounterVec
	heartbeatFields  *prometheus.CounterVec
	liveDropped      *prometheus.CounterVec
	reportsPurged    *prometheus.CounterVec
	inventoryEntries *prometheus.CounterVec
	deadLetters      *prometheus.GaugeVec
}

func newLimitMetrics() limitMetrics {
	return limitMetrics{
		// An agent heartbeating far more often than the others shows as a rate apart (the hub
		// cannot know each agent's configured interval to call it a violation); what it costs
		// the hub is bounded by the heartbeats it need not write (liveness.go, nothingNew).
		heartbeats: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleet_cluster_agent_heartbeats_total",
			Help: "Agent heartbeats received, by cluster."}, []string{"cluster"}),
		liveDropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleet_cluster_agent_heartbeats_dropped_total",
			Help: "Heartbeats from core NATS not recorded, by reason: malformed, or failed (the agent's next one is)."}, []string{"reason"}),
		heartbeatFields: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleet_cluster_agent_heartbeat_fields_refused_total",
			Help: "Heartbeat fields dropped for being out of bounds or malformed, by cluster and field."}, []string{"cluster", "field"}),
		reportsPurged: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleet_cluster_agent_reports_purged_total",
			Help: "Agent report subjects purged from FLEET_AGENT for being over their cluster's limits, by cluster and limit."}, []string{"cluster", "limit"}),
		inventoryEntries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleet_cluster_agent_inventory_entries_refused_total",
			Help: "Namespace inventory entries (namespaces, labels, phases) dropped for being invalid, by cluster."}, []string{"cluster"}),
		deadLetters: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fleetstream_dead_letters",
			Help: "Messages FLEET_DLQ holds, by source: the stream and consumer (or view-<view>) they were parked from, as <stream>.<consumer>."}, []string{"source"}),
	}
}

func (m limitMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.heartbeats, m.heartbeatFields, m.liveDropped, m.reportsPurged, m.inventoryEntries, m.deadLetters}
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

// checkNamespaces returns an inventory's namespaces as the view keeps them, without what
// Kubernetes could not have reported: a namespace whose name is not a DNS label (it is
// dropped), a label that is not a valid label (the label is dropped), a phase other than Active
// and Terminating (left empty). Namespace names from inventories go into namespace claims and
// events; an agent's word is not enough for them. problems name the dropped fields by path.
func checkNamespaces(in []*agentv1.Namespace) ([]*clusterv1.InventoryNamespace, []string) {
	out := make([]*clusterv1.InventoryNamespace, 0, len(in))
	var problems []string
	for i, ns := range in {
		if len(validation.IsDNS1123Label(ns.Name)) > 0 {
			problems = append(problems, fmt.Sprintf("namespaces[%d].name: not a DNS label (%d bytes)", i, len(ns.Name)))
			continue
		}
		n := &clusterv1.InventoryNamespace{Name: ns.Name, Labels: ns.Labels, Phase: ns.Phase}
		cloned := false
		for k, v := range ns.Labels {
			if len(validation.IsQualifiedName(k)) > 0 || len(validation.IsValidLabelValue(v)) > 0 {
				if !cloned { // the agent's map is the decoded event's: never changed in place
					n.Labels, cloned = maps.Clone(ns.Labels), true
				}
				delete(n.Labels, k)
				problems = append(problems, fmt.Sprintf("namespaces[%d].labels: not a label (key %d bytes, value %d bytes)", i, len(k), len(v)))
			}
		}
		if n.Phase != "" && n.Phase != "Active" && n.Phase != "Terminating" {
			n.Phase = ""
			problems = append(problems, fmt.Sprintf("namespaces[%d].phase: not Active or Terminating", i))
		}
		out = append(out, n)
	}
	return out, problems
}

// reasonInvalidInventory is the reason of the condition of a cluster whose inventory had
// entries dropped.
const (
	reasonInvalidInventory = "InvalidInventory"
	limitsReaderInventory  = "cluster-import-inventory"
)

// inventoryChecks keeps what the inventory view dropped from each cluster's chunks, and
// reports it behind the view (the projection never waits for a bucket).
type inventoryChecks struct {
	mu      sync.Mutex
	bad     map[string]map[uint32][]string // cluster → chunk → problems
	dirty   map[string]struct{}
	changed chan struct{}
	metric  func(cluster string, n int)
}

func newInventoryChecks() *inventoryChecks {
	return &inventoryChecks{bad: map[string]map[uint32][]string{}, dirty: map[string]struct{}{}, changed: make(chan struct{}, 1)}
}

// record is the inventory projection's report of one chunk it applied.
func (c *inventoryChecks) record(cluster string, chunk uint32, problems []string) {
	c.mu.Lock()
	chunks := c.bad[cluster]
	switch {
	case len(problems) > 0:
		if chunks == nil {
			chunks = map[uint32][]string{}
			c.bad[cluster] = chunks
		}
		chunks[chunk] = problems
	case chunks != nil && chunks[chunk] != nil:
		delete(chunks, chunk)
		if len(chunks) == 0 {
			delete(c.bad, cluster)
		}
	default:
		c.mu.Unlock()
		return
	}
	c.dirty[cluster] = struct{}{}
	metric := c.metric
	c.mu.Unlock()
	if metric != nil && len(problems) > 0 {
		metric(cluster, len(problems))
	}
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// runInventoryChecks reports each cluster's dropped inventory entries as its AgentWithinLimits
// condition, and clears it once every chunk is clean.
func (s *Registry) runInventoryChecks(ctx context.Context) error {
	c := s.inventoryChecks
	select {
	case <-s.ready:
	case <-ctx.Done():
		return nil
	}
	for {
		c.mu.Lock()
		type item struct {
			cluster  string
			problems []string
		}
		var todo []item
		for cluster := range c.dirty {
			var problems []string
			for _, chunk := range slices.Sorted(maps.Keys(c.bad[cluster])) {
				problems = append(problems, c.bad[cluster][chunk]...)
			}
			todo = append(todo, item{cluster, problems})
		}
		clear(c.dirty)
		c.mu.Unlock()
		for _, it := range todo {
			var cond *clusterv1.Condition
			if len(it.problems) > 0 {
				msg := "inventory entries dropped: " + strings.Join(it.problems[:min(len(it.problems), 5)], "; ")
				if len(it.problems) > 5 {
					msg += fmt.Sprintf("; and %d more", len(it.problems)-5)
				}
				cond = &clusterv1.Condition{Type: subjects.ConditionAgentWithinLimits, Status: clusterv1.ConditionStatus_CONDITION_STATUS_FALSE,
					Reason: reasonInvalidInventory, Message: msg, LastTransitionTime: timestamppb.New(s.now())}
			}
			if err := s.setLimitCondition(ctx, it.cluster, limitsReaderInventory, cond); err != nil {
				s.log.Warn("report dropped inventory entries", zap.String("cluster", it.cluster), zap.Error(err))
				c.mu.Lock()
				c.dirty[it.cluster] = struct{}{} // again on the next change or tick
				c.mu.Unlock()
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-c.changed:
		case <-time.After(5 * time.Second):
		}
	}
}
