package placement

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestRuleContract holds every filter and prioritizer, the ones to come
// included, to what Schedule relies on: a filter keeps an ordered subset of
// its candidates, a prioritizer scores every feasible cluster in
// [MinClusterScore, MaxClusterScore], and both are pure.
func TestRuleContract(t *testing.T) {
	now := fakeTime
	rng := rand.New(rand.NewPCG(5, 6))
	clusters, sets, scores := benchFleet(200, rng, now)
	f, err := NewFleet(clusters, sets, scores)
	if err != nil {
		t.Fatal(err)
	}
	p := benchPlacement()
	c, mis := compile(&p)
	if mis != nil {
		t.Fatal(mis)
	}
	st := PlacementState{BoundClusterSets: benchSets, PreviousDecision: []string{clusters[3].Name, clusters[7].Name},
		OtherDecisions: map[string]int{clusters[7].Name: 2, clusters[9].Name: 1}, Now: now}
	inDecision := make([]bool, len(f.clusters))
	inDecision[f.byName[clusters[3].Name]], inDecision[f.byName[clusters[7].Name]] = true, true
	r := &round{fleet: f, placement: &p, compiled: c, state: st, inDecision: inDecision}

	// Every other cluster: rules must not assume they see the whole fleet.
	var candidates []int
	for i := 0; i < len(f.clusters); i += 2 {
		candidates = append(candidates, i)
	}

	for _, fl := range filters {
		kept, _ := fl.filter(r, slices.Clone(candidates))
		again, _ := fl.filter(r, slices.Clone(candidates))
		if !slices.Equal(kept, again) {
			t.Errorf("%T: two calls kept %v and %v", fl, kept, again)
		}
		if !slices.IsSorted(kept) || len(kept) > len(candidates) {
			t.Errorf("%T: kept %v, not an ordered subset of the candidates", fl, kept)
		}
		for _, i := range kept {
			if _, ok := slices.BinarySearch(candidates, i); !ok {
				t.Errorf("%T: kept %d, not a candidate", fl, i)
			}
		}
		// Explain asks a filter why it dropped each cluster it dropped: every one has a
		// reason of a kind, in words.
		dropped := 0
		for _, i := range candidates {
			if _, ok := slices.BinarySearch(kept, i); ok {
				continue
			}
			dropped++
			if ns := fl.why(r, i); ns == nil || ns.Kind == "" || ns.Message == "" {
				t.Errorf("%T: dropped cluster %d, and why says %+v", fl, i, ns)
			}
		}
		if dropped == 0 {
			t.Errorf("%T dropped no cluster of the test fleet: its why goes untested", fl)
		}
	}

	rules := map[string]prioritizer{"AddOn": addOnScore{coord: AddOnScoreCoordinate{ResourceName: "telemetry", ScoreName: "cpuRatio"}}}
	for name, rule := range builtInPrioritizers {
		rules[name] = rule
	}
	for name, rule := range rules {
		out := make([]int64, len(candidates))
		rule.score(r, candidates, out)
		again := make([]int64, len(candidates))
		rule.score(r, candidates, again)
		if !slices.Equal(out, again) {
			t.Errorf("%s: two calls scored %v and %v", name, out, again)
		}
		for j, v := range out {
			if v < MinClusterScore || v > MaxClusterScore {
				t.Errorf("%s: cluster %s scored %d, out of [%d, %d]", name, f.clusters[candidates[j]].Name, v, MinClusterScore, MaxClusterScore)
			}
		}
	}
}

// TestBuiltInPrioritizerRegistry: every registered name is accepted as a
// built-in and reported under that name.
func TestBuiltInPrioritizerRegistry(t *testing.T) {
	f, err := NewFleet(plainClusters(3), defaultSets(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for name := range builtInPrioritizers {
		p := Placement{PrioritizerPolicy: PrioritizerPolicy{Mode: PrioritizerPolicyModeExact,
			Configurations: []PrioritizerConfig{builtIn(name, 2)}}}
		d, err := f.Schedule(context.Background(), &p, PlacementState{BoundClusterSets: []string{DefaultClusterSet}, Now: fakeTime})
		if err != nil {
			t.Fatal(err)
		}
		if want := []PrioritizerResult{{Name: name, Weight: 2}}; !slices.Equal(d.Prioritizers, want) {
			t.Errorf("%s: prioritizers %v, want %v", name, d.Prioritizers, want)
		}
		if len(d.Clusters) != 3 {
			t.Errorf("%s: selected %v, want all 3", name, d.ClusterNames())
		}
	}
}
