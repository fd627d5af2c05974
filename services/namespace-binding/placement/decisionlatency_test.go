package placement

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// Input change → decision, by trigger, as the scheduler decides on the real views: a new
// placement's first decision is measured from its change (trigger placement), a cluster joining
// that the placement then selects from the cluster's change (trigger fleet, after the fleet's
// debounce); a look that changes no clusters (a second cluster's label that the placement
// ignores) observes nothing.
func TestDecisionLatencyFromInputChangeToDecision(t *testing.T) {
	const name = "fleetstream_placement_decision_duration_seconds"
	h := startTestHub(t, nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(h.svc.sched.latency.hist)
	h.putCluster(t, clusterName(1), map[string]string{"env": "prod"})
	h.bindSet(t, "team", "global")
	if err := h.svc.WaitSchedulingRound(testkit.Context(t, 20*time.Second)); err != nil {
		t.Fatal(err)
	}
	observed := func(trigger string, want uint64) {
		t.Helper()
		testkit.Eventually(t, 10*time.Second, func() error {
			if n := testkit.Histogram(t, reg, name, "trigger", trigger).GetSampleCount(); n != want {
				return fmt.Errorf("%s{trigger=%s}: %d observations, want %d", name, trigger, n, want)
			}
			return nil
		})
	}

	t0 := testkit.WallNow()
	h.createPlacement(t, &placementv1.Placement{Project: "team", Name: "prod", Predicates: []*placementv1.Predicate{{
		RequiredClusterSelector: &placementv1.ClusterSelector{LabelSelector: &placementv1.LabelSelector{MatchLabels: map[string]string{"env": "prod"}}}}}})
	h.waitDecided(t, "team", "prod", 1, 10*time.Second)
	observed(triggerPlacement, 1)
	testkit.CheckObservation(t, "the new placement's decision", testkit.Histogram(t, reg, name, "trigger", triggerPlacement), 0, testkit.WallSince(t0).Seconds())
	if h := testkit.Histogram(t, reg, name, "trigger", triggerFleet); h != nil {
		t.Fatalf("a placement's own change observed as a fleet change: %d", h.GetSampleCount())
	}

	// A cluster the placement ignores: the fleet changes, the decision does not.
	h.putCluster(t, clusterName(2), map[string]string{"env": "dev"})
	if err := h.svc.WaitSchedulingRound(testkit.Context(t, 20*time.Second)); err != nil {
		t.Fatal(err)
	}
	if h := testkit.Histogram(t, reg, name, "trigger", triggerFleet); h != nil {
		t.Fatalf("a fleet change that moved no decision observed %d", h.GetSampleCount())
	}

	t1 := testkit.WallNow()
	h.putCluster(t, clusterName(3), map[string]string{"env": "prod"})
	h.waitDecided(t, "team", "prod", 2, 10*time.Second)
	observed(triggerFleet, 1)
	testkit.CheckObservation(t, "the joining cluster's decision", testkit.Histogram(t, reg, name, "trigger", triggerFleet),
		schedulerDebounce.Seconds(), testkit.WallSince(t1).Seconds())
	observed(triggerPlacement, 1)

	// A fleet change the fingerprint does not see (noted an hour ago here, as a set's new
	// description would be) is consumed by the rebuild that looked at it: the next change that
	// moves a decision is measured from itself, not from an hour ago.
	h.svc.sched.latency.noteFleet(time.Now().Add(-time.Hour))
	h.svc.sched.ctrl.Add(fleetChangedKey)
	if err := h.svc.WaitSchedulingRound(testkit.Context(t, 20*time.Second)); err != nil {
		t.Fatal(err)
	}
	t2 := testkit.WallNow()
	h.putCluster(t, clusterName(4), map[string]string{"env": "prod"})
	h.waitDecided(t, "team", "prod", 3, 10*time.Second)
	observed(triggerFleet, 2)
	if s := testkit.Histogram(t, reg, name, "trigger", triggerFleet).GetSampleSum(); s > 60 {
		t.Fatalf("the fourth cluster's decision summed into %.0f s: measured from a change that moved nothing (%.1f s ago at most)", s, testkit.WallSince(t2).Seconds())
	}
}
