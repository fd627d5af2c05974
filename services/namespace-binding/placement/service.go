// Package placement is namespace-binding's placement: cluster sets, their bindings to projects
// and their roles, placements, the scheduler that decides them, its decisions and the add-on
// scores it reads (docs/placement.md). The scheduling itself, pure, is pkg/placement (imported
// here as core); this package keeps its inputs and outputs in views, serves ClusterSetService
// and PlacementService, and runs the scheduler.
//
// namespace-binding's Service wires it: it ensures the stream, gives it what it reads of the rest
// of that service through small interfaces (Projects, Followers, Clusters), so this package
// never imports namespacebinding, runs it, mounts its APIs, and runs its scheduler under the
// placement lease beside the follower of namespaces that follow placements, which reads the
// decisions back (DecidedClusters, WatchDecisions).
package placement

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/apiwait"
	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1/placementv1connect"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/reconcile"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// Config tunes placement.
type Config struct {
	// Replicas of the view buckets (1 single node, 3 production).
	Replicas int
	// ScoreRefresh is the least time between two stored decisions of a placement that change
	// only its scores or its timer (default 10 s): a decision whose clusters stand is stored
	// at once if the last such store is older, else when ScoreRefresh has passed, so score
	// churn costs at most one event per placement per ScoreRefresh.
	ScoreRefresh time.Duration
}

func (c *Config) defaults() {
	if c.ScoreRefresh == 0 {
		c.ScoreRefresh = 10 * time.Second
	}
}

// Projects is what placement reads of the projects: a placement and a set binding are a
// project's.
type Projects interface {
	// ProjectExists reports whether the project exists.
	ProjectExists(name string) bool
}

// Followers is what placement reads of the namespaces that follow placements: a placement
// they follow is not deleted.
type Followers interface {
	// FollowersOf lists the namespaces that follow project's placement.
	FollowersOf(project, placement string) []string
}

// Clusters is cluster-import's registry as placement reads it: the wiring service's cache of
// the clusters view (a *view.Cache[*clusterv1.Cluster] has these methods). It is read only once
// the API is admitted (Deps.Gate) or the scheduler runs.
type Clusters interface {
	List(keep func(key string, c *clusterv1.Cluster) bool) []*clusterv1.Cluster
	GetFresh(ctx context.Context, key string) (*clusterv1.Cluster, bool, error)
	Changed() <-chan struct{}
	Current(ctx context.Context) (uint64, error)
	// Watch is reconcile.Watch of the cache, for the scheduler.
	Watch(keys func(u view.Update[*clusterv1.Cluster]) []string) reconcile.Source
}

// Deps is what the wiring service gives placement.
type Deps struct {
	// Store appends placement's events, with the wiring service's actor.
	Store *events.Store
	// Gate admits API calls once the wiring service is ready, its caches included.
	Gate      apiwait.Gate
	Projects  Projects
	Followers Followers
	Clusters  Clusters
}

// Service is placement: its views and their caches, the APIs it serves on them (ClusterSetAPI,
// PlacementAPI) and the scheduler.
type Service struct {
	cfg       Config
	js        jetstream.JetStream
	log       *zap.Logger
	store     *events.Store
	gate      apiwait.Gate
	projects  Projects
	followers Followers
	clusters  Clusters
	// stream is FLEET_PLACEMENT.
	stream jetstream.Stream

	// views are placement's views (declareViews); the caches below are theirs, set once views
	// is ready.
	views *view.Set

	clusterSets *view.Cache[*placementv1.ClusterSet]
	setBindings *view.Cache[*placementv1.ClusterSetBinding]
	setRoles    *view.Cache[*placementv1.ClusterSetRoleBinding]
	placements  *view.Cache[*placementv1.Placement]
	decisions   *view.Cache[*placementv1.PlacementDecisions]
	addOnScores *view.Cache[*placementv1.AddOnScore]

	// decisionStore appends the scheduler's decisions: Store, but for a test that makes one
	// placement's appends fail.
	decisionStore appender
	// sched is the placement scheduler (scheduler.go), run by RunScheduler.
	sched *scheduler
	now   func() time.Time
	ready chan struct{}
}

// appender is what the scheduler appends its decisions with (an *events.Store).
type appender interface {
	Append(ctx context.Context, subject, aggregateID string, expect events.Expect, payload proto.Message) (uint64, error)
}

// New builds placement on the stream the wiring service ensured (Stream); Run starts it.
func New(ctx context.Context, js jetstream.JetStream, cfg Config, deps Deps, log *zap.Logger) (*Service, error) {
	cfg.defaults()
	s := &Service{cfg: cfg, js: js, log: log, store: deps.Store, gate: deps.Gate,
		projects: deps.Projects, followers: deps.Followers, clusters: deps.Clusters,
		decisionStore: deps.Store, now: time.Now, ready: make(chan struct{})}
	s.sched = newScheduler(s)
	var err error
	if s.stream, err = js.Stream(ctx, Stream); err != nil {
		return nil, fmt.Errorf("stream %s: %w", Stream, err)
	}
	if s.views = s.declareViews(js, log, view.WithReplicas(cfg.Replicas)); s.views.Err() != nil {
		return nil, s.views.Err()
	}
	return s, nil
}

// ClusterSetAPI serves fleetstream.placement.v1.ClusterSetService (clustersets.go,
// setroles.go).
type ClusterSetAPI struct{ *Service }

// PlacementAPI serves fleetstream.placement.v1.PlacementService (placements.go).
type PlacementAPI struct{ *Service }

var (
	_ placementv1connect.ClusterSetServiceHandler = (*ClusterSetAPI)(nil)
	_ placementv1connect.PlacementServiceHandler  = (*PlacementAPI)(nil)
)

// ClusterSets returns the ClusterSetService API.
func (s *Service) ClusterSets() *ClusterSetAPI { return &ClusterSetAPI{s} }

// Placements returns the PlacementService API.
func (s *Service) Placements() *PlacementAPI { return &PlacementAPI{s} }

// Mount registers the APIs on srv. Readiness is the wiring service's (Deps.Gate).
func (s *Service) Mount(srv *server.Server) {
	srv.Handle(placementv1connect.NewClusterSetServiceHandler(s.ClusterSets(), srv.HandlerOptions()...))
	srv.Handle(placementv1connect.NewPlacementServiceHandler(s.Placements(), srv.HandlerOptions()...))
	if err := s.views.Register(srv.Registry()); err != nil {
		panic(err) // as MustRegister: a programming error, not a condition of the fleet
	}
	for _, m := range s.sched.ctrl.Collectors() {
		_ = srv.Registry().Register(m)
	}
	srv.Registry().MustRegister(setAgents{s}, s.sched.latency.hist)
}

// Ready is closed once the caches have caught up and the built-in cluster sets exist.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// Run runs the projections and caches until ctx is done. The scheduler runs apart
// (RunScheduler), under the wiring service's lease.
func (s *Service) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.views.Run(ctx) })
	g.Go(func() error {
		if !wait(ctx, s.views.Ready()) {
			return nil
		}
		// `default` and `global` exist before the API answers, as rbac-sync's built-in roles do.
		if err := s.ensureClusterSets(ctx); err != nil {
			return err
		}
		close(s.ready)
		return nil
	})
	return g.Wait()
}

// declareViews is the one place placement's views are declared: each projection with the cache
// it is read through. Projections() lists them in this order, which namespace-binding's
// Projections() and the tools that index it keep.
func (s *Service) declareViews(js jetstream.JetStream, log *zap.Logger, opts ...view.Option) *view.Set {
	set := view.NewSet(js, log, opts...)
	view.Add(set, clusterSetsProjection(), &s.clusterSets)
	view.Add(set, setBindingsProjection(), &s.setBindings, view.WithIndex(setBindingIndex))
	view.Add(set, setRolesProjection(), &s.setRoles, view.WithIndex(setRoleIndex))
	view.Add(set, placementsProjection(), &s.placements, view.WithIndex(placementIndex))
	view.Add(set, decisionsProjection(), &s.decisions)
	view.Add(set, addOnScoresProjection(), &s.addOnScores)
	return set
}

func wait(ctx context.Context, ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	}
}

// What the wiring service reads back: whether a placement exists, and what it decided.

// PlacementExists reports whether project's placement name is in the view.
func (s *Service) PlacementExists(project, name string) bool {
	_, ok := s.placements.Get(placementKey(project, name))
	return ok
}

// PlacementCount is how many placements project has.
func (s *Service) PlacementCount(project string) int { return s.placements.Count(byProject(project)) }

// PlacementGone confirms from the stream that a placement was deleted (or never created), for
// a reader whose view may lag: another replica may have decided a placement created a moment
// ago, before this replica's view of placements shows it.
func (s *Service) PlacementGone(ctx context.Context, project, name string) bool {
	_, last, err := events.Last(ctx, s.stream, subjects.Placement(project, name))
	if err != nil {
		s.log.Warn("confirm placement deletion", zap.String("project", project), zap.String("placement", name), zap.Error(err))
		return false
	}
	_, deleted := events.PayloadOf(last).(*placementv1.PlacementDeleted)
	return last == nil || deleted
}

// DecidedClusters lists the clusters of the placement's decision, best first within each group,
// groups in order; false before its first decision.
func (s *Service) DecidedClusters(project, name string) ([]string, bool) {
	d, ok := s.decisions.Get(placementKey(project, name))
	return decidedClusters(d), ok
}

// WatchDecisions is a reconcile source queuing, whenever a placement's decision changes, the
// keys that keys returns for that placement.
func (s *Service) WatchDecisions(keys func(project, name string) []string) reconcile.Source {
	return reconcile.Watch(s.decisions, func(u view.Update[*placementv1.PlacementDecisions]) []string {
		return keys(u.Value.GetProject(), u.Value.GetName())
	})
}

// maxAttempts bounds the retries of a command that lost an optimistic-concurrency race.
const maxAttempts = 10

// clusterRegistered is NotFound unless cluster is in cluster-import's registry. A cluster
// registered a moment ago counts even before this replica's cache of the registry has caught up:
// a client that registers and then scores must not be told the cluster does not exist.
func (s *Service) clusterRegistered(ctx context.Context, cluster string) error {
	_, ok, err := s.clusters.GetFresh(ctx, keys.Encode(cluster))
	switch {
	case err != nil:
		return apierr.Internal(fmt.Errorf("look up cluster %q: %w", cluster, err))
	case !ok:
		return apierr.NotFound("cluster", cluster)
	}
	return nil
}

func (s *Service) waitView(ctx context.Context, wait func(context.Context) error) error {
	return apiwait.Visible(ctx, "change", wait)
}
