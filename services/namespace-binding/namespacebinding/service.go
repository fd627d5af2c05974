// Package namespacebinding is the project service: projects, the namespaces they own on member
// clusters (bindings, claimed atomically per (cluster, namespace)), their quotas, and the
// desired Namespace and ResourceQuota objects the clusters' agents apply. It also wires
// placement (package placement: cluster sets, placements, their decisions and scheduler), whose
// decisions its follower turns into bindings for the namespaces that follow a placement.
//
// See docs/namespaces.md for the design: events, views, the claim protocol and its repair, and
// how binding phases and project sums are derived from what agents report.
package namespacebinding

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/fleetstream/fleetstream/pkg/apiwait"
	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	"github.com/fleetstream/fleetstream/pkg/lease"
	"github.com/fleetstream/fleetstream/pkg/protectedns"
	"github.com/fleetstream/fleetstream/pkg/reconcile"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/slo"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/topology"
	"github.com/fleetstream/fleetstream/pkg/view"
	"github.com/fleetstream/fleetstream/services/namespace-binding/placement"
)

// Config tunes the service.
type Config struct {
	// Replicas of streams and buckets (1 single node, 3 production).
	Replicas int
	// Retention overrides the limits of the streams the service ensures (default: kept forever).
	Retention topology.Retentions
	// ClaimGrace is how old a claim whose binding never appeared must be before the repair
	// loop releases it. It must exceed the longest a BindNamespace call can take between its
	// claim and its event (bindTimeout).
	ClaimGrace time.Duration
	// RepairInterval is how often claims are reconciled with the bindings view.
	RepairInterval time.Duration
	// ReleaseInterval is how often Terminating bindings are checked for the agent's
	// confirmation (it is also checked on every change).
	ReleaseInterval time.Duration
	// StatusResync is how often every binding's recorded phase is compared with the live one
	// (it is also compared on every change).
	StatusResync time.Duration
	// ScoreRefresh is the least time between two stored decisions of a placement that change
	// only its scores or its timer (placement.Config.ScoreRefresh, default 10 s).
	ScoreRefresh time.Duration
	// Protected are the namespaces no project may bind on any cluster (--protected-namespaces);
	// the zero List protects the defaults (kube-*, default, and Fleetstream's own).
	Protected protectedns.List
}

func (c *Config) defaults() {
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.ClaimGrace == 0 {
		c.ClaimGrace = 2 * time.Minute
	}
	if c.RepairInterval == 0 {
		c.RepairInterval = 30 * time.Second
	}
	if c.ReleaseInterval == 0 {
		c.ReleaseInterval = 5 * time.Second
	}
	if c.StatusResync == 0 {
		c.StatusResync = time.Minute
	}
}

const actor = "system:namespace-binding"

// Topology is every stream and bucket namespace-binding owns, plus the agents' status bucket
// it needs to exist (created if missing: agents write it, any desired-state owner may create it).
func Topology() topology.Topology {
	return topology.Merge(topology.DeadLetter(), topology.Topology{
		Streams: []jetstream.StreamConfig{
			topology.EventStream(Stream, "Projects, namespace bindings and quotas.", SubjectPrefix+".>"),
			topology.EventStream(PlacementStream, "Cluster sets, set bindings, placements, their decisions, add-on scores and namespaces following placements.", PlacementPrefix+".>"),
		},
		Buckets: []jetstream.KeyValueConfig{
			bucketConfig(ClaimsBucket, "Which project owns each (cluster, namespace)."),
		},
	})
}

// Service is namespace-binding: the state its APIs share (streams, views and caches, the claims
// bucket, the project locks) and the loops that run on it. It serves ProjectService through
// ProjectAPI, and wires placement, which serves ClusterSetService and PlacementService.
type Service struct {
	// leases reports the placement lease (fleetstream_lease_leading).
	leases *lease.Metrics
	cfg    Config
	// prop measures a binding's and a quota's time from change to applied (propagation.go).
	prop   *slo.Propagation
	js     jetstream.JetStream
	log    *zap.Logger
	store  *events.Store
	stream jetstream.Stream
	// placementStream is FLEET_PLACEMENT, where the namespaces that follow a placement are
	// recorded (the rest of it is placement's).
	placementStream jetstream.Stream
	// clusterStream is cluster-import's FLEET_CLUSTER, read to confirm deregistrations; opened
	// on first use by the release loop, its only user.
	clusterStream jetstream.Stream

	// views are this service's own views (declareViews): projects, bindings, desired and
	// placementNamespaces are their caches, set once views is ready.
	views *view.Set

	projects  *view.Cache[*projectv1.Project]
	bindings  *view.Cache[*projectv1.NamespaceBinding]
	claims    *view.Cache[*projectv1.Claim]
	desired   *view.Cache[*desiredv1.DesiredObject]
	applied   *view.Cache[*desiredv1.AppliedStatus]
	clusters  *view.Cache[*clusterv1.Cluster]
	inventory *view.Cache[*clusterv1.NamespaceInventory]
	claimsKV  jetstream.KeyValue

	placementNamespaces *view.Cache[*placementv1.PlacementNamespace]
	followBackoff       backoff

	// placement is the placement component, which this service runs, mounts and schedules
	// (under PlacementLease); the follower and the project API read it through placements.
	placement  *placement.Service
	placements placements

	ready chan struct{}
	gate  apiwait.Gate
	now   func() time.Time

	// locks serializes each project's commands in this replica (appendProject).
	locks *events.Locks[*projectv1.Project]

	// loops are the hub loops (declareLoops); release and follower are two of them, which
	// other code queues keys on (or, in tests, syncs).
	loops    []hubLoop
	release  *reconcile.Controller
	follower *reconcile.Controller
}

// New ensures the service's streams and buckets and builds it; Run starts it.
func New(ctx context.Context, js jetstream.JetStream, cfg Config, log *zap.Logger) (*Service, error) {
	cfg.defaults()
	if err := topology.Ensure(ctx, js, cfg.Replicas, cfg.Retention.Apply(Topology())); err != nil {
		return nil, err
	}
	if err := ensureAppliedBucket(ctx, js, cfg.Replicas); err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, js: js, log: log.Named("namespace-binding"), store: events.NewStore(js, actor), prop: slo.NewPropagation(), leases: lease.NewMetrics(),
		ready: make(chan struct{}), now: time.Now}
	s.gate = apiwait.NewGate(s.ready, "namespace-binding")
	s.locks = events.NewLocks[*projectv1.Project](s.projectSettled)
	s.loops = s.declareLoops()
	var err error
	if s.stream, err = js.Stream(ctx, Stream); err != nil {
		return nil, fmt.Errorf("stream %s: %w", Stream, err)
	}
	if s.placementStream, err = js.Stream(ctx, PlacementStream); err != nil {
		return nil, fmt.Errorf("stream %s: %w", PlacementStream, err)
	}
	if s.placement, err = placement.New(ctx, js, placement.Config{Replicas: cfg.Replicas, ScoreRefresh: cfg.ScoreRefresh},
		placement.Deps{Store: s.store, Gate: s.gate, Projects: placementHub{s}, Followers: placementHub{s}, Clusters: registry{s}}, s.log); err != nil {
		return nil, err
	}
	s.placements = s.placement
	if s.views = s.declareViews(js, s.log, view.WithReplicas(cfg.Replicas)); s.views.Err() != nil {
		return nil, s.views.Err()
	}
	if s.claimsKV, err = js.KeyValue(ctx, ClaimsBucket); err != nil {
		return nil, fmt.Errorf("bucket %s: %w", ClaimsBucket, err)
	}
	s.claims = view.NewCache(s.js, s.claimsKV, func() *projectv1.Claim { return &projectv1.Claim{} }, s.log, view.WithIndex(claimIndex))
	return s, nil
}

// ensureAppliedBucket creates or updates the agents' status bucket with its one shared
// configuration.
func ensureAppliedBucket(ctx context.Context, js jetstream.JetStream, replicas int) error {
	if _, err := js.CreateOrUpdateKeyValue(ctx, subjects.AppliedBucketConfig(replicas)); err != nil {
		return fmt.Errorf("ensure bucket %s: %w", subjects.AppliedBucket, err)
	}
	return nil
}

// Index terms of the bindings and claims caches.
func byProject(p string) string           { return "p\x00" + p }
func byCluster(c string) string           { return "c\x00" + c }
func byProjectCluster(p, c string) string { return "pc\x00" + p + "\x00" + c }

const terminatingTerm = "terminating"

// byProjectNamespace finds a project's bindings of one namespace on every cluster; placedTerm
// finds the bindings made because a namespace follows a placement.
func byProjectNamespace(p, ns string) string { return "pn\x00" + p + "\x00" + ns }

const placedTerm = "placed"

func bindingIndex(_ string, b *projectv1.NamespaceBinding) []string {
	terms := []string{byProject(b.Project), byCluster(b.Cluster), byProjectCluster(b.Project, b.Cluster), byProjectNamespace(b.Project, b.Namespace)}
	if b.Phase == projectv1.BindingPhase_BINDING_PHASE_TERMINATING {
		terms = append(terms, terminatingTerm)
	}
	if b.Placement != "" {
		terms = append(terms, placedTerm)
	}
	return terms
}

func claimIndex(key string, c *projectv1.Claim) []string {
	// The key holds the cluster; the claim value only the project.
	return []string{byCluster(clusterOfKey(key)), byProject(c.Project)}
}

// ProjectAPI serves fleetstream.project.v1.ProjectService: projects, their budgets and the
// bindings of their namespaces (api.go, budget.go, watch.go).
type ProjectAPI struct{ *Service }

var _ projectv1connect.ProjectServiceHandler = (*ProjectAPI)(nil)

// Projects returns the ProjectService API.
func (s *Service) Projects() *ProjectAPI { return &ProjectAPI{s} }

// Ready is closed when the views have caught up and the API answers from current state.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// Mount registers the APIs and readiness on srv.
func (s *Service) Mount(srv *server.Server) {
	srv.Handle(projectv1connect.NewProjectServiceHandler(s.Projects(), srv.HandlerOptions()...))
	s.placement.Mount(srv)
	srv.ReadyWhen("namespace-binding", s.ready)
	for _, l := range s.loops {
		for _, m := range l.c.Collectors() {
			_ = srv.Registry().Register(m)
		}
	}
	_ = s.prop.Register(srv.Registry())
	if err := s.views.Register(srv.Registry()); err != nil {
		panic(err) // as MustRegister: a programming error, not a condition of the fleet
	}
	if err := s.leases.Register(srv.Registry()); err != nil {
		panic(err)
	}
}

// Run runs the projections, caches, placement, the hub loops (declareLoops: the claim repair,
// the release of unbound namespaces, the recording of binding phases) and the placement
// scheduler with the follower, until ctx is done.
func (s *Service) Run(ctx context.Context) error { return server.Stopped(ctx, s.run(ctx)) }

func (s *Service) run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.placement.Run(ctx) })
	g.Go(func() error { return s.views.Run(ctx) })
	g.Go(func() error { return s.claims.Run(ctx) })
	g.Go(func() error {
		// The loops read the views' caches, which the set opens once their engines have
		// created the buckets.
		if !wait(ctx, s.views.Ready()) {
			return nil
		}
		if err := s.openCaches(ctx); err != nil {
			return err
		}
		g.Go(func() error { return s.applied.Run(ctx) })
		g.Go(func() error { return s.clusters.Run(ctx) })
		g.Go(func() error { return s.inventory.Run(ctx) })
		// placement is ready once its caches are and the built-in cluster sets exist.
		for _, ch := range []<-chan struct{}{s.applied.Ready(), s.claims.Ready(), s.clusters.Ready(), s.inventory.Ready(), s.placement.Ready()} {
			if !wait(ctx, ch) {
				return nil
			}
		}
		// Subscribed once caught up, so a replay of the buckets is no change to measure.
		desired, applied := s.desired.Updates(ctx, propagationBuffer), s.applied.Updates(ctx, propagationBuffer)
		g.Go(func() error { s.measurePropagation(ctx, desired, applied); return nil })
		close(s.ready)
		for _, l := range s.loops {
			if !l.leased {
				g.Go(func() error { return l.run(ctx) })
			}
		}
		g.Go(func() error { return s.runPlacementLoops(ctx) })
		return nil
	})
	return g.Wait()
}

// openCaches opens the caches of the buckets other components write: the agents' statuses, and
// cluster-import's registry and inventory.
func (s *Service) openCaches(ctx context.Context) error {
	// Opened once the views are ready, under the fleet's load: a lookup that times out is made
	// again (view.WaitBucket) rather than ending the service.
	appliedKV, err := view.WaitBucket(ctx, s.js, subjects.AppliedBucket, s.log)
	if err != nil {
		return fmt.Errorf("bucket %s: %w", subjects.AppliedBucket, err)
	}
	// Only this service's statuses: the bucket also holds every other desired bucket's.
	s.applied = view.NewCache(s.js, appliedKV, func() *desiredv1.AppliedStatus { return &desiredv1.AppliedStatus{} }, s.log,
		view.WithFilter(subjects.DesiredNamespacesBucket+".>"))
	// The registry and inventory are cluster-import's; a standalone deployment may start first.
	clustersKV, err := view.WaitBucket(ctx, s.js, subjects.ClustersBucket, s.log)
	if err != nil {
		return err
	}
	inventoryKV, err := view.WaitBucket(ctx, s.js, subjects.ClusterInventoryBucket, s.log)
	if err != nil {
		return err
	}
	s.clusters = view.NewCache(s.js, clustersKV, func() *clusterv1.Cluster { return &clusterv1.Cluster{} }, s.log)
	// Indexed by cluster: an inventory is one entry per chunk (nsinventory.Assemble).
	s.inventory = view.NewCache(s.js, inventoryKV, func() *clusterv1.NamespaceInventory { return &clusterv1.NamespaceInventory{} }, s.log,
		view.WithIndex(func(key string, _ *clusterv1.NamespaceInventory) []string {
			return []string{subjects.ClusterInventoryKeyCluster(key)}
		}))
	return nil
}

func wait(ctx context.Context, ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	}
}

// PlacementLease is the lease whose holder runs the placement scheduler and the follower of
// namespaces that follow placements. One writer each: two replicas deciding (or following)
// from views that lag each other by different amounts would undo each other's work.
const PlacementLease = "namespace-binding.placement"

func (s *Service) runPlacementLoops(ctx context.Context) error {
	runs := []func(context.Context) error{s.placement.RunScheduler}
	for _, l := range s.loops {
		if l.leased {
			runs = append(runs, l.run)
		}
	}
	return reconcile.RunLeased(ctx, s.js, PlacementLease, []lease.Option{lease.WithLogger(s.log), lease.WithReplicas(s.cfg.Replicas), lease.WithMetrics(s.leases)}, runs...)
}

// hubLoop is one of the service's hub loops (pkg/reconcile): a controller, and the sources
// that queue its keys (nil: its Keys at the start and each resync only), read once the caches
// are open.
type hubLoop struct {
	c       *reconcile.Controller
	sources func() []reconcile.Source
	// leased: only in the replica holding PlacementLease, beside the placement scheduler.
	leased bool
}

func (l hubLoop) run(ctx context.Context) error {
	var sources []reconcile.Source
	if l.sources != nil {
		sources = l.sources()
	}
	return l.c.Run(ctx, sources...)
}

// declareLoops is the one place the service's hub loops are declared (as declareViews is for
// its views): Run runs each once the caches are open (a leased one under PlacementLease) and
// Mount registers its queue's metrics.
func (s *Service) declareLoops() []hubLoop {
	s.release, s.follower = s.releaser(), s.newFollower()
	return []hubLoop{
		{c: s.statusRecorder(), sources: s.statusSources},
		{c: s.release, sources: s.releaseSources},
		{c: s.repairer()},
		{c: s.follower, sources: s.followSources, leased: true},
	}
}

// Projections are the service's views, placement's included, for tools that check a running
// fleet's buckets against a rebuild from the streams (view.Verify; make chaos).
func Projections() []view.Projection {
	own := new(Service).declareViews(nil, nil).Projections()
	// Placement's views sit between desired and the followers' view: tools index this order.
	return slices.Concat(own[:3], placement.Projections(), own[3:])
}

// declareViews is the one place namespace-binding's own views are declared (placement declares
// its own): each projection with the cache it is read through.
func (s *Service) declareViews(js jetstream.JetStream, log *zap.Logger, opts ...view.Option) *view.Set {
	set := view.NewSet(js, log, opts...)
	view.Add(set, projectsProjection(), &s.projects)
	view.Add(set, bindingsProjection(), &s.bindings, view.WithIndex(bindingIndex))
	view.Add(set, desiredProjection(), &s.desired)
	view.Add(set, placementNamespacesProjection(), &s.placementNamespaces, view.WithIndex(placementNamespaceIndex))
	return set
}

// placementHub is what placement reads of this service (placement.Projects and
// placement.Followers).
type placementHub struct{ s *Service }

func (h placementHub) ProjectExists(name string) bool {
	_, ok := h.s.projects.Get(projectKey(name))
	return ok
}

func (h placementHub) FollowersOf(project, placement string) []string {
	return h.s.followersOf(project, placement)
}

// registry is this service's cache of the registry as placement reads it (placement.Clusters),
// looked up on every call: the cache opens once the service runs, and placement reads it only
// after (its API waits for the service's gate, its scheduler runs once the service is ready).
type registry struct{ s *Service }

func (r registry) List(keep func(string, *clusterv1.Cluster) bool) []*clusterv1.Cluster {
	return r.s.clusters.List(keep)
}

func (r registry) GetFresh(ctx context.Context, key string) (*clusterv1.Cluster, bool, error) {
	return r.s.clusters.GetFresh(ctx, key)
}

func (r registry) Changed() <-chan struct{} { return r.s.clusters.Changed() }

func (r registry) Current(ctx context.Context) (uint64, error) { return r.s.clusters.Current(ctx) }

func (r registry) Watch(keys func(view.Update[*clusterv1.Cluster]) []string) reconcile.Source {
	return reconcile.Watch(r.s.clusters, keys)
}
