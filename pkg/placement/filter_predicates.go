package placement

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"
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

// why names, for each predicate, the first requirement cluster i does not meet.
func (predicates) why(r *round, i int) *NotSelected {
	ns := &NotSelected{Kind: PredicateNotMatched}
	var parts []string
	for k := range r.compiled.predicates {
		m := mismatch(&r.compiled.predicates[k], r.fleet, i)
		m.Predicate = k
		ns.Predicates = append(ns.Predicates, m)
		parts = append(parts, fmt.Sprintf("predicates[%d].%s requires %s", k, m.Selector, m.Requirement))
	}
	ns.Message = "matches no predicate: " + strings.Join(parts, "; ")
	return ns
}

// mismatch finds what s requires of cluster i that it lacks, checking in selector.matches' order.
func mismatch(s *selector, f *Fleet, i int) PredicateMismatch {
	if m, ok := failedRequirement(s.label, f.labelSets[i]); ok {
		return PredicateMismatch{Selector: "label_selector", Requirement: m}
	}
	if s.claim != nil {
		if m, ok := failedRequirement(s.claim, f.claimSets[i]); ok {
			return PredicateMismatch{Selector: "claim_selector", Requirement: m}
		}
	}
	for _, p := range s.cel {
		if !celMatches([]*celProgram{p}, f, i) {
			return PredicateMismatch{Selector: "cel_selector", Requirement: p.expr}
		}
	}
	return PredicateMismatch{Requirement: "(matches now: the fleet changed during the round)"}
}

func failedRequirement(sel labels.Selector, set labels.Set) (string, bool) {
	if sel.Matches(set) {
		return "", false
	}
	reqs, _ := sel.Requirements()
	for _, q := range reqs {
		if !q.Matches(set) {
			return q.String(), true
		}
	}
	return sel.String(), true
}
