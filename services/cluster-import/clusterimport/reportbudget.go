package clusterimport

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/consumer"
	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// FLEET_AGENT keeps the latest message of every subject an agent publishes under its prefix,
// and an agent chooses its subjects: a flood of unique ones grew the hub's data directory
// without bound. The stream bounds each message (MaxMsgSize), hence each subject; JetStream
// has no limit per subject prefix, and a stream-wide MaxBytes would let one cluster either
// block every other's reports (DiscardNew) or evict their latest ones (DiscardOld). So
// cluster-import keeps the budget of each cluster itself: it reads the stream's headers (the
// latest message of each subject, then every new one) and counts, per cluster, the report
// subjects and their bytes. A message that takes its cluster past a limit has its subject
// purged at once; the other clusters' subjects are never touched. The heartbeat, the first
// inventory chunk and the relist marker are one subject each and never purged: liveness and
// inventories do not depend on the budget. Deleted subjects (tombstones whose TTL ran out)
// are noticed by asking the stream which of the cluster's subjects it still holds, before a
// purge (at most every resync interval) and while the cluster is over its limits, so a
// cluster never pays for what it no longer has. The purge is counted in
// fleet_cluster_agent_reports_purged_total and shown as the cluster's AgentWithinLimits
// condition until it has kept within its limits for a resync interval.
//
// Purging happens after the message was stored: between the two, readers may have applied it
// (only for a cluster over its limits, whose state beyond them is not served consistently).

// AgentLimits bound what one cluster's agent may keep in FLEET_AGENT.
type AgentLimits struct {
	// MaxReportSubjectsPerCluster is the most report subjects one cluster may hold in
	// FLEET_AGENT (default DefaultMaxReportSubjectsPerCluster).
	MaxReportSubjectsPerCluster int
	// MaxReportBytesPerCluster is the most bytes (payload and subject of each subject's latest
	// message) one cluster may hold in FLEET_AGENT (default DefaultMaxReportBytesPerCluster).
	MaxReportBytesPerCluster int64
}

// The defaults leave room for a cluster at the collector's default limits (25,000
// EndpointSlices, 250,000 endpoints, with the tombstones of an hour of deleted slices), a
// large namespace inventory and import sources of a few thousand objects.
const (
	DefaultMaxReportSubjectsPerCluster = 100_000
	DefaultMaxReportBytesPerCluster    = 256 << 20
)

func (l *AgentLimits) defaults() {
	if l.MaxReportSubjectsPerCluster <= 0 {
		l.MaxReportSubjectsPerCluster = DefaultMaxReportSubjectsPerCluster
	}
	if l.MaxReportBytesPerCluster <= 0 {
		l.MaxReportBytesPerCluster = DefaultMaxReportBytesPerCluster
	}
}

// RegisterFlags adds the limits' flags to fs (cluster-import and fleetd).
func (l *AgentLimits) RegisterFlags(fs *flag.FlagSet) {
	fs.IntVar(&l.MaxReportSubjectsPerCluster, "max-agent-report-subjects-per-cluster", DefaultMaxReportSubjectsPerCluster,
		"most report subjects one cluster's agent may keep in stream FLEET_AGENT; past it new subjects are purged and the cluster shows condition AgentWithinLimits=False")
	fs.Int64Var(&l.MaxReportBytesPerCluster, "max-agent-report-bytes-per-cluster", DefaultMaxReportBytesPerCluster,
		"most bytes one cluster's agent may keep in stream FLEET_AGENT (each subject's latest message); past it, as --max-agent-report-subjects-per-cluster")
}

// The limits a cluster's reports can exceed (the metric's label and the condition's reason).
const (
	limitReportSubjects = "ReportSubjectsPerCluster"
	limitReportBytes    = "ReportBytesPerCluster"
)

func (l *AgentLimits) exceeded(subjects int, bytes int64) string {
	switch {
	case subjects > l.MaxReportSubjectsPerCluster:
		return limitReportSubjects
	case bytes > l.MaxReportBytesPerCluster:
		return limitReportBytes
	}
	return ""
}

// budget is what one cluster keeps in FLEET_AGENT, as far as the budget counts.
type budget struct {
	name     string           // the cluster's
	subjects map[string]int64 // report subject → bytes of its latest message
	bytes    int64
	// over is the limit its last purge was for ("" within its limits).
	over        string
	lastPurge   time.Time
	lastResync  time.Time
	prefixMatch string // subjects.AgentPrefixFor(name) + ".>"
}

type reportBudget struct {
	s      *Registry
	stream jetstream.Stream
	resync time.Duration

	mu      sync.Mutex
	budgets map[string]*budget // by cluster token
}

// unbudgeted are the report kinds of one fixed subject each, never purged.
func unbudgeted(toks []string) bool {
	switch {
	case len(toks) == 4 && (toks[3] == "heartbeat" || toks[3] == "inventory" || toks[3] == "endpointsync"):
		return true
	}
	return false
}

// runReportBudget keeps every cluster within its AgentLimits until ctx is done.
func (s *Registry) runReportBudget(ctx context.Context) error {
	select {
	case <-s.ready:
	case <-ctx.Done():
		return nil
	}
	// Looked up once the registry is ready, under a joining fleet's load: a timed-out request is
	// made again rather than ending the service.
	var stream jetstream.Stream
	err := events.Retry(ctx, s.log, "agent stream lookup", func() (err error) {
		stream, err = s.js.Stream(ctx, subjects.AgentStreamName)
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("agent stream: %w", err)
	}
	rb := &reportBudget{s: s, stream: stream, budgets: map[string]*budget{}, resync: 2 * max(s.cfg.CheckInterval, 500*time.Millisecond)}
	r, err := consumer.NewOrdered(ctx, s.js, subjects.AgentStreamName, []string{subjects.AgentPrefix + ".>"}, 0, 2048, s.log,
		consumer.WithLastPerSubject(), consumer.WithHeadersOnly())
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("agent stream budget reader: %w", err)
	}
	defer r.Stop()
	go rb.runClear(ctx)
	err = r.Each(ctx, func(m jetstream.Msg, _ *jetstream.MsgMetadata) {
		size, err := strconv.ParseInt(m.Headers().Get(nats.MsgSize), 10, 64)
		if err != nil {
			size = int64(len(m.Data()))
		}
		rb.account(ctx, m.Subject(), size+int64(len(m.Subject())))
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("agent stream budget reader: %w", err)
	}
	return nil
}

// account counts the latest message of subject, of size bytes, and purges the subject when
// that takes its cluster past a limit.
func (rb *reportBudget) account(ctx context.Context, subject string, size int64) {
	toks := strings.Split(subject, ".")
	if len(toks) < 4 || unbudgeted(toks) {
		return
	}
	name, err := keys.Decode(toks[2])
	if err != nil {
		return // not an agent's: agents publish under their encoded name only
	}
	rb.mu.Lock()
	defer rb.mu.Unlock()
	b := rb.budgets[toks[2]]
	if b == nil {
		b = &budget{name: name, subjects: map[string]int64{}, prefixMatch: subjects.AgentPrefixFor(name) + ".>"}
		rb.budgets[toks[2]] = b
	}
	limit := rb.over(b, subject, size)
	if limit != "" && rb.s.now().Sub(b.lastResync) >= rb.resync {
		// Maybe some of what the budget counts is gone (expired tombstones): ask first.
		rb.resyncBudget(ctx, b)
		limit = rb.over(b, subject, size)
	}
	if limit == "" {
		b.bytes += size - b.subjects[subject]
		b.subjects[subject] = size
		return
	}
	if err := rb.stream.Purge(ctx, jetstream.WithPurgeSubject(subject)); err != nil {
		rb.s.log.Error("purge agent report subject over its cluster's limits", zap.String("cluster", name), zap.String("subject", subject), zap.Error(err))
	}
	if old, ok := b.subjects[subject]; ok {
		b.bytes -= old
		delete(b.subjects, subject)
	}
	rb.s.metrics.reportsPurged.WithLabelValues(name, limit).Inc()
	b.lastPurge = rb.s.now()
	if b.over != limit {
		b.over = limit
		l := rb.s.cfg.AgentLimits
		msg := fmt.Sprintf("the agent keeps more than %d report subjects or %d bytes in FLEET_AGENT (--max-agent-report-subjects-per-cluster, --max-agent-report-bytes-per-cluster): the subjects past it are purged",
			l.MaxReportSubjectsPerCluster, l.MaxReportBytesPerCluster)
		rb.report(ctx, b, &clusterv1.Condition{Type: subjects.ConditionAgentWithinLimits, Status: clusterv1.ConditionStatus_CONDITION_STATUS_FALSE,
			Reason: limit, Message: msg, LastTransitionTime: timestamppb.New(rb.s.now())})
	}
}

// over returns the limit b would be past with subject's latest message of size bytes, or "".
func (rb *reportBudget) over(b *budget, subject string, size int64) string {
	old, had := b.subjects[subject]
	n := len(b.subjects)
	if !had {
		n++
	}
	return rb.s.cfg.AgentLimits.exceeded(n, b.bytes-old+size)
}

// resyncBudget forgets what b counts that the stream no longer holds.
func (rb *reportBudget) resyncBudget(ctx context.Context, b *budget) {
	b.lastResync = rb.s.now()
	info, err := rb.stream.Info(ctx, jetstream.WithSubjectFilter(b.prefixMatch))
	if err != nil {
		rb.s.log.Warn("agent report budget: list the cluster's subjects", zap.String("cluster", b.name), zap.Error(err))
		return
	}
	for subj, size := range b.subjects {
		if _, ok := info.State.Subjects[subj]; !ok {
			b.bytes -= size
			delete(b.subjects, subj)
		}
	}
}

// runClear clears the condition of each cluster that has kept within its limits for a resync
// interval.
func (rb *reportBudget) runClear(ctx context.Context) {
	t := time.NewTicker(rb.resync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rb.mu.Lock()
		for _, b := range rb.budgets {
			if b.over == "" || rb.s.now().Sub(b.lastPurge) < rb.resync {
				continue
			}
			rb.resyncBudget(ctx, b)
			if rb.s.cfg.AgentLimits.exceeded(len(b.subjects), b.bytes) == "" {
				b.over = ""
				rb.report(ctx, b, nil)
			}
		}
		rb.mu.Unlock()
	}
}

func (rb *reportBudget) report(ctx context.Context, b *budget, cond *clusterv1.Condition) {
	if err := rb.s.setLimitCondition(ctx, b.name, limitsReaderReports, cond); err != nil {
		rb.s.log.Warn("agent report budget", zap.String("cluster", b.name), zap.Error(err))
		if cond != nil {
			b.over = "" // reported again with the next purge
		}
	}
}
