// Package audit is Fleetstream's audit trail: an index of every event of the domain streams by
// project, cluster, object and actor (stream FLEET_AUDIT, written by one indexer at a time),
// denied API calls recorded beside them (DenialRecorder, in every process that serves an API),
// and AuditService.ListActivity, which answers from the index. See docs/operations.md, "Audit
// trail", and docs/architecture.md for why it is its own stream.
package audit

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/audit/v1/auditv1connect"
	"github.com/fleetstream/fleetstream/pkg/lease"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/topology"
)

// LeaseName is the indexer's lease: one writer of FLEET_AUDIT's event rows at a time.
const LeaseName = "audit.indexer"

// Config configures the service.
type Config struct {
	Replicas int
	// Retention overrides stream limits (--stream-retention); FLEET_AUDIT's is the trail's.
	Retention topology.Retentions
	// LeaseTTL is the indexer's lease TTL; 0 means lease.DefaultTTL.
	LeaseTTL time.Duration
}

// Topology is what the audit trail needs: FLEET_AUDIT (kept forever unless --stream-retention
// limits it, like the domain streams) and the indexer's checkpoints.
func Topology() topology.Topology {
	sc := topology.EventStream(subjects.AuditStream,
		"The audit trail: one activity record per domain event and per denied API call (pkg/audit).",
		subjects.AuditPrefix+".>")
	// Denied rows carry a TTL (DenialLimits.TTL); event rows none.
	sc.AllowMsgTTL = true
	return topology.Merge(lease.Topology(), topology.Topology{
		Streams: []jetstream.StreamConfig{sc},
		Buckets: []jetstream.KeyValueConfig{{Bucket: subjects.AuditCheckpointsBucket,
			Description: "The audit indexer's checkpoint per domain stream.", History: 1, Storage: jetstream.FileStorage}},
	})
}

// Service serves AuditService and runs the indexer under its lease.
type Service struct {
	// leases reports the indexer's lease (fleetstream_lease_leading).
	leases *lease.Metrics
	auditv1connect.UnimplementedAuditServiceHandler

	cfg    Config
	js     jetstream.JetStream
	log    *zap.Logger
	stream jetstream.Stream
	kv     jetstream.KeyValue
	ready  chan struct{}

	indexed *prometheus.CounterVec
	// maxScan bounds the index rows one call reads (the package's maxScan but in tests).
	maxScan atomic.Uint64
}

// New ensures the topology and returns the service; Run starts the indexer.
func New(ctx context.Context, js jetstream.JetStream, cfg Config, log *zap.Logger) (*Service, error) {
	if err := topology.Ensure(ctx, js, max(cfg.Replicas, 1), cfg.Retention.Apply(Topology())); err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	stream, err := js.Stream(ctx, subjects.AuditStream)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	kv, err := js.KeyValue(ctx, subjects.AuditCheckpointsBucket)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = lease.DefaultTTL
	}
	s := &Service{cfg: cfg, js: js, log: log.Named("audit"), stream: stream, kv: kv, ready: make(chan struct{}), leases: lease.NewMetrics(),
		indexed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetstream_audit_events_indexed_total",
			Help: "Domain events this process's audit indexer recorded as activity, by stream.",
		}, []string{"stream"}),
	}
	s.maxScan.Store(maxScan)
	close(s.ready) // the index is ready to answer from the start; rows appear as it catches up
	return s, nil
}

// Mount serves AuditService on srv and registers the metrics.
func (s *Service) Mount(srv *server.Server) {
	srv.Handle(auditv1connect.NewAuditServiceHandler(s, srv.HandlerOptions()...))
	srv.Registry().MustRegister(s.indexed)
	if err := s.leases.Register(srv.Registry()); err != nil {
		panic(err) // as MustRegister: a programming error, not a condition of the fleet
	}
}

// Ready is closed from the start: ListActivity answers from the index as it is.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// Run indexes the domain streams while this replica holds the lease, until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	ix := &indexer{js: s.js, log: s.log, kv: s.kv, indexed: func(stream string) { s.indexed.WithLabelValues(stream).Inc() }}
	err := lease.Run(ctx, s.js, LeaseName, lease.DefaultHolder(), s.cfg.LeaseTTL, ix.run,
		lease.WithLogger(s.log), lease.WithReplicas(max(s.cfg.Replicas, 1)), lease.WithMetrics(s.leases))
	return server.Stopped(ctx, err)
}
