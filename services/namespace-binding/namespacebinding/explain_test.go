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

// TestExplainPlacementSaysWhyEachClusterIsNotSelected: a fleet where each cluster but the
// selected one is dropped by a different step of the round. ExplainPlacement names that step
// for each, and the selected cluster's scores are the decision's.
func TestExplainPlacementSaysWhyEachClusterIsNotSelected(t *testing.T) {
	// ScoreRefresh short: Steady scores c1 once it is decided, and that score-only evaluation is
	// what the stored decision must come to show.
	e := start(t, nil, namespacebinding.Config{ReleaseInterval: 100 * time.Millisecond, ScoreRefresh: 50 * time.Millisecond})
	e.register(t, "c1", "c2", "c3", "c4", "c5", "c6")
	e.connectAgents(t, "c1", "c2", "c3", "c4", "c5") // c6's agent never connects: unreachable
	for _, c := range []string{"c1", "c2", "c3", "c6"} {
		e.labelCluster(t, c, "region", "eu", "fleet", "yes")
	}
	e.labelCluster(t, "c4", "region", "us", "fleet", "yes") // fails the predicate
	e.labelCluster(t, "c5", "region", "eu")                 // outside the bound set
	e.taintCluster(t, "c3", &clusterv1.Taint{Key: "maintenance", Effect: clusterv1.TaintEffect_TAINT_EFFECT_NO_SELECT})
	e.createProject(t, "team-a")
	if _, err := e.createSet("fleet", matchLabels("fleet", "yes")); err != nil {
		t.Fatal(err)
	}
	e.eventuallyMembers(t, "fleet", "c1", "c2", "c3", "c4", "c6")
	if _, err := e.bindSet("team-a", "fleet"); err != nil {
		t.Fatal(err)
	}
	e.mustCreatePlacement(t, &placementv1.Placement{Project: "team-a", Name: "eu-1", NumberOfClusters: ptr[int32](1),
		Predicates: []*placementv1.Predicate{predicate("region", "eu")}})
	e.eventuallyDecided(t, "team-a", "eu-1", "c1") // c1 and c2 tie; the name breaks it
	// The explanation and the stored decision read the same inputs: once the scheduler stored
	// its last evaluation, the selected cluster's scores are the decision's.
	var d *placementv1.PlacementDecisions
	var ex *placementv1.ExplainPlacementResponse
	testkit.Eventually(t, 10*time.Second, func() error {
		d = e.decisions(t, "team-a", "eu-1")
		res, err := e.pl.ExplainPlacement(context.Background(), connect.NewRequest(&placementv1.ExplainPlacementRequest{Project: "team-a", Name: "eu-1"}))
		if err != nil {
			return err
		}
		ex = res.Msg
		dc, c1 := d.Groups[0].Pages[0].Clusters[0], ex.Clusters[0]
		if c1.ClusterName != dc.ClusterName || c1.Total != dc.Total || !slices.Equal(c1.Scores, dc.Scores) {
			return fmt.Errorf("explained %v, decided %v", c1, dc)
		}
		return nil
	})
	var prios, decidedPrios []string
	for _, p := range ex.Prioritizers {
		prios = append(prios, p.Name)
	}
	for _, p := range d.Prioritizers {
		decidedPrios = append(decidedPrios, p.Name)
	}
	if !slices.Equal(prios, decidedPrios) {
		t.Fatalf("explained prioritizers %v, decision's %v", prios, decidedPrios)
	}
	by := map[string]*placementv1.ClusterExplanation{}
	var names []string
	for _, c := range ex.Clusters {
		by[c.ClusterName] = c
		names = append(names, c.ClusterName)
	}
	// Every registered cluster, the selected one first.
	if !slices.Equal(names, []string{"c1", "c2", "c3", "c4", "c5", "c6"}) {
		t.Fatalf("explained clusters %v, want c1 (selected), c2 (ranked) then the others by name", names)
	}
	dc := d.Groups[0].Pages[0].Clusters[0]
	if c1 := by["c1"]; !c1.Selected || c1.Reason != nil || c1.Rank != 1 || c1.Total != dc.Total || !slices.Equal(c1.Scores, dc.Scores) {
		t.Fatalf("c1 explained %v, want selected, rank 1, with the decision's scores %v total %d", c1, dc.Scores, dc.Total)
	}
	kind := func(name string) placementv1.NotSelectedReasonKind { return by[name].GetReason().GetKind() }

	if r := by["c2"].Reason; kind("c2") != placementv1.NotSelectedReasonKind_NOT_SELECTED_REASON_KIND_CUT_BY_NUMBER_OF_CLUSTERS ||
		by["c2"].Selected || by["c2"].Rank != 2 || r.NumberOfClusters != 1 || r.LastSelectedTotal != dc.Total || by["c2"].Total > dc.Total {
		t.Errorf("c2 explained %v, want cut by numberOfClusters 1 at rank 2 behind total %d", by["c2"], dc.Total)
	}
	if r := by["c3"].Reason; kind("c3") != placementv1.NotSelectedReasonKind_NOT_SELECTED_REASON_KIND_TAINT_NOT_TOLERATED ||
		r.Taint.GetKey() != "maintenance" || r.Taint.GetEffect() != clusterv1.TaintEffect_TAINT_EFFECT_NO_SELECT || r.Message == "" {
		t.Errorf("c3 explained %v, want the maintenance:NoSelect taint not tolerated", by["c3"])
	}
	if r := by["c4"].Reason; kind("c4") != placementv1.NotSelectedReasonKind_NOT_SELECTED_REASON_KIND_PREDICATE_NOT_MATCHED ||
		len(r.Predicates) != 1 || r.Predicates[0].Selector != "label_selector" || r.Predicates[0].Requirement != "region=eu" {
		t.Errorf("c4 explained %v, want predicates[0].label_selector region=eu unmet", by["c4"])
	}
	if r := by["c5"].Reason; kind("c5") != placementv1.NotSelectedReasonKind_NOT_SELECTED_REASON_KIND_NOT_IN_CLUSTER_SETS ||
		!slices.Equal(r.EligibleClusterSets, []string{"fleet"}) {
		t.Errorf("c5 explained %v, want not in the bound set fleet", by["c5"])
	}
	if r := by["c6"].Reason; kind("c6") != placementv1.NotSelectedReasonKind_NOT_SELECTED_REASON_KIND_TAINT_NOT_TOLERATED ||
		r.Taint.GetKey() != "fleetstream.io/unreachable" {
		t.Errorf("c6 explained %v, want the unreachable taint not tolerated", by["c6"])
	}
	for _, c := range []string{"c2", "c3", "c4", "c5", "c6"} {
		if by[c].Selected || by[c].Reason.GetMessage() == "" {
			t.Errorf("%s explained %v: not selected, it needs a message", c, by[c])
		}
	}

	// A placement that does not exist is NotFound, not an empty explanation.
	_, err := e.pl.ExplainPlacement(testkit.Context(t, 5*time.Second), connect.NewRequest(&placementv1.ExplainPlacementRequest{Project: "team-a", Name: "nope"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("explain a missing placement: %v, want NotFound", err)
	}
}
