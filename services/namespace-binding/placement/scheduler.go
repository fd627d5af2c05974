package placement

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	core "github.com/fleetstream/fleetstream/pkg/placement"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// The placement scheduler: it decides every placement whose inputs changed and appends each
// changed decision as PlacementDecisionsChanged.
//
// A placement's inputs are its spec, the sets bound to its project, and the fleet: every
// cluster's labels, claims, taints and resources, the sets and the add-on scores. Each is
// fingerprinted; a placement is decided again only when its fingerprint moved or a moment the
// last decision named (a toleration running out, a score expiring) has come, so heartbeats and
// unrelated writes cost a hash, not a schedule, and "decisions change only when an input
// changes" holds by construction. Other placements' decisions feed Balance but are not an
// input: one placement moving does not re-decide the rest (OCM does the same between resyncs).
//
// A decision that keeps the clusters, groups and conditions but scores them differently, or
// arms, drops or moves its timer, is appended too, so what the API shows is the last evaluation;
// score-only changes at most once per Config.ScoreRefresh per placement (storeEvaluation).
//
// Fingerprints live in memory: after a start every placement is decided once, and a decision
// equal to the stored one appends nothing. Replicas decide the same inputs alike; the append
// expects the decision subject's last sequence, so of two replicas one writes and the other
// sees its decision on the next round.

// schedulerDebounce gathers a burst of changes (an import adding 100 clusters) into one round.
const schedulerDebounce = 50 * time.Millisecond

type schedulerState struct {
	fleetSum [32]byte
	fleet    *core.Fleet
	// fleetInputs are the change channels of the caches the fleet was built from: while none
	// has fired, the fleet (and its fingerprint) stands, and a round woken by a decision or a
	// placement does not walk every cluster again.
	fleetInputs []<-chan struct{}
	// inputs remembers each cluster's scheduling facts by revision (fleetinputs.go).
	inputs fleetInputs
	// decided is each placement's input fingerprint at its last decision in this process.
	decided map[string][32]byte
	// next is the moment each placement must be decided again with no input changing.
	next map[string]time.Time
	// scoreStored is when each placement's last decision that changed only scores or its
	// timer was stored: the next such one waits until ScoreRefresh has passed.
	scoreStored map[string]time.Time
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

// kickScheduler asks for a round now (an API write the caller waits on).
func (s *Service) kickScheduler() {
	select {
	case s.schedKick <- struct{}{}:
	default:
	}
}

// RunScheduler runs the scheduler until ctx is done. One replica at a time: the caller holds
// the lease (namespace-binding's PlacementLease) for as long as it runs.
func (s *Service) RunScheduler(ctx context.Context) error {
	st := &schedulerState{decided: map[string][32]byte{}, next: map[string]time.Time{}, scoreStored: map[string]time.Time{}}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		s.rounds.start()
		// Take the change channels before deciding, so a change during the round wakes the
		// next one.
		changed := []<-chan struct{}{s.clusters.Changed(), s.clusterSets.Changed(), s.setBindings.Changed(),
			s.placements.Changed(), s.addOnScores.Changed(), s.decisions.Changed()}
		began := time.Now()
		wake, err := s.scheduleRound(ctx, st)
		took := time.Since(began)
		s.rounds.finish()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			s.log.Error("placement scheduling round", zap.Error(err))
			wake = s.now().Add(time.Second) // retried; the round's writes are idempotent
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		if !wake.IsZero() {
			timer.Reset(max(time.Until(wake), 0))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.schedKick:
			// An API write waits on this round: only the short debounce, whatever a round costs.
			took = 0
		case <-timer.C:
		case <-changed[0]:
		case <-changed[1]:
		case <-changed[2]:
		case <-changed[3]:
		case <-changed[4]:
		case <-changed[5]:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(debounceAfter(took)):
		}
	}
}

// debounceAfter is how long the scheduler gathers changes after a round that took took: at
// least schedulerDebounce, and long enough that rounds take at most a fifth of a core however
// large the fleet. A round passes over every cluster (its fleet's fingerprint), and during a
// 10,000-cluster join, with a change every few milliseconds, back-to-back rounds were a tenth
// of the hub's CPU (docs/scale.md).
func debounceAfter(took time.Duration) time.Duration {
	return min(max(schedulerDebounce, 4*took), time.Second)
}

// scheduleRound decides what is due and returns the earliest moment a decision must be made
// again with no input changing (zero for none).
func (s *Service) scheduleRound(ctx context.Context, st *schedulerState) (time.Time, error) {
	now := s.now()
	if err := s.refreshFleet(st); err != nil {
		return time.Time{}, err
	}
	placements := s.placements.List(nil)
	live := make(map[string]bool, len(placements))
	// Balance counts every other placement's decision: the total, minus the placement's own
	// while it is decided, updated as decisions change within the round.
	counts := map[string]int{}
	for _, d := range s.decisions.List(nil) {
		for _, c := range decidedClusters(d) {
			counts[c]++
		}
	}
	var firstErr error
	for _, p := range placements {
		key := placementKey(p.Project, p.Name)
		live[key] = true
		sum := s.inputSum(st, p)
		if _, known := st.decided[key]; !known {
			// First round of this process: a decision made from these very inputs (by an
			// earlier process or another replica) stands, so a restart moves nothing.
			if d, ok := s.decisions.Get(key); ok && bytes.Equal(d.InputDigest, sum[:]) {
				st.decided[key] = sum
				if d.NextEvaluation != nil {
					st.next[key] = d.NextEvaluation.AsTime()
				}
			}
		}
		if st.decided[key] == sum && (st.next[key].IsZero() || now.Before(st.next[key])) {
			continue
		}
		if err := s.decide(ctx, st, p, sum, counts, now); err != nil {
			if ctx.Err() != nil {
				return time.Time{}, ctx.Err()
			}
			delete(st.decided, key) // decided again next round
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	// A deleted placement's decision goes too, with a last event removing every cluster, so
	// whoever follows it (namespaces, subscribers) lets go.
	for _, d := range s.decisions.List(nil) {
		key := placementKey(d.Project, d.Name)
		if live[key] || !s.PlacementGone(ctx, d.Project, d.Name) {
			continue
		}
		if _, err := s.store.Append(ctx, subjects.PlacementDecision(d.Project, d.Name), key, events.At(d.Revision),
			&placementv1.PlacementDecisionsChanged{Project: d.Project, Name: d.Name, Removed: sorted(decidedClusters(d))}); err != nil && !events.IsConflict(err) && firstErr == nil {
			firstErr = fmt.Errorf("drop decisions of deleted placement %s/%s: %w", d.Project, d.Name, err)
		}
		delete(st.decided, key)
		delete(st.next, key)
		delete(st.scoreStored, key)
	}
	var wake time.Time
	for key, t := range st.next {
		if !live[key] {
			delete(st.next, key)
			delete(st.scoreStored, key)
			continue
		}
		if !t.IsZero() && (wake.IsZero() || t.Before(wake)) {
			wake = t
		}
	}
	return wake, firstErr
}

func (s *Service) decide(ctx context.Context, st *schedulerState, p *placementv1.Placement, sum [32]byte, counts map[string]int, now time.Time) error {
	key := placementKey(p.Project, p.Name)
	cur, hasCur := s.decisions.Get(key)
	prev := decidedClusters(cur)
	for _, c := range prev {
		counts[c]--
	}
	var bound []string
	for _, b := range s.setBindings.Lookup(byProject(p.Project)) {
		bound = append(bound, b.ClusterSet)
	}
	d, err := st.fleet.Schedule(ctx, toCorePlacement(p), core.PlacementState{
		BoundClusterSets: bound, PreviousDecision: prev, OtherDecisions: counts, Now: now})
	if err != nil {
		for _, c := range prev {
			counts[c]++
		}
		return fmt.Errorf("schedule placement %s/%s: %w", p.Project, p.Name, err)
	}
	restore := func() {
		for _, c := range prev {
			counts[c]++
		}
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
			restore()
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
			restore()
			return nil
		}
		// The subject may end in a deleted placement's last event: expect exactly that.
		last, _, err := events.Last(ctx, s.stream, subjects.PlacementDecision(p.Project, p.Name))
		if err != nil {
			restore()
			return err
		}
		expect = events.At(last)
	}
	_, err = s.store.Append(ctx, subjects.PlacementDecision(p.Project, p.Name), key, expect,
		&placementv1.PlacementDecisionsChanged{Project: p.Project, Name: p.Name, Decisions: next, Added: added, Removed: removed})
	if events.IsConflict(err) {
		// Another writer decided first; its decision arrives in the view and wakes a round.
		restore()
		return nil
	}
	if err != nil {
		restore()
		return fmt.Errorf("append decisions of placement %s/%s: %w", p.Project, p.Name, err)
	}
	// Balance for the rest of the round counts the decision just written.
	for _, c := range decidedClusters(next) {
		counts[c]++
	}
	st.decided[key], st.next[key] = sum, d.NextEvaluation
	s.log.Info("placement decided", zap.String("project", p.Project), zap.String("placement", p.Name),
		zap.Strings("added", added), zap.Strings("removed", removed), zap.Int32("selected", d.NumberOfSelectedClusters))
	return nil
}

// refreshFleet rebuilds the scheduler's fleet when a cluster, set or score changed in a way the
// scheduler can see.
func (s *Service) refreshFleet(st *schedulerState) error {
	if st.fleet != nil && !anyClosed(st.fleetInputs) {
		return nil
	}
	// Taken before reading, so a change while reading is seen next round.
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

// inputSum fingerprints a placement's inputs: the fleet, its spec and its project's bound sets.
func (s *Service) inputSum(st *schedulerState, p *placementv1.Placement) [32]byte {
	h := sha256.New()
	h.Write(st.fleetSum[:])
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], p.Revision)
	h.Write(n[:])
	var bound []string
	for _, b := range s.setBindings.Lookup(byProject(p.Project)) {
		bound = append(bound, b.ClusterSet)
	}
	slices.Sort(bound)
	for _, b := range bound {
		h.Write([]byte(b))
		h.Write([]byte{0})
	}
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

// WaitSchedulingRound blocks until the scheduler has made a whole round that began after the
// call, with the clusters, sets, set bindings, placements, decisions and add-on scores as they
// are in their buckets now: whatever those inputs make it decide has then been appended. It
// asks for the round itself, since a round that changes nothing is otherwise not due. For
// tests, before asserting that a decision did not change (namespace-binding's tests reach it
// through the Service's WaitSchedulingRound, compiled into its test binary alone); only the
// replica running RunScheduler schedules, so on another one it waits until ctx is done.
func (s *Service) WaitSchedulingRound(ctx context.Context) error {
	for _, current := range []func(context.Context) (uint64, error){s.clusters.Current, s.clusterSets.Current,
		s.setBindings.Current, s.placements.Current, s.decisions.Current, s.addOnScores.Current} {
		if _, err := current(ctx); err != nil {
			return err
		}
	}
	want := s.rounds.next()
	s.kickScheduler()
	if err := s.rounds.wait(ctx, want); err != nil {
		return fmt.Errorf("wait for a scheduling round: %w", err)
	}
	return nil
}

// passes counts the placement scheduler's rounds, so a caller
// can wait for a whole round that began after it asked (WaitSchedulingRound).
type passes struct {
	mu            sync.Mutex
	started, done uint64
	changed       chan struct{}
}

func newPasses() *passes { return &passes{changed: make(chan struct{})} }

func (p *passes) start() {
	p.mu.Lock()
	p.started++
	p.mu.Unlock()
}

func (p *passes) finish() {
	p.mu.Lock()
	p.done = p.started
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

// next is the pass a caller asking now waits for: the first to begin after the call.
func (p *passes) next() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.started + 1
}

// wait blocks until pass want has finished.
func (p *passes) wait(ctx context.Context, want uint64) error {
	for {
		p.mu.Lock()
		done, ch := p.done, p.changed
		p.mu.Unlock()
		if done >= want {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}
