package rbacsync

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/lease"
	"github.com/fleetstream/fleetstream/pkg/slo"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// FanoutLease is the lease whose holder writes desired-rbac: with several replicas of
// rbac-sync, exactly one fans out at a time.
const FanoutLease = "rbac-sync.fanout"

// subscriptionBuffer is how many changes an input may queue before the fan-out is cut off and
// resubscribes (a full recompute): generous, since a burst of bindings arrives at once.
const subscriptionBuffer = 1 << 16

// maxDrain bounds how many input changes are folded into one write round.
const maxDrain = 8192

var errResubscribe = errors.New("input subscription fell behind")

// The fan-out's inputs, indexing its positions in them.
const (
	inTemplates = iota
	inBindings
	inClusters
	inNamespaces
	numInputs
)

// errCollectDue interrupts waiting for input when it is time to collect tombstones.
var errCollectDue = errors.New("time to collect tombstones")

// DefaultCollectInterval is how often the writer deletes tombstones whose removal the
// cluster's agent has confirmed.
const DefaultCollectInterval = 30 * time.Second

// DefaultMarkerPurgeAfter is how long the delete marker a collected tombstone leaves in
// desired-rbac stays before the writer purges it. JetStream keeps a marker (a header-only
// message) per deleted key for ever; only an agent that already confirmed the removal could
// still miss one, so an hour is ample.
const DefaultMarkerPurgeAfter = time.Hour

// written is what the desired bucket holds for a key, as the fan-out last wrote or read it: a
// digest of the stored bytes rather than the object, so memory stays small with hundreds of
// thousands of keys (100,000 namespaces × their roles).
type written struct {
	t         target
	sum       digest
	tombstone bool
	revision  uint64
}

// digest identifies a stored value; 128 bits of SHA-256, so a collision (which would skip a
// needed write) is not a practical concern.
type digest [16]byte

func digestOf(data []byte) digest {
	s := sha256.Sum256(data)
	return digest(s[:16])
}

// encode marshals a desired object. DesiredObject has no map fields, so equal objects give
// equal bytes and their digests can be compared.
func encode(o *desiredv1.DesiredObject) []byte {
	data, err := proto.Marshal(o)
	if err != nil {
		// Only bytes, strings, bools and enums: marshalling cannot fail.
		panic(fmt.Sprintf("marshal desired object: %v", err))
	}
	return data
}

// fanout computes rbac-sync's desired state and writes it into the desired-rbac bucket, its
// single writer. It watches four inputs (templates and project role bindings from rbac-sync's
// own views, the cluster registry, the namespace bindings), keeps them in a model, and for every
// change recomputes only the targets the change touches, writing a key only when its object
// differs from what the bucket holds. Since desired state is a function of the inputs' current
// state, the order in which changes arrive does not matter.
//
// Every replica runs it, but only the holder of lease FanoutLease writes; the others keep the
// same model and follow the bucket instead of writing it, so the API (plans, status, access)
// answers alike in every replica, and a replica taking over starts from the bucket as it is.
type fanout struct {
	leases   *lease.Metrics // nil: not reported
	js       jetstream.JetStream
	log      *zap.Logger
	replicas int // of the lease bucket, if the fan-out has to create it
	leaseTTL time.Duration

	templates  *view.Cache[*rbacv1.RoleTemplate]
	bindings   *view.Cache[*rbacv1.ProjectRoleBinding]
	clusters   *view.Cache[*clusterv1.Cluster]
	namespaces namespaceSource

	kv       jetstream.KeyValue
	kvPrefix string

	// status returns the applied status an agent reported for a key of the applied bucket
	// (nil: tombstones are never collected); collectEvery is how often they are.
	status       func(appliedKey string) (*desiredv1.AppliedStatus, bool)
	collectEvery time.Duration
	// markerAge is how old a delete marker must be before the writer purges it; lastPurge is
	// when it last did.
	markerAge time.Duration
	lastPurge time.Time
	// loadStall is how long a load of the bucket may receive nothing before it is made again.
	loadStall time.Duration

	mu               sync.RWMutex
	m                *model
	written          map[string]*written
	writtenByCluster map[string]map[string]target
	writtenByPlace   map[place]map[string]target

	ready     chan struct{}
	readyOnce sync.Once

	// taken is, per input, the position (view.Cache.Current) of the last change folded into the
	// model; folded is taken as of the last round that is also written (a follower: folded in
	// the model). progress is closed when folded moves. All under mu.
	taken, folded [numInputs]uint64
	progress      chan struct{}

	// changedAt is, per target key dirtied since the last plan, the time of the earliest change
	// that dirtied it (none for a snapshot's) and its input: when the change its next write
	// carries out was made, and of what kind. Under mu.
	changedAt map[string]change
	prop      *slo.Propagation

	writes  *prometheus.CounterVec
	skipped prometheus.Counter
	rounds  prometheus.Histogram
}

func newFanout(js jetstream.JetStream, log *zap.Logger) *fanout {
	return &fanout{
		js: js, log: log.Named("fanout"), m: newModel(), replicas: 1, leaseTTL: lease.DefaultTTL, collectEvery: DefaultCollectInterval,
		markerAge: DefaultMarkerPurgeAfter, loadStall: defaultLoadStall,
		written: map[string]*written{}, writtenByCluster: map[string]map[string]target{}, writtenByPlace: map[place]map[string]target{},
		ready: make(chan struct{}), progress: make(chan struct{}), prop: slo.NewPropagation(), changedAt: map[string]change{},
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetstream_rbac_desired_writes_total", Help: "Desired-rbac keys written, by operation (put, tombstone, delete, collect).",
		}, []string{"op"}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleetstream_rbac_desired_unchanged_total", Help: "Recomputed desired-rbac keys left alone because nothing changed.",
		}),
		rounds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "fleetstream_rbac_fanout_round_seconds", Help: "Time of one recompute-and-write round.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
	}
}

func (f *fanout) collectors() []prometheus.Collector {
	return []prometheus.Collector{f.writes, f.skipped, f.rounds}
}

// Run fans out while this replica holds lease FanoutLease, and follows the replica that does
// otherwise, until ctx ends.
func (f *fanout) Run(ctx context.Context) error {
	return lease.Run(ctx, f.js, FanoutLease, lease.DefaultHolder(), f.leaseTTL,
		func(ctx context.Context) error { return f.term(ctx, true) },
		lease.WithStandby(func(ctx context.Context) error { return f.term(ctx, false) }),
		lease.WithLogger(f.log), lease.WithReplicas(f.replicas), lease.WithMetrics(f.leases))
}

// term runs the fan-out as the writer (lead) or as a follower until ctx ends (for the writer:
// until the lease is lost). Each term starts from the bucket as it is: a writer's picture of it
// is only right while it is the only writer.
func (f *fanout) term(ctx context.Context, lead bool) error {
	w, err := f.loadRetrying(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if lead {
		_ = w.Stop()
	} else {
		followed := make(chan struct{})
		go func() {
			defer close(followed)
			f.followBucket(ctx, w)
		}()
		// Done before the next term (which may lead) reloads the bucket.
		defer func() { <-followed }()
	}
	for {
		err := f.session(ctx, lead)
		if ctx.Err() != nil {
			return nil
		}
		if !errors.Is(err, errResubscribe) {
			return err
		}
		f.log.Warn("an input fell behind; resubscribing and recomputing everything")
	}
}

// loadRetrying loads the bucket, again after a failure NATS may get over: a request that timed
// out or found no responders while the server is busy (a hub restarted under 10,000
// reconnecting agents timed the watch's consumer out, and rbac-sync stopped, taking fleetd with
// it: docs/scale.md), a stream without a leader for a moment, or a load that makes no progress
// for loadStall (a request sent while the connection was down may never be answered). Anything
// else is returned.
func (f *fanout) loadRetrying(ctx context.Context) (w jetstream.KeyWatcher, err error) {
	err = events.Retry(ctx, f.log, "desired-rbac not loaded", func() (err error) {
		w, err = f.load(ctx)
		return err
	}, errLoadStalled)
	return w, err
}

// errLoadStalled: a load received nothing for loadStall.
var errLoadStalled = errors.New("load desired-rbac: no progress")

// defaultLoadStall is how long a load may receive nothing before it is made again.
const defaultLoadStall = 30 * time.Second

// load reads the desired bucket into memory: what is written is compared against, so nothing
// unchanged is rewritten even right after a restart. It returns the watch, which goes on with
// the bucket's changes after the initial values. The watch lives until ctx ends or it is
// stopped; a load that stalls is abandoned (its watch with it) and errLoadStalled returned.
func (f *fanout) load(ctx context.Context) (jetstream.KeyWatcher, error) {
	f.kvPrefix = "$KV." + f.kv.Bucket() + "."
	wctx, cancel := context.WithCancel(ctx)
	stall := time.AfterFunc(f.loadStall, cancel)
	type result struct {
		w   jetstream.KeyWatcher
		err error
	}
	created := make(chan result, 1)
	go func() {
		w, err := f.kv.WatchAll(wctx)
		created <- result{w, err}
	}()
	var w jetstream.KeyWatcher
	select {
	case r := <-created:
		if r.err != nil {
			cancel()
			if stall.Stop() || ctx.Err() != nil {
				return nil, fmt.Errorf("load desired-rbac: %w", r.err)
			}
			return nil, errLoadStalled
		}
		w = r.w
	case <-ctx.Done():
		cancel()
		return nil, ctx.Err()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.written, f.writtenByCluster, f.writtenByPlace = map[string]*written{}, map[string]map[string]target{}, map[place]map[string]target{}
	for {
		select {
		case <-wctx.Done():
			_ = w.Stop()
			cancel()
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, errLoadStalled
		case e, ok := <-w.Updates():
			if !ok {
				cancel()
				return nil, errors.New("load desired-rbac: watch closed")
			}
			if e == nil {
				if !stall.Stop() {
					// The stall fired just now: the watch is being torn down.
					_ = w.Stop()
					return nil, errLoadStalled
				}
				f.log.Info("desired state loaded", zap.Int("keys", len(f.written)))
				return &cancelWatch{KeyWatcher: w, cancel: cancel}, nil
			}
			stall.Reset(f.loadStall)
			f.record(e)
		}
	}
}

// cancelWatch releases the load's context when the watch is stopped.
type cancelWatch struct {
	jetstream.KeyWatcher
	cancel context.CancelFunc
}

func (w *cancelWatch) Stop() error {
	err := w.KeyWatcher.Stop()
	w.cancel()
	return err
}

// record takes one entry of the desired bucket; the caller holds f.mu.
func (f *fanout) record(e jetstream.KeyValueEntry) {
	t, ok := parseTarget(e.Key())
	if !ok {
		f.log.Warn("ignoring foreign key in desired-rbac", zap.String("key", e.Key()))
		return
	}
	if e.Operation() != jetstream.KeyValuePut {
		f.forget(e.Key(), t)
		return
	}
	// An undecodable value is no tombstone, and its digest equals nothing computed: the first
	// reconcile rewrites it.
	obj := &desiredv1.DesiredObject{}
	_ = proto.Unmarshal(e.Value(), obj)
	f.remember(e.Key(), &written{t: t, sum: digestOf(e.Value()), tombstone: obj.Tombstone, revision: e.Revision()})
}

// followBucket keeps a follower's record of the bucket current with what the writer writes,
// for the API; it re-reads the whole bucket when the watch breaks.
func (f *fanout) followBucket(ctx context.Context, w jetstream.KeyWatcher) {
	for {
		for e := range w.Updates() {
			if e == nil {
				continue // the end of the initial values of a fresh watch
			}
			f.mu.Lock()
			f.record(e)
			f.mu.Unlock()
		}
		_ = w.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			var err error
			if w, err = f.kv.WatchAll(ctx); err == nil {
				break
			}
			f.log.Warn("follow desired-rbac; retrying", zap.Error(err))
		}
	}
}

// parseTarget reverses target.key for keys rbac-sync writes.
func parseTarget(key string) (target, bool) {
	toks, err := keys.Split(key)
	if err != nil || len(toks) != 4 || !strings.HasPrefix(toks[3], ObjectPrefix) {
		return target{}, false
	}
	t := target{cluster: toks[0], namespace: toks[2], template: strings.TrimPrefix(toks[3], ObjectPrefix)}
	if t.kind() != toks[1] || t.key() != key {
		return target{}, false
	}
	return t, true
}

func (f *fanout) remember(key string, w *written) {
	f.written[key] = w
	if f.writtenByCluster[w.t.cluster] == nil {
		f.writtenByCluster[w.t.cluster] = map[string]target{}
	}
	f.writtenByCluster[w.t.cluster][key] = w.t
	if w.t.namespace != "" {
		pl := w.t.place()
		if f.writtenByPlace[pl] == nil {
			f.writtenByPlace[pl] = map[string]target{}
		}
		f.writtenByPlace[pl][key] = w.t
	}
}

func (f *fanout) forget(key string, t target) {
	delete(f.written, key)
	delete(f.writtenByCluster[t.cluster], key)
	if len(f.writtenByCluster[t.cluster]) == 0 {
		delete(f.writtenByCluster, t.cluster)
	}
	if t.namespace != "" {
		pl := t.place()
		delete(f.writtenByPlace[pl], key)
		if len(f.writtenByPlace[pl]) == 0 {
			delete(f.writtenByPlace, pl)
		}
	}
}

func (f *fanout) writtenAt(pl place) []target {
	out := make([]target, 0, len(f.writtenByPlace[pl]))
	for _, t := range f.writtenByPlace[pl] {
		out = append(out, t)
	}
	return out
}

func (f *fanout) writtenOn(cluster string) []target {
	out := make([]target, 0, len(f.writtenByCluster[cluster]))
	for _, t := range f.writtenByCluster[cluster] {
		out = append(out, t)
	}
	return out
}

// session subscribes to every input, rebuilds the model from their snapshots, reconciles every
// key once (only when it leads: a follower keeps the model and writes nothing), then applies
// changes as they come. It returns errResubscribe when an input subscription was cut off.
func (f *fanout) session(ctx context.Context, lead bool) error {
	for _, ch := range []<-chan struct{}{f.templates.Ready(), f.bindings.Ready(), f.clusters.Ready(), f.namespaces.Ready()} {
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tSnap, tAt, tCh := f.templates.SubscribeAt(sctx, subscriptionBuffer)
	bSnap, bAt, bCh := f.bindings.SubscribeAt(sctx, subscriptionBuffer)
	cSnap, cAt, cCh := f.clusters.SubscribeAt(sctx, subscriptionBuffer)
	nSnap, nAt, nCh := f.namespaces.Subscribe(sctx, subscriptionBuffer)

	f.mu.Lock()
	f.m = newModel()
	clear(f.changedAt) // a new session's first round is a resync, not a change
	f.taken = [numInputs]uint64{inTemplates: tAt, inBindings: bAt, inClusters: cAt, inNamespaces: nAt}
	for _, u := range cSnap {
		f.applyCluster(u)
	}
	for _, u := range tSnap {
		f.applyTemplate(u)
	}
	for _, u := range bSnap {
		f.applyBinding(u)
	}
	for _, u := range nSnap {
		f.applyNamespace(u)
	}
	// Everything the model wants, and everything written that it may no longer want.
	dirty := f.m.all()
	for _, w := range f.written {
		dirty = append(dirty, w.t)
	}
	f.mu.Unlock()
	if lead {
		if err := f.flush(ctx, dirty); err != nil {
			return err
		}
	}
	f.markFolded()
	f.readyOnce.Do(func() { close(f.ready) })

	var tick <-chan time.Time
	if lead && f.status != nil {
		t := time.NewTicker(f.collectEvery)
		defer t.Stop()
		tick = t.C
	}
	for {
		var dirty []target
		collect := false
		// Block for one change, then take whatever else is queued, so a burst becomes one
		// write round.
		n := 0
		for n < maxDrain {
			block := n == 0
			got, err := f.next(sctx, block, tick, tCh, bCh, cCh, nCh, &dirty)
			if errors.Is(err, errCollectDue) {
				collect = true
				break
			}
			if err != nil {
				return err
			}
			if !got {
				break
			}
			n++
		}
		if !lead {
			f.mu.Lock()
			clear(f.changedAt) // only the writer measures
			f.mu.Unlock()
			f.markFolded()
			continue
		}
		if err := f.flush(ctx, dirty); err != nil {
			return err
		}
		f.markFolded()
		// In the same loop as the writes, so a tombstone is never deleted across a put of the
		// same key planned meanwhile.
		if collect {
			if err := f.collect(ctx); err != nil {
				return err
			}
			f.purgeMarkers(ctx)
		}
	}
}

// purgeMarkers removes, at most once per markerAge, the delete markers older than markerAge
// that collected tombstones and deregistered clusters' keys left, so the bucket holds nothing
// per object ever removed. Each purge is bounded by the marker's own sequence, so it removes the
// marker and what came before it on that key, never a put that landed after the listing (by this
// loop or by a previous leader still running past its lease). Failures are logged, not fatal:
// it is housekeeping, tried again markerAge later.
func (f *fanout) purgeMarkers(ctx context.Context) {
	if f.markerAge <= 0 || time.Since(f.lastPurge) < f.markerAge {
		return
	}
	// Once per markerAge even when it fails: it runs in the writer's loop, and a bus outage must
	// not hold the writes for its timeout on every collection.
	f.lastPurge = time.Now()
	n, err := f.purgeOldMarkers(ctx)
	if err != nil {
		f.log.Warn("purge delete markers; retried in markerAge", zap.String("bucket", f.kv.Bucket()), zap.Int("purged", n), zap.Error(err))
		return
	}
	if n > 0 {
		f.log.Debug("purged delete markers", zap.Int("markers", n))
	}
}

func (f *fanout) purgeOldMarkers(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	w, err := f.kv.WatchAll(ctx, jetstream.MetaOnly())
	if err != nil {
		return 0, err
	}
	defer func() { _ = w.Stop() }()
	limit := time.Now().Add(-f.markerAge)
	var old []jetstream.KeyValueEntry
	for done := false; !done; {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return 0, errors.New("watch closed")
			case e == nil:
				done = true
			case e.Operation() != jetstream.KeyValuePut && e.Created().Before(limit):
				old = append(old, e)
			}
		}
	}
	_ = w.Stop()
	stream, err := f.js.Stream(ctx, "KV_"+f.kv.Bucket())
	if err != nil {
		return 0, err
	}
	for i, e := range old {
		if err := stream.Purge(ctx, jetstream.WithPurgeSubject(f.kvPrefix+e.Key()), jetstream.WithPurgeSequence(e.Revision()+1)); err != nil {
			return i, fmt.Errorf("purge marker of %s: %w", e.Key(), err)
		}
	}
	return len(old), nil
}

// markFolded records that every change taken so far is in the model and, when leading, written.
func (f *fanout) markFolded() {
	f.mu.Lock()
	defer f.mu.Unlock()
	moved := false
	for i, p := range f.taken {
		if p > f.folded[i] {
			f.folded[i], moved = p, true
		}
	}
	if moved {
		close(f.progress)
		f.progress = make(chan struct{})
	}
}

// Sync blocks until the fan-out has folded in every change its inputs' buckets held when Sync
// was called and, while it holds the lease, written what they imply to desired-rbac. After it,
// a key missing from desired-rbac is one the fan-out does not want, not one it has yet to write.
func (f *fanout) Sync(ctx context.Context) error {
	var want [numInputs]uint64
	var err error
	if want[inTemplates], err = f.templates.Current(ctx); err != nil {
		return err
	}
	if want[inBindings], err = f.bindings.Current(ctx); err != nil {
		return err
	}
	if want[inClusters], err = f.clusters.Current(ctx); err != nil {
		return err
	}
	if want[inNamespaces], err = f.namespaces.Current(ctx); err != nil {
		return err
	}
	for {
		f.mu.RLock()
		folded, ch := f.folded, f.progress
		f.mu.RUnlock()
		behind := false
		for i := range want {
			behind = behind || folded[i] < want[i]
		}
		if !behind {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("fan-out at %v, inputs at %v: %w", folded, want, ctx.Err())
		case <-ch:
		}
	}
}

// collect deletes every tombstone the model still does not want whose removal the cluster's
// agent has confirmed: its applied status says the object is absent, for this tombstone's
// revision or a later one. The agent then drops its status too, so neither bucket keeps a key
// per object ever removed. An agent that has not confirmed (offline, or still deleting) keeps
// the tombstone until it does; a deregistered cluster's keys are deleted by plan.
func (f *fanout) collect(ctx context.Context) error {
	f.mu.Lock()
	var ops []*op
	for k, w := range f.written {
		if !w.tombstone || f.m.desired(w.t) != nil || !f.m.clusters[w.t.cluster] {
			continue
		}
		st, ok := f.status(subjects.AppliedKey(subjects.DesiredRBACBucket, k))
		if ok && st.GetAbsent() && st.GetDesiredRevision() >= w.revision {
			ops = append(ops, &op{key: k, t: w.t, kind: "collect"})
		}
	}
	f.mu.Unlock()
	if len(ops) == 0 {
		return nil
	}
	f.log.Debug("collecting confirmed tombstones", zap.Int("keys", len(ops)))
	return f.writeAll(ctx, ops)
}

// next applies one input change to the model, appending the targets it touches to dirty. It
// waits for one when block is set; otherwise it reports false if none is queued.
func (f *fanout) next(ctx context.Context, block bool, tick <-chan time.Time,
	tCh <-chan view.Update[*rbacv1.RoleTemplate], bCh <-chan view.Update[*rbacv1.ProjectRoleBinding],
	cCh <-chan view.Update[*clusterv1.Cluster], nCh <-chan nsUpdate, dirty *[]target) (bool, error) {
	if !block {
		select {
		case u, ok := <-tCh:
			return f.take(ok, inTemplates, u.Revision, u.Time, func() []target { return f.applyTemplate(u) }, dirty)
		case u, ok := <-bCh:
			return f.take(ok, inBindings, u.Revision, u.Time, func() []target { return f.applyBinding(u) }, dirty)
		case u, ok := <-cCh:
			return f.take(ok, inClusters, u.Revision, u.Time, func() []target { return f.applyCluster(u) }, dirty)
		case u, ok := <-nCh:
			return f.take(ok, inNamespaces, u.rev, u.at, func() []target { return f.applyNamespace(u) }, dirty)
		default:
			return false, nil
		}
	}
	select {
	case <-ctx.Done():
		return false, ctx.Err()
	case <-tick:
		return false, errCollectDue
	case u, ok := <-tCh:
		return f.take(ok, inTemplates, u.Revision, u.Time, func() []target { return f.applyTemplate(u) }, dirty)
	case u, ok := <-bCh:
		return f.take(ok, inBindings, u.Revision, u.Time, func() []target { return f.applyBinding(u) }, dirty)
	case u, ok := <-cCh:
		return f.take(ok, inClusters, u.Revision, u.Time, func() []target { return f.applyCluster(u) }, dirty)
	case u, ok := <-nCh:
		return f.take(ok, inNamespaces, u.rev, u.at, func() []target { return f.applyNamespace(u) }, dirty)
	}
}

func (f *fanout) take(ok bool, input int, rev uint64, at time.Time, apply func() []target, dirty *[]target) (bool, error) {
	if !ok {
		return false, errResubscribe
	}
	f.mu.Lock()
	ts := apply()
	if !at.IsZero() {
		for _, t := range ts {
			k := t.key()
			if first, ok := f.changedAt[k]; !ok || at.Before(first.at) {
				f.changedAt[k] = change{at: at, input: input}
			}
		}
	}
	*dirty = append(*dirty, ts...)
	f.taken[input] = max(f.taken[input], rev)
	f.mu.Unlock()
	return true, nil
}

// The apply functions fold one input change into the model; the caller holds f.mu.

func (f *fanout) applyTemplate(u view.Update[*rbacv1.RoleTemplate]) []target {
	if u.Op == view.Delete {
		return f.m.setTemplate(u.Value.GetName(), nil)
	}
	return f.m.setTemplate(u.Value.GetName(), u.Value)
}

func (f *fanout) applyBinding(u view.Update[*rbacv1.ProjectRoleBinding]) []target {
	if u.Op == view.Delete {
		return f.m.setPRB(u.Key, nil)
	}
	return f.m.setPRB(u.Key, u.Value)
}

func (f *fanout) applyCluster(u view.Update[*clusterv1.Cluster]) []target {
	return f.m.setCluster(u.Value.GetName(), u.Op == view.Put, f.writtenOn)
}

func (f *fanout) applyNamespace(u nsUpdate) []target {
	if u.key == "" {
		return nil // a position mark, no change
	}
	return f.m.setNamespaceBinding(u.key, u.grant, f.writtenAt)
}

// op is one write to the desired bucket.
type op struct {
	key       string
	t         target
	data      []byte // nil: delete the key
	tombstone bool
	kind      string // put, tombstone, delete, collect (metrics)
	result    uint64
	// since is when the change this write carries out was made (zero: a resync's write), and
	// cause the input it came from.
	since time.Time
	cause int
}

// change is the earliest change that dirtied a target key: when, and on which input.
type change struct {
	at    time.Time
	input int
}

// flush recomputes dirty targets and writes those whose object changed, pipelined, retrying
// failed writes until they succeed or ctx ends.
func (f *fanout) flush(ctx context.Context, dirty []target) error {
	if len(dirty) == 0 {
		return nil
	}
	start := time.Now()
	f.mu.Lock()
	ops := f.plan(dirty)
	f.mu.Unlock()

	if err := f.writeAll(ctx, ops); err != nil {
		return err
	}
	f.rounds.Observe(time.Since(start).Seconds())
	return nil
}

// writeAll writes ops, retrying the failed ones with backoff until all succeed or ctx ends.
func (f *fanout) writeAll(ctx context.Context, ops []*op) error {
	delay := 50 * time.Millisecond
	for len(ops) > 0 {
		failed, err := f.write(ctx, ops)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		f.log.Warn("desired write failed; retrying", zap.Int("keys", len(failed)), zap.Duration("in", delay), zap.Error(err))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		// At most a second: a revocation must reach the clusters as soon as the bucket's
		// leader is back (the usual cause of a failed write is its election).
		delay = min(2*delay, time.Second)
		ops = failed
	}
	return nil
}

// plan decides the write of each dirty target; the caller holds f.mu.
func (f *fanout) plan(dirty []target) []*op {
	seen := make(map[string]bool, len(dirty))
	var ops []*op
	defer func() {
		for _, o := range ops {
			c := f.changedAt[o.key]
			o.since, o.cause = c.at, c.input
		}
		clear(f.changedAt)
	}()
	for _, t := range dirty {
		k := t.key()
		if seen[k] {
			continue
		}
		seen[k] = true
		want := f.m.desired(t)
		cur := f.written[k]
		switch {
		case want != nil:
			data := encode(want)
			if cur != nil && cur.sum == digestOf(data) {
				f.skipped.Inc()
				continue
			}
			ops = append(ops, &op{key: k, t: t, data: data, kind: "put"})
		case cur == nil:
		case !f.m.clusters[t.cluster]:
			// A deregistered cluster has no agent left to act on a tombstone.
			ops = append(ops, &op{key: k, t: t, kind: "delete"})
		case !cur.tombstone:
			ops = append(ops, &op{key: k, t: t, data: encode(tombstone()), tombstone: true, kind: "tombstone"})
		default:
			f.skipped.Inc()
		}
	}
	return ops
}

// write publishes ops to the bucket's subjects without waiting for each acknowledgement (the KV
// protocol: a put is a message on $KV.<bucket>.<key>), then records what got stored. It
// returns the ops that failed.
func (f *fanout) write(ctx context.Context, ops []*op) ([]*op, error) {
	futures := make([]jetstream.PubAckFuture, len(ops))
	var firstErr error
	for i, o := range ops {
		msg := nats.NewMsg(f.kvPrefix + o.key)
		if o.data != nil {
			msg.Data = o.data
		} else {
			msg.Header.Set("KV-Operation", "DEL")
		}
		fut, err := f.js.PublishMsgAsync(msg)
		if err != nil {
			firstErr = fmt.Errorf("write desired %s: %w", o.key, err)
			break
		}
		futures[i] = fut
	}
	var failed []*op
	for i, fut := range futures {
		if fut == nil {
			failed = append(failed, ops[i])
			continue
		}
		select {
		case ack := <-fut.Ok():
			ops[i].result = ack.Sequence
		case err := <-fut.Err():
			failed = append(failed, ops[i])
			if firstErr == nil {
				firstErr = fmt.Errorf("write desired %s: %w", ops[i].key, err)
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	for _, o := range ops {
		if o.result == 0 {
			continue
		}
		f.writes.WithLabelValues(o.kind).Inc()
		if o.data == nil {
			f.forget(o.key, o.t)
		} else {
			f.remember(o.key, &written{t: o.t, sum: digestOf(o.data), tombstone: o.tombstone, revision: o.result})
		}
	}
	f.mu.Unlock()
	f.measure(ops)
	if len(failed) > 0 && firstErr == nil {
		firstErr = errors.New("unacknowledged writes")
	}
	return failed, firstErr
}

// measure starts the propagation clock of each written grant (a put) and revocation (a
// tombstone); a deleted key has no agent left to report on it. A status the agent already
// reported (a fast agent beats this call) is taken at once.
func (f *fanout) measure(ops []*op) {
	for _, o := range ops {
		if o.result == 0 {
			continue
		}
		switch o.kind {
		case "put", "tombstone":
			// A role template's change re-writes the objects of every binding of it: its
			// own kind, whichever way. Bindings, clusters and namespaces grant or revoke.
			kind := "grant"
			switch {
			case o.cause == inTemplates && !o.since.IsZero():
				kind = "role_template"
			case o.tombstone:
				kind = "revoke"
			}
			f.prop.Written(o.key, o.result, kind, o.since)
			if f.status != nil {
				if st, ok := f.status(appliedPrefix + o.key); ok {
					f.prop.Reported(o.key, st)
				}
			}
		default:
			f.prop.Forget(o.key)
		}
	}
}

// Ready is closed after the first full reconcile, or in a follower once its model is built.
func (f *fanout) Ready() <-chan struct{} { return f.ready }
