package placement

import (
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Source prefixes: every case below names the OCM test it is transcribed from
// (open-cluster-management-io/ocm at 00f84c32b03b813ca504809bc526f59ec6c5df8b,
// under pkg/placement/). OCM tests one plugin at a time; here every case runs
// through the whole scheduler (Fleet.Schedule), which is what the plugin's
// result must agree with: a filter case checks the selected set, a
// prioritizer case checks the per-prioritizer scores in Exact mode.
const (
	pt = "plugins/predicate/predicate_test.go: TestMatchWithClusterPredicates/"
	tt = "plugins/tainttoleration/taint_toleration_test.go: TestMatchWithClusterTaintToleration/"
	bt = "plugins/balance/balance_test.go: TestScoreClusterWithBalance/"
	st = "plugins/steady/steady_test.go: TestScoreClusterWithSteady/"
	rt = "plugins/resource/resource_test.go: TestScoreClusterWithResource/"
	at = "plugins/addon/addon_test.go: TestScoreClusterWithAddOn/"
	sc = "controllers/scheduling/schedule_test.go: TestSchedule/"
	ct = "controllers/scheduling/scheduling_controller_test.go: "
)

var (
	addedTime8  = fakeTime.Add(-8 * time.Second)
	addedTime9  = fakeTime.Add(-9 * time.Second)
	addedTime10 = fakeTime.Add(-10 * time.Second)
	requeue1    = fakeTime.Add(1 * time.Second)
	expiredTime = fakeTime.Add(-30 * time.Second)
)

type ocmCase struct {
	src       string
	placement Placement
	clusters  []Cluster
	sets      []ClusterSet // nil: default and global
	bound     []string     // nil: ["default"]
	scores    []AddOnScore
	prev      []string
	others    map[string]int

	want          []string // selected clusters
	ordered       bool     // want is in rank order (else compared as a set)
	wantScores    map[string]map[string]int64
	wantMisField  string
	wantMisMsg    string
	wantSatisfied string // reason, checked when set
	wantUnsched   int
	wantNext      time.Time
}

func TestOCMCases(t *testing.T) {
	cases := []ocmCase{
		// ---- predicate ----
		{
			src:       pt + "match with label",
			placement: Placement{Predicates: []Predicate{labelPredicate("cloud", "Amazon")}},
			clusters:  []Cluster{cluster("cluster1", lbl("cloud", "Amazon")), cluster("cluster2", lbl("cloud", "Google"))},
			want:      []string{"cluster1"},
		},
		{
			src:       pt + "match with claim",
			placement: Placement{Predicates: []Predicate{{RequiredClusterSelector: ClusterSelector{ClaimSelector: claimIn("cloud", "Amazon")}}}},
			clusters:  []Cluster{cluster("cluster1", claim("cloud", "Amazon")), cluster("cluster2", claim("cloud", "Google"))},
			want:      []string{"cluster1"},
		},
		{
			src: pt + "match with both label and claim",
			placement: Placement{Predicates: []Predicate{{RequiredClusterSelector: ClusterSelector{
				LabelSelector: matchLabels("cloud", "Amazon"), ClaimSelector: claimIn("region", "us-east-1")}}}},
			clusters: []Cluster{
				cluster("cluster1", lbl("cloud", "Amazon"), claim("region", "us-east-1")),
				cluster("cluster2", lbl("cloud", "Amazon"), claim("region", "us-east-2")),
			},
			want: []string{"cluster1"},
		},
		{
			src: pt + "match with multiple predicates",
			placement: Placement{Predicates: []Predicate{
				labelPredicate("cloud", "Amazon"),
				{RequiredClusterSelector: ClusterSelector{ClaimSelector: claimIn("region", "us-east-1")}},
			}},
			clusters: []Cluster{
				cluster("cluster1", lbl("cloud", "Amazon")),
				cluster("cluster2", claim("region", "us-east-1")),
				cluster("cluster3", claim("region", "us-east-2")),
			},
			want: []string{"cluster1", "cluster2"},
		},
		{
			// OCM's case has an empty CEL selector; without CEL that is a predicate with empty selectors.
			src:       pt + "empty CEL expressions",
			placement: Placement{Predicates: []Predicate{{}}},
			clusters:  []Cluster{cluster("cluster1")},
			want:      []string{"cluster1"},
		},

		// ---- taint toleration ----
		{
			src:       tt + "taint.Effect is NoSelect and tolerations is empty",
			placement: Placement{Tolerations: []Toleration{}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "value1", TaintEffectNoSelect, time.Time{})),
			},
			want: []string{},
		},
		{
			src:       tt + "taint.Effect is NoSelect and tolerations.Operator is Equal, key/value matches",
			placement: Placement{Tolerations: []Toleration{{Key: "key1", Value: "value1", Operator: TolerationOpEqual}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "value1", TaintEffectNoSelect, time.Time{})),
			},
			want: []string{"cluster1"},
		},
		{
			src:       tt + "taint.Effect is NoSelect and tolerations.Operator is Equal, toleration has empty key",
			placement: Placement{Tolerations: []Toleration{{Value: "value1", Operator: TolerationOpEqual}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "value1", TaintEffectNoSelect, time.Time{})),
			},
			want:         []string{},
			wantMisField: "tolerations[0].key", wantMisMsg: "If the key is empty, operator must be Exists.",
		},
		{
			src:       tt + "taint.Effect is NoSelect and tolerations.Operator is Equal, toleration has empty value",
			placement: Placement{Tolerations: []Toleration{{Key: "key1", Operator: TolerationOpEqual}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "value1", TaintEffectNoSelect, time.Time{})),
			},
			want: []string{},
		},
		{
			src:       tt + "taint.Effect is NoSelect and tolerations.Operator is Equal, key/value doesn't match",
			placement: Placement{Tolerations: []Toleration{{Key: "key1", Value: "value1", Operator: TolerationOpEqual}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "value2", TaintEffectNoSelect, time.Time{})),
				cluster("cluster2", taint("key2", "value1", TaintEffectNoSelect, time.Time{})),
			},
			want: []string{},
		},
		{
			src:       tt + "taint.Effect is NoSelect and tolerations.Operator is Exist, key matches",
			placement: Placement{Tolerations: []Toleration{{Key: "key1", Operator: TolerationOpExists}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "value1", TaintEffectNoSelect, time.Time{})),
			},
			want: []string{"cluster1"},
		},
		{
			src:       tt + "taint.Effect is NoSelect and tolerations.Operator is Exist, toleration has empty key",
			placement: Placement{Tolerations: []Toleration{{Value: "value1", Operator: TolerationOpExists}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "value1", TaintEffectNoSelect, time.Time{})),
			},
			want:         []string{},
			wantMisField: "tolerations[0].value", wantMisMsg: "If the operator is Exists, the value should be empty.",
		},
		{
			src:       tt + "taint.Effect is NoSelect and tolerations.Operator is Exist, toleration has empty value",
			placement: Placement{Tolerations: []Toleration{{Key: "key1", Operator: TolerationOpExists}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "value1", TaintEffectNoSelect, time.Time{})),
			},
			want: []string{"cluster1"},
		},
		{
			src:       tt + "taint.Effect is NoSelect and tolerations.Operator is Exist, toleration key doesn't match",
			placement: Placement{Tolerations: []Toleration{{Key: "key2", Operator: TolerationOpExists}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "value1", TaintEffectNoSelect, time.Time{})),
			},
			want: []string{},
		},
		{
			src:       tt + "taint.Effect is NoSelectIfNew and tolerations is empty, cluster is not in decision",
			placement: Placement{Tolerations: []Toleration{}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "", TaintEffectNoSelectIfNew, time.Time{})),
			},
			want: []string{},
		},
		{
			src:       tt + "taint.Effect is NoSelectIfNew and tolerations is empty, cluster is in decision",
			placement: Placement{Tolerations: []Toleration{}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "", TaintEffectNoSelectIfNew, time.Time{})),
			},
			prev: []string{"cluster1"},
			want: []string{"cluster1"},
		},
		{
			src:       tt + "taint.Effect is NoSelectIfNew and tolerations matches, cluster is not in decision",
			placement: Placement{Tolerations: []Toleration{{Key: "key1", Operator: TolerationOpExists}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "", TaintEffectNoSelectIfNew, time.Time{})),
			},
			want: []string{"cluster1"},
		},
		{
			src:       tt + "taint.Effect is NoSelectIfNew and tolerations matches, cluster is in decision",
			placement: Placement{Tolerations: []Toleration{{Key: "key1", Operator: TolerationOpExists}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "", TaintEffectNoSelectIfNew, time.Time{})),
			},
			prev: []string{"cluster1"},
			want: []string{"cluster1"},
		},
		{
			src:       tt + "taint.Effect is NoSelectIfNew and tolerations doesn't match, cluster is not in decision",
			placement: Placement{Tolerations: []Toleration{{Key: "key2", Operator: TolerationOpExists}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "", TaintEffectNoSelectIfNew, time.Time{})),
			},
			want: []string{},
		},
		{
			src:       tt + "taint.Effect is NoSelectIfNew and tolerations doesn't match, cluster is in decision",
			placement: Placement{Tolerations: []Toleration{{Key: "key2", Operator: TolerationOpExists}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "", TaintEffectNoSelectIfNew, time.Time{})),
			},
			prev: []string{"cluster1"},
			want: []string{"cluster1"},
		},
		{
			src:       tt + "taint.Effect is PreferNoSelect and tolerations is Empty",
			placement: Placement{Tolerations: []Toleration{}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "", TaintEffectPreferNoSelect, time.Time{})),
			},
			want: []string{"cluster1"},
		},
		{
			src:       tt + "taint.Effect is PreferNoSelect and tolerations matches",
			placement: Placement{Tolerations: []Toleration{{Key: "key1", Operator: TolerationOpExists}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "", TaintEffectPreferNoSelect, time.Time{})),
			},
			want: []string{"cluster1"},
		},
		{
			src:       tt + "taint.Effect is PreferNoSelect and tolerations doesn't match",
			placement: Placement{Tolerations: []Toleration{{Key: "key2", Operator: TolerationOpExists}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "", TaintEffectPreferNoSelect, time.Time{})),
			},
			want: []string{"cluster1"},
		},
		{
			src:       tt + "cluster has multiple taints and placement has multiple tolerations, all the taints are matched",
			placement: Placement{Tolerations: []Toleration{{Key: "key1", Value: "value1", Operator: TolerationOpEqual}, {Key: "key2", Operator: TolerationOpExists}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "value1", TaintEffectNoSelect, time.Time{}), taint("key2", "", TaintEffectNoSelect, time.Time{})),
				cluster("cluster2", taint("key1", "value1", TaintEffectNoSelect, time.Time{}), taint("key2", "", TaintEffectNoSelect, time.Time{})),
			},
			want: []string{"cluster1", "cluster2"},
		},
		{
			src:       tt + "taint.Effect is NoSelect, key/value matches, toleration effect is empty",
			placement: Placement{Tolerations: []Toleration{{Key: "key1", Value: "value1", Operator: TolerationOpEqual}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "value1", TaintEffectNoSelect, time.Time{})),
			},
			want: []string{"cluster1"},
		},
		{
			src:       tt + "taint.Effect is NoSelect, key/value matches, toleration effect doesn't match",
			placement: Placement{Tolerations: []Toleration{{Key: "key1", Value: "value1", Operator: TolerationOpEqual, Effect: TaintEffectNoSelectIfNew}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "value1", TaintEffectNoSelect, time.Time{})),
			},
			want: []string{},
		},
		{
			src:       tt + "taint.Effect is NoSelect, key/value matches, toleration effect matches",
			placement: Placement{Tolerations: []Toleration{{Key: "key1", Value: "value1", Operator: TolerationOpEqual, Effect: TaintEffectNoSelect}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "value1", TaintEffectNoSelect, time.Time{})),
			},
			want: []string{"cluster1"},
		},
		{
			src:       tt + "taint.Effect is NoSelectIfNew, key/value matches, toleration effect is empty",
			placement: Placement{Tolerations: []Toleration{{Key: "key1", Value: "value1", Operator: TolerationOpEqual}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "value1", TaintEffectNoSelectIfNew, time.Time{})),
			},
			want: []string{"cluster1"},
		},
		{
			src:       tt + "taint.Effect is NoSelectIfNew, key/value matches, toleration effect matches",
			placement: Placement{Tolerations: []Toleration{{Key: "key1", Value: "value1", Operator: TolerationOpEqual, Effect: TaintEffectNoSelectIfNew}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "value1", TaintEffectNoSelectIfNew, time.Time{})),
			},
			want: []string{"cluster1"},
		},
		{
			src:       tt + "taint.Effect is NoSelectIfNew, key/value matches, toleration effect doesn't match",
			placement: Placement{Tolerations: []Toleration{{Key: "key1", Value: "value2", Operator: TolerationOpEqual, Effect: TaintEffectNoSelectIfNew}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "value1", TaintEffectNoSelectIfNew, time.Time{})),
			},
			want: []string{},
		},
		{
			src:       tt + "taint.Effect is NoSelectIfNew, cluster is in decision, toleration effect is empty",
			placement: Placement{Tolerations: []Toleration{{Key: "key1", Value: "value2", Operator: TolerationOpEqual}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "value1", TaintEffectNoSelectIfNew, time.Time{})),
			},
			prev: []string{"cluster1"},
			want: []string{"cluster1"},
		},
		{
			src:       tt + "taint.Effect is NoSelectIfNew, cluster is in decision, toleration effect matches",
			placement: Placement{Tolerations: []Toleration{{Key: "key1", Value: "value2", Operator: TolerationOpEqual, Effect: TaintEffectNoSelectIfNew}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "value1", TaintEffectNoSelectIfNew, time.Time{})),
			},
			prev: []string{"cluster1"},
			want: []string{"cluster1"},
		},
		{
			src:       tt + "taint.Effect is NoSelectIfNew, cluster is in decision, toleration effect doesn't match",
			placement: Placement{Tolerations: []Toleration{{Key: "key1", Value: "value2", Operator: TolerationOpEqual, Effect: TaintEffectNoSelect}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "value1", TaintEffectNoSelectIfNew, time.Time{})),
			},
			prev: []string{"cluster1"},
			want: []string{"cluster1"},
		},
		{
			// OCM's RequeueAfter reads the decisions stored before this run
			// (none here) and expects no requeue; its own write of cluster1 and
			// cluster2 then triggers a reconcile that requeues at +1s. A pure
			// function has no second pass, so NextEvaluation covers the
			// feasible clusters of this run: the moment OCM converges to.
			src:       tt + "tanits match tolerations by toleration.TolerationSeconds",
			placement: Placement{Tolerations: []Toleration{{Key: "key1", Operator: TolerationOpExists, TolerationSeconds: i64(10)}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "value1", TaintEffectNoSelect, addedTime8)),
				cluster("cluster2", taint("key1", "value2", TaintEffectNoSelect, addedTime9)),
				cluster("cluster3", taint("key1", "value3", TaintEffectNoSelect, addedTime10)),
			},
			want:     []string{"cluster1", "cluster2"},
			wantNext: requeue1,
		},
		{
			src:       tt + "placement requeue placement when expire toleration.TolerationSeconds",
			placement: Placement{Tolerations: []Toleration{{Key: "key1", Operator: TolerationOpExists, TolerationSeconds: i64(10)}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "value1", TaintEffectNoSelect, addedTime8)),
				cluster("cluster2", taint("key1", "value2", TaintEffectNoSelect, addedTime9)),
				cluster("cluster3", taint("key1", "value3", TaintEffectNoSelect, addedTime10)),
			},
			prev:     []string{"cluster1", "cluster2"},
			want:     []string{"cluster1", "cluster2"},
			wantNext: requeue1,
		},

		// ---- balance (OCM counts PlacementDecisions of other placements; OtherDecisions is that count) ----
		{
			src:        bt + "no decisions",
			placement:  exact(builtIn(PrioritizerBalance, 1)),
			clusters:   plainClusters(3),
			want:       names("cluster", 3),
			wantScores: map[string]map[string]int64{PrioritizerBalance: {"cluster1": 100, "cluster2": 100, "cluster3": 100}},
		},
		{
			// The decision belongs to this placement: it is PreviousDecision, not OtherDecisions.
			src:        bt + "one decision belongs to current placement",
			placement:  exact(builtIn(PrioritizerBalance, 1)),
			clusters:   plainClusters(3),
			prev:       []string{"cluster1"},
			want:       names("cluster", 3),
			wantScores: map[string]map[string]int64{PrioritizerBalance: {"cluster1": 100, "cluster2": 100, "cluster3": 100}},
		},
		{
			src:        bt + "one decision not belong to current placement",
			placement:  exact(builtIn(PrioritizerBalance, 1)),
			clusters:   plainClusters(3),
			others:     map[string]int{"cluster1": 1},
			want:       names("cluster", 3),
			wantScores: map[string]map[string]int64{PrioritizerBalance: {"cluster1": -100, "cluster2": 100, "cluster3": 100}},
		},
		{
			src:        bt + "multiple decisions",
			placement:  exact(builtIn(PrioritizerBalance, 1)),
			clusters:   plainClusters(3),
			others:     map[string]int{"cluster1": 2, "cluster2": 1, "cluster3": 1},
			want:       names("cluster", 3),
			wantScores: map[string]map[string]int64{PrioritizerBalance: {"cluster1": -100, "cluster2": 0, "cluster3": 0}},
		},

		// ---- steady ----
		{
			src:        st + "no decisions",
			placement:  exact(builtIn(PrioritizerSteady, 1)),
			clusters:   plainClusters(3),
			want:       names("cluster", 3),
			wantScores: map[string]map[string]int64{PrioritizerSteady: {"cluster1": 0, "cluster2": 0, "cluster3": 0}},
		},
		{
			src:        st + "one decisions",
			placement:  exact(builtIn(PrioritizerSteady, 1)),
			clusters:   plainClusters(3),
			prev:       []string{"cluster1"},
			want:       names("cluster", 3),
			wantScores: map[string]map[string]int64{PrioritizerSteady: {"cluster1": 100, "cluster2": 0, "cluster3": 0}},
		},
		{
			// OCM names two cases "one decisions"; this is the second (decisions on two pages).
			src:        st + "one decisions (second case, two PlacementDecisions)",
			placement:  exact(builtIn(PrioritizerSteady, 1)),
			clusters:   plainClusters(3),
			prev:       []string{"cluster1", "cluster3"},
			want:       names("cluster", 3),
			wantScores: map[string]map[string]int64{PrioritizerSteady: {"cluster1": 100, "cluster2": 0, "cluster3": 100}},
		},

		// ---- resource ----
		{
			src:       rt + "scores of ResourceAllocatableMemory",
			placement: exact(builtIn(PrioritizerResourceAllocatableMemory, 1)),
			clusters: []Cluster{
				cluster("cluster1", res(ResourceMemory, "20", "100")),
				cluster("cluster2", res(ResourceMemory, "60", "100")),
				cluster("cluster3", res(ResourceMemory, "100", "100")),
			},
			want:       []string{"cluster3", "cluster2", "cluster1"},
			ordered:    true,
			wantScores: map[string]map[string]int64{PrioritizerResourceAllocatableMemory: {"cluster1": -100, "cluster2": 0, "cluster3": 100}},
		},
		{
			src:       rt + "scores of ResourceAllocatableMemory with same resource value",
			placement: exact(builtIn(PrioritizerResourceAllocatableMemory, 1)),
			clusters: []Cluster{
				cluster("cluster1", res(ResourceMemory, "50", "100")),
				cluster("cluster2", res(ResourceMemory, "50", "100")),
				cluster("cluster3", res(ResourceMemory, "50", "100")),
			},
			want:       names("cluster", 3),
			ordered:    true,
			wantScores: map[string]map[string]int64{PrioritizerResourceAllocatableMemory: {"cluster1": 100, "cluster2": 100, "cluster3": 100}},
		},
		{
			src:       rt + "scores of ResourceAllocatableMemory with zero resource value",
			placement: exact(builtIn(PrioritizerResourceAllocatableMemory, 1)),
			clusters: []Cluster{
				cluster("cluster1", res(ResourceMemory, "0", "100")),
				cluster("cluster2", res(ResourceMemory, "0", "100")),
				cluster("cluster3", res(ResourceMemory, "0", "100")),
			},
			want:       names("cluster", 3),
			wantScores: map[string]map[string]int64{PrioritizerResourceAllocatableMemory: {"cluster1": 100, "cluster2": 100, "cluster3": 100}},
		},
		{
			// OCM returns no score at all; an absent score adds 0 to the total, reported as 0.
			src:        rt + "scores of ResourceAllocatableMemory with no cluster resource",
			placement:  exact(builtIn(PrioritizerResourceAllocatableMemory, 1)),
			clusters:   plainClusters(3),
			want:       names("cluster", 3),
			wantScores: map[string]map[string]int64{PrioritizerResourceAllocatableMemory: {"cluster1": 0, "cluster2": 0, "cluster3": 0}},
		},
		{
			src:       rt + "scores of ResourceAllocatableCPU",
			placement: exact(builtIn(PrioritizerResourceAllocatableCPU, 1)),
			clusters: []Cluster{
				cluster("cluster1", res(ResourceCPU, "10", "10")),
				cluster("cluster2", res(ResourceCPU, "6", "10")),
				cluster("cluster3", res(ResourceCPU, "2", "10")),
			},
			want:       names("cluster", 3),
			ordered:    true,
			wantScores: map[string]map[string]int64{PrioritizerResourceAllocatableCPU: {"cluster1": 100, "cluster2": 0, "cluster3": -100}},
		},
		{
			src:       rt + "scores of ResourceAllocatableCPU with same resource value",
			placement: exact(builtIn(PrioritizerResourceAllocatableCPU, 1)),
			clusters: []Cluster{
				cluster("cluster1", res(ResourceCPU, "5", "10")),
				cluster("cluster2", res(ResourceCPU, "5", "10")),
				cluster("cluster3", res(ResourceCPU, "5", "10")),
			},
			want:       names("cluster", 3),
			wantScores: map[string]map[string]int64{PrioritizerResourceAllocatableCPU: {"cluster1": 100, "cluster2": 100, "cluster3": 100}},
		},
		{
			src:       rt + "scores of ResourceAllocatableCPU with zero resource value",
			placement: exact(builtIn(PrioritizerResourceAllocatableCPU, 1)),
			clusters: []Cluster{
				cluster("cluster1", res(ResourceCPU, "0", "10")),
				cluster("cluster2", res(ResourceCPU, "0", "10")),
				cluster("cluster3", res(ResourceCPU, "0", "10")),
			},
			want:       names("cluster", 3),
			wantScores: map[string]map[string]int64{PrioritizerResourceAllocatableCPU: {"cluster1": 100, "cluster2": 100, "cluster3": 100}},
		},
		{
			src:        rt + "scores of ResourceAllocatableCPU with no cluster resource",
			placement:  exact(builtIn(PrioritizerResourceAllocatableCPU, 1)),
			clusters:   plainClusters(3),
			want:       names("cluster", 3),
			wantScores: map[string]map[string]int64{PrioritizerResourceAllocatableCPU: {"cluster1": 0, "cluster2": 0, "cluster3": 0}},
		},

		// ---- add-on ----
		{
			src:        at + "no addon scores",
			placement:  exact(addOn("test", "score1", 1)),
			clusters:   plainClusters(3),
			want:       names("cluster", 3),
			wantScores: map[string]map[string]int64{"AddOn/test/score1": {"cluster1": 0, "cluster2": 0, "cluster3": 0}},
		},
		{
			src:        at + "part of addon scores generated",
			placement:  exact(addOn("test", "score1", 1)),
			clusters:   plainClusters(3),
			scores:     []AddOnScore{score("cluster1", "test", "score1", 30, nil)},
			want:       []string{"cluster1", "cluster2", "cluster3"},
			ordered:    true,
			wantScores: map[string]map[string]int64{"AddOn/test/score1": {"cluster1": 30, "cluster2": 0, "cluster3": 0}},
		},
		{
			src:       at + "part of addon scores expired",
			placement: exact(addOn("test", "score1", 1)),
			clusters:  plainClusters(3),
			scores: []AddOnScore{
				score("cluster1", "test", "score1", 30, &expiredTime),
				score("cluster2", "test", "score1", 40, nil),
				score("cluster3", "test", "score1", 50, nil),
			},
			want:       []string{"cluster3", "cluster2", "cluster1"},
			ordered:    true,
			wantScores: map[string]map[string]int64{"AddOn/test/score1": {"cluster1": 0, "cluster2": 40, "cluster3": 50}},
		},
		{
			src:       at + "all the addon scores generated",
			placement: exact(addOn("test", "score1", 1)),
			clusters:  plainClusters(3),
			scores: []AddOnScore{
				score("cluster1", "test", "score1", 30, nil),
				score("cluster2", "test", "score1", 40, nil),
				score("cluster3", "test", "score1", 50, nil),
			},
			want:       []string{"cluster3", "cluster2", "cluster1"},
			ordered:    true,
			wantScores: map[string]map[string]int64{"AddOn/test/score1": {"cluster1": 30, "cluster2": 40, "cluster3": 50}},
		},

		// ---- whole scheduler ----
		{
			src:           sc + "new placement satisfied",
			clusters:      []Cluster{cluster("cluster1")},
			want:          []string{"cluster1"},
			wantScores:    map[string]map[string]int64{PrioritizerBalance: {"cluster1": 100}, PrioritizerSteady: {"cluster1": 0}},
			wantSatisfied: ReasonAllDecisionsScheduled,
		},
		{
			src:           sc + "new placement unsatisfied",
			placement:     Placement{NumberOfClusters: i32(3)},
			clusters:      []Cluster{cluster("cluster1")},
			want:          []string{"cluster1"},
			wantScores:    map[string]map[string]int64{PrioritizerBalance: {"cluster1": 100}, PrioritizerSteady: {"cluster1": 0}},
			wantUnsched:   2,
			wantSatisfied: ReasonNotAllDecisionsScheduled,
		},
		{
			src:           sc + "new placement misconfigured",
			placement:     Placement{NumberOfClusters: i32(3), Tolerations: []Toleration{{Value: "value1", Operator: TolerationOpEqual}}},
			clusters:      []Cluster{cluster("cluster1")},
			want:          []string{},
			wantMisField:  "tolerations[0].key",
			wantMisMsg:    "If the key is empty, operator must be Exists.",
			wantSatisfied: ReasonNoManagedClusterMatched,
		},
		{
			src:           sc + "placement with all decisions scheduled",
			placement:     Placement{NumberOfClusters: i32(2)},
			clusters:      plainClusters(3),
			prev:          []string{"cluster1", "cluster2"},
			want:          []string{"cluster1", "cluster2"},
			ordered:       true,
			wantScores:    map[string]map[string]int64{PrioritizerBalance: {"cluster1": 100, "cluster2": 100}, PrioritizerSteady: {"cluster1": 100, "cluster2": 100}},
			wantSatisfied: ReasonAllDecisionsScheduled,
		},
		{
			src:        sc + "placement with empty Prioritizer Policy",
			placement:  Placement{PrioritizerPolicy: PrioritizerPolicy{Mode: ""}},
			clusters:   []Cluster{cluster("cluster1")},
			want:       []string{"cluster1"},
			wantScores: map[string]map[string]int64{PrioritizerBalance: {"cluster1": 100}, PrioritizerSteady: {"cluster1": 0}},
		},
		{
			src:       sc + "placement with taint and toleration",
			placement: Placement{NumberOfClusters: i32(3), Tolerations: []Toleration{{Key: "key1", Value: "value1", Operator: TolerationOpEqual}}},
			clusters: []Cluster{
				cluster("cluster1", taint("key1", "value1", TaintEffectNoSelect, time.Time{})),
				cluster("cluster2", taint("key2", "value2", TaintEffectNoSelect, time.Time{})),
				cluster("cluster3"),
			},
			scores: []AddOnScore{
				score("cluster1", "demo", "demo", 30, nil),
				score("cluster2", "demo", "demo", 40, nil),
				score("cluster3", "demo", "demo", 50, nil),
			},
			want:          []string{"cluster1", "cluster3"},
			ordered:       true,
			wantUnsched:   1,
			wantSatisfied: ReasonNotAllDecisionsScheduled,
		},
		{
			src: sc + "placement with additive Prioritizer Policy",
			placement: Placement{NumberOfClusters: i32(2), PrioritizerPolicy: PrioritizerPolicy{Mode: PrioritizerPolicyModeAdditive,
				Configurations: []PrioritizerConfig{builtIn(PrioritizerBalance, 3), builtIn(PrioritizerResourceAllocatableMemory, 1), addOn("demo", "demo", 1)}}},
			clusters: []Cluster{
				cluster("cluster1", res(ResourceMemory, "100", "100")),
				cluster("cluster2", res(ResourceMemory, "50", "100")),
				cluster("cluster3", res(ResourceMemory, "0", "100")),
			},
			scores: []AddOnScore{
				score("cluster1", "demo", "demo", 30, nil),
				score("cluster2", "demo", "demo", 40, nil),
				score("cluster3", "demo", "demo", 50, nil),
			},
			want:    []string{"cluster1", "cluster2"},
			ordered: true,
			wantScores: map[string]map[string]int64{
				PrioritizerBalance:                   {"cluster1": 100, "cluster2": 100},
				PrioritizerSteady:                    {"cluster1": 0, "cluster2": 0},
				PrioritizerResourceAllocatableMemory: {"cluster1": 100, "cluster2": 0},
				"AddOn/demo/demo":                    {"cluster1": 30, "cluster2": 40},
			},
		},
		{
			src: sc + "placement with exact Prioritizer Policy",
			placement: Placement{NumberOfClusters: i32(2), PrioritizerPolicy: PrioritizerPolicy{Mode: PrioritizerPolicyModeExact,
				Configurations: []PrioritizerConfig{builtIn(PrioritizerBalance, 3), builtIn(PrioritizerResourceAllocatableMemory, 1)}}},
			clusters: []Cluster{
				cluster("cluster1", res(ResourceMemory, "100", "100")),
				cluster("cluster2", res(ResourceMemory, "50", "100")),
				cluster("cluster3", res(ResourceMemory, "0", "100")),
			},
			want:    []string{"cluster1", "cluster2"},
			ordered: true,
			wantScores: map[string]map[string]int64{
				PrioritizerBalance:                   {"cluster1": 100, "cluster2": 100},
				PrioritizerResourceAllocatableMemory: {"cluster1": 100, "cluster2": 0},
			},
		},
		{
			src:           sc + "placement with part of decisions scheduled",
			placement:     Placement{NumberOfClusters: i32(4)},
			clusters:      plainClusters(2),
			prev:          []string{"cluster1"},
			want:          []string{"cluster1", "cluster2"},
			ordered:       true,
			wantScores:    map[string]map[string]int64{PrioritizerBalance: {"cluster1": 100, "cluster2": 100}, PrioritizerSteady: {"cluster1": 100, "cluster2": 0}},
			wantUnsched:   2,
			wantSatisfied: ReasonNotAllDecisionsScheduled,
		},
		{
			src:        sc + "schedule to cluster with least decisions",
			placement:  Placement{NumberOfClusters: i32(1)},
			clusters:   plainClusters(3),
			others:     map[string]int{"cluster1": 1, "cluster2": 1},
			want:       []string{"cluster3"},
			wantScores: map[string]map[string]int64{PrioritizerBalance: {"cluster3": 100}, PrioritizerSteady: {"cluster3": 0}},
		},
		{
			src:        sc + "do not schedule to other cluster even with least decisions",
			placement:  Placement{NumberOfClusters: i32(1)},
			clusters:   plainClusters(3),
			others:     map[string]int{"cluster1": 1, "cluster2": 2, "cluster3": 1},
			prev:       []string{"cluster3"},
			want:       []string{"cluster3"},
			wantScores: map[string]map[string]int64{PrioritizerBalance: {"cluster3": 0}, PrioritizerSteady: {"cluster3": 100}},
		},

		// ---- cluster sets, bindings and the Satisfied condition (scheduling controller) ----
		{
			src:           ct + "TestSchedulingController_sync/placement missing managedclustersetbindings",
			clusters:      plainClusters(1),
			bound:         []string{},
			want:          []string{},
			wantSatisfied: ReasonNoManagedClusterSetBindings,
		},
		{
			src:           ct + "TestSchedulingController_sync/placement all managedclustersets empty ",
			clusters:      []Cluster{cluster("cluster1", lbl(ClusterSetLabel, "other"))},
			sets:          []ClusterSet{{Name: "clusterset1"}, {Name: "other"}},
			bound:         []string{"clusterset1"},
			want:          []string{},
			wantSatisfied: ReasonAllManagedClusterSetsEmpty,
		},
		{
			src:           ct + "TestSchedulingController_sync/placement no cluster matches",
			placement:     Placement{Predicates: []Predicate{labelPredicate("cloud", "Amazon")}},
			clusters:      []Cluster{cluster("cluster1", lbl(ClusterSetLabel, "clusterset1"))},
			sets:          []ClusterSet{{Name: "clusterset1"}},
			bound:         []string{"clusterset1"},
			want:          []string{},
			wantSatisfied: ReasonNoManagedClusterMatched,
		},
		{
			src:           ct + "TestGetValidManagedClusterSetBindings/invalid binding",
			clusters:      []Cluster{cluster("cluster1", lbl(ClusterSetLabel, "clusterset1"))},
			sets:          []ClusterSet{},
			bound:         []string{"clusterset1"},
			want:          []string{},
			wantSatisfied: ReasonNoManagedClusterSetBindings,
		},
		{
			src:           ct + "TestGetValidManagedClusterSets/no clusterset bindings",
			placement:     Placement{ClusterSets: []string{"clusterset1", "clusterset2"}},
			clusters:      []Cluster{cluster("cluster1", lbl(ClusterSetLabel, "clusterset2"))},
			sets:          []ClusterSet{{Name: "clusterset2"}, {Name: "clusterset3"}},
			bound:         []string{},
			want:          []string{},
			wantSatisfied: ReasonNoManagedClusterSetBindings,
		},
		{
			src:      ct + "TestGetValidManagedClusterSets/no placement clusterset",
			clusters: []Cluster{cluster("cluster1", lbl(ClusterSetLabel, "clusterset1")), cluster("cluster2", lbl(ClusterSetLabel, "clusterset2"))},
			sets:     []ClusterSet{{Name: "clusterset1"}, {Name: "clusterset2"}},
			bound:    []string{"clusterset1", "clusterset2"},
			want:     []string{"cluster1", "cluster2"},
		},
		{
			src:       ct + "TestGetValidManagedClusterSets/intersection of clusterset bindings and placement clusterset",
			placement: Placement{ClusterSets: []string{"clusterset1", "clusterset2"}},
			clusters: []Cluster{
				cluster("cluster1", lbl(ClusterSetLabel, "clusterset1")),
				cluster("cluster2", lbl(ClusterSetLabel, "clusterset2")),
				cluster("cluster3", lbl(ClusterSetLabel, "clusterset3")),
			},
			sets:  []ClusterSet{{Name: "clusterset1"}, {Name: "clusterset2"}, {Name: "clusterset3"}},
			bound: []string{"clusterset2", "clusterset3"},
			want:  []string{"cluster2"},
		},
		{
			src:           ct + "TestNewSatisfiedCondition/NoIntersection",
			placement:     Placement{ClusterSets: []string{"clusterset1"}},
			clusters:      []Cluster{cluster("cluster1", lbl(ClusterSetLabel, "clusterset2"))},
			sets:          []ClusterSet{{Name: "clusterset1"}, {Name: "clusterset2"}},
			bound:         []string{"clusterset2"},
			want:          []string{},
			wantSatisfied: ReasonNoIntersection,
		},
		{
			src:      ct + "TestGetAvailableClusters/select clusters from clustersets",
			clusters: []Cluster{cluster("cluster1", lbl(ClusterSetLabel, "clusterset1")), cluster("cluster2", lbl(ClusterSetLabel, "clusterset2"))},
			sets:     []ClusterSet{{Name: "clusterset1"}, {Name: "clusterset2"}},
			bound:    []string{"clusterset1", "clusterset2"},
			want:     []string{"cluster1", "cluster2"},
		},
		{
			src:      ct + "TestGetAvailableClusters/clusterset has no ClusterSelector",
			clusters: []Cluster{cluster("cluster1", lbl(ClusterSetLabel, "clusterset1")), cluster("cluster2")},
			sets:     []ClusterSet{{Name: "clusterset1"}},
			bound:    []string{"clusterset1"},
			want:     []string{"cluster1"},
		},
		{
			src:      ct + "TestGetAvailableClusters/clusterset has Legacy set label ClusterSelector",
			clusters: []Cluster{cluster("cluster1", lbl(ClusterSetLabel, "clusterset1")), cluster("cluster2", lbl(ClusterSetLabel, "x"))},
			sets:     []ClusterSet{{Name: "clusterset1", Selector: ClusterSetSelector{Type: SelectorExclusiveLabel}}},
			bound:    []string{"clusterset1"},
			want:     []string{"cluster1"},
		},
		{
			src:      ct + "TestGetAvailableClusters/clusterset has labelSelector type ClusterSelector",
			clusters: []Cluster{cluster("cluster1", lbl(ClusterSetLabel, "clusterset1")), cluster("cluster2", lbl("vendor", "openShift"))},
			sets: []ClusterSet{{Name: "clusterset1", Selector: ClusterSetSelector{Type: SelectorLabelSelector,
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"vendor": "openShift"}}}}},
			bound: []string{"clusterset1"},
			want:  []string{"cluster2"},
		},
		{
			src:      ct + "TestGetAvailableClusters/clusterset has labelSelector type ClusterSelector(select everything)",
			clusters: []Cluster{cluster("cluster1", lbl(ClusterSetLabel, "clusterset1")), cluster("cluster2")},
			sets:     []ClusterSet{{Name: "clusterset1", Selector: ClusterSetSelector{Type: SelectorLabelSelector, LabelSelector: &metav1.LabelSelector{}}}},
			bound:    []string{"clusterset1"},
			want:     []string{"cluster1", "cluster2"},
		},
		{
			src:           ct + "TestGetAvailableClusters/clusterset is removed",
			clusters:      []Cluster{cluster("cluster1", lbl(ClusterSetLabel, "clusterset1"))},
			sets:          []ClusterSet{},
			bound:         []string{"clusterset1"},
			want:          []string{},
			wantSatisfied: ReasonNoManagedClusterSetBindings,
		},
	}

	for _, c := range cases {
		t.Run(c.src, func(t *testing.T) {
			bound := c.bound
			if bound == nil {
				bound = []string{DefaultClusterSet}
			}
			d := run(t, c.clusters, c.sets, c.scores, c.placement, PlacementState{
				BoundClusterSets: bound, PreviousDecision: c.prev, OtherDecisions: c.others,
			})
			got := d.ClusterNames()
			want := c.want
			if !c.ordered {
				got, want = sortedCopy(got), sortedCopy(want)
			}
			if !slices.Equal(got, want) {
				t.Errorf("selected %v, want %v", got, want)
			}
			for prio, byCluster := range c.wantScores {
				for cl, w := range byCluster {
					g, ok := scoreOf(d, prio, cl)
					if !ok || g != w {
						t.Errorf("score %s of %s = %d (found %v), want %d", prio, cl, g, ok, w)
					}
				}
			}
			mis, _ := d.Condition(ConditionPlacementMisconfigured)
			if c.wantMisField == "" {
				if mis.Status != ConditionFalse {
					t.Errorf("misconfigured: %+v", mis)
				}
			} else if mis.Status != ConditionTrue || mis.Field != c.wantMisField || mis.Message != c.wantMisField+": "+c.wantMisMsg {
				t.Errorf("misconfigured = %+v, want field %q message %q", mis, c.wantMisField, c.wantMisMsg)
			}
			sat, _ := d.Condition(ConditionPlacementSatisfied)
			if c.wantSatisfied != "" && sat.Reason != c.wantSatisfied {
				t.Errorf("satisfied reason %q (%s), want %q", sat.Reason, sat.Message, c.wantSatisfied)
			}
			if sat.Unscheduled != c.wantUnsched {
				t.Errorf("unscheduled %d, want %d", sat.Unscheduled, c.wantUnsched)
			}
			if !d.NextEvaluation.Equal(c.wantNext) {
				t.Errorf("next evaluation %v, want %v", d.NextEvaluation, c.wantNext)
			}
		})
	}
	if len(cases) < 60 {
		t.Fatalf("only %d OCM cases, the issue asks for at least 60", len(cases))
	}
}

func exact(cfg ...PrioritizerConfig) Placement {
	return Placement{PrioritizerPolicy: PrioritizerPolicy{Mode: PrioritizerPolicyModeExact, Configurations: cfg}}
}

func score(clusterName, resourceName, scoreName string, v int32, validUntil *time.Time) AddOnScore {
	return AddOnScore{AddOnScoreKey: AddOnScoreKey{Cluster: clusterName, ResourceName: resourceName, ScoreName: scoreName}, Score: v, ValidUntil: validUntil}
}
