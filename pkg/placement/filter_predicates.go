package placement

import (
	"fmt"
	"time"
)

// predicates is OCM's Predicate filter (plugins/predicate, without CEL): a
// cluster passes if it matches any of the placement's predicates; no
// predicates pass every cluster.
type predicates struct{}

func (predicates) filter(r *round, candidates []int) ([]int, time.Time) {
	sels := r.compiled.predicates
	if len(sels) == 0 {
		return candidates, time.Time{}
	}
	kept := candidates[:0]
	for _, i := range candidates {
		c := &r.fleet.clusters[i]
		for _, s := range sels {
			if s.matches(c) {
				kept = append(kept, i)
				break
			}
		}
	}
	return kept, time.Time{}
}

// compilePredicates compiles each predicate's selectors, or names the first bad one.
func compilePredicates(p *Placement) ([]selector, *misconfig) {
	var out []selector
	for i, pr := range p.Predicates {
		s, m := compileSelector(pr.RequiredClusterSelector.LabelSelector, pr.RequiredClusterSelector.ClaimSelector,
			fmt.Sprintf("predicates[%d].required_cluster_selector", i))
		if m != nil {
			return nil, m
		}
		out = append(out, s)
	}
	return out, nil
}
