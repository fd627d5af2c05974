package placement

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DecisionBuckets fit the scheduler's promise: a placement's own change is decided at once (a
// few JetStream round trips), a fleet change after a debounce of 50 ms up to a second of quiet
// (more when a large fleet's rebuild takes long), so fine from 10 ms to a few seconds, up to the
// 30 s past which a decision is plainly stuck.
var DecisionBuckets = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

// Triggers of fleetstream_placement_decision_duration_seconds.
const (
	triggerPlacement = "placement" // the placement itself, or its project's set bindings
	triggerFleet     = "fleet"     // a cluster's scheduling facts, a cluster set, an add-on score
)

// decisionLatency measures the time from a change of a placement's inputs, as the scheduler's
// caches received it (the view entry's time: its event's plus the projection's lag), to the
// append of the decision that changed its clusters for it. Sources note the changes as they
// queue them (their goroutines, hence the lock); the worker takes them.
type decisionLatency struct {
	hist *prometheus.HistogramVec

	mu sync.Mutex
	// placement is, per placement key, the earliest own-input change not yet decided on.
	placement map[string]time.Time
	// fleet is the earliest fleet change not yet taken by a fleet rebuild.
	fleet time.Time
}

func newDecisionLatency() *decisionLatency {
	return &decisionLatency{
		hist: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "fleetstream_placement_decision_duration_seconds",
			Help: "Time from a change of a placement's inputs (as the scheduler's caches received it) to the append of the decision that changed its clusters, " +
				"by trigger: placement (the placement or its project's set bindings) or fleet (a cluster's scheduling facts, a cluster set, an add-on score). " +
				"Decisions that keep the clusters (scores only), and those of a start or a resync, are not observed.",
			Buckets: DecisionBuckets,
		}, []string{"trigger"}),
		placement: map[string]time.Time{},
	}
}

func earlier(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// notePlacement records a change of key's own inputs at t (zero: a snapshot, no change).
func (l *decisionLatency) notePlacement(key string, t time.Time) {
	if t.IsZero() {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.placement[key] = earlier(l.placement[key], t)
}

// noteFleet records a change of the fleet at t.
func (l *decisionLatency) noteFleet(t time.Time) {
	if t.IsZero() {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fleet = earlier(l.fleet, t)
}

// takePlacement returns and forgets key's pending own-input change.
func (l *decisionLatency) takePlacement(key string) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.placement[key]
	delete(l.placement, key)
	return t
}

// takeFleet returns and forgets the pending fleet change.
func (l *decisionLatency) takeFleet() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.fleet
	l.fleet = time.Time{}
	return t
}

// observe records a decision appended at now for a change at since by trigger.
func (l *decisionLatency) observe(trigger string, since, now time.Time) {
	if since.IsZero() {
		return
	}
	l.hist.WithLabelValues(trigger).Observe(max(now.Sub(since), 0).Seconds())
}
