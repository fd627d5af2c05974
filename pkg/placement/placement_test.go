package placement

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

var bound = PlacementState{BoundClusterSets: []string{DefaultClusterSet}}

func TestTolerationExpiry(t *testing.T) {
	t0 := fakeTime
	unreachable := func(name string, since time.Time) Cluster {
		c := cluster(name)
		c.Taints = []Taint{BuiltInTaint(TaintUnreachable, since)}
		return c
	}
	tol5m := Toleration{Key: TaintUnreachable, Operator: TolerationOpExists, TolerationSeconds: i64(300)}
	cases := []struct {
		name     string
		clusters []Cluster
		tols     []Toleration
		prev     []string
		now      time.Time
		want     []string
		wantNext time.Time
	}{
		{"tolerated before expiry, timer at expiry", []Cluster{unreachable("a", t0), cluster("b")},
			[]Toleration{tol5m}, nil, t0.Add(100 * time.Second), []string{"a", "b"}, t0.Add(300 * time.Second)},
		{"at the expiry moment it no longer holds (strictly before)", []Cluster{unreachable("a", t0), cluster("b")},
			[]Toleration{tol5m}, []string{"a"}, t0.Add(300 * time.Second), []string{"b"}, time.Time{}},
		{"earliest of several clusters", []Cluster{unreachable("a", t0), unreachable("b", t0.Add(-time.Minute)), unreachable("c", t0.Add(-time.Hour))},
			[]Toleration{tol5m}, nil, t0.Add(10 * time.Second), []string{"a", "b"}, t0.Add(240 * time.Second)},
		{"earliest of a cluster's taints", []Cluster{{Name: "a", Taints: []Taint{
			{Key: "k1", Effect: TaintEffectNoSelect, TimeAdded: t0},
			{Key: "k2", Effect: TaintEffectNoSelect, TimeAdded: t0.Add(-100 * time.Second)}}}},
			[]Toleration{{Operator: TolerationOpExists, TolerationSeconds: i64(300)}}, nil, t0, []string{"a"}, t0.Add(200 * time.Second)},
		{"the first matching toleration wins (OCM), a later unlimited one takes over after it expires", []Cluster{unreachable("a", t0)},
			[]Toleration{tol5m, {Key: TaintUnreachable, Operator: TolerationOpExists}}, nil, t0, []string{"a"}, t0.Add(300 * time.Second)},
		{"... and after expiry the unlimited one holds with no timer", []Cluster{unreachable("a", t0)},
			[]Toleration{tol5m, {Key: TaintUnreachable, Operator: TolerationOpExists}}, nil, t0.Add(time.Hour), []string{"a"}, time.Time{}},
		{"NoSelectIfNew on a decided cluster needs no toleration, so no timer",
			[]Cluster{cluster("a", taint("k", "", TaintEffectNoSelectIfNew, t0))},
			[]Toleration{{Key: "k", Operator: TolerationOpExists, TolerationSeconds: i64(60)}}, []string{"a"}, t0, []string{"a"}, time.Time{}},
		{"untolerated clusters set no timer", []Cluster{unreachable("a", t0)},
			[]Toleration{{Key: "other", Operator: TolerationOpExists, TolerationSeconds: i64(60)}}, nil, t0, []string{}, time.Time{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := run(t, c.clusters, nil, nil, Placement{Tolerations: c.tols},
				PlacementState{BoundClusterSets: []string{DefaultClusterSet}, PreviousDecision: c.prev, Now: c.now})
			if got := sortedCopy(d.ClusterNames()); !slices.Equal(got, c.want) {
				t.Errorf("selected %v, want %v", got, c.want)
			}
			if !d.NextEvaluation.Equal(c.wantNext) {
				t.Errorf("next evaluation %v, want %v", d.NextEvaluation, c.wantNext)
			}
		})
	}
}

func TestBuiltInTaints(t *testing.T) {
	for _, key := range []string{TaintUnreachable, TaintUnavailable} {
		t.Run(key, func(t *testing.T) {
			a := cluster("a")
			a.Taints = []Taint{BuiltInTaint(key, fakeTime.Add(-time.Hour))}
			clusters := []Cluster{a, cluster("b"), cluster("c")}
			// NoSelect drops an existing decision: a leaves even though Steady favours it.
			d := run(t, clusters, nil, nil, Placement{NumberOfClusters: i32(2)},
				PlacementState{BoundClusterSets: []string{DefaultClusterSet}, PreviousDecision: []string{"a", "b"}})
			if got := d.ClusterNames(); !slices.Equal(got, []string{"b", "c"}) {
				t.Errorf("selected %v, want [b c]", got)
			}
			// A toleration lets it stay.
			d = run(t, clusters, nil, nil, Placement{NumberOfClusters: i32(2), Tolerations: []Toleration{{Key: key, Operator: TolerationOpExists}}},
				PlacementState{BoundClusterSets: []string{DefaultClusterSet}, PreviousDecision: []string{"a", "b"}})
			if got := d.ClusterNames(); !slices.Equal(got, []string{"a", "b"}) {
				t.Errorf("tolerated: selected %v, want [a b]", got)
			}
		})
	}
}

func TestMisconfigured(t *testing.T) {
	badSel := metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "k", Operator: "Near"}}}
	cases := []struct {
		name      string
		p         Placement
		wantField string
	}{
		{"weight above 10", Placement{PrioritizerPolicy: PrioritizerPolicy{Configurations: []PrioritizerConfig{builtIn(PrioritizerSteady, 11)}}},
			"prioritizer_policy.configurations[0].weight"},
		{"weight below -10", Placement{PrioritizerPolicy: PrioritizerPolicy{Configurations: []PrioritizerConfig{builtIn(PrioritizerSteady, 3), builtIn(PrioritizerBalance, -11)}}},
			"prioritizer_policy.configurations[1].weight"},
		{"unknown built-in prioritizer", Placement{PrioritizerPolicy: PrioritizerPolicy{Configurations: []PrioritizerConfig{builtIn("Random", 1)}}},
			"prioritizer_policy.configurations[0].score_coordinate.built_in"},
		{"unknown mode", Placement{PrioritizerPolicy: PrioritizerPolicy{Mode: "Subtractive"}}, "prioritizer_policy.mode"},
		{"missing score coordinate", Placement{PrioritizerPolicy: PrioritizerPolicy{Configurations: []PrioritizerConfig{{Weight: 1}}}},
			"prioritizer_policy.configurations[0].score_coordinate"},
		{"add-on coordinate without add_on", Placement{PrioritizerPolicy: PrioritizerPolicy{Configurations: []PrioritizerConfig{
			{ScoreCoordinate: &ScoreCoordinate{Type: ScoreCoordinateTypeAddOn}, Weight: 1}}}},
			"prioritizer_policy.configurations[0].score_coordinate.add_on"},
		{"add-on coordinate without score name", Placement{PrioritizerPolicy: PrioritizerPolicy{Configurations: []PrioritizerConfig{addOn("r", "", 1)}}},
			"prioritizer_policy.configurations[0].score_coordinate.add_on"},
		{"unknown coordinate type", Placement{PrioritizerPolicy: PrioritizerPolicy{Configurations: []PrioritizerConfig{
			{ScoreCoordinate: &ScoreCoordinate{Type: "Magic"}, Weight: 1}}}},
			"prioritizer_policy.configurations[0].score_coordinate.type"},
		{"invalid predicate label selector", Placement{Predicates: []Predicate{{}, {RequiredClusterSelector: ClusterSelector{LabelSelector: badSel}}}},
			"predicates[1].required_cluster_selector.label_selector"},
		{"invalid predicate claim selector", Placement{Predicates: []Predicate{{RequiredClusterSelector: ClusterSelector{ClaimSelector: ClaimSelector{MatchExpressions: badSel.MatchExpressions}}}}},
			"predicates[0].required_cluster_selector.claim_selector"},
		{"unknown toleration operator", Placement{Tolerations: []Toleration{{Key: "k", Operator: "Like"}}}, "tolerations[0].operator"},
		{"unknown toleration effect", Placement{Tolerations: []Toleration{{Key: "k", Effect: "NoExecute"}}}, "tolerations[0].effect"},
		{"negative number of clusters", Placement{NumberOfClusters: i32(-1)}, "number_of_clusters"},
		{"clusters per group not a percentage", Placement{DecisionStrategy: DecisionStrategy{ClustersPerDecisionGroup: intstr.FromString("3")}},
			"decision_strategy.clusters_per_decision_group"},
		{"clusters per group bad percentage", Placement{DecisionStrategy: DecisionStrategy{ClustersPerDecisionGroup: intstr.FromString("x%")}},
			"decision_strategy.clusters_per_decision_group"},
		{"invalid group selector", Placement{DecisionStrategy: DecisionStrategy{Groups: []DecisionGroup{{GroupName: "g", GroupClusterSelector: GroupClusterSelector{LabelSelector: badSel}}}}},
			"decision_strategy.groups[0].group_cluster_selector.label_selector"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := run(t, plainClusters(3), nil, nil, c.p, PlacementState{BoundClusterSets: []string{DefaultClusterSet}, PreviousDecision: []string{"cluster1"}})
			mis, _ := d.Condition(ConditionPlacementMisconfigured)
			if mis.Status != ConditionTrue || mis.Reason != ReasonMisconfigured || mis.Field != c.wantField {
				t.Errorf("misconfigured = %+v, want field %q", mis, c.wantField)
			}
			// As in OCM a misconfigured placement decides nothing (one empty group, one empty page).
			if len(d.Clusters) != 0 || d.NumberOfSelectedClusters != 0 || len(d.DecisionGroups) != 1 || len(d.DecisionGroups[0].Pages) != 1 {
				t.Errorf("misconfigured decision not empty: %+v", d)
			}
			if sat, _ := d.Condition(ConditionPlacementSatisfied); sat.Reason != ReasonNoManagedClusterMatched {
				t.Errorf("satisfied = %+v", sat)
			}
		})
	}
	t.Run("unknown built-in at weight 0 is ignored, as in OCM", func(t *testing.T) {
		d := run(t, plainClusters(1), nil, nil, Placement{PrioritizerPolicy: PrioritizerPolicy{Configurations: []PrioritizerConfig{builtIn("Random", 0)}}}, bound)
		if mis, _ := d.Condition(ConditionPlacementMisconfigured); mis.Status != ConditionFalse {
			t.Errorf("misconfigured = %+v", mis)
		}
	})
	t.Run("weights -10 and 10 are in range", func(t *testing.T) {
		d := run(t, plainClusters(1), nil, nil, Placement{PrioritizerPolicy: PrioritizerPolicy{Configurations: []PrioritizerConfig{builtIn(PrioritizerSteady, 10), builtIn(PrioritizerBalance, -10)}}}, bound)
		if mis, _ := d.Condition(ConditionPlacementMisconfigured); mis.Status != ConditionFalse {
			t.Errorf("misconfigured = %+v", mis)
		}
	})
}

// TestConditionsFromOCM transcribes TestNewSatisfiedCondition and TestNewMisconfiguredCondition.
func TestConditionsFromOCM(t *testing.T) {
	cases := []struct {
		src                              string
		spec, eligible                   []string
		bindings, available, feasible, u int
		wantStatus                       ConditionStatus
		wantReason                       string
	}{
		{ct + "TestNewSatisfiedCondition/NoManagedClusterSetBindings", nil, nil, 0, 0, 0, 5, ConditionFalse, ReasonNoManagedClusterSetBindings},
		{ct + "TestNewSatisfiedCondition/NoIntersection", []string{"clusterset1"}, nil, 1, 0, 0, 0, ConditionFalse, ReasonNoIntersection},
		{ct + "TestNewSatisfiedCondition/AllManagedClusterSetsEmpty", nil, []string{"clusterset1"}, 1, 0, 0, 0, ConditionFalse, ReasonAllManagedClusterSetsEmpty},
		{ct + "TestNewSatisfiedCondition/NoManagedClusterMatched", nil, []string{"clusterset1"}, 1, 1, 0, 0, ConditionFalse, ReasonNoManagedClusterMatched},
		{ct + "TestNewSatisfiedCondition/AllDecisionsScheduled", nil, []string{"clusterset1"}, 1, 1, 1, 0, ConditionTrue, ReasonAllDecisionsScheduled},
		{ct + "TestNewSatisfiedCondition/NotAllDecisionsScheduled", nil, []string{"clusterset1"}, 1, 1, 1, 1, ConditionFalse, ReasonNotAllDecisionsScheduled},
	}
	for _, c := range cases {
		t.Run(c.src, func(t *testing.T) {
			got := satisfaction{specSets: c.spec, eligible: c.eligible, bindings: c.bindings, available: c.available}.condition(c.feasible, c.u)
			if got.Status != c.wantStatus || got.Reason != c.wantReason || got.Type != ConditionPlacementSatisfied {
				t.Errorf("got %+v, want %s %s", got, c.wantStatus, c.wantReason)
			}
		})
	}
	t.Run(ct+"TestNewSatisfiedCondition/NotAllDecisionsScheduled message says how many", func(t *testing.T) {
		got := satisfaction{eligible: []string{"s"}, bindings: 1, available: 1}.condition(1, 3)
		if got.Message != "3 cluster decisions unscheduled" || got.Unscheduled != 3 {
			t.Errorf("got %+v", got)
		}
	})
	t.Run(ct+"TestNewMisconfiguredCondition/Misconfigured is false when status is success", func(t *testing.T) {
		got := misconfiguredCondition(nil)
		if got.Status != ConditionFalse || got.Reason != ReasonSucceedconfigured || got.Message != "Placement configurations check pass" {
			t.Errorf("got %+v", got)
		}
	})
	t.Run(ct+"TestNewMisconfiguredCondition/Misconfigured is true", func(t *testing.T) {
		got := misconfiguredCondition(&misconfig{field: "plugin", msg: "reasons"})
		if got.Status != ConditionTrue || got.Reason != ReasonMisconfigured || got.Message != "plugin: reasons" || got.Field != "plugin" {
			t.Errorf("got %+v", got)
		}
	})
}

func TestClusterSets(t *testing.T) {
	clusters := []Cluster{
		cluster("a"),
		cluster("b", lbl(ClusterSetLabel, DefaultClusterSet)),
		cluster("c", lbl(ClusterSetLabel, "eu")),
		cluster("d", lbl(ClusterSetLabel, ""), lbl("env", "prod")),
	}
	sets := append(defaultSets(),
		ClusterSet{Name: "eu"},
		ClusterSet{Name: "none", Selector: ClusterSetSelector{Type: SelectorLabelSelector}},
		ClusterSet{Name: "prod", Selector: ClusterSetSelector{Type: SelectorLabelSelector, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"env": "prod"}}}},
	)
	f, err := NewFleet(clusters, sets, nil)
	if err != nil {
		t.Fatal(err)
	}
	for set, want := range map[string][]string{
		DefaultClusterSet: {"a", "b", "d"}, // no label or an empty one means default
		GlobalClusterSet:  {"a", "b", "c", "d"},
		"eu":              {"c"},
		"none":            {}, // nil selector selects none
		"prod":            {"d"},
	} {
		got, ok := f.Members(set)
		if !ok || !slices.Equal(append([]string{}, got...), want) {
			t.Errorf("members of %s = %v (%v), want %v", set, got, ok, want)
		}
	}
	if _, ok := f.Members("missing"); ok {
		t.Error("a missing set exists")
	}
	// OCM: TestGetAvailableClusters/clusterset has invalid ClusterSelector expects an error.
	if _, err := NewFleet(clusters, []ClusterSet{{Name: "clusterset1", Selector: ClusterSetSelector{Type: "errorType"}}}, nil); err == nil {
		t.Error(ct + "TestGetAvailableClusters/clusterset has invalid ClusterSelector: no error")
	}
	if _, err := NewFleet([]Cluster{cluster("a"), cluster("a")}, nil, nil); err == nil {
		t.Error("duplicate cluster: no error")
	}
	// Overlapping bound sets count a cluster once.
	d, err := f.Schedule(context.Background(), &Placement{}, PlacementState{BoundClusterSets: []string{GlobalClusterSet, DefaultClusterSet, "eu"}, Now: fakeTime})
	if err != nil || !slices.Equal(d.ClusterNames(), []string{"a", "b", "c", "d"}) {
		t.Errorf("union of sets: %v %v", d.ClusterNames(), err)
	}
}

func TestPrioritizerRules(t *testing.T) {
	two := plainClusters(2)
	t.Run("Steady keeps the current decision", func(t *testing.T) {
		d := run(t, two, nil, nil, Placement{NumberOfClusters: i32(1)}, PlacementState{BoundClusterSets: []string{DefaultClusterSet}, PreviousDecision: []string{"cluster2"}})
		if got := d.ClusterNames(); !slices.Equal(got, []string{"cluster2"}) {
			t.Errorf("got %v", got)
		}
	})
	t.Run("weight 0 disables Steady in Additive mode", func(t *testing.T) {
		d := run(t, two, nil, nil, Placement{NumberOfClusters: i32(1), PrioritizerPolicy: PrioritizerPolicy{Configurations: []PrioritizerConfig{builtIn(PrioritizerSteady, 0)}}},
			PlacementState{BoundClusterSets: []string{DefaultClusterSet}, PreviousDecision: []string{"cluster2"}})
		if got := d.ClusterNames(); !slices.Equal(got, []string{"cluster1"}) {
			t.Errorf("got %v", got)
		}
		if len(d.Prioritizers) != 1 || d.Prioritizers[0].Name != PrioritizerBalance {
			t.Errorf("prioritizers %v", d.Prioritizers)
		}
	})
	t.Run("Exact with no configuration scores nothing and ties break by name", func(t *testing.T) {
		d := run(t, []Cluster{cluster("b"), cluster("c"), cluster("a")}, nil, nil, exact(), bound)
		if got := d.ClusterNames(); !slices.Equal(got, []string{"a", "b", "c"}) || len(d.Prioritizers) != 0 {
			t.Errorf("got %v %v", got, d.Prioritizers)
		}
	})
	t.Run("negative weight prefers the least", func(t *testing.T) {
		d := run(t, []Cluster{cluster("a", res(ResourceMemory, "1Gi", "1Gi")), cluster("b", res(ResourceMemory, "2Gi", "2Gi"))}, nil, nil,
			Placement{NumberOfClusters: i32(1), PrioritizerPolicy: PrioritizerPolicy{Mode: PrioritizerPolicyModeExact,
				Configurations: []PrioritizerConfig{builtIn(PrioritizerResourceAllocatableMemory, -2)}}}, bound)
		if got := d.ClusterNames(); !slices.Equal(got, []string{"a"}) || d.Clusters[0].Total != 200 {
			t.Errorf("got %v %+v", got, d.Clusters)
		}
	})
	t.Run("later configuration of the same coordinate overrides", func(t *testing.T) {
		d := run(t, two, nil, nil, exact(builtIn(PrioritizerSteady, 5), builtIn(PrioritizerSteady, 2)), bound)
		if len(d.Prioritizers) != 1 || d.Prioritizers[0].Weight != 2 {
			t.Errorf("prioritizers %v", d.Prioritizers)
		}
	})
	t.Run("add-on score valid until exactly now still counts, later it is absent", func(t *testing.T) {
		until := fakeTime
		scores := []AddOnScore{score("cluster1", "r", "s", 40, &until), score("cluster2", "r", "s", 150, nil)}
		d := run(t, two, nil, scores, exact(addOn("r", "s", 1)), bound)
		if s, _ := scoreOf(d, "AddOn/r/s", "cluster1"); s != 40 {
			t.Errorf("at ValidUntil: %d", s)
		}
		if s, _ := scoreOf(d, "AddOn/r/s", "cluster2"); s != 100 {
			t.Errorf("out-of-range score not clamped: %d", s)
		}
		d = run(t, two, nil, scores, exact(addOn("r", "s", 1)), PlacementState{BoundClusterSets: []string{DefaultClusterSet}, Now: fakeTime.Add(time.Nanosecond)})
		if s, _ := scoreOf(d, "AddOn/r/s", "cluster1"); s != 0 {
			t.Errorf("after ValidUntil: %d", s)
		}
	})
	t.Run("a resource needs allocatable and capacity", func(t *testing.T) {
		c := cluster("cluster1", res(ResourceCPU, "4", "4"))
		delete(c.Capacity, ResourceCPU)
		d := run(t, []Cluster{c, cluster("cluster2", res(ResourceCPU, "2", "2"))}, nil, nil, exact(builtIn(PrioritizerResourceAllocatableCPU, 1)), bound)
		s1, _ := scoreOf(d, PrioritizerResourceAllocatableCPU, "cluster1")
		s2, _ := scoreOf(d, PrioritizerResourceAllocatableCPU, "cluster2")
		if s1 != 0 || s2 != 100 {
			t.Errorf("scores %d %d, want 0 100", s1, s2)
		}
	})
	t.Run("Balance truncates like OCM: 1 of 3 → 32", func(t *testing.T) {
		d := run(t, two, nil, nil, exact(builtIn(PrioritizerBalance, 1)),
			PlacementState{BoundClusterSets: []string{DefaultClusterSet}, OtherDecisions: map[string]int{"cluster1": 1, "elsewhere": 3}})
		if s, _ := scoreOf(d, PrioritizerBalance, "cluster1"); s != 32 {
			t.Errorf("score %d, want 32", s)
		}
	})
}

func TestDeterministic(t *testing.T) {
	clusters := []Cluster{
		cluster("d", res(ResourceCPU, "2", "2")), cluster("a", res(ResourceCPU, "2", "2")),
		cluster("c", res(ResourceCPU, "4", "4")), cluster("b", res(ResourceCPU, "1", "1")),
	}
	p := Placement{NumberOfClusters: i32(3), PrioritizerPolicy: PrioritizerPolicy{Configurations: []PrioritizerConfig{builtIn(PrioritizerResourceAllocatableCPU, 1)}}}
	want := run(t, clusters, nil, nil, p, bound).ClusterNames()
	if !slices.Equal(want, []string{"c", "a", "d"}) {
		t.Fatalf("got %v, want [c a d]", want)
	}
	slices.Reverse(clusters)
	if got := run(t, clusters, nil, nil, p, bound).ClusterNames(); !slices.Equal(got, want) {
		t.Errorf("input order changed the decision: %v vs %v", got, want)
	}
}

func TestScheduleErrors(t *testing.T) {
	f, err := NewFleet(plainClusters(1), defaultSets(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Schedule(context.Background(), &Placement{}, PlacementState{}); !errors.Is(err, errNoNow) {
		t.Errorf("no Now: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := f.Schedule(ctx, &Placement{}, PlacementState{Now: fakeTime}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}

func TestAddOnScoreExpirySetsNextEvaluation(t *testing.T) {
	soon, later := fakeTime.Add(time.Minute), fakeTime.Add(time.Hour)
	scores := []AddOnScore{
		score("cluster1", "r", "s", 90, &later),
		score("cluster2", "r", "s", 50, &soon),
		score("cluster3", "r", "s", 10, nil),
		score("cluster2", "other", "s", 10, &fakeTime), // not used by the placement
	}
	p := Placement{NumberOfClusters: i32(1), PrioritizerPolicy: PrioritizerPolicy{Configurations: []PrioritizerConfig{addOn("r", "s", 1)}}}
	d := run(t, plainClusters(3), nil, scores, p, bound)
	if want := soon.Add(time.Nanosecond); !d.NextEvaluation.Equal(want) {
		t.Errorf("next evaluation %v, want %v", d.NextEvaluation, want)
	}
	// Not used at weight 0: no timer.
	p.PrioritizerPolicy.Configurations[0].Weight = 0
	if d := run(t, plainClusters(3), nil, scores, p, bound); !d.NextEvaluation.IsZero() {
		t.Errorf("next evaluation %v with the add-on disabled", d.NextEvaluation)
	}
}

func TestConcurrentSchedules(t *testing.T) {
	clusters := plainClusters(50)
	f, err := NewFleet(clusters, defaultSets(), nil)
	if err != nil {
		t.Fatal(err)
	}
	p := Placement{NumberOfClusters: i32(5)}
	want, err := f.Schedule(context.Background(), &p, PlacementState{BoundClusterSets: []string{DefaultClusterSet}, Now: fakeTime})
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		go func() {
			d, err := f.Schedule(context.Background(), &p, PlacementState{BoundClusterSets: []string{DefaultClusterSet}, Now: fakeTime})
			if err == nil && !slices.Equal(d.ClusterNames(), want.ClusterNames()) {
				err = errors.New("different decision")
			}
			errs <- err
		}()
	}
	for g := 0; g < 8; g++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

func TestDecisionDiff(t *testing.T) {
	a := cluster("a")
	a.Taints = []Taint{BuiltInTaint(TaintUnreachable, fakeTime)}
	prev := []string{"a", "b"}
	d := run(t, []Cluster{a, cluster("b"), cluster("c")}, nil, nil, Placement{NumberOfClusters: i32(2)},
		PlacementState{BoundClusterSets: []string{DefaultClusterSet}, PreviousDecision: prev})
	added, removed := DecisionDiff(prev, d)
	if !slices.Equal(added, []string{"c"}) || !slices.Equal(removed, []string{"a"}) {
		t.Errorf("added %v removed %v, want [c] [a]", added, removed)
	}
	added, removed = DecisionDiff(d.ClusterNames(), d)
	if len(added)+len(removed) != 0 {
		t.Errorf("unchanged decision: added %v removed %v", added, removed)
	}
}
