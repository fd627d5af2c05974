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
	if len(sels) == 1 && sels[0].claim == nil && len(sels[0].cel) == 0 {
		// The common placement, one label selector: matching is most of a
		// round, so its loop carries nothing else.
		label, sets := sels[0].label, r.fleet.labelSets
		for _, i := range candidates {
			if label.Matches(sets[i]) {
				kept = append(kept, i)
			}
		}
		return kept, time.Time{}
	}
	for _, i := range candidates {
		for k := range sels {
			if sels[k].matches(r.fleet, i) {
				kept = append(kept, i)
				break
			}
		}
	}
	return kept, time.Time{}
}

// compilePredicates compiles each predicate's selectors, or names the first bad one.
func compilePredicates(p *Placement, out []selector) ([]selector, *misconfig) {
	for i := range p.Predicates {
		f := func() string { return fmt.Sprintf("predicates[%d].required_cluster_selector", i) }
		rcs := &p.Predicates[i].RequiredClusterSelector
		s, m := compileSelector(&rcs.LabelSelector, &rcs.ClaimSelector, f)
		if m != nil {
			return nil, m
		}
		if s.cel, m = compileCELSelector(rcs.CELSelector.CELExpressions, f); m != nil {
			return nil, m
		}
		out = append(out, s)
	}
	return out, nil
}
