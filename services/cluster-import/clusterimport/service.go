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

	// views are the registry's own views (declareViews); clusters, inventory and importPolicies
	// are their caches, set once views is ready.
	views          *view.Set
	importPolicies *view.Cache[*clusterv1.ImportPolicy]
	clusters       *view.Cache[*clusterv1.Cluster]
	inventory      *view.Cache[*clusterv1.NamespaceInventory]
	// policySources are the claims of import policies' sources.
	policySources jetstream.KeyValue
	status        *view.Cache[*clusterv1.AgentStatus]
	secrets       jetstream.KeyValue
	tokens        jetstream.KeyValue
	statusKV      jetstream.KeyValue
	// What hub readers refuse of each cluster's agent (agentlimits.go).
	limits   *view.Cache[*clusterv1.Condition]
	limitsKV jetstream.KeyValue
	metrics  limitMetrics
	// deadLetterSources: what fleetstream_dead_letters reports (deadletters.go).
	deadLetterSources deadLetterSources
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
	if s.views = s.declareViews(js, s.log, view.WithReplicas(cfg.Replicas)); s.views.Err() != nil {
		return nil, s.views.Err()
	}
	if s.policySources, err = js.KeyValue(ctx, subjects.ImportPolicySourcesBucket); err != nil {
		return nil, fmt.Errorf("import policy sources bucket: %w", err)
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
	srv.Registry().MustRegister(heartbeatAge{s})
	if err := s.views.Register(srv.Registry()); err != nil {
		panic(err) // as MustRegister: a programming error, not a condition of the fleet
	}
}

// Run runs the projections, caches and liveness tracking until ctx is done.
func (s *Registry) Run(ctx context.Context) error { return server.Stopped(ctx, s.run(ctx)) }

func (s *Registry) run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.views.Run(ctx) })
	g.Go(func() error { return s.status.Run(ctx) })
	g.Go(func() error { return s.limits.Run(ctx) })
	// The loops below read the views' caches, which the set opens once the engines have
	// created their buckets.
	select {
	case <-s.views.Ready():
	case <-ctx.Done():
		return g.Wait()
	}
	g.Go(func() error {
		for _, ch := range []<-chan struct{}{s.status.Ready(), s.limits.Ready()} {
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
	g.Go(func() error { return s.runDeadLetters(ctx) })
	return g.Wait()
}

// Projections are the service's views, for tools that check a running fleet's buckets
// against a rebuild from the streams (view.Verify; make chaos).
func Projections() []view.Projection { return new(Registry).declareViews(nil, nil).Projections() }

// declareViews is the one place the registry's views are declared: each projection with the
// cache it is read through. Projections() lists them in this order (tools index it).
func (s *Registry) declareViews(js jetstream.JetStream, log *zap.Logger, opts ...view.Option) *view.Set {
	// A running registry counts what the inventory view drops (agentlimits.go); the view a
	// tool lists and rebuilds is the same without the count.
	inventory := inventoryProjection()
	if s.inventoryChecks != nil {
		inventory = inventoryProjectionReporting(s.inventoryChecks.record)
	}
	set := view.NewSet(js, log, opts...)
	view.Add(set, clustersProjection(), &s.clusters)
	view.Add(set, importPoliciesProjection(), &s.importPolicies)
	view.Add(set, inventory, &s.inventory, view.WithIndex(inventoryIndex))
	return set
}
