// Package rbacsync is rbac-sync: role templates and project role bindings (the RBACService API
// and their views), and the fan-out that turns them, with the namespace bindings of
// namespace-binding and the cluster registry, into the ClusterRoles and RoleBindings every member
// cluster should have (bucket desired-rbac), which the clusters' agents apply.
package rbacsync

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/fleetstream/fleetstream/pkg/apiwait"
	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1/rbacv1connect"
	"github.com/fleetstream/fleetstream/pkg/lease"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/topology"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// Defaults of the inputs rbac-sync reads (owned by other services).
const (
	// DefaultNamespaceBindingsBucket is namespace-binding's view of bindings.
	DefaultNamespaceBindingsBucket = subjects.NamespaceBindingsBucket
	// DefaultNamespaceStream is namespace-binding's event stream, replayed by AccessAt.
	DefaultNamespaceStream = subjects.NamespaceStream
)

// Config tunes the service.
type Config struct {
	// Replicas of streams and buckets (1 single node, 3 production).
	Replicas int
	// Retention overrides the limits of the streams the service ensures (default: kept forever).
	Retention topology.Retentions
	// NamespaceBindingsBucket and NamespaceStream name namespace-binding's view and stream.
	NamespaceBindingsBucket string
	NamespaceStream         string
	// Snapshots tunes AccessAt's snapshots (snapshots.go).
	Snapshots SnapshotConfig
	// CollectInterval is how often confirmed tombstones are deleted from desired-rbac
	// (default DefaultCollectInterval).
	CollectInterval time.Duration
	// MarkerPurgeAfter is the age at which the delete markers of collected tombstones are
	// purged from desired-rbac (default DefaultMarkerPurgeAfter).
	MarkerPurgeAfter time.Duration
}

func (c *Config) defaults() {
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.NamespaceBindingsBucket == "" {
		c.NamespaceBindingsBucket = DefaultNamespaceBindingsBucket
	}
	if c.NamespaceStream == "" {
		c.NamespaceStream = DefaultNamespaceStream
	}
	c.Snapshots.defaults()
	if c.CollectInterval <= 0 {
		c.CollectInterval = DefaultCollectInterval
	}
	if c.MarkerPurgeAfter <= 0 {
		c.MarkerPurgeAfter = DefaultMarkerPurgeAfter
	}
}

const actor = "system:rbac-sync"

// Topology is every stream and bucket rbac-sync owns, and the lease bucket its single writers
// (view engines, fan-out) share. The views' buckets are created by their engines.
func Topology() topology.Topology {
	return topology.Merge(topology.DeadLetter(), lease.Topology(), topology.Topology{
		Streams: []jetstream.StreamConfig{eventStream()},
		Buckets: []jetstream.KeyValueConfig{desiredBucketConfig(), snapshotsBucketConfig()},
	})
}

func desiredBucketConfig() jetstream.KeyValueConfig {
	return subjects.FeedBucketConfig(subjects.DesiredRBACBucket, "Desired ClusterRoles and RoleBindings of member clusters, keys <cluster>.<kind>.<namespace>.<name>.")
}

// Service implements rbacv1connect.RBACServiceHandler and runs the fan-out.
type Service struct {
	// leases reports the fan-out's and the snapshots' leases (fleetstream_lease_leading).
	leases *lease.Metrics
	rbacv1connect.UnimplementedRBACServiceHandler

	cfg    Config
	js     jetstream.JetStream
	log    *zap.Logger
	store  *events.Store
	stream jetstream.Stream

	// views are rbac-sync's own views (declareViews); templates and bindings are their caches,
	// set once the views are ready.
	views     *view.Set
	templates *view.Cache[*rbacv1.RoleTemplate]
	bindings  *view.Cache[*rbacv1.ProjectRoleBinding]
	// status mirrors what agents reported about rbac-sync's desired keys: the part of bucket
	// `applied` under `desired-rbac.` (see appliedPrefix).
	status *view.Cache[*desiredv1.AppliedStatus]
	fan    *fanout

	ready chan struct{}
	gate  apiwait.Gate
	now   func() time.Time
}

// New ensures the service's streams and buckets and builds it; Run starts it.
func New(ctx context.Context, js jetstream.JetStream, cfg Config, log *zap.Logger) (*Service, error) {
	cfg.defaults()
	if err := topology.Ensure(ctx, js, cfg.Replicas, cfg.Retention.Apply(Topology())); err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, js: js, log: log.Named("rbac-sync"), store: events.NewStore(js, actor), ready: make(chan struct{}), now: time.Now}
	s.gate = apiwait.NewGate(s.ready, "rbac-sync")
	var err error
	if s.stream, err = js.Stream(ctx, Stream); err != nil {
		return nil, fmt.Errorf("rbac stream: %w", err)
	}
	if s.views = s.declareViews(js, s.log, view.WithReplicas(cfg.Replicas)); s.views.Err() != nil {
		return nil, s.views.Err()
	}
	s.leases = lease.NewMetrics()
	s.fan = newFanout(js, s.log)
	s.fan.leases = s.leases
	s.fan.replicas = cfg.Replicas
	if s.fan.kv, err = js.KeyValue(ctx, subjects.DesiredRBACBucket); err != nil {
		return nil, fmt.Errorf("desired bucket: %w", err)
	}
	// Agents write the applied bucket; its readers ensure it with one shared configuration.
	applied, err := js.CreateOrUpdateKeyValue(ctx, subjects.AppliedBucketConfig(cfg.Replicas))
	if err != nil {
		return nil, fmt.Errorf("applied bucket: %w", err)
	}
	s.status = view.NewCache(s.js, applied, func() *desiredv1.AppliedStatus { return &desiredv1.AppliedStatus{} }, s.log,
		view.WithFilter(appliedPrefix+">"))
	s.fan.status, s.fan.collectEvery, s.fan.markerAge = s.status.Get, cfg.CollectInterval, cfg.MarkerPurgeAfter
	return s, nil
}

// Ready is closed when the views have caught up and the desired state has been reconciled once.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// SyncFanout blocks until the fan-out has taken every change its inputs (templates, project
// role bindings, clusters, namespace bindings) held in their buckets when it was called and, in
// the replica that writes desired-rbac, written what they imply. A key missing from desired-rbac
// afterwards is one rbac-sync does not want, not one it has yet to write: tests use it before
// asserting absence. Call it once the service is ready.
func (s *Service) SyncFanout(ctx context.Context) error { return s.fan.Sync(ctx) }

// Mount registers the API, readiness and metrics on srv.
func (s *Service) Mount(srv *server.Server) {
	srv.Handle(rbacv1connect.NewRBACServiceHandler(s, srv.HandlerOptions()...))
	srv.ReadyWhen("rbac-sync", s.ready)
	for _, c := range s.fan.collectors() {
		srv.Registry().MustRegister(c)
	}
	if err := s.fan.prop.Register(srv.Registry()); err != nil {
		panic(err) // as MustRegister: a programming error, not a condition of the fleet
	}
	if err := s.views.Register(srv.Registry()); err != nil {
		panic(err)
	}
	if err := s.leases.Register(srv.Registry()); err != nil {
		panic(err)
	}
}

// Run runs the projections, the caches of every input and the fan-out until ctx is done.
func (s *Service) Run(ctx context.Context) error { return server.Stopped(ctx, s.run(ctx)) }

func (s *Service) run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.views.Run(ctx) })
	g.Go(func() error { return s.status.Run(ctx) })
	g.Go(func() error { s.followApplied(ctx); return nil })
	if !s.cfg.Snapshots.Disabled {
		g.Go(func() error { return s.runSnapshots(ctx) })
	}
	g.Go(func() error {
		if err := s.start(ctx, g); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		return nil
	})
	return g.Wait()
}

// followApplied hands each applied status agents report on rbac-sync's desired keys to the
// propagation measure; a subscription cut off for falling behind is made again (a status it
// missed leaves its key pending, bounded, until the key is written again).
func (s *Service) followApplied(ctx context.Context) {
	for ctx.Err() == nil {
		for u := range s.status.Updates(ctx, subscriptionBuffer) {
			if u.Op == view.Put {
				s.fan.prop.Reported(strings.TrimPrefix(u.Key, appliedPrefix), u.Value)
			}
		}
	}
}

// start opens the caches once their buckets exist and starts the fan-out.
func (s *Service) start(ctx context.Context, g *errgroup.Group) error {
	select {
	case <-s.views.Ready():
	case <-ctx.Done():
		return ctx.Err()
	}
	// Other services own these and create them when they start; wait for them.
	clustersKV, err := view.WaitBucket(ctx, s.js, subjects.ClustersBucket, s.log)
	if err != nil {
		return err
	}
	clusters := view.NewCache(s.js, clustersKV, func() *clusterv1.Cluster { return &clusterv1.Cluster{} }, s.log)
	nsBindings := newBindingSource(s.js, s.cfg.NamespaceBindingsBucket, s.log)
	s.fan.templates, s.fan.bindings, s.fan.clusters, s.fan.namespaces = s.templates, s.bindings, clusters, nsBindings
	g.Go(func() error { return clusters.Run(ctx) })
	g.Go(func() error { return nsBindings.Run(ctx) })
	g.Go(func() error { return s.fan.Run(ctx) })
	for _, ch := range []<-chan struct{}{s.fan.Ready(), s.status.Ready()} {
		select {
		case <-ch:
		case <-ctx.Done():
			return nil
		}
	}
	if err := s.ensureBuiltins(ctx); err != nil {
		return err
	}
	close(s.ready)
	s.log.Info("rbac-sync ready")
	return nil
}

// Projections are the service's views, for tools that check a running fleet's buckets
// against a rebuild from the streams (view.Verify; make chaos).
func Projections() []view.Projection { return new(Service).declareViews(nil, nil).Projections() }

// declareViews is the one place rbac-sync's views are declared: each projection with the cache
// it is read through. Projections() lists them in this order (tools index it).
func (s *Service) declareViews(js jetstream.JetStream, log *zap.Logger, opts ...view.Option) *view.Set {
	set := view.NewSet(js, log, opts...)
	view.Add(set, templatesProjection(), &s.templates)
	view.Add(set, bindingsProjection(), &s.bindings)
	return set
}
