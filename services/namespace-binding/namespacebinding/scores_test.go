package namespacebinding_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
)

// scoresOf returns each decided cluster's scores by prioritizer name.
func scoresOf(d *placementv1.PlacementDecisions) map[string]map[string]int64 {
	out := map[string]map[string]int64{}
	for _, g := range d.GetGroups() {
		for _, p := range g.Pages {
			for _, c := range p.Clusters {
				out[c.ClusterName] = map[string]int64{}
				for i, pw := range d.Prioritizers {
					if i < len(c.Scores) {
						out[c.ClusterName][pw.Name] = c.Scores[i]
					}
				}
			}
		}
	}
	return out
}

// wantScores checks that every one of clusters scores want on prioritizer.
func wantScores(d *placementv1.PlacementDecisions, prioritizer string, want int64, clusters ...string) error {
	got := scoresOf(d)
	for _, c := range clusters {
		s, ok := got[c][prioritizer]
		if !ok || s != want {
			return fmt.Errorf("%s scores %v on %s, want %d (all: %v)", c, got[c], prioritizer, want, got)
		}
	}
	return nil
}

// membershipEvents counts a placement's decision events that added or removed clusters.
func (e *env) membershipEvents(t testing.TB, project, name string) (membership, scoreOnly int) {
	t.Helper()
	for _, ev := range e.decisionEvents(t, project, name) {
		if len(ev.Added)+len(ev.Removed) > 0 {
			membership++
		} else {
			scoreOnly++
		}
	}
	return membership, scoreOnly
}

// A re-decision that keeps the clusters but scores them differently is what the API shows:
// Steady for clusters being kept, Balance once another placement decided the same clusters.
// Before, such a decision was dropped and the first decision's scores (Steady 0, Balance 100)
// stood for as long as the clusters did.
func TestDecisionsShowTheScoresOfTheLastEvaluation(t *testing.T) {
	e := placementFleet(t)
	eu := []string{"c1", "c2", "c3"}
	e.mustCreatePlacement(t, &placementv1.Placement{Project: "team-a", Name: "a", Predicates: []*placementv1.Predicate{predicate("region", "eu")}})
	d := e.eventuallyDecided(t, "team-a", "a", eu...)
	// Nobody else decided anything, nothing was decided before: Balance 100, Steady 0.
	if err := wantScores(d, "Balance", 100, eu...); err != nil {
		t.Fatal(err)
	}
	if err := wantScores(d, "Steady", 0, eu...); err != nil {
		t.Fatal(err)
	}
	e.mustCreatePlacement(t, &placementv1.Placement{Project: "team-a", Name: "b", Predicates: []*placementv1.Predicate{predicate("region", "eu")}})
	e.eventuallyDecided(t, "team-a", "b", eu...)
	e.scheduled(t)
	before, _ := e.membershipEvents(t, "team-a", "a")
	ctx := testkit.Context(t, 20*time.Second)
	watch, err := e.pl.WatchPlacementDecisions(ctx, connect.NewRequest(&placementv1.WatchPlacementDecisionsRequest{Project: "team-a", Name: "a"}))
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	if !watch.Receive() {
		t.Fatalf("watch: %v", watch.Err())
	}

	// An input of "a" changes without moving its clusters: it is evaluated again, and that
	// evaluation is what GetPlacementDecisions shows.
	e.labelCluster(t, "c4", "region", "us", "tier", "gold")
	testkit.Eventually(t, 10*time.Second, func() error {
		d = e.decisions(t, "team-a", "a")
		if err := wantScores(d, "Steady", 100, eu...); err != nil {
			return err
		}
		// b decided each of them once, the most any cluster was: 2 × (50 − 100) = −100.
		return wantScores(d, "Balance", -100, eu...)
	})
	if got := decided(d); !slices.Equal(got, eu) {
		t.Fatalf("decided %v, want still %v", got, eu)
	}
	for _, c := range d.Groups[0].Pages[0].Clusters {
		if c.Total != 0 {
			t.Fatalf("%s totals %d, want 100 - 100 = 0", c.ClusterName, c.Total)
		}
	}
	// A watcher sees the new scores too, as a change adding and removing nothing.
	for watch.Receive() {
		m := watch.Msg()
		if wantScores(m.Decisions, "Steady", 100, eu...) != nil || wantScores(m.Decisions, "Balance", -100, eu...) != nil {
			continue
		}
		if len(m.Added)+len(m.Removed) > 0 {
			t.Fatalf("watch: scores-only change added %v removed %v, want neither", m.Added, m.Removed)
		}
		break
	}
	if watch.Err() != nil {
		t.Fatalf("watch: %v", watch.Err())
	}
	if after, _ := e.membershipEvents(t, "team-a", "a"); after != before {
		t.Fatalf("%d events adding or removing clusters, want still %d: only the scores changed", after, before)
	}
}

// A toleration with toleration_seconds that holds a decided cluster arms a timer; the decision
// shows when it runs out, and shows none again once the taint is gone.
func TestNextEvaluationShowsAnArmedTolerationTimer(t *testing.T) {
	e := placementFleet(t)
	eu := []string{"c1", "c2", "c3"}
	e.mustCreatePlacement(t, &placementv1.Placement{Project: "team-a", Name: "eu", Predicates: []*placementv1.Predicate{predicate("region", "eu")},
		Tolerations: []*placementv1.Toleration{{Key: "maintenance", Operator: "Exists", TolerationSeconds: ptr[int64](600)}}})
	if d := e.eventuallyDecided(t, "team-a", "eu", eu...); d.NextEvaluation != nil {
		t.Fatalf("next evaluation %v with no taint, want none", d.NextEvaluation.AsTime())
	}
	e.taintCluster(t, "c1", &clusterv1.Taint{Key: "maintenance", Effect: clusterv1.TaintEffect_TAINT_EFFECT_NO_SELECT})
	// cluster-import stamps the taint's time_added; the toleration counts from it.
	res, err := e.clusters.GetCluster(context.Background(), connect.NewRequest(&clusterv1.GetClusterRequest{Name: "c1"}))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Msg.Cluster.Taints) != 1 || res.Msg.Cluster.Taints[0].TimeAdded == nil {
		t.Fatalf("c1's taints %v, want maintenance with its time added", res.Msg.Cluster.Taints)
	}
	want := res.Msg.Cluster.Taints[0].TimeAdded.AsTime().Add(600 * time.Second)
	testkit.Eventually(t, 10*time.Second, func() error {
		d := e.decisions(t, "team-a", "eu")
		if got := d.GetNextEvaluation(); got == nil || !got.AsTime().Equal(want) {
			return fmt.Errorf("next evaluation %v, want %v: when c1's toleration runs out", got.AsTime(), want)
		}
		if got := decided(d); !slices.Equal(got, eu) {
			return fmt.Errorf("decided %v, want still %v while tolerated", got, eu)
		}
		return nil
	})
	e.taintCluster(t, "c1")
	testkit.Eventually(t, 10*time.Second, func() error {
		if got := e.decisions(t, "team-a", "eu").GetNextEvaluation(); got != nil {
			return fmt.Errorf("next evaluation %v once the taint is gone, want none", got.AsTime())
		}
		return nil
	})
}

// An add-on rewriting its score many times a second moves a placement's scores every round;
// each such evaluation is stored at most once per ScoreRefresh, and the last one is shown
// within ScoreRefresh. The test measures the events with and without the bound.
func TestScoreChurnIsStoredAtABoundedRate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		refresh time.Duration
		bounded bool // false: only measured
	}{
		{"every round", time.Nanosecond, false},
		{"once a second", time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := placementFleetWith(t, namespacebinding.Config{ScoreRefresh: tc.refresh})
			ctx := context.Background()
			set := func(score int32) {
				t.Helper()
				if _, err := e.pl.SetAddOnScore(ctx, connect.NewRequest(&placementv1.SetAddOnScoreRequest{Cluster: "c1", ResourceName: "cost",
					ScoreName: "cheap", Score: score})); err != nil {
					t.Fatal(err)
				}
			}
			set(1)
			e.mustCreatePlacement(t, &placementv1.Placement{Project: "team-a", Name: "cheap", Predicates: []*placementv1.Predicate{predicate("region", "eu")},
				PrioritizerPolicy: &placementv1.PrioritizerPolicy{Mode: "Exact", Configurations: []*placementv1.PrioritizerConfig{{
					ScoreCoordinate: &placementv1.ScoreCoordinate{Type: placementv1.ScoreCoordinateType_SCORE_COORDINATE_TYPE_ADD_ON,
						AddOn: &placementv1.AddOnScoreCoordinate{ResourceName: "cost", ScoreName: "cheap"}}}}}})
			e.eventuallyDecided(t, "team-a", "cheap", "c1", "c2", "c3")
			e.scheduled(t)
			_, before := e.membershipEvents(t, "team-a", "cheap")

			const writes, every = 60, 50 * time.Millisecond // 3 s of churn
			began := time.Now()
			for i := range writes {
				set(int32(2 + i))
				time.Sleep(every)
			}
			churn := time.Since(began)
			last := int64(2 + writes - 1)
			testkit.Eventually(t, tc.refresh+5*time.Second, func() error {
				return wantScores(e.decisions(t, "team-a", "cheap"), "AddOn/cost/cheap", last, "c1")
			})
			shown := time.Since(began)
			e.scheduled(t)
			membership, scoreOnly := e.membershipEvents(t, "team-a", "cheap")
			scoreOnly -= before
			t.Logf("ScoreRefresh %v: %d score writes in %v gave %d score-only decision events (%d adding or removing clusters); last score shown after %v",
				tc.refresh, writes, churn.Round(time.Millisecond), scoreOnly, membership, shown)
			if membership != 1 {
				t.Fatalf("%d events adding or removing clusters, want only the first", membership)
			}
			if scoreOnly == 0 {
				t.Fatal("no score-only event: the scores shown are stale")
			}
			// One at once, one per ScoreRefresh while the churn lasts, one deferred to its end.
			if limit := int(churn/tc.refresh) + 2; tc.bounded && scoreOnly > limit {
				t.Fatalf("%d score-only events in %v with ScoreRefresh %v, want at most %d", scoreOnly, churn, tc.refresh, limit)
			}
		})
	}
}
