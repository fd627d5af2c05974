package placement

import (
	"context"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestExplain: a fleet where each cluster but one is dropped by a different step; Explain must
// name that step, and its selected clusters and scores must be Schedule's.
func TestExplain(t *testing.T) {
	clusters := []Cluster{
		cluster("a-best", lbl("env", "prod"), res(ResourceCPU, "8", "10")),
		cluster("b-cut", lbl("env", "prod"), res(ResourceCPU, "2", "10")),
		cluster("c-dev", lbl("env", "dev"), res(ResourceCPU, "9", "10"), claim("region", "eu")),
		cluster("d-tainted", lbl("env", "prod"), taint(TaintUnreachable, "", TaintEffectNoSelect, fakeTime)),
		cluster("e-elsewhere", lbl("env", "prod"), lbl(ClusterSetLabel, "other")),
		cluster("f-tolerated", lbl("env", "prod"), taint("gpu", "", TaintEffectNoSelect, fakeTime), res(ResourceCPU, "1", "10")),
	}
	sets := append(defaultSets(), ClusterSet{Name: "other"})
	p := Placement{Project: "p", Name: "n", NumberOfClusters: i32(1),
		Predicates: []Predicate{
			labelPredicate("env", "prod"),
			{RequiredClusterSelector: ClusterSelector{ClaimSelector: claimIn("region", "us")}},
		},
		Tolerations:       []Toleration{{Key: "gpu", Operator: TolerationOpExists}},
		PrioritizerPolicy: PrioritizerPolicy{Mode: PrioritizerPolicyModeExact, Configurations: []PrioritizerConfig{builtIn(PrioritizerResourceAllocatableCPU, 2)}},
	}
	st := PlacementState{BoundClusterSets: []string{DefaultClusterSet}, Now: fakeTime}
	f, err := NewFleet(clusters, sets, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := f.Schedule(context.Background(), &p, st)
	if err != nil {
		t.Fatal(err)
	}
	ex, err := f.Explain(context.Background(), &p, st)
	if err != nil {
		t.Fatal(err)
	}
	if len(ex.Clusters) != len(clusters) {
		t.Fatalf("explained %d clusters, want every one of %d: %+v", len(ex.Clusters), len(clusters), ex.Clusters)
	}
	by := map[string]ClusterExplanation{}
	var selected []string
	for _, c := range ex.Clusters {
		by[c.ClusterName] = c
		if c.Selected {
			selected = append(selected, c.ClusterName)
			if c.Reason != nil {
				t.Errorf("%s selected with a reason %+v", c.ClusterName, c.Reason)
			}
		}
	}
	if !slices.Equal(selected, d.ClusterNames()) {
		t.Fatalf("explained selection %v, Schedule's %v", selected, d.ClusterNames())
	}
	for _, dc := range d.Clusters {
		if got := by[dc.ClusterName]; got.Total != dc.Total || !slices.Equal(got.Scores, dc.Scores) {
			t.Errorf("%s: explained scores %v total %d, decision's %v total %d", dc.ClusterName, got.Scores, got.Total, dc.Scores, dc.Total)
		}
	}
	if !slices.Equal(selected, []string{"a-best"}) {
		t.Fatalf("selected %v, want [a-best]", selected)
	}
	for _, tc := range []struct {
		cluster string
		check   func(*NotSelected) bool
	}{
		{"b-cut", func(r *NotSelected) bool {
			return r.Kind == CutByNumberOfClusters && r.NumberOfClusters == 1 && r.LastSelectedTotal == by["a-best"].Total &&
				by["b-cut"].Rank == 2 && by["b-cut"].Total < r.LastSelectedTotal
		}},
		{"f-tolerated", func(r *NotSelected) bool { return r.Kind == CutByNumberOfClusters && by["f-tolerated"].Rank == 3 }},
		{"c-dev", func(r *NotSelected) bool {
			return r.Kind == PredicateNotMatched && slices.Equal(r.Predicates, []PredicateMismatch{
				{Predicate: 0, Selector: "label_selector", Requirement: "env=prod"},
				{Predicate: 1, Selector: "claim_selector", Requirement: "region in (us)"},
			})
		}},
		{"d-tainted", func(r *NotSelected) bool {
			return r.Kind == TaintNotTolerated && r.Taint != nil && r.Taint.Key == TaintUnreachable && r.Taint.Effect == TaintEffectNoSelect
		}},
		{"e-elsewhere", func(r *NotSelected) bool {
			return r.Kind == NotInClusterSets && slices.Equal(r.EligibleSets, []string{DefaultClusterSet})
		}},
	} {
		c := by[tc.cluster]
		if c.Selected || c.Reason == nil || !tc.check(c.Reason) {
			t.Errorf("%s: selected=%v rank=%d total=%d reason %+v", tc.cluster, c.Selected, c.Rank, c.Total, c.Reason)
		}
	}
}

// TestExplainMisconfigured: a placement that fails to compile explains every candidate so.
func TestExplainMisconfigured(t *testing.T) {
	f, err := NewFleet([]Cluster{cluster("a")}, defaultSets(), nil)
	if err != nil {
		t.Fatal(err)
	}
	p := Placement{Project: "p", Name: "n", Predicates: []Predicate{{RequiredClusterSelector: ClusterSelector{
		LabelSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "k", Operator: "Bogus"}}}}}}}
	ex, err := f.Explain(context.Background(), &p, PlacementState{BoundClusterSets: []string{DefaultClusterSet}, Now: fakeTime})
	if err != nil {
		t.Fatal(err)
	}
	if ex.Misconfigured == "" || len(ex.Clusters) != 1 || ex.Clusters[0].Reason.Kind != Misconfigured {
		t.Fatalf("explanation %+v", ex)
	}
}

// TestExplainNoBoundSet: with no set bound, every cluster says so, in the words of
// PlacementSatisfied.
func TestExplainNoBoundSet(t *testing.T) {
	f, err := NewFleet([]Cluster{cluster("a")}, defaultSets(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ex, err := f.Explain(context.Background(), &Placement{Project: "p", Name: "n"}, PlacementState{Now: fakeTime})
	if err != nil {
		t.Fatal(err)
	}
	if r := ex.Clusters[0].Reason; r == nil || r.Kind != NotInClusterSets ||
		r.Message != "the placement may use no cluster set: no cluster set is bound to the placement's project" {
		t.Fatalf("reason %+v", r)
	}
}
