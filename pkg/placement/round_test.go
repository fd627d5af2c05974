package placement

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// TestRankIsTheDecisionOrder: the clusters a decision lists, best first,
// are the first n of all feasible clusters sorted by total desc then by
// name, whether rank keeps them by insertion or sorts them all.
func TestRankIsTheDecisionOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, tc := range []struct {
		name     string
		feasible int
		spread   int64 // totals in [-spread, spread]: small spreads tie a lot
	}{
		{"none", 0, 10},
		{"one", 1, 10},
		{"ties everywhere", 50, 1},
		{"some ties", 67, 20},
		{"distinct", 200, 1 << 40},
		{"more than insertion keeps", 3 * topInsertMax, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			totals := make([]int64, tc.feasible)
			for j := range totals {
				totals[j] = rng.Int64N(2*tc.spread+1) - tc.spread
			}
			want := make([]int, tc.feasible)
			for j := range want {
				want[j] = j
			}
			slices.SortStableFunc(want, func(a, b int) int { return cmp.Compare(totals[b], totals[a]) })
			sc := &roundScratch{}
			for n := 0; n <= tc.feasible; n++ {
				var got []int
				for _, r := range sc.rank(totals, n) {
					got = append(got, r.j)
					if r.total != totals[r.j] {
						t.Fatalf("n=%d: position %d ranked with total %d, has %d", n, r.j, r.total, totals[r.j])
					}
				}
				if !slices.Equal(got, want[:n]) {
					t.Fatalf("n=%d: ranked %v, want %v", n, got, want[:n])
				}
			}
		})
	}
}

// TestMemoisedSelectorsSelectAsCompiled: a label selector taken from the
// memo selects what compiling it afresh selects, selectors that differ are
// never confused (however their strings could be run together), and an
// invalid one is refused with apimachinery's message every time.
func TestMemoisedSelectorsSelectAsCompiled(t *testing.T) {
	sets := []map[string]string{
		{"a": "bc"}, {"ab": "c"}, {"a": "b", "c": "d"}, {"a": "b|1:c"}, {"a": "b", "env": "prod"}, {},
		{"region": "eu-1", "env": "prod"}, {"region": "eu-2"},
	}
	in := func(k string, vs ...string) metav1.LabelSelectorRequirement {
		return metav1.LabelSelectorRequirement{Key: k, Operator: metav1.LabelSelectorOpIn, Values: vs}
	}
	selectors := []metav1.LabelSelector{
		{MatchLabels: map[string]string{"a": "bc"}},
		{MatchLabels: map[string]string{"ab": "c"}},
		{MatchLabels: map[string]string{"a": "b", "c": "d"}},
		{MatchLabels: map[string]string{"a": "b"}, MatchExpressions: []metav1.LabelSelectorRequirement{in("c", "d")}},
		{MatchExpressions: []metav1.LabelSelectorRequirement{in("a", "b", "c")}},
		{MatchExpressions: []metav1.LabelSelectorRequirement{in("a", "bc")}},
		{MatchExpressions: []metav1.LabelSelectorRequirement{in("a", "b"), in("c", "d")}},
		{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "env", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"prod"}}}},
		{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "env", Operator: metav1.LabelSelectorOpExists}}},
		{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "env", Operator: metav1.LabelSelectorOpDoesNotExist}}},
		{MatchLabels: map[string]string{"region": "eu-1", "env": "prod"}},
		{},
	}
	invalid := []metav1.LabelSelector{
		{MatchLabels: map[string]string{"a": "b|1:c"}}, // spells another selector's key, were strings not length-prefixed
		{MatchLabels: map[string]string{"a": "not a value"}},
		{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Near"}}},
		{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: metav1.LabelSelectorOpIn}}},
	}
	for round := 0; round < 2; round++ { // the second round reads the memo
		for i := range selectors {
			want, err := metav1.LabelSelectorAsSelector(&selectors[i])
			if err != nil {
				t.Fatal(err)
			}
			got, err := labelSelector(&selectors[i])
			if err != nil {
				t.Fatalf("selector %d: %v", i, err)
			}
			for _, s := range sets {
				if g, w := got.Matches(labels.Set(s)), want.Matches(labels.Set(s)); g != w {
					t.Errorf("round %d: selector %d on %v: %v, compiled afresh %v", round, i, s, g, w)
				}
			}
		}
		for i := range invalid {
			_, want := metav1.LabelSelectorAsSelector(&invalid[i])
			if _, err := labelSelector(&invalid[i]); err == nil || err.Error() != want.Error() {
				t.Errorf("round %d: invalid selector %d: %v, want %v", round, i, err, want)
			}
		}
	}
	keys := map[string]int{}
	all := append(selectors, invalid...)
	for i := range all {
		k := string(appendSelectorKey(nil, &all[i]))
		if j, dup := keys[k]; dup {
			t.Errorf("selectors %d and %d share the memo key %q", j, i, k)
		}
		keys[k] = i
	}
}

// TestRoundsDoNotShareState: rounds recycle their working memory through
// the fleet; deciding placements in any order, or concurrently, with
// misconfigured ones among them, gives each the decision it gets alone on
// a new fleet.
func TestRoundsDoNotShareState(t *testing.T) {
	r := newRedecideCase(t)
	ctx := context.Background()
	alone := make([][]string, 50)
	for i := 0; i < len(alone); i += 7 {
		// A misconfigured placement leaves its round half compiled.
		bad := Placement{Predicates: []Predicate{{}, {RequiredClusterSelector: ClusterSelector{
			LabelSelector: metav1.LabelSelector{MatchLabels: map[string]string{"env": "not a value"}}}}}}
		bad.Predicates[0] = r.placements[i].Predicates[0]
		r.placements[i] = bad
	}
	for i := range alone {
		f, err := NewFleet(r.clusters, r.sets, r.scores)
		if err != nil {
			t.Fatal(err)
		}
		d, err := f.Schedule(ctx, &r.placements[i], r.states[i])
		if err != nil {
			t.Fatal(err)
		}
		if c, _ := d.Condition(ConditionPlacementMisconfigured); (c.Status == ConditionTrue) != (i%7 == 0) {
			t.Fatalf("placement %d: %+v", i, c)
		}
		alone[i] = d.ClusterNames()
	}
	f, err := NewFleet(r.clusters, r.sets, r.scores)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 4)
	for w := 0; w < 4; w++ {
		go func() {
			for k := range alone {
				i := (k*7 + w*13) % len(alone)
				d, err := f.Schedule(ctx, &r.placements[i], r.states[i])
				if err == nil && !slices.Equal(d.ClusterNames(), alone[i]) {
					err = fmt.Errorf("placement %d: decided %v, alone %v", i, d.ClusterNames(), alone[i])
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for w := 0; w < 4; w++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
