package mcs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/agentlimits"
	"github.com/fleetstream/fleetstream/pkg/consumer"
	"github.com/fleetstream/fleetstream/pkg/daemon"
	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/lease"
	"github.com/fleetstream/fleetstream/pkg/reconcile"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/view"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/collector"
)

// LeaseName is the lease of the one writer of bucket desired-mcs.
const LeaseName = "endpoint-collector.mcs"

// Endpoints is what the computation reads of the collector.
type Endpoints interface {
	ServiceEndpoints(ref collector.ServiceRef) (*endpointv1.GetServiceEndpointsResponse, bool)
	Feed() *collector.Feed
	Ready() <-chan struct{}
}

// Ownership is who owns each namespace on each cluster (*authz.Authorizer).
type Ownership interface {
	NamespaceBindings(namespace string) []*projectv1.NamespaceBinding
	NamespaceBindingsChanged() <-chan struct{}
	Ready() <-chan struct{}
}

// Service computes and writes the multi-cluster Services of the fleet. It is a
// server.Component; every replica reads the reports, the lease holder writes.
type Service struct {
	js      jetstream.JetStream
	eps     Endpoints
	owners  Ownership
	log     *zap.Logger
	exports *exportStore
	ctrl    *reconcile.Controller
	refused *prometheus.CounterVec
	omitted *prometheus.GaugeVec
	ready   chan struct{}
	// caughtUp is closed once the report reader has delivered every report the stream held
	// when it started: the writer computes nothing before, or a service whose reports are
	// not read yet would count no exports and lose its imports on every cluster.
	caughtUp     chan struct{}
	caughtUpOnce sync.Once
	// noWrites: this replica never writes (collector.Config.NoViewWrites).
	noWrites bool

	kv jetstream.KeyValue
	// written is what the bucket holds, by service key: desired key → its value and revision.
	// Rebuilt from the bucket whenever the lease is taken; changed by the reconciler only.
	mu      sync.Mutex
	written map[string]map[string]stored
	// applied is bucket `applied`, where agents confirm tombstones (collect.go); opened when
	// first needed.
	applied jetstream.KeyValue

	// ingestMu serializes the report reader and rebind: a report rebind re-reads from the
	// stream must not be applied after a newer one the reader applied.
	ingestMu sync.Mutex

	omittedMu   sync.Mutex
	lastOmitted map[string]uint32

	// limits is each cluster's AgentWithinLimits condition as this replica judges it (absent:
	// within); judgeMu makes each judgement's read and write of it one step.
	judgeMu sync.Mutex
	limits  *agentlimits.Status

	// leases reports the writer's lease (fleetstream_lease_leading).
	leases *lease.Metrics
}

// LimitsReader is this package's name in bucket agent-limits' keys.
const LimitsReader = "endpoint-collector-mcs"

// New returns the multi-cluster Services writer over js, reading endpoints and ownership.
func New(js jetstream.JetStream, eps Endpoints, owners Ownership, log *zap.Logger) *Service {
	if log == nil {
		log = zap.NewNop()
	}
	s := &Service{js: js, eps: eps, owners: owners, log: log.Named("mcs"), exports: newExportStore(),
		ready: make(chan struct{}), caughtUp: make(chan struct{}), written: map[string]map[string]stored{}, lastOmitted: map[string]uint32{},
		limits: agentlimits.New(LimitsReader), leases: lease.NewMetrics(),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetstream_mcs_export_reports_refused_total",
			Help: "ServiceExport reports of agents refused whole (invalid, or past the bounds an agent keeps to), by cluster.",
		}, []string{"cluster"}),
		omitted: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fleetstream_mcs_exports_omitted",
			Help: "ServiceExports an agent left out of its reports because a namespace has more than one report carries (1,000), by cluster: they are not exported.",
		}, []string{"cluster"})}
	s.exports.bound = func(cluster, ns string) bool {
		for _, b := range owners.NamespaceBindings(ns) {
			if b.GetCluster() == cluster {
				return true
			}
		}
		return false
	}
	s.ctrl = reconcile.New(reconcile.Config{Name: "endpoint-collector-mcs", Keys: s.keys, Resync: 10 * time.Minute, Log: s.log}, reconcile.Func(s.reconcile))
	// Nothing of the fleet's API waits for it: its output goes to clusters, not to callers.
	close(s.ready)
	return s
}

// NewFromEnv builds the service of a daemon (endpoint-collector's binary, fleetd). A replica
// started with --no-view-writes (noWrites) serves only: it neither contends for the lease nor
// reads the reports.
func NewFromEnv(env *daemon.Env, eps Endpoints, noWrites bool) *Service {
	s := New(env.JS, eps, env.Authz, env.Log)
	s.noWrites = noWrites
	return s
}

// Mount registers its metrics.
func (s *Service) Mount(srv *server.Server) {
	for _, c := range append(s.ctrl.Collectors(), s.refused, s.omitted) {
		_ = srv.Registry().Register(c)
	}
	if err := s.leases.Register(srv.Registry()); err != nil {
		panic(err) // as MustRegister: a programming error, not a condition of the fleet
	}
}

// Ready is closed at once: the writer follows the lease, not readiness.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// Exporters returns the clusters whose agents reported an export of service ns/name, whether
// or not it counts (tests, diagnostics).
func (s *Service) Exporters(ns, name string) []string {
	return slices.Sorted(maps.Keys(s.exports.of(ns, name)))
}

// Sync reconciles every service now and waits (tests).
func (s *Service) Sync(ctx context.Context) error { return s.ctrl.Sync(ctx) }

// Run reads the reports and, while this replica holds the lease, writes.
func (s *Service) Run(ctx context.Context) error {
	if s.noWrites {
		<-ctx.Done()
		return nil
	}
	for _, ch := range []<-chan struct{}{s.eps.Ready(), s.owners.Ready()} {
		select {
		case <-ch:
		case <-ctx.Done():
			return nil
		}
	}
	// Opened once the collector has replayed every report, the hub at its busiest: a lookup
	// that times out is tried again, not the end of fleetd.
	kv, err := view.WaitBucket(ctx, s.js, subjects.DesiredMCSBucket, s.log)
	if err != nil {
		return server.Stopped(ctx, fmt.Errorf("mcs: bucket %s: %w", subjects.DesiredMCSBucket, err))
	}
	s.kv = kv
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() { s.followEndpoints(ctx) })
	wg.Go(func() { s.followOwnership(ctx) })
	errc := make(chan error, 2)
	wg.Go(func() { errc <- s.consume(ctx) })
	// Only a replica that knows every export may write: a lease taken before would reconcile
	// each service from a partial set of reports and tombstone the imports of the rest, fleet
	// wide, until the reader caught up (every hub restart, every lease move).
	select {
	case <-s.caughtUp:
	case err = <-errc:
		return server.Stopped(ctx, err)
	case <-ctx.Done():
		return nil
	}
	wg.Go(func() {
		errc <- reconcile.RunLeased(ctx, s.js, LeaseName, []lease.Option{lease.WithMetrics(s.leases)}, func(ctx context.Context) error {
			// The lease is taken when the hub is at its busiest (a restarted hub's agents
			// replaying, the stream at its consumer limit): an error here would stop fleetd.
			if err := events.Retry(ctx, s.log, "desired-mcs not loaded", func() error { return s.loadWritten(ctx) }, errLoadStalled); err != nil {
				return err
			}
			return s.ctrl.Run(ctx)
		}, s.runLimits)
	})
	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	return server.Stopped(ctx, err)
}

// consume reads every cluster's latest export reports and sync markers.
func (s *Service) consume(ctx context.Context) error {
	r, err := consumer.NewOrdered(ctx, s.js, subjects.AgentStreamName, []string{
		subjects.AgentPrefix + ".*." + subjects.AgentServiceExportsKind + ".*",
		subjects.AgentPrefix + ".*.serviceexportsync",
	}, 0, 256, s.log, consumer.WithLastPerSubject())
	if err != nil {
		return fmt.Errorf("mcs: agent stream consumer: %w", err)
	}
	defer r.Stop()
	// Caught up once what was pending at the start is delivered (messages come in stream
	// order, so those come first), or once nothing is pending: under a steady flow of new
	// reports the second may never happen.
	initial, delivered := r.InitialPending(), uint64(0)
	if initial == 0 {
		s.markCaughtUp()
	}
	return r.Each(ctx, func(m jetstream.Msg, md *jetstream.MsgMetadata) {
		delivered++
		s.ingestMu.Lock()
		changed, err := s.exports.handle(m.Subject(), m.Data())
		s.ingestMu.Unlock()
		cluster, _ := keys.Decode(strings.Split(m.Subject(), ".")[2])
		if err != nil {
			s.refused.WithLabelValues(cluster).Inc()
			s.log.Warn("ServiceExport report refused", zap.String("subject", m.Subject()), zap.Error(err))
		}
		for _, k := range changed {
			s.ctrl.Add(k)
		}
		s.recordOmitted(cluster)
		s.judgeLimits(cluster)
		if delivered >= initial || md.NumPending == 0 {
			s.markCaughtUp()
		}
	})
}

func (s *Service) markCaughtUp() { s.caughtUpOnce.Do(func() { close(s.caughtUp) }) }

// followEndpoints queues the services whose endpoints changed.
func (s *Service) followEndpoints(ctx context.Context) {
	f := s.eps.Feed()
	defer f.Close()
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.Changed():
		}
		for _, ref := range f.Take() {
			// Most services are exported nowhere: their endpoints' churn costs a lookup.
			if k := ref.Namespace + "/" + ref.Name; s.exports.exported(k) || s.hasWritten(k) {
				s.ctrl.Add(k)
			}
		}
	}
}

// followOwnership queues the services of each namespace whose bindings changed: a bind or
// unbind adds or removes the clusters an import goes to. Only exported (or written) services'
// namespaces are looked at, and only a namespace whose bindings differ is queued.
func (s *Service) followOwnership(ctx context.Context) {
	seen := map[string]string{} // namespace → its bindings, as last looked at
	for {
		ch := s.owners.NamespaceBindingsChanged()
		byNS := map[string][]string{}
		for _, k := range s.keys() {
			ns, _, _ := strings.Cut(k, "/")
			byNS[ns] = append(byNS[ns], k)
		}
		now := make(map[string]string, len(byNS))
		for ns, svcs := range byNS {
			var sig []string
			for _, b := range s.owners.NamespaceBindings(ns) {
				sig = append(sig, b.GetCluster()+"="+b.GetProject())
			}
			slices.Sort(sig)
			now[ns] = strings.Join(sig, ",")
			if prev, ok := seen[ns]; !ok || prev != now[ns] {
				for _, k := range svcs {
					s.ctrl.Add(k)
				}
			}
		}
		seen = now
		s.rebind(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ch:
		}
	}
}

// rebind follows binding changes in what the store holds: a namespace's report dropped as not
// bound is read again from the stream (its last message) once the namespace is bound there
// (the agent does not report it again: for it nothing changed), and a held report of a
// namespace no longer bound is dropped. The hub thus holds reports only of bound namespaces.
func (s *Service) rebind(ctx context.Context) {
	s.ingestMu.Lock()
	defer s.ingestMu.Unlock()
	for _, k := range s.exports.unbind() {
		s.ctrl.Add(k)
	}
	var stream jetstream.Stream
	for cluster, nss := range s.exports.unboundAll() {
		for _, ns := range nss {
			if !s.exports.bound(cluster, ns) {
				continue
			}
			if stream == nil {
				var err error
				if stream, err = s.js.Stream(ctx, subjects.AgentStreamName); err != nil {
					s.log.Warn("re-reading ServiceExport reports of newly bound namespaces", zap.Error(err))
					return
				}
			}
			subj := subjects.AgentServiceExports(cluster, ns)
			m, err := stream.GetLastMsgForSubject(ctx, subj)
			if err != nil {
				s.log.Warn("re-reading a ServiceExport report of a newly bound namespace", zap.String("subject", subj), zap.Error(err))
				continue
			}
			changed, err := s.exports.handle(m.Subject, m.Data)
			if err != nil {
				s.log.Warn("ServiceExport report refused", zap.String("subject", subj), zap.Error(err))
			}
			for _, k := range changed {
				s.ctrl.Add(k)
			}
		}
	}
}

// Unbound returns the namespaces of cluster whose last ServiceExport report the hub dropped as
// not bound there (tests, diagnostics).
func (s *Service) Unbound(cluster string) []string {
	out := s.exports.unboundAll()[cluster]
	slices.Sort(out)
	return out
}

// keys is every service with exports or with objects written.
func (s *Service) keys() []string {
	out := s.exports.keys()
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.written {
		out = append(out, k)
	}
	return out
}

func (s *Service) hasWritten(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.written[key]) > 0
}

// loadWritten reads what the bucket holds, for the reconciler to compare with.
// errLoadStalled: a load received nothing for loadStall (a request sent while the connection
// was down may never be answered).
var errLoadStalled = errors.New("load desired-mcs: no progress")

const loadStall = 30 * time.Second

func (s *Service) loadWritten(ctx context.Context) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stall := time.AfterFunc(loadStall, cancel)
	defer stall.Stop()
	w, err := s.kv.WatchAll(wctx, jetstream.IgnoreDeletes())
	if err != nil {
		if wctx.Err() != nil && ctx.Err() == nil {
			return errLoadStalled
		}
		return fmt.Errorf("mcs: read %s: %w", subjects.DesiredMCSBucket, err)
	}
	defer func() { _ = w.Stop() }()
	written := map[string]map[string]stored{}
	loaded := false // the watch said it had sent every key (a nil entry)
	for e := range w.Updates() {
		stall.Reset(loadStall)
		if e == nil {
			loaded = true
			break
		}
		svc, _, ok := serviceOfKey(e.Key())
		if !ok {
			continue
		}
		if written[svc] == nil {
			written[svc] = map[string]stored{}
		}
		written[svc][e.Key()] = stored{data: e.Value(), rev: e.Revision()}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if !loaded {
		// Stalled, or the subscription closed before the last key: a partial map would leave
		// the keys it lacks untombstoned for good.
		return errLoadStalled
	}
	s.mu.Lock()
	s.written = written
	s.mu.Unlock()
	return nil
}

// reconcile writes the desired objects of service key and tombstones those no longer desired.
func (s *Service) reconcile(ctx context.Context, key string) error {
	ns, name, ok := strings.Cut(key, "/")
	if !ok {
		return nil
	}
	bound, since := map[string]string{}, map[string]time.Time{}
	for _, b := range s.owners.NamespaceBindings(ns) {
		bound[b.GetCluster()] = b.GetProject()
		if t := b.GetCreateTime(); t != nil && t.CheckValid() == nil {
			since[b.GetCluster()] = t.AsTime()
		}
	}
	d := Compute(Input{Namespace: ns, Name: name, Exports: s.exports.of(ns, name), Bound: bound, BoundSince: since,
		Endpoints: func(project string) *endpointv1.GetServiceEndpointsResponse {
			r, _ := s.eps.ServiceEndpoints(collector.ServiceRef{Namespace: ns, Name: name, Project: project})
			return r
		}})
	s.mu.Lock()
	prev := s.written[key]
	s.mu.Unlock()
	next := map[string]stored{}
	var errs []error
	for k, obj := range d.Objects {
		data, err := proto.MarshalOptions{Deterministic: true}.Marshal(obj)
		if err != nil {
			return err
		}
		if p, ok := prev[k]; ok && bytes.Equal(p.data, data) {
			next[k] = p
			continue
		}
		rev, err := s.kv.Put(ctx, k, data)
		if err != nil {
			errs = append(errs, fmt.Errorf("put %s: %w", k, err))
			// The bucket still holds what it held: kept, not taken below for an object no
			// longer desired and tombstoned (the error retries the whole service).
			if p, ok := prev[k]; ok {
				next[k] = p
			}
			continue
		}
		next[k] = stored{data: data, rev: rev}
	}
	for k, old := range prev {
		if _, ok := next[k]; ok {
			continue
		}
		oldObj := &desiredv1.DesiredObject{}
		if err := proto.Unmarshal(old.data, oldObj); err == nil && oldObj.GetTombstone() {
			// Already gone: kept until the cluster's agent confirms it removed the object, so
			// that an agent away when it went still removes it; then collected.
			collected, err := s.collect(ctx, k, old.rev)
			if err != nil {
				errs = append(errs, err)
			}
			if !collected {
				next[k] = old
			}
			continue
		}
		tomb, _ := proto.MarshalOptions{Deterministic: true}.Marshal(Tombstone(oldObj.GetOwnerLabelValue()))
		rev, err := s.kv.Put(ctx, k, tomb)
		if err != nil {
			errs = append(errs, fmt.Errorf("tombstone %s: %w", k, err))
			next[k] = old
			continue
		}
		next[k] = stored{data: tomb, rev: rev}
	}
	s.mu.Lock()
	if len(next) == 0 {
		delete(s.written, key)
	} else {
		s.written[key] = next
	}
	s.mu.Unlock()
	return errors.Join(errs...)
}

// recordOmitted publishes how many exports cluster's agent left out, and logs a cluster that
// starts leaving some out: those services are not exported, and only the cluster's users can
// fix it (fewer exports per namespace).
func (s *Service) recordOmitted(cluster string) {
	n := s.exports.omitted(cluster)
	s.omittedMu.Lock()
	defer s.omittedMu.Unlock()
	prev := s.lastOmitted[cluster]
	switch {
	case n == prev:
		return
	case n == 0:
		delete(s.lastOmitted, cluster)
		s.omitted.DeleteLabelValues(cluster)
		return
	case prev == 0:
		s.log.Warn("an agent leaves ServiceExports out of its reports: a namespace has more than one report carries", zap.String("cluster", cluster), zap.Uint32("omitted", n))
	}
	s.lastOmitted[cluster] = n
	s.omitted.WithLabelValues(cluster).Set(float64(n))
}

// judgeLimits updates cluster's AgentWithinLimits condition after one of its messages.
func (s *Service) judgeLimits(cluster string) {
	reason, msg := s.exports.limits(cluster)
	s.judgeMu.Lock()
	defer s.judgeMu.Unlock()
	cur := s.limits.Get(cluster)
	switch {
	case reason == "" && cur == nil:
		return
	case reason == "":
		s.limits.Set(cluster, nil)
		s.log.Info("cluster agent's ServiceExport reports back within their limits", zap.String("cluster", cluster))
	case cur != nil && cur.GetReason() == reason && cur.GetMessage() == msg:
		return
	default:
		cond := &clusterv1.Condition{Type: subjects.ConditionAgentWithinLimits, Status: clusterv1.ConditionStatus_CONDITION_STATUS_FALSE,
			Reason: reason, Message: msg, LastTransitionTime: timestamppb.Now()}
		if cur != nil && cur.GetReason() == reason {
			cond.LastTransitionTime = cur.GetLastTransitionTime()
		}
		s.limits.Set(cluster, cond)
	}
}

// runLimits keeps this reader's entries of bucket agent-limits as judged (lease holder only):
// cluster-import shows them as each cluster's AgentWithinLimits condition.
func (s *Service) runLimits(ctx context.Context) error {
	return s.limits.Run(ctx, s.js, 5*time.Second, s.log)
}
