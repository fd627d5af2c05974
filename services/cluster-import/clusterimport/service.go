// Package clusterimport is the cluster registry: the ClusterService API, the cluster view,
// connection credentials and agent tokens, and agent liveness (conditions and the
// fleetstream.io/unreachable taint). Import policies build on it.
package clusterimport

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/fleetstream/fleetstream/pkg/apiwait"
	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	"github.com/fleetstream/fleetstream/pkg/kubecreds"
	"github.com/fleetstream/fleetstream/pkg/liveness"
	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/sealed"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/topology"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// Config tunes the service.
type Config struct {
	// UnreachableAfter is how long without a heartbeat before a cluster is tainted unreachable.
	UnreachableAfter time.Duration
	// CheckInterval is the longest a failed liveness check waits before it is tried again
	// (each cluster is checked when it is due, not on an interval).
	CheckInterval time.Duration
	// Replicas of streams and buckets (1 single node, 3 production).
	Replicas int
	// Retention overrides the limits of the streams the service ensures (default: kept forever).
	Retention topology.Retentions
	// Keyring seals connection credentials at rest (--credentials-key-file). Required unless
	// PlaintextCredentials.
	Keyring *sealed.Keyring
	// PlaintextCredentials stores credentials unsealed when there is no Keyring: --insecure-dev
	// only. Sealed values cannot be read then.
	PlaintextCredentials bool
	// PolicyClaimGrace is how old a claim on an import policy's source must be, its policy
	// never having got its event, before another policy may take the source over (default
	// 2m). It must exceed the 30 s a create has from its claim to its event, and the clock
	// skew between the NATS servers and the replicas.
	PolicyClaimGrace time.Duration
	// Credentials says what a stored kubeconfig may hold beyond inline data
	// (--credentials-allowed-proxies); checked when credentials are written or rendered.
	Credentials kubecreds.Policy
	// AgentLimits bound what one cluster's agent may keep in FLEET_AGENT (reportbudget.go).
	AgentLimits AgentLimits
	// Kicker closes the open NATS connections of an agent or subscriber when it is revoked
	// (revoke.go), on every server: natsauth.ServerKicker for an embedded server,
	// natsauth.SystemKicker for a NATS cluster (--nats-system-user). Nil leaves them open until
	// their authorization expires.
	Kicker natsauth.Kicker
}

func (c *Config) defaults() {
	if c.UnreachableAfter == 0 {
		c.UnreachableAfter = liveness.UnreachableAfter
	}
	if c.CheckInterval == 0 {
		c.CheckInterval = min(c.UnreachableAfter/4, 5*time.Second)
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.PolicyClaimGrace == 0 {
		c.PolicyClaimGrace = 2 * time.Minute
	}
	c.AgentLimits.defaults()
}

const actor = "system:cluster-import"

// Topology is every stream and bucket cluster-import owns.
func Topology() topology.Topology {
	return topology.Merge(topology.DeadLetter(), subscribersTopology(), topology.Topology{
		Streams: []jetstream.StreamConfig{
			topology.EventStream(subjects.ClusterStream, "Cluster registry events.", subjects.ClusterPrefix+".>"),
			subjects.AgentStream(),
		},
		Buckets: []jetstream.KeyValueConfig{
			bucketConfig(subjects.ClusterCredentialsBucket, "Connection credentials and agent token digests, by cluster id."),
			bucketConfig(subjects.AgentTokensBucket, "Agent identity by token digest."),
			bucketConfig(subjects.ClusterStatusBucket, "Latest agent heartbeat per cluster."),
			bucketConfig(subjects.ImportPolicySourcesBucket, "The import policy of each (cluster, group, resource) source."),
			subjects.FeedBucketConfig(subjects.ImportWatchBucket, "What each inventory cluster's agent reports for import policies, by cluster."),
			subjects.AgentLimitsBucketConfig(),
		},
	})
}

func bucketConfig(name, desc string) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: name, Description: desc, History: 1, Storage: jetstream.FileStorage}
}

// Registry is the cluster registry. It serves clusterv1connect.ClusterServiceHandler itself, and
// the subscriber and import-policy APIs through Subscribers and ImportPolicies.
type Registry struct {
	// valid remembers each cluster's last heartbeat fields found valid (liveness.go).
	valid validHeartbeats
	clusterv1connect.UnimplementedClusterServiceHandler

	cfg    Config
	js     jetstream.JetStream
	log    *zap.Logger
	store  *events.Store
	stream jetstream.Stream

	clustersView  *view.Engine
	inventoryView *view.Engine
	// Import policies: their view, its cache, and the claims of their sources.
	importPoliciesView *view.Engine
	importPolicies     *view.Cache[*clusterv1.ImportPolicy]
	policySources      jetstream.KeyValue
	clusters           *view.Cache[*clusterv1.Cluster]
	inventory          *view.Cache[*clusterv1.NamespaceInventory]
	status             *view.Cache[*clusterv1.AgentStatus]
	secrets            jetstream.KeyValue
	tokens             jetstream.KeyValue
	statusKV           jetstream.KeyValue
	// What hub readers refuse of each cluster's agent (agentlimits.go).
	limits   *view.Cache[*clusterv1.Condition]
	limitsKV jetstream.KeyValue
	metrics  limitMetrics
	// inventoryChecks: what the inventory view dropped, per cluster and chunk.
	inventoryChecks *inventoryChecks
	subs            subscriberStore
	// lifecycles imports clusters from the sources agents report.
	lifecycles *lifecycles
	// liveness marks silent clusters lost (liveness.go).
	liveness livenessLoop

	ready chan struct{}
	gate  apiwait.Gate
	now   func() time.Time
}

// New ensures the service's streams and buckets and builds it; Run starts it.
func New(ctx context.Context, js jetstream.JetStream, cfg Config, log *zap.Logger) (*Registry, error) {
	cfg.defaults()
	if cfg.Keyring == nil && !cfg.PlaintextCredentials {
		return nil, errors.New("cluster-import: no key to seal cluster credentials with: give --credentials-key-file (or --insecure-dev to store them unencrypted)")
	}
	if err := topology.Ensure(ctx, js, cfg.Replicas, cfg.Retention.Apply(Topology())); err != nil {
		return nil, err
	}
	s := &Registry{cfg: cfg, js: js, log: log.Named("cluster-import"), store: events.NewStore(js, actor),
		ready: make(chan struct{}), now: time.Now, metrics: newLimitMetrics(), inventoryChecks: newInventoryChecks()}
	s.gate = apiwait.NewGate(s.ready, "cluster registry")
	s.inventoryChecks.metric = func(cluster string, n int) { s.metrics.inventoryEntries.WithLabelValues(cluster).Add(float64(n)) }
	if cfg.Keyring != nil {
		s.log.Info("cluster credentials are sealed", zap.String("active_key_id", cfg.Keyring.ActiveID()), zap.Strings("key_ids", cfg.Keyring.IDs()))
	} else {
		s.log.Warn("cluster credentials are stored UNENCRYPTED (--insecure-dev without --credentials-key-file)")
	}
	var err error
	if s.stream, err = js.Stream(ctx, subjects.ClusterStream); err != nil {
		return nil, fmt.Errorf("cluster stream: %w", err)
	}
	if s.clustersView, err = view.NewEngine(js, clustersProjection(), s.log, view.WithReplicas(cfg.Replicas)); err != nil {
		return nil, err
	}
	if s.importPoliciesView, err = view.NewEngine(js, importPoliciesProjection(), s.log, view.WithReplicas(cfg.Replicas)); err != nil {
		return nil, err
	}
	if s.policySources, err = js.KeyValue(ctx, subjects.ImportPolicySourcesBucket); err != nil {
		return nil, fmt.Errorf("import policy sources bucket: %w", err)
	}
	if s.inventoryView, err = view.NewEngine(js, inventoryProjectionReporting(s.inventoryChecks.record), s.log, view.WithReplicas(cfg.Replicas)); err != nil {
		return nil, err
	}
	for name, dst := range map[string]*jetstream.KeyValue{
		subjects.ClusterCredentialsBucket: &s.secrets, subjects.AgentTokensBucket: &s.tokens, subjects.ClusterStatusBucket: &s.statusKV,
		subjects.AgentLimitsBucket: &s.limitsKV,
	} {
		if *dst, err = js.KeyValue(ctx, name); err != nil {
			return nil, fmt.Errorf("bucket %s: %w", name, err)
		}
	}
	if s.subs, err = openSubscribers(ctx, js); err != nil {
		return nil, err
	}
	s.lifecycles = newLifecycles(s)
	s.status = view.NewCache(s.js, s.statusKV, func() *clusterv1.AgentStatus { return &clusterv1.AgentStatus{} }, s.log)
	s.limits = view.NewCache(s.js, s.limitsKV, func() *clusterv1.Condition { return &clusterv1.Condition{} }, s.log, view.WithIndex(limitsIndex))
	return s, nil
}

// Ready is closed when the views have caught up and the API answers from current state.
func (s *Registry) Ready() <-chan struct{} { return s.ready }

// Mount registers the API and readiness on srv.
func (s *Registry) Mount(srv *server.Server) {
	srv.Handle(clusterv1connect.NewClusterServiceHandler(s, srv.HandlerOptions()...))
	srv.Handle(clusterv1connect.NewSubscriberServiceHandler(s.Subscribers(), srv.HandlerOptions()...))
	srv.Handle(clusterv1connect.NewImportPolicyServiceHandler(s.ImportPolicies(), srv.HandlerOptions()...))
	srv.ReadyWhen("cluster-import", s.ready)
	for _, m := range append(s.metrics.collectors(), s.livenessController().Collectors()...) {
		_ = srv.Registry().Register(m)
	}
}

// Run runs the projections, caches and liveness tracking until ctx is done.
func (s *Registry) Run(ctx context.Context) error { return server.Stopped(ctx, s.run(ctx)) }

func (s *Registry) run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.clustersView.Run(ctx) })
	g.Go(func() error { return s.inventoryView.Run(ctx) })
	g.Go(func() error { return s.importPoliciesView.Run(ctx) })
	// The caches open the view buckets, which the engines create on start.
	select {
	case <-s.clustersView.Ready():
	case <-ctx.Done():
		return g.Wait()
	}
	for _, ch := range []<-chan struct{}{s.inventoryView.Ready(), s.importPoliciesView.Ready()} {
		select {
		case <-ch:
		case <-ctx.Done():
			return g.Wait()
		}
	}
	clustersKV, err := s.js.KeyValue(ctx, subjects.ClustersBucket)
	if err != nil {
		return fmt.Errorf("clusters bucket: %w", err)
	}
	inventoryKV, err := s.js.KeyValue(ctx, subjects.ClusterInventoryBucket)
	if err != nil {
		return fmt.Errorf("inventory bucket: %w", err)
	}
	s.clusters = view.NewCache(s.js, clustersKV, func() *clusterv1.Cluster { return &clusterv1.Cluster{} }, s.log)
	s.inventory = view.NewCache(s.js, inventoryKV, func() *clusterv1.NamespaceInventory { return &clusterv1.NamespaceInventory{} }, s.log,
		view.WithIndex(inventoryIndex))
	policiesKV, err := s.js.KeyValue(ctx, subjects.ImportPoliciesBucket)
	if err != nil {
		return fmt.Errorf("import policies bucket: %w", err)
	}
	s.importPolicies = view.NewCache(s.js, policiesKV, func() *clusterv1.ImportPolicy { return &clusterv1.ImportPolicy{} }, s.log)
	g.Go(func() error { return s.clusters.Run(ctx) })
	g.Go(func() error { return s.inventory.Run(ctx) })
	g.Go(func() error { return s.importPolicies.Run(ctx) })
	g.Go(func() error { return s.status.Run(ctx) })
	g.Go(func() error { return s.limits.Run(ctx) })
	g.Go(func() error {
		for _, ch := range []<-chan struct{}{s.clusters.Ready(), s.inventory.Ready(), s.status.Ready(), s.importPolicies.Ready(), s.limits.Ready()} {
			select {
			case <-ch:
			case <-ctx.Done():
				return nil
			}
		}
		close(s.ready)
		return nil
	})
	g.Go(func() error { return s.runHeartbeats(ctx) })
	g.Go(func() error { return s.runLiveHeartbeats(ctx) })
	g.Go(func() error { return s.runReportBudget(ctx) })
	g.Go(func() error { return s.runInventoryChecks(ctx) })
	g.Go(func() error { return s.runLiveness(ctx) })
	g.Go(func() error { return s.lifecycles.run(ctx) })
	g.Go(func() error { return s.runHostedCredentials(ctx, s.js.Conn()) })
	g.Go(func() error { return s.runRevocation(ctx) })
	return g.Wait()
}

// Projections are the service's views, for tools that check a running fleet's buckets
// against a rebuild from the streams (view.Verify; make chaos).
func Projections() []view.Projection {
	return []view.Projection{clustersProjection(), importPoliciesProjection(), inventoryProjection()}
}
