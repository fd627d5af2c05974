package placement

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Why a cluster is not selected: the first step of a round that dropped it.
type NotSelectedKind string

const (
	// NotInClusterSets: not a member of any set the placement may use.
	NotInClusterSets NotSelectedKind = "NotInClusterSets"
	// PredicateNotMatched: matches none of the predicates.
	PredicateNotMatched NotSelectedKind = "PredicateNotMatched"
	// TaintNotTolerated: has a taint the placement does not tolerate.
	TaintNotTolerated NotSelectedKind = "TaintNotTolerated"
	// CutByNumberOfClusters: feasible, but ranked after numberOfClusters.
	CutByNumberOfClusters NotSelectedKind = "CutByNumberOfClusters"
	// Misconfigured: the placement's spec is wrong and selects nothing.
	Misconfigured NotSelectedKind = "Misconfigured"
)

// PredicateMismatch is what one predicate requires that a cluster lacks.
type PredicateMismatch struct {
	Predicate int
	// Selector is "label_selector", "claim_selector" or "cel_selector".
	Selector string
	// Requirement is the requirement as Kubernetes prints it, or the CEL expression.
	Requirement string
}

// NotSelected says why a cluster is not selected.
type NotSelected struct {
	Kind    NotSelectedKind
	Message string
	// EligibleSets (NotInClusterSets) are the sets the placement may use.
	EligibleSets []string
	// Predicates (PredicateNotMatched) has one entry per predicate: they are ORed.
	Predicates []PredicateMismatch
	// Taint (TaintNotTolerated) is the first taint not tolerated.
	Taint *Taint
	// NumberOfClusters and LastSelectedTotal (CutByNumberOfClusters).
	NumberOfClusters  int32
	LastSelectedTotal int64
}

// ClusterExplanation is one cluster of an Explanation.
type ClusterExplanation struct {
	ClusterName string
	Selected    bool
	// Scores align with Explanation.Prioritizers; nil for a cluster that was not feasible.
	Scores []int64
	Total  int64
	// Rank is the 1-based position among the feasible clusters, 0 if not feasible.
	Rank   int
	Reason *NotSelected
}

// Explanation is a round with every cluster of the fleet accounted for.
type Explanation struct {
	Prioritizers []PrioritizerResult
	// Clusters: those that passed the filters by rank (the selected first), then the others by name.
	Clusters []ClusterExplanation
	// Misconfigured is the spec error of a misconfigured placement, else empty.
	Misconfigured string
}

// Explain runs the round Schedule runs (the same sets, filters, prioritizers and ranking) and
// says of every cluster of the fleet whether it is selected, how it scored and, if not
// selected, why. Its selected clusters are Schedule's on the same arguments.
func (f *Fleet) Explain(ctx context.Context, p *Placement, st PlacementState) (*Explanation, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("explain placement %s/%s: %w", p.Project, p.Name, err)
	}
	if st.Now.IsZero() {
		return nil, fmt.Errorf("explain placement %s/%s: %w", p.Project, p.Name, errNoNow)
	}
	sc := f.getScratch()
	defer f.putScratch(sc)

	reasons := make([]*NotSelected, len(f.clusters))
	candidates, sat := f.availableClusters(p, &st, sc)
	eligible := slices.Clone(sat.eligible)
	inSets := make([]bool, len(f.clusters))
	for _, i := range candidates {
		inSets[i] = true
	}
	for i := range f.clusters {
		if !inSets[i] {
			msg := "not in a cluster set bound to the project"
			if len(p.ClusterSets) > 0 {
				msg = "not in a cluster set both bound to the project and named by the placement"
			}
			if len(eligible) == 0 {
				msg = "the placement may use no cluster set: " + strings.ToLower(sat.condition(0, 0).Message[:1]) + sat.condition(0, 0).Message[1:]
			} else {
				msg = fmt.Sprintf("%s [%s]", msg, strings.Join(eligible, ","))
			}
			reasons[i] = &NotSelected{Kind: NotInClusterSets, EligibleSets: eligible, Message: msg}
		}
	}
	ex := &Explanation{}
	c, mis := compileInto(p, &sc.compiled)
	if mis != nil {
		ex.Misconfigured = mis.Error()
		for _, i := range candidates {
			reasons[i] = &NotSelected{Kind: Misconfigured, Message: "the placement is misconfigured: " + mis.Error()}
		}
		ex.Clusters = f.explained(nil, reasons)
		return ex, nil
	}
	for _, n := range st.PreviousDecision {
		if i, ok := f.byName[n]; ok {
			sc.inDecision[i] = true
			sc.prev = append(sc.prev, i)
		}
	}
	sc.round = round{fleet: f, placement: p, compiled: c, state: st, inDecision: sc.inDecision}
	r := &sc.round

	feasible, _ := runFilters(r, candidates, func(fl filter, i int) { reasons[i] = fl.why(r, i) })
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("explain placement %s/%s: %w", p.Project, p.Name, err)
	}
	nf, np := len(feasible), len(c.prioritizers)
	totals := make([]int64, nf)
	scores := make([]int64, np*nf)
	var next time.Time // Explain arms no timer
	ex.Prioritizers = runPrioritizers(r, feasible, totals, scores, &next)

	n := nf
	if p.NumberOfClusters != nil && int(*p.NumberOfClusters) < n {
		n = int(*p.NumberOfClusters)
	}
	order := sc.rank(totals, nf) // every feasible cluster, in the decision order
	ranked := make([]ClusterExplanation, nf)
	for rk, o := range order {
		j := o.j
		ce := ClusterExplanation{ClusterName: f.names[feasible[j]], Selected: rk < n, Total: totals[j], Rank: rk + 1,
			Scores: make([]int64, np)}
		for k := range np {
			ce.Scores[k] = scores[k*nf+j]
		}
		if rk >= n {
			last := int64(0)
			if n > 0 {
				last = order[n-1].total
			}
			ce.Reason = &NotSelected{Kind: CutByNumberOfClusters, NumberOfClusters: int32(n), LastSelectedTotal: last, //nolint:gosec // n ≤ clusters
				Message: fmt.Sprintf("ranked %d of %d feasible clusters with total %d; numberOfClusters is %d (the last selected has total %d)",
					rk+1, nf, totals[j], n, last)}
			if p.NumberOfClusters != nil {
				ce.Reason.NumberOfClusters = *p.NumberOfClusters
			}
		}
		ranked[rk] = ce
	}
	ex.Clusters = f.explained(ranked, reasons)
	return ex, nil
}

// explained lists the ranked (feasible) clusters, then every other cluster by name with its reason.
func (f *Fleet) explained(ranked []ClusterExplanation, reasons []*NotSelected) []ClusterExplanation {
	out := append(make([]ClusterExplanation, 0, len(f.clusters)), ranked...)
	for i := range f.clusters {
		if reasons[i] != nil {
			out = append(out, ClusterExplanation{ClusterName: f.names[i], Reason: reasons[i]})
		}
	}
	return out
}
