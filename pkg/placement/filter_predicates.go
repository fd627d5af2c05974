package placement

import (
	"fmt"
	"time"
)

// predicates is OCM's Predicate filter (plugins/predicate): a cluster passes
// if it matches any of the placement's predicates (label AND claim AND CEL
// selector); no predicates pass every cluster.
type predicates struct{}

func (predicates) filter(r *round, candidates []int) ([]int, time.Time) {
	sels := r.compiled.predicates
	if len(sels) == 0 {
		return candidates, time.Time{}
	}
	kept := candidates[:0]
	for _, i := range candidates {
		for _, s := range sels {
			if s.matches(r.fleet, i) {
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
		f := fmt.Sprintf("predicates[%d].required_cluster_selector", i)
		s, m := compileSelector(pr.RequiredClusterSelector.LabelSelector, pr.RequiredClusterSelector.ClaimSelector, f)
		if m != nil {
			return nil, m
		}
		if s.cel, m = compileCELSelector(pr.RequiredClusterSelector.CELSelector.CELExpressions, f+".cel_selector"); m != nil {
			return nil, m
		}
		out = append(out, s)
	}
	return out, nil
}
