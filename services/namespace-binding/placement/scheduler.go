package placement

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	core "github.com/fleetstream/fleetstream/pkg/placement"
	"github.com/fleetstream/fleetstream/pkg/reconcile"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// The placement scheduler: a controller (pkg/reconcile) keyed by placement (placementKey, the
// key of the placements and decisions views) that decides a placement and appends a changed
// decision as PlacementDecisionsChanged, and appends a deleted placement's last one.
//
// A placement's inputs are its spec, the sets bound to its project, and the fleet: every
// cluster's labels, claims, taints and resources, the sets and the add-on scores. Each is
// fingerprinted; a placement is decided again only when its fingerprint moved or a moment the
// last decision named (a toleration running out, a score expiring) has come, so heartbeats,
// resyncs and unrelated writes cost a hash, not a schedule, and "decisions change only when an
// input changes" holds by construction.
//
// What queues a placement:
//   - a change of its spec or of its decision (another writer's, or a deleted placement's left
//     over), at once;
//   - a set bound to or unbound from its project, at once;
//   - a change of the fleet, through fleetChangedKey: every change of a cluster's scheduling
//     facts, of a set or of a score queues it once the fleet debounce has passed
//     (reconcile.Delay; a burst of changes, a fleet joining, waits once and is reconciled once),
//     and it rebuilds the fleet and, when its fingerprint moved, queues every placement at once
//     (each one's fingerprint covers the whole fleet, so every one's moved: a placement reading
//     none of the changed clusters costs a Schedule that decides what it had, appending
//     nothing). While the placements the last fleet change queued are being decided, and for
//     four times as long after (quiet), it waits: the old loop's adaptive debounce;
//   - the moment its decision named, by its own reconcile (AddAfter);
//   - every placement, at the start and every schedulerResync.
//
// Other placements' decisions feed Balance (how many placements decided each cluster) but are
// not an input: a change of one placement's decision queues that placement alone, never the
// placements that read it. Re-deciding the readers would make every decision depend on when the
// others were made (A moving re-balances B, which re-balances A: namespaces moved between
// clusters for no change anyone made), and would break "decisions change only when an input
// changes"; a placement reads the others' counts afresh whenever it is decided for a reason of
// its own. OCM does the same: other placements' decisions are read at scheduling time, not
// watched. The counts include what this scheduler appended and the view does not show yet
// (balance), and one worker decides one placement at a time, so placements decided one after
// another (a fleet change queues them all) see each other as they did in one round.
//
// A decision that keeps the clusters, groups and conditions but scores them differently, or
// arms, drops or moves its timer, is appended too, so what the API shows is the last evaluation;
// score-only changes at most once per Config.ScoreRefresh per placement (storeEvaluation).
//
// A placement whose scheduling fails (its append, a bus outage) is queued again with its own
// backoff (reconcile.Config.BaseDelay doubling to MaxDelay); the others go on.
//
// Fingerprints live in memory: after a start every placement is decided once, and a decision
// equal to the stored one appends nothing. Only the holder of namespace-binding's
// PlacementLease runs the scheduler; should two ever decide, each append expects the decision
// subject's last sequence, so one writes and the other sees its decision arrive.

// fleetKey and fleetChangedKey are the scheduler's keys that are no placement's (placement keys
// are keys.Join(project, name) of DNS labels): the fleet, rebuilt when a cluster, set or score
// changed. fleetKey (the start, a resync, Sync) rebuilds it at once; fleetChangedKey (a change)
// waits for the quiet after the last change's work.
const (
	fleetKey        = "\x00fleet"
	fleetChangedKey = "\x00fleet-changed"
)

// schedulerDebounce is the least time a change of the fleet waits before it is acted on, so a
// burst of changes (an import adding 100 clusters) costs one rebuild and one decision of each
// placement.
const schedulerDebounce = 50 * time.Millisecond

// schedulerResync is how often every placement is looked at with nothing changing: a safety
// net, since each is queued by its inputs and at its own moment.
const schedulerResync = time.Minute

// Backoff of a placement whose scheduling failed: as soon as the old loop's retry of every
// placement (1 s) at first, and at most a minute apart.
const (
	schedulerRetry    = time.Second
	schedulerMaxRetry = time.Minute
)

type schedulerState struct {
	fleetSum [32]byte
	fleet    *core.Fleet
	// fleetInputs are the change channels of the caches the fleet was built from: while none
	// has fired, the fleet (and its fingerprint) stands.
	fleetInputs []<-chan struct{}
	// queuedSum is the fleet fingerprint every placement was last queued for (reconcileFleet).
	queuedSum [32]byte
	// inputs remembers each cluster's scheduling facts by revision (fleetinputs.go).
	inputs fleetInputs
	// own is each placement's own inputs (ownInputs) when it was last looked at.
	own map[string]string
	// decided is each placement's input fingerprint at its last decision in this run.
	decided map[string][32]byte
	// next is the moment each placement must be decided again with no input changing.
	next map[string]time.Time
	// scoreStored is when each placement's last decision that changed only scores or its
	// timer was stored: the next such one waits until ScoreRefresh has passed.
	scoreStored map[string]time.Time
	balance     balance
	// generation measures what a fleet change costs: the placements reconcileFleet queued and not
	// yet reconciled, and the time the rebuild and their reconciles took so far.
	generation     map[string]struct{}
	generationWork time.Duration
	// fleetDeferred: fleetChangedKey came while a generation was being decided; it is queued
	// again once that is done, after the quiet.
	fleetDeferred bool
	// generationSince is the earliest fleet change the current generation decides on (zero
	// for a start or a resync): what its decisions are measured from.
	generationSince time.Time
}

// scheduler is the placement scheduler's reconciler. One worker runs it: the state is the
// worker's alone, but for quietUntil, which the sources read.
type scheduler struct {
	s    *Service
	ctrl *reconcile.Controller
	st   schedulerState
	// latency measures input change → decision (decisionlatency.go).
	latency *decisionLatency
	// quietUntil (unix ns) is when the next fleet change may be acted on: four times what
	// deciding every placement for the last one took, after that was done.
	quietUntil atomic.Int64
}

func newScheduler(s *Service) *scheduler {
	sc := &scheduler{s: s, latency: newDecisionLatency()}
	sc.ctrl = reconcile.New(reconcile.Config{Name: "placement-scheduler", Keys: sc.keys, Resync: schedulerResync,
		BaseDelay: schedulerRetry, MaxDelay: schedulerMaxRetry, Log: s.log}, sc)
	return sc
}

// debounce is how long a change of the fleet waits before fleetChangedKey is queued: at least
// schedulerDebounce, and until the quiet after the last change's work has passed
// (fleetChanged waits for the rest), so fleet changes cost at most a fifth of a core however
// large the fleet. A rebuild passes over every cluster and re-decides every placement, and
// during a 10,000-cluster join, with a change every few milliseconds, back-to-back rounds were
// a tenth of the hub's CPU (docs/scale.md). The old loop's adaptive debounce, with the same
// bounds; a placement's own change is not debounced at all (its key is queued at once).
func (sc *scheduler) debounce() time.Duration {
	return max(schedulerDebounce, time.Until(time.Unix(0, sc.quietUntil.Load())))
}

// quiet is the pause after work that took took: four times as long, within schedulerDebounce
// and a second.
func quiet(took time.Duration) time.Duration { return min(max(schedulerDebounce, 4*took), time.Second) }

// RunScheduler runs the scheduler until ctx is done. One replica at a time: the caller holds
// the lease (namespace-binding's PlacementLease) for as long as it runs; each run starts from
// no fingerprints.
func (s *Service) RunScheduler(ctx context.Context) error {
	sc := s.sched
	sc.st = schedulerState{own: map[string]string{}, decided: map[string][32]byte{}, next: map[string]time.Time{}, scoreStored: map[string]time.Time{},
		balance: balance{counts: map[string]int{}, counted: map[string]countedDecision{}}}
	fleet := func(src reconcile.Source) reconcile.Source { return reconcile.Delay(src, sc.debounce) }
	return sc.ctrl.Run(ctx,
		reconcile.Watch(s.placements, func(u view.Update[*placementv1.Placement]) []string {
			sc.latency.notePlacement(u.Key, u.Time)
			return []string{u.Key}
		}),
		reconcile.Watch(s.decisions, nil),
		reconcile.Watch(s.setBindings, func(u view.Update[*placementv1.ClusterSetBinding]) []string {
			keys := sc.placementsOfBinding(u)
			for _, k := range keys {
				sc.latency.notePlacement(k, u.Time)
			}
			return keys
		}),
		fleet(s.clusters.Watch(fleetChange(sc, schedulingFactsChanged))),
		fleet(reconcile.Watch(s.clusterSets, fleetChange(sc, toFleet[*placementv1.ClusterSet]))),
		fleet(reconcile.Watch(s.addOnScores, fleetChange(sc, toFleet[*placementv1.AddOnScore]))))
}

// fleetChange is keys, noting the change's time for the decisions it leads to when it queues
// the fleet's rebuild.
func fleetChange[T proto.Message](sc *scheduler, keys func(view.Update[T]) []string) func(view.Update[T]) []string {
	return func(u view.Update[T]) []string {
		out := keys(u)
		if len(out) > 0 {
			sc.latency.noteFleet(u.Time)
		}
		return out
	}
}

// keys are the fleet and every placement or decision (perhaps a deleted placement's).
func (sc *scheduler) keys() []string {
	out := append([]string{fleetKey}, cacheKeys(sc.s.placements)...)
	for _, k := range cacheKeys(sc.s.decisions) {
		if _, ok := sc.s.placements.Get(k); !ok {
			out = append(out, k)
		}
	}
	return out
}

func cacheKeys[T proto.Message](c *view.Cache[T]) []string {
	entries := c.Entries(nil)
	out := make([]string, len(entries))
	for i, e := range entries {
		out[i] = e.Key
	}
	return out
}

func (sc *scheduler) placementsOfBinding(u view.Update[*placementv1.ClusterSetBinding]) []string {
	return sc.s.placements.Keys(byProject(u.Value.GetProject()))
}

func toFleet[T proto.Message](view.Update[T]) []string { return []string{fleetChangedKey} }

// schedulingFactsChanged queues fleetChangedKey for a change of a cluster the scheduler can see: not
// for a connection or a condition, which a joining or reconnecting fleet makes by the thousand.
func schedulingFactsChanged(u view.Update[*clusterv1.Cluster]) []string {
	if u.Op == view.Put && u.Prev != nil && proto.Equal(schedulingFacts(u.Prev), schedulingFacts(u.Value)) {
		return nil
	}
	return []string{fleetChangedKey}
}

// Reconcile rebuilds the fleet (fleetKey) or decides one placement.
func (sc *scheduler) Reconcile(ctx context.Context, key string) error {
	began := time.Now()
	defer func() { sc.measure(key, time.Since(began)) }()
	switch key {
	case fleetKey:
		return sc.reconcileFleet()
	case fleetChangedKey:
		return sc.fleetChanged()
	}
	return sc.reconcilePlacement(ctx, key)
}

// fleetChanged rebuilds the fleet for a change, once the placements the last change queued are
// decided and the quiet after them has passed.
func (sc *scheduler) fleetChanged() error {
	if len(sc.st.generation) > 0 {
		sc.st.fleetDeferred = true
		return nil
	}
	if wait := time.Until(time.Unix(0, sc.quietUntil.Load())); wait > 0 {
		sc.ctrl.AddAfter(fleetChangedKey, wait)
		return nil
	}
	return sc.reconcileFleet()
}

// measure adds a reconcile's time to its fleet change's, and starts the quiet when that
// change's last placement is done.
func (sc *scheduler) measure(key string, took time.Duration) {
	st := &sc.st
	if key == fleetKey || key == fleetChangedKey {
		st.generationWork += took
		return
	}
	if _, ok := st.generation[key]; !ok {
		return
	}
	delete(st.generation, key)
	st.generationWork += took
	if len(st.generation) == 0 {
		sc.endGeneration()
	}
}

// endGeneration starts the quiet after a fleet change's work, and queues a change that came
// meanwhile for its end.
func (sc *scheduler) endGeneration() {
	st := &sc.st
	q := quiet(st.generationWork)
	sc.quietUntil.Store(time.Now().Add(q).UnixNano())
	if st.fleetDeferred {
		st.fleetDeferred = false
		sc.ctrl.AddAfter(fleetChangedKey, q)
	}
}

// reconcileFleet rebuilds the fleet and, when its fingerprint moved, queues every placement.
func (sc *scheduler) reconcileFleet() error {
	st := &sc.st
	if err := sc.refreshFleet(true); err != nil {
		return err
	}
	// The changes noted so far are seen by this rebuild whether or not they move the
	// fingerprint: one that did not (a set's description) must not date the next one that does.
	since := sc.latency.takeFleet()
	if st.fleetSum == st.queuedSum {
		return nil
	}
	st.queuedSum = st.fleetSum
	st.generationSince = since
	keys := cacheKeys(sc.s.placements)
	st.generation, st.generationWork = make(map[string]struct{}, len(keys)), 0
	for _, k := range keys {
		st.generation[k] = struct{}{}
		sc.ctrl.Add(k)
	}
	if len(keys) == 0 {
		sc.endGeneration()
	}
	return nil
}

// reconcilePlacement decides the placement at key if its inputs moved or its moment came, or
// drops the decision of a deleted one.
func (sc *scheduler) reconcilePlacement(ctx context.Context, key string) error {
	s, st := sc.s, &sc.st
	// The own-input change this look decides on; put back if the decision fails, so its retry
	// is measured from it.
	since := sc.latency.takePlacement(key)
	p, ok := s.placements.Get(key)
	if !ok {
		return sc.dropDecision(ctx, key)
	}
	now := s.now()
	// A placement whose own inputs moved (new to this run, edited, its sets bound or unbound)
	// or whose moment came is decided on the fleet as it is now, as the caller who changed it
	// expects; any other look (its own decision arriving, a resync, a fleet change's queueing)
	// takes the fleet as last rebuilt: a change since has queued fleetChangedKey.
	own := s.ownInputs(p)
	moved := st.own[key] != string(own) || (!st.next[key].IsZero() && !now.Before(st.next[key]))
	if err := sc.refreshFleet(moved); err != nil {
		return err
	}
	st.own[key] = string(own)
	sum := inputSum(st, own)
	if _, known := st.decided[key]; !known {
		// First look in this run: a decision made from these very inputs (by an earlier
		// process or another replica) stands, so a restart moves nothing.
		if d, ok := s.decisions.Get(key); ok && bytes.Equal(d.InputDigest, sum[:]) {
			st.decided[key] = sum
			if d.NextEvaluation != nil {
				st.next[key] = d.NextEvaluation.AsTime()
			}
		}
	}
	if st.decided[key] != sum || (!st.next[key].IsZero() && !now.Before(st.next[key])) {
		if err := sc.decide(ctx, p, sum, now, since); err != nil {
			delete(st.decided, key) // decided again when retried
			sc.latency.notePlacement(key, since)
			return err
		}
	}
	// A moment already past is a decision that lost its append to another writer's: that
	// one's arrival queues the placement.
	if at := st.next[key]; at.After(now) {
		sc.ctrl.AddAfter(key, at.Sub(now))
	}
	return nil
}

// dropDecision appends a deleted placement's last decision event, removing every cluster, so
// whoever follows it (namespaces, subscribers) lets go.
func (sc *scheduler) dropDecision(ctx context.Context, key string) error {
	s, st := sc.s, &sc.st
	forget := func() {
		delete(st.own, key)
		delete(st.decided, key)
		delete(st.next, key)
		delete(st.scoreStored, key)
	}
	d, ok := s.decisions.Get(key)
	if !ok {
		forget()
		return nil
	}
	// A placement this replica's view does not show yet may just have been created: its
	// update queues it again.
	if !s.PlacementGone(ctx, d.Project, d.Name) {
		return nil
	}
	seq, err := s.decisionStore.Append(ctx, subjects.PlacementDecision(d.Project, d.Name), key, events.At(d.Revision),
		&placementv1.PlacementDecisionsChanged{Project: d.Project, Name: d.Name, Removed: sorted(decidedClusters(d))})
	switch {
	case events.IsConflict(err):
		return nil // another writer's event arrives in the view and queues it again
	case err != nil:
		return fmt.Errorf("drop decisions of deleted placement %s/%s: %w", d.Project, d.Name, err)
	}
	st.balance.record(key, seq, nil)
	forget()
	return nil
}

// storeEvaluation says whether next, which decides the same clusters, groups and conditions
// as cur, is to be stored now; if not, at is when it is due (zero for never: nothing to show).
func (s *Service) storeEvaluation(st *schedulerState, key string, cur, next *placementv1.PlacementDecisions, now time.Time) (store bool, at time.Time) {
	if sameEvaluation(cur, next) {
		return false, time.Time{}
	}
	if timerMoved(cur.NextEvaluation, next.NextEvaluation, now) {
		return true, time.Time{}
	}
	due := st.scoreStored[key].Add(s.cfg.ScoreRefresh)
	if now.Before(due) {
		return false, due
	}
	return true, time.Time{}
}

// timerMoved reports whether the shown next evaluation would be wrong in a way that matters:
// one armed or dropped, one brought forward, or one shown that has passed.
func timerMoved(shown, next *timestamppb.Timestamp, now time.Time) bool {
	switch {
	case (shown == nil) != (next == nil):
		return true
	case shown == nil:
		return false
	}
	return !shown.AsTime().After(now) || next.AsTime().Before(shown.AsTime())
}

// earliest is the earlier of two moments, zero meaning none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// decide schedules p on the fleet and appends its decision if it changed.
//
// since is the placement's own-input change it decides on (zero: none); a decision that changes
// the clusters is measured from it, else, in a fleet change's generation, from that change.
func (sc *scheduler) decide(ctx context.Context, p *placementv1.Placement, sum [32]byte, now time.Time, since time.Time) error {
	s, st := sc.s, &sc.st
	key := placementKey(p.Project, p.Name)
	cur, hasCur := s.decisions.Get(key)
	prev := decidedClusters(cur)
	// Balance counts every other placement's decision.
	others, restore := st.balance.without(key, s.decisions, s.placements)
	var bound []string
	for _, b := range s.setBindings.Lookup(byProject(p.Project)) {
		bound = append(bound, b.ClusterSet)
	}
	d, err := st.fleet.Schedule(ctx, toCorePlacement(p), core.PlacementState{
		BoundClusterSets: bound, PreviousDecision: prev, OtherDecisions: others, Now: now})
	restore()
	if err != nil {
		return fmt.Errorf("schedule placement %s/%s: %w", p.Project, p.Name, err)
	}
	next := toDecisions(p.Project, p.Name, d, cur, now)
	next.InputDigest = sum[:]
	if !d.NextEvaluation.IsZero() {
		next.NextEvaluation = timestamppb.New(d.NextEvaluation)
	}
	if hasCur && sameDecision(cur, next) {
		// The clusters stand; what the API shows must still be this evaluation: its scores
		// and its timer. Scores alone may churn (an add-on rewriting its score every second),
		// so they are stored at most once per ScoreRefresh per placement, and a deferred one
		// is stored when that time comes; a timer armed, dropped or brought forward is
		// stored at once, since a wrong one says the decision will not change when it will.
		store, at := s.storeEvaluation(st, key, cur, next, now)
		if !store {
			st.decided[key], st.next[key] = sum, earliest(d.NextEvaluation, at)
			return nil
		}
		st.scoreStored[key] = now
	}
	added, removed := core.DecisionDiff(prev, d)
	expect := events.At(cur.GetRevision())
	if !hasCur {
		// A placement this replica's view still shows may just have been deleted (its
		// decision's removal already folded): never bring its decision back.
		if s.PlacementGone(ctx, p.Project, p.Name) {
			return nil
		}
		// The subject may end in a deleted placement's last event: expect exactly that.
		last, _, err := events.Last(ctx, s.stream, subjects.PlacementDecision(p.Project, p.Name))
		if err != nil {
			return err
		}
		expect = events.At(last)
	}
	seq, err := s.decisionStore.Append(ctx, subjects.PlacementDecision(p.Project, p.Name), key, expect,
		&placementv1.PlacementDecisionsChanged{Project: p.Project, Name: p.Name, Decisions: next, Added: added, Removed: removed})
	if events.IsConflict(err) {
		// Another writer decided first; its decision arrives in the view and queues this
		// placement again.
		return nil
	}
	if err != nil {
		return fmt.Errorf("append decisions of placement %s/%s: %w", p.Project, p.Name, err)
	}
	// Balance counts the decision just written from now on, before the view shows it.
	st.balance.record(key, seq, decidedClusters(next))
	if !hasCur || len(added)+len(removed) > 0 {
		if _, inGeneration := st.generation[key]; since.IsZero() && inGeneration {
			sc.latency.observe(triggerFleet, st.generationSince, time.Now())
		} else {
			sc.latency.observe(triggerPlacement, since, time.Now())
		}
	}
	st.decided[key], st.next[key] = sum, d.NextEvaluation
	s.log.Info("placement decided", zap.String("project", p.Project), zap.String("placement", p.Name),
		zap.Strings("added", added), zap.Strings("removed", removed), zap.Int32("selected", d.NumberOfSelectedClusters))
	return nil
}

// refreshFleet rebuilds the scheduler's fleet when a cluster, set or score changed since it was
// built; unless now, only if there is none yet. A change the scheduler can see queues
// fleetChangedKey, which rebuilds the fleet with now and queues every placement, so the others
// take the fleet as it was: during a join, the placements it queued and their decisions coming back cost no
// rebuild each (a rebuild passes over every cluster), and the joins are gathered per debounce.
func (sc *scheduler) refreshFleet(now bool) error {
	s, st := sc.s, &sc.st
	if st.fleet != nil && (!now || !anyClosed(st.fleetInputs)) {
		return nil
	}
	// Taken before reading, so a change while reading is seen by the next rebuild.
	inputs := []<-chan struct{}{s.clusters.Changed(), s.clusterSets.Changed(), s.addOnScores.Changed()}
	var prev *[32]byte
	if st.fleet != nil {
		prev = &st.fleetSum
	}
	f, sum, err := st.inputs.build(s.clusters.List(nil), s.clusterSets.List(nil), s.addOnScores.List(nil), prev)
	if err != nil {
		return err
	}
	if f == nil {
		st.fleetInputs = inputs
		return nil
	}
	st.fleet, st.fleetSum, st.fleetInputs = f, sum, inputs
	return nil
}

// schedulingFacts is the part of a cluster the scheduler reads.
func schedulingFacts(c *clusterv1.Cluster) *clusterv1.Cluster {
	out := &clusterv1.Cluster{Name: c.Name, Labels: c.Labels, Claims: c.Claims, Taints: c.Taints}
	if r := c.GetStatus().GetResources(); r != nil {
		out.Status = &clusterv1.ClusterStatus{Resources: &clusterv1.ClusterResources{Allocatable: r.Allocatable, Capacity: r.Capacity}}
	}
	return out
}

// ownInputs encodes the inputs that are the placement's own: its spec (by revision) and its
// project's bound sets.
func (s *Service) ownInputs(p *placementv1.Placement) []byte {
	out := binary.BigEndian.AppendUint64(nil, p.Revision)
	var bound []string
	for _, b := range s.setBindings.Lookup(byProject(p.Project)) {
		bound = append(bound, b.ClusterSet)
	}
	slices.Sort(bound)
	for _, b := range bound {
		out = append(append(out, b...), 0)
	}
	return out
}

// inputSum fingerprints a placement's inputs: the fleet and its own (ownInputs).
func inputSum(st *schedulerState, own []byte) [32]byte {
	h := sha256.New()
	h.Write(st.fleetSum[:])
	h.Write(own)
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

func anyClosed(chs []<-chan struct{}) bool {
	for _, ch := range chs {
		select {
		case <-ch:
			return true
		default:
		}
	}
	return false
}

// WaitSchedulingRound blocks until the scheduler has looked at the fleet and every placement
// since the call, with the clusters, sets, set bindings, placements, decisions and add-on scores
// as they are in their buckets now: whatever those inputs make it decide has then been appended
// (reconcile's Sync). For tests, before asserting that a decision did not change
// (namespace-binding's tests reach it through the Service's WaitSchedulingRound, compiled into
// its test binary alone); only the replica running RunScheduler schedules, so on another one it
// waits until ctx is done.
func (s *Service) WaitSchedulingRound(ctx context.Context) error {
	for _, current := range []func(context.Context) (uint64, error){s.clusters.Current, s.clusterSets.Current,
		s.setBindings.Current, s.placements.Current, s.decisions.Current, s.addOnScores.Current} {
		if _, err := current(ctx); err != nil {
			return err
		}
	}
	if err := s.sched.ctrl.Sync(ctx); err != nil {
		return fmt.Errorf("wait for the placement scheduler: %w", err)
	}
	return nil
}

// balance keeps, for Balance, how many placements decided each cluster, in step with the
// decisions view: each placement's decided clusters as counted, with the revision they were
// counted at. A decision this scheduler appended counts at once, until the view shows it.
type balance struct {
	counts  map[string]int
	counted map[string]countedDecision
	// changed fires when the decisions view next changes: until then counts stand.
	changed <-chan struct{}
}

type countedDecision struct {
	rev      uint64
	clusters []string
	// mine: appended by this scheduler, perhaps not in the view yet.
	mine bool
}

func (b *balance) set(key string, c countedDecision) {
	for _, cl := range b.counted[key].clusters {
		if b.counts[cl]--; b.counts[cl] == 0 {
			delete(b.counts, cl)
		}
	}
	for _, cl := range c.clusters {
		b.counts[cl]++
	}
	if c.rev == 0 {
		delete(b.counted, key)
		return
	}
	b.counted[key] = c
}

// record counts a decision this scheduler appended at rev.
func (b *balance) record(key string, rev uint64, clusters []string) {
	b.set(key, countedDecision{rev: rev, clusters: clusters, mine: true})
}

// sync brings the counts in line with the decisions view, keeping the decisions this scheduler
// appended that it does not show yet (of placements that still exist).
func (b *balance) sync(decisions *view.Cache[*placementv1.PlacementDecisions], placements *view.Cache[*placementv1.Placement]) {
	if b.changed != nil {
		select {
		case <-b.changed:
		default:
			return
		}
	}
	b.changed = decisions.Changed()
	seen := map[string]bool{}
	for _, e := range decisions.Entries(nil) {
		seen[e.Key] = true
		c, rev := b.counted[e.Key], e.Value.GetRevision()
		if (c.mine && rev < c.rev) || (!c.mine && c.rev == rev) {
			continue
		}
		b.set(e.Key, countedDecision{rev: rev, clusters: decidedClusters(e.Value)})
	}
	for key, c := range b.counted {
		if seen[key] {
			continue
		}
		if _, exists := placements.Get(key); c.mine && exists {
			continue
		}
		b.set(key, countedDecision{})
	}
}

// without is the counts of every placement's decision but key's, and what restores key's.
func (b *balance) without(key string, decisions *view.Cache[*placementv1.PlacementDecisions], placements *view.Cache[*placementv1.Placement]) (map[string]int, func()) {
	b.sync(decisions, placements)
	own := b.counted[key].clusters
	for _, cl := range own {
		b.counts[cl]--
	}
	return b.counts, func() {
		for _, cl := range own {
			b.counts[cl]++
		}
	}
}
