// Package collector is endpoint-collector: it merges the EndpointSlices that cluster agents
// report into one multi-cluster view per service, keeps operator weight overrides as events,
// and serves both through fleetstream.endpoint.v1.EndpointService, a watch stream and bucket
// `endpoints`. See docs/endpoints.md for the design.
//
// Agent reports are decoded by hand, straight from the protobuf wire format into the compact
// store (wire.go), because the generated code is measurably slower on the single ingest
// goroutine (BenchmarkSliceReplay reports the ratio). That decoder is the package's one use of
// package unsafe (unsafeString, for three calls that keep nothing of the string); it yields
// exactly what the generated code does or declines and lets the generated code decode, and
// FuzzDecodeReport holds it to that on arbitrary bytes.
package collector

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"
	"google.golang.org/protobuf/proto"
	"k8s.io/client-go/util/workqueue"

	"github.com/fleetstream/fleetstream/pkg/agentlimits"
	"github.com/fleetstream/fleetstream/pkg/apiwait"
	"github.com/fleetstream/fleetstream/pkg/consumer"
	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1/endpointv1connect"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/lease"
	"github.com/fleetstream/fleetstream/pkg/liveness"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/topology"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// Config tunes the collector. Zero fields take the defaults.
type Config struct {
	// StaleAfter is how long a cluster's agent may be silent before its endpoints are flagged
	// stale (still served). Default liveness.UnreachableAfter (40s).
	StaleAfter time.Duration
	// EvictAfter is how long before they are no longer served. Default 5m.
	EvictAfter time.Duration
	// CheckInterval is how often liveness is evaluated. Default min(StaleAfter/4, 5s).
	CheckInterval time.Duration
	// WeightCleanupAfter is how long an endpoint weight outlives its endpoint (the IP gone from
	// a live cluster, or taken by another pod) before it is removed. Default 1h.
	WeightCleanupAfter time.Duration
	// ViewFlushInterval coalesces writes of bucket `endpoints`: a service changing many times
	// within it is written once. Default 200ms.
	ViewFlushInterval time.Duration
	// NoViewWrites keeps this replica from ever writing bucket `endpoints` or cleaning up
	// weights: it serves the API only. Without it, replicas elect the one writer themselves
	// (lease WriterLease); the flag is for replicas that must never write.
	NoViewWrites bool
	// Workers reconciling services concurrently. Default 2.
	Workers int
	// RetryQPS bounds the overall rate of retried reconciles (the work queue's bucket limiter);
	// default 50/s with a burst of 500. Fresh changes are never delayed, only coalesced.
	RetryQPS float64
	// Replicas of the stream and buckets (1 single node, 3 production).
	Replicas int
	// ResponseCacheBytes bounds the memory of cached GetServiceEndpoints responses (messages and
	// their encodings) over all services; past it the least recently used go (a clock sweep).
	// Default (0): ResponseCacheBytesPerAddress per address the store holds, at least
	// MinResponseCacheBytes and at most DefaultResponseCacheBytes; negative: nothing is cached.
	ResponseCacheBytes int64
	// Retention overrides the limits of the streams the service ensures (default: kept forever).
	Retention topology.Retentions
	// Limits bound what one cluster's agent may make the collector hold (limits.go).
	Limits Limits
}

func (c *Config) defaults() {
	if c.StaleAfter <= 0 {
		c.StaleAfter = liveness.UnreachableAfter
	}
	if c.EvictAfter <= 0 {
		c.EvictAfter = 5 * time.Minute
	}
	if c.EvictAfter < c.StaleAfter {
		c.EvictAfter = c.StaleAfter
	}
	if c.CheckInterval <= 0 {
		c.CheckInterval = min(c.StaleAfter/4, 5*time.Second)
	}
	if c.WeightCleanupAfter <= 0 {
		c.WeightCleanupAfter = time.Hour
	}
	if c.ViewFlushInterval <= 0 {
		c.ViewFlushInterval = 200 * time.Millisecond
	}
	if c.Workers <= 0 {
		c.Workers = 2
	}
	if c.RetryQPS <= 0 {
		c.RetryQPS = 50
	}
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	c.Limits.defaults()
}

// The default response cache budget scales with the store, so that the cache holds about the same
// share of the services' responses in a small fleet as in a large one (the hit rate depends on
// that share when a few services are polled far more than the rest) for the same bytes per
// endpoint: ResponseCacheBytesPerAddress per address held (an endpoint on one port), a quarter of
// the 250-byte per-endpoint goal, at least MinResponseCacheBytes (a small fleet: every response
// fits) and at most DefaultResponseCacheBytes (from 500,000 addresses on the share falls).
// BenchmarkResponseCacheHitRate measures hit rate against budget; docs/benchmarks.md has the
// figures.
const (
	ResponseCacheBytesPerAddress = 64
	MinResponseCacheBytes        = 4 << 20
	DefaultResponseCacheBytes    = 32 << 20
)

const actor = "system:endpoint-collector"

// Topology is what the collector needs: its weight stream and view bucket, the lease bucket of
// its single writers (weights view engine, bucket writer), and the agent stream it reads (declared in pkg/subjects; ensuring it with the same config is idempotent, so
// the collector can start before cluster-import).
func Topology() topology.Topology {
	return topology.Merge(topology.DeadLetter(), topology.Topology{
		Streams: []jetstream.StreamConfig{
			topology.EventStream(subjects.EndpointStream, "Endpoint weight events.", subjects.EndpointPrefix+".>"),
			subjects.AgentStream(),
		},
		Buckets: []jetstream.KeyValueConfig{{
			Bucket: subjects.EndpointsBucket, Description: "Merged multi-cluster endpoints per service (derived from agent reports).",
			History: 1, Storage: jetstream.FileStorage,
		}, subjects.AgentLimitsBucketConfig(),
			// Multi-cluster Services for member clusters, written by package mcs.
			subjects.FeedBucketConfig(subjects.DesiredMCSBucket, "Desired ServiceImports and EndpointSlices of member clusters (multi-cluster Services), keys <cluster>.<kind>.<namespace>.<name>.")},
	}, lease.Topology())
}

type metrics struct {
	reports    prometheus.Counter
	malformed  prometheus.Counter
	pruned     prometheus.Counter
	reconciles prometheus.Counter
	served     prometheus.Histogram
}

// ReportBuckets fit the endpoint promises (a changed endpoint served, and pushed to proxies,
// well within a second): fine from 5 ms, up to the 10 s past which a report is plainly stuck.
var ReportBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

func newMetrics() metrics {
	return metrics{
		reports:    prometheus.NewCounter(prometheus.CounterOpts{Name: "fleet_endpoint_reports_total", Help: "Agent messages applied."}),
		malformed:  prometheus.NewCounter(prometheus.CounterOpts{Name: "fleet_endpoint_reports_malformed_total", Help: "Agent messages dead-lettered."}),
		pruned:     prometheus.NewCounter(prometheus.CounterOpts{Name: "fleet_endpoint_slices_pruned_total", Help: "Slices dropped by relist markers."}),
		reconciles: prometheus.NewCounter(prometheus.CounterOpts{Name: "fleet_endpoint_reconciles_total", Help: "Service snapshots published."}),
		served: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "fleetstream_endpoint_report_served_seconds",
			Help: "Time from an agent's EndpointSlice report (its stream time) until the service's snapshot that takes it in is served (GetServiceEndpoints, watches and feeds answer it), " +
				"one observation per snapshot, from its earliest report; reports replayed at start are not timed.",
			Buckets: ReportBuckets}),
	}
}

// Collector implements endpointv1connect.EndpointServiceHandler.
type Collector struct {
	endpointv1connect.UnimplementedEndpointServiceHandler

	// leases reports the bucket writer's lease (fleetstream_lease_leading).
	leases *lease.Metrics

	cfg     Config
	js      jetstream.JetStream
	log     *zap.Logger
	events  *events.Store
	store   *Store
	pending *pendingSet
	queue   workqueue.TypedRateLimitingInterface[string]
	ingest  *ingester
	kv      *kvWriter
	codec   *responseCodec
	env     *snapEnv // shared by every snapshot: the store's strings, the response cache
	metrics metrics
	// refused counts reports over a cluster's Limits; limitStatus says which clusters are.
	refused     *prometheus.CounterVec
	limitStatus *agentlimits.Status

	// viewSet is the collector's views (declareViews); weightsView and weights are the engine
	// and cache of its one view, weights set once viewSet is ready.
	viewSet     *view.Set
	weightsView *view.Engine
	weights     *view.Cache[*endpointv1.ServiceWeights]
	registry    *registry
	leaseTTL    time.Duration

	caughtUp     chan struct{}
	caughtUpOnce sync.Once
	ready        chan struct{}
	gate         apiwait.Gate
	now          func() time.Time
	// onPublish, when set (benchmarks), is called with every snapshot once it is served.
	onPublish func(*snapshot)

	feedsMu sync.RWMutex
	feeds   []*Feed

	// owners says who owns each namespace on each cluster (ownership.go); nil: nobody.
	owners       Ownership
	ownersSynced chan struct{}
	// views is the keys of the views each owned service (by key) serves now; an entry is
	// changed only by the reconciler of its service.
	viewsMu sync.Mutex
	views   map[string][]string
	nviews  atomic.Int64 // len(views)
}

// New ensures the collector's streams and buckets and builds it; Run starts it.
func New(ctx context.Context, js jetstream.JetStream, cfg Config, log *zap.Logger) (*Collector, error) {
	cfg.defaults()
	if err := topology.Ensure(ctx, js, cfg.Replicas, cfg.Retention.Apply(Topology())); err != nil {
		return nil, err
	}
	c := newCollector(cfg, log)
	c.js = js
	c.events = events.NewStore(js, actor)
	if c.viewSet = c.declareViews(js, c.log, view.WithReplicas(cfg.Replicas)); c.viewSet.Err() != nil {
		return nil, c.viewSet.Err()
	}
	if !cfg.NoViewWrites {
		c.kv = &kvWriter{c: c, dirty: map[string]struct{}{}}
	}
	c.registry = &registry{c: c}
	return c, nil
}

// newCollector builds the in-memory part, without JetStream (benchmarks drive it directly).
func newCollector(cfg Config, log *zap.Logger) *Collector {
	cfg.defaults()
	c := &Collector{cfg: cfg, log: log.Named("endpoint-collector"), store: NewStore(), leases: lease.NewMetrics(),
		pending: &pendingSet{m: map[string]*pendingService{}},
		codec:   newResponseCodec(cfg.ResponseCacheBytes, nil),
		metrics: newMetrics(),
		refused: newRefusedMetric(), limitStatus: agentlimits.New(limitsReader),
		caughtUp: make(chan struct{}), ready: make(chan struct{}), now: time.Now, leaseTTL: lease.DefaultTTL,
		ownersSynced: make(chan struct{}), views: map[string][]string{}}
	c.gate = apiwait.NewGate(c.ready, "endpoint collector")
	c.store.strs = newStrtab()
	c.codec.addresses = &c.store.addresses
	c.env = &snapEnv{strs: c.store.strs, codec: c.codec}
	c.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedMaxOfRateLimiter(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](5*time.Millisecond, 30*time.Second),
			&workqueue.TypedBucketRateLimiter[string]{Limiter: rate.NewLimiter(rate.Limit(cfg.RetryQPS), 500)},
		),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "endpoint-collector"})
	c.ingest = newIngester(c)
	return c
}

// Ready is closed once the collector has applied every report that was in the stream when it
// started, and its weights: from then on the API answers from current state.
func (c *Collector) Ready() <-chan struct{} { return c.ready }

// Store returns the in-memory store (for tests and benchmarks).
func (c *Collector) Store() *Store { return c.store }

// Mount registers the API, its metrics and readiness on srv.
func (c *Collector) Mount(srv *server.Server) {
	srv.Handle(endpointv1connect.NewEndpointServiceHandler(c, c.HandlerOptions(srv)...))
	srv.ReadyWhen("endpoint-collector", c.ready)
	for _, m := range []prometheus.Collector{c.metrics.reports, c.metrics.malformed, c.metrics.pruned, c.metrics.reconciles, c.metrics.served, c.refused} {
		_ = srv.Registry().Register(m)
	}
	if err := c.viewSet.Register(srv.Registry()); err != nil {
		panic(err) // as MustRegister: a programming error, not a condition of the fleet
	}
	if err := c.leases.Register(srv.Registry()); err != nil {
		panic(err)
	}
}

// Run consumes reports, reconciles, and keeps the weights, the liveness and the view bucket
// until ctx is done.
func (c *Collector) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	for range c.cfg.Workers {
		g.Go(func() error { c.runWorker(); return nil })
	}
	g.Go(func() error {
		<-ctx.Done()
		c.queue.ShutDown()
		return nil
	})
	g.Go(func() error { return c.viewSet.Run(ctx) })
	select {
	case <-c.viewSet.Ready():
	case <-ctx.Done():
		return g.Wait()
	}
	g.Go(func() error { return c.followWeights(ctx) })
	g.Go(func() error { return c.registry.run(ctx) })
	g.Go(func() error { return c.consume(ctx) })
	g.Go(func() error { return c.followOwnership(ctx) })
	g.Go(func() error { return c.runLiveness(ctx) })
	if c.kv != nil {
		g.Go(func() error { return c.runWriter(ctx) })
		g.Go(func() error { return c.runLimitStatus(ctx) })
	}
	g.Go(func() error { return c.awaitReady(ctx) })
	return g.Wait()
}

// awaitReady closes ready once the initial replay is applied.
func (c *Collector) awaitReady(ctx context.Context) error {
	for _, ch := range []<-chan struct{}{c.caughtUp, c.weights.Ready(), c.ownersSynced} {
		select {
		case <-ch:
		case <-ctx.Done():
			return nil
		}
	}
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for c.pending.len() > 0 || c.queue.Len() > 0 {
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil
		}
	}
	close(c.ready)
	c.log.Info("endpoint collector ready", zap.Int("services", len(c.store.Services(nil))))
	return nil
}

// consume reads the agent stream starting from the latest message of every subject: each
// report is a snapshot, so that replay is exactly the current state. Every replica needs all of
// it in memory, which is why this is not a shared durable work queue. consumer.Ordered, not
// nats.go's ordered consumer, whose replacement of a consumer lost with a NATS node takes 10 s
// per attempt (issue 14): reports would stall that long after the node died.
func (c *Collector) consume(ctx context.Context) error {
	// Heartbeats go on core NATS (subjects.LivePrefix) and are not in the replay: every replica
	// hears them live, and starts from when cluster-import last recorded each agent.
	sub, err := c.js.Conn().Subscribe(subjects.AgentLiveHeartbeats, func(m *nats.Msg) {
		if err := c.ingest.handle(m.Subject, nil, time.Now()); err != nil {
			c.metrics.malformed.Inc()
		}
	})
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", subjects.AgentLiveHeartbeats, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	c.seedLastSeen(ctx)
	r, err := consumer.NewOrdered(ctx, c.js, subjects.AgentStreamName, []string{
		subjects.AgentPrefix + ".*." + kindHeartbeat,
		subjects.AgentPrefix + ".*." + kindSlice + ".>",
		subjects.AgentPrefix + ".*." + kindSync,
	}, 0, 2048, c.log, consumer.WithLastPerSubject())
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("agent stream consumer: %w", err)
	}
	defer r.Stop()
	if r.InitialPending() == 0 {
		c.markCaughtUp()
	}
	err = r.Each(ctx, func(m jetstream.Msg, md *jetstream.MsgMetadata) {
		if err := c.ingest.handle(m.Subject(), m.Data(), md.Timestamp); err != nil {
			c.metrics.malformed.Inc()
			c.log.Error("dead-lettering agent report", zap.String("subject", m.Subject()), zap.Error(err))
			if dlErr := deadLetter(ctx, c.js, m, err); dlErr != nil {
				c.log.Error("dead-letter failed", zap.String("subject", m.Subject()), zap.Error(dlErr))
			}
		} else {
			c.metrics.reports.Inc()
		}
		if md.NumPending == 0 {
			c.markCaughtUp()
		}
	})
	if err != nil {
		return fmt.Errorf("consume agent stream: %w", err)
	}
	return nil
}

func (c *Collector) markCaughtUp() { c.caughtUpOnce.Do(func() { close(c.caughtUp) }) }

// runLiveness re-evaluates every cluster's liveness, so silence is noticed without messages.
func (c *Collector) runLiveness(ctx context.Context) error {
	t := time.NewTicker(c.cfg.CheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			c.ingest.mu.Lock()
			for _, ci := range c.ingest.clusters {
				c.evaluate(ci.info)
			}
			c.ingest.mu.Unlock()
		}
	}
}

// registry follows bucket `clusters` (cluster-import's view) for cluster ids. It is optional:
// until the bucket exists, ids come from the agents' reports.
type registry struct {
	c *Collector
}

func (r *registry) run(ctx context.Context) error {
	for ctx.Err() == nil {
		pause := registryReattach
		// No logger: the bucket is optional, and waiting for it is not worth a warning.
		kv, err := view.WaitBucket(ctx, r.c.js, subjects.ClustersBucket, nil)
		if err != nil {
			if ctx.Err() == nil {
				r.c.log.Warn("cluster registry bucket", zap.Error(err))
			}
			pause = registryRetry
		} else {
			r.attach(ctx, kv)
		}
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
	}
	return nil
}

// registryReattach is the pause before the registry attaches again after its bucket was
// rebuilt or its reader failed; registryRetry after the bucket could not be opened (a
// permission refused, say: not worth a warning a few times a second).
const (
	registryReattach = 250 * time.Millisecond
	registryRetry    = 2 * time.Second
)

// attach follows one incarnation of bucket kv until view.Follow ends it: the bucket was dropped
// or created again (cluster-import rebuilt its view, a rolling upgrade may), or its reader
// failed. Before, a failed reader went unnoticed (its error was discarded) and the collector
// kept the registry as it last saw it, for good: a cluster deregistered after that kept its
// endpoints served.
func (r *registry) attach(ctx context.Context, kv jetstream.KeyValue) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cache := view.NewCache(r.c.js, kv, func() *clusterv1.Cluster { return &clusterv1.Cluster{} }, r.c.log)
	ready := make(chan struct{})
	followed := make(chan error, 1)
	go func() { followed <- view.Follow(ctx, kv, cache, nil, func() { close(ready) }) }()
	ended := func(err error) {
		if ctx.Err() == nil {
			r.c.log.Info("cluster registry ended (rebuilt or gone?); attaching again", zap.Error(err))
		}
	}
	select {
	case <-ready:
	case err := <-followed:
		ended(err)
		return
	case <-ctx.Done():
		return
	}
	r.forgetMissing(ctx, cache)
	go r.sweepUnregistered(ctx, cache)
	for {
		snap, ch := cache.Subscribe(ctx, 1024)
		for _, u := range snap {
			r.apply(ctx, u)
		}
	subscribed:
		for {
			select {
			case u, ok := <-ch:
				if !ok {
					break subscribed // cut off for falling behind, or ctx ended
				}
				r.apply(ctx, u)
			case err := <-followed:
				ended(err)
				return
			}
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// forgetMissing hands apply, as deletions, the clusters an earlier incarnation of the registry
// showed that this one lacks: a cluster deregistered while the registry was rebuilt or
// unreadable is otherwise never seen to go (the new bucket just does not hold it). apply
// confirms each with the cluster's last event, as for any deletion.
func (r *registry) forgetMissing(ctx context.Context, cache *view.Cache[*clusterv1.Cluster]) {
	for _, name := range r.c.store.Registered() {
		key := keys.Encode(name)
		if _, ok := cache.Get(key); !ok {
			r.apply(ctx, view.Update[*clusterv1.Cluster]{Op: view.Delete, Key: key})
		}
	}
}

func (r *registry) apply(ctx context.Context, u view.Update[*clusterv1.Cluster]) {
	if u.Op != view.Put {
		// Deregistration evicts the cluster's endpoints at once rather than after EvictAfter
		// of silence (docs/endpoints.md), once the cluster's last event confirms it: a registry
		// view being rebuilt drops entries too.
		name, err := keys.Decode(u.Key)
		if err != nil || !r.deregistered(ctx, name) {
			return
		}
		ci := r.c.store.cluster(name)
		if !ci.deregistered.Swap(true) {
			r.c.log.Info("cluster deregistered: its endpoints are no longer served", zap.String("cluster", name))
			r.c.reevaluate(name)
		}
		return
	}
	name := u.Value.Name
	ci := r.c.store.cluster(name)
	r.c.store.registered(ci)
	back := ci.deregistered.Swap(false)
	if ci.setID(u.Value.Id) && !back {
		for _, key := range r.c.ingest.servicesOf(name) {
			r.c.queue.Add(key)
		}
	}
	if back {
		r.c.reevaluate(name)
	}
}

// sweepUnregistered catches the deregistrations apply cannot see. A cluster registered and
// deregistered within one batch of the registry view's engine never appears in the bucket (the
// engine writes only the batch's outcome, a delete of a key the cache never had, which is no
// update), yet its agent may have reported endpoints meanwhile. At start and on every change of
// the bucket, each cluster with endpoints that the registry has never shown is checked against
// its stream;
// in a fleet whose clusters are all registered there are none to check.
func (r *registry) sweepUnregistered(ctx context.Context, cache *view.Cache[*clusterv1.Cluster]) {
	// Once at start too: the registry may attach after such a pair (it waits for the bucket),
	// and the loaded bucket then just lacks the cluster.
	start := make(chan struct{})
	close(start)
	var changed <-chan struct{} = start
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
		changed = cache.Changed() // before the sweep: a change during it wakes the next one
		for _, ci := range r.c.store.Unregistered() {
			if _, ok := cache.Get(keys.Encode(ci.name)); ok || !r.deregistered(ctx, ci.name) {
				continue
			}
			if !ci.deregistered.Swap(true) {
				r.c.log.Info("cluster deregistered: its endpoints are no longer served", zap.String("cluster", ci.name))
				r.c.reevaluate(ci.name)
			}
		}
	}
}

// deregistered reports whether the last event of cluster name is its deregistration.
func (r *registry) deregistered(ctx context.Context, name string) bool {
	stream, err := r.c.js.Stream(ctx, subjects.ClusterStream)
	if err != nil {
		r.c.log.Warn("confirm deregistration", zap.String("cluster", name), zap.Error(err))
		return false
	}
	_, last, err := events.Last(ctx, stream, subjects.Cluster(name))
	if err != nil {
		r.c.log.Warn("confirm deregistration", zap.String("cluster", name), zap.Error(err))
		return false
	}
	if last == nil {
		return false
	}
	_, ok := last.Payload.(*clusterv1.ClusterDeregistered)
	return ok
}

// reevaluate re-judges one cluster's liveness now (a deregistration, a registration again).
func (c *Collector) reevaluate(name string) {
	c.ingest.mu.Lock()
	defer c.ingest.mu.Unlock()
	if ic := c.ingest.clusters[name]; ic != nil {
		c.evaluate(ic.info)
	}
}

func (c *Collector) idFromRegistry(cluster string) bool {
	return c.store.cluster(cluster).fromRegistry.Load()
}

// serviceKey is the work-queue key of a service.
func serviceKey(ns, name string) string { return ns + "/" + name }

// viewKey is the KV key of a service in buckets `endpoints` and `endpoint-weights`.
func viewKey(ns, name string) string { return keys.Join(ns, name) }

// Projections are the service's views, for tools that check a running fleet's buckets
// against a rebuild from the streams (view.Verify; make chaos).
func Projections() []view.Projection { return new(Collector).declareViews(nil, nil).Projections() }

// declareViews is the one place the collector's views are declared: each projection with the
// engine and cache it is run and read through. Projections() lists them in this order.
func (c *Collector) declareViews(js jetstream.JetStream, log *zap.Logger, opts ...view.Option) *view.Set {
	set := view.NewSet(js, log, opts...)
	c.weightsView = view.Add(set, weightsProjection(), &c.weights)
	return set
}

// seedLastSeen starts each cluster's last-seen from cluster-import's cluster-status bucket: a
// restarted collector does not replay heartbeats (they are not stored), and judging silence by
// the replayed slices alone would take every quiet cluster for evicted (stale until its agent
// relists). Without the bucket (no cluster-import yet) it starts from the replay, as before.
func (c *Collector) seedLastSeen(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, seedTimeout)
	defer cancel()
	kv, err := c.js.KeyValue(ctx, subjects.ClusterStatusBucket)
	if err != nil {
		c.log.Info("no agent last-seen times to start from", zap.Error(err))
		return
	}
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		c.log.Warn("agent last-seen times not read", zap.Error(err))
		return
	}
	defer func() { _ = w.Stop() }()
	n := 0
	for {
		select {
		case <-ctx.Done():
			c.log.Warn("agent last-seen times read in part", zap.Int("clusters", n), zap.Error(ctx.Err()))
			return
		case e := <-w.Updates():
			if e == nil {
				c.log.Info("started from the agents' last-seen times", zap.Int("clusters", n))
				return
			}
			st := &clusterv1.AgentStatus{}
			if proto.Unmarshal(e.Value(), st) != nil || st.GetClusterName() == "" || st.GetLastSeen() == nil {
				continue
			}
			c.ingest.seen(st.GetClusterName(), st.GetLastSeen().AsTime())
			n++
		}
	}
}

// seedTimeout bounds the read of the last-seen times at start.
const seedTimeout = 10 * time.Second
