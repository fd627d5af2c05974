package placement

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

func ceilInt(f float64) int { return int(math.Ceil(f)) }

// Schedule decides one placement against the fleet. It is a pure function of
// its arguments: the same fleet, placement and state give the same decision.
// A misconfigured placement is not an error: it yields an empty decision with
// PlacementMisconfigured=True naming the field, as OCM's scheduler does.
// Errors are reserved for bad calls (a cancelled context, no Now).
func (f *Fleet) Schedule(ctx context.Context, p *Placement, st PlacementState) (*Decision, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("schedule placement %s/%s: %w", p.Project, p.Name, err)
	}
	if st.Now.IsZero() {
		return nil, fmt.Errorf("schedule placement %s/%s: %w", p.Project, p.Name, errNoNow)
	}

	// Sets: OCM's GetValidManagedClusterSetBindings, GetEligibleClusterSets, GetAvailableClusters.
	bound := map[string]bool{}
	for _, s := range st.BoundClusterSets {
		if _, ok := f.members[s]; ok {
			bound[s] = true
		}
	}
	eligible := make([]string, 0, len(bound))
	if len(p.ClusterSets) == 0 {
		for s := range bound {
			eligible = append(eligible, s)
		}
	} else {
		seen := map[string]bool{}
		for _, s := range p.ClusterSets {
			if bound[s] && !seen[s] {
				seen[s] = true
				eligible = append(eligible, s)
			}
		}
	}
	sort.Strings(eligible)
	available := make([]bool, len(f.clusters))
	numAvailable := 0
	for _, s := range eligible {
		for _, i := range f.members[s] {
			if !available[i] {
				available[i] = true
				numAvailable++
			}
		}
	}

	d := &Decision{}
	sat := satisfaction{specSets: p.ClusterSets, eligible: eligible, bindings: len(bound), available: numAvailable}

	c, mis := compile(p)
	if mis != nil {
		// OCM: a Misconfigured status leaves the schedule result empty, the
		// decision is written empty and Satisfied says nothing matched.
		d.DecisionGroups = f.groups(nil, nil, nil, nil)
		d.Conditions = []Condition{sat.condition(0, 0), misconfiguredCondition(mis)}
		return d, nil
	}

	inDecision := make([]bool, len(f.clusters))
	for _, n := range st.PreviousDecision {
		if i, ok := f.byName[n]; ok {
			inDecision[i] = true
		}
	}

	// Filters: Predicate, then TaintToleration; clusters stay in name order.
	feasible := make([]int, 0, numAvailable)
	var next time.Time
	for i := range f.clusters {
		if !available[i] {
			continue
		}
		fc := &f.clusters[i]
		if len(c.predicates) > 0 {
			ok := false
			for _, s := range c.predicates {
				if s.matches(fc) {
					ok = true
					break
				}
			}
			if !ok {
				continue
			}
		}
		ok, requeue := clusterTolerated(fc, p.Tolerations, inDecision[i], st.Now)
		if !ok {
			continue
		}
		if !requeue.IsZero() && (next.IsZero() || requeue.Before(next)) {
			next = requeue
		}
		feasible = append(feasible, i)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("schedule placement %s/%s: %w", p.Project, p.Name, err)
	}

	// Prioritizers: each scores the feasible clusters; the total is Σ score×weight.
	r := &round{fleet: f, placement: p, compiled: c, state: st, inDecision: inDecision}
	scores := make([][]int64, len(c.prioritizers))
	totals := make([]int64, len(feasible))
	buf := make([]int64, len(c.prioritizers)*len(feasible))
	for k, pr := range c.prioritizers {
		s := buf[k*len(feasible) : (k+1)*len(feasible) : (k+1)*len(feasible)]
		if expiry := pr.rule.score(r, feasible, s); !expiry.IsZero() && (next.IsZero() || expiry.Before(next)) {
			next = expiry
		}
		scores[k] = s
		for j, v := range s {
			totals[j] += v * int64(pr.weight)
		}
		d.Prioritizers = append(d.Prioritizers, PrioritizerResult{Name: pr.name, Weight: pr.weight})
	}

	// Sort by total desc, then by name: feasible is in name order, so the
	// position breaks ties (OCM's sort.SliceStable with the same rule).
	order := make([]int, len(feasible))
	for j := range order {
		order[j] = j
	}
	sort.Slice(order, func(a, b int) bool {
		ta, tb := totals[order[a]], totals[order[b]]
		if ta != tb {
			return ta > tb
		}
		return order[a] < order[b]
	})

	n := len(order)
	unscheduled := 0
	if p.NumberOfClusters != nil {
		want := int(*p.NumberOfClusters)
		if want < n {
			n = want
		}
		unscheduled = want - n
	}
	d.Clusters = make([]ClusterDecision, n)
	selIdx := make([]int, n)
	for r := 0; r < n; r++ {
		j := order[r]
		cd := ClusterDecision{ClusterName: f.clusters[feasible[j]].Name, Total: totals[j]}
		if len(scores) > 0 {
			cd.Scores = make([]int64, len(scores))
			for k := range scores {
				cd.Scores[k] = scores[k][j]
			}
		}
		d.Clusters[r] = cd
		selIdx[r] = feasible[j]
	}
	d.NumberOfSelectedClusters = int32(n) //nolint:gosec // n ≤ number of clusters
	d.DecisionGroups = f.groups(c, p, selIdx, d.Clusters)
	d.NextEvaluation = next
	d.Conditions = []Condition{sat.condition(n, unscheduled), misconfiguredCondition(nil)}
	return d, nil
}

var errNoNow = errors.New("state.Now is required")

// clusterTolerated is OCM's isClusterTolerated: every taint must be
// tolerated; the returned moment is the earliest expiry of the tolerations
// used (zero when none expires).
func clusterTolerated(c *fleetCluster, tols []Toleration, inDecision bool, now time.Time) (bool, time.Time) {
	var min time.Time
	for i := range c.Taints {
		ok, requeue := taintTolerated(&c.Taints[i], tols, inDecision, now)
		if !ok {
			return false, time.Time{}
		}
		if !requeue.IsZero() && (min.IsZero() || requeue.Before(min)) {
			min = requeue
		}
	}
	return true, min
}

// taintTolerated is OCM's isTaintTolerated. The first toleration that
// tolerates the taint wins, even if a later one would tolerate it for longer.
func taintTolerated(t *Taint, tols []Toleration, inDecision bool, now time.Time) (bool, time.Time) {
	if t.Effect == TaintEffectPreferNoSelect {
		return true, time.Time{}
	}
	if t.Effect == TaintEffectNoSelectIfNew && inDecision {
		return true, time.Time{}
	}
	for i := range tols {
		if ok, requeue := tolerates(t, &tols[i], now); ok {
			return true, requeue
		}
	}
	return false, time.Time{}
}

// tolerates is OCM's isTolerated + isTolerationTimeExpired.
func tolerates(t *Taint, tol *Toleration, now time.Time) (bool, time.Time) {
	if tol.Effect != "" && tol.Effect != t.Effect {
		return false, time.Time{}
	}
	if tol.Key != "" && tol.Key != t.Key {
		return false, time.Time{}
	}
	switch tol.Operator {
	case "", TolerationOpEqual:
		if tol.Value != t.Value {
			return false, time.Time{}
		}
	case TolerationOpExists:
	default:
		return false, time.Time{}
	}
	if tol.TolerationSeconds == nil {
		return true, time.Time{}
	}
	until := t.TimeAdded.Add(time.Duration(*tol.TolerationSeconds) * time.Second)
	if now.Before(until) {
		return true, until
	}
	return false, time.Time{}
}

// satisfaction carries what OCM's newSatisfiedCondition needs.
type satisfaction struct {
	specSets  []string
	eligible  []string
	bindings  int
	available int
}

// condition is OCM's newSatisfiedCondition (the Error branch cannot happen
// here: this package has no internal errors during scheduling).
func (s satisfaction) condition(scheduled, unscheduled int) Condition {
	c := Condition{Type: ConditionPlacementSatisfied, Status: ConditionFalse}
	switch {
	case s.bindings == 0:
		c.Reason = ReasonNoManagedClusterSetBindings
		c.Message = "No cluster set is bound to the placement's project"
	case len(s.eligible) == 0:
		c.Reason = ReasonNoIntersection
		c.Message = fmt.Sprintf("None of the cluster sets [%s] is bound to the placement's project", strings.Join(s.specSets, ","))
	case s.available == 0:
		c.Reason = ReasonAllManagedClusterSetsEmpty
		c.Message = fmt.Sprintf("All cluster sets [%s] have no member cluster", strings.Join(s.eligible, ","))
	case scheduled == 0:
		c.Reason = ReasonNoManagedClusterMatched
		c.Message = "No cluster matches any of the cluster predicates"
	case unscheduled == 0:
		c.Status = ConditionTrue
		c.Reason = ReasonAllDecisionsScheduled
		c.Message = "All cluster decisions scheduled"
	default:
		c.Reason = ReasonNotAllDecisionsScheduled
		c.Message = fmt.Sprintf("%d cluster decisions unscheduled", unscheduled)
		c.Unscheduled = unscheduled
	}
	return c
}

// misconfiguredCondition is OCM's newMisconfiguredCondition, with the field.
func misconfiguredCondition(m *misconfig) Condition {
	if m == nil {
		return Condition{Type: ConditionPlacementMisconfigured, Status: ConditionFalse,
			Reason: ReasonSucceedconfigured, Message: "Placement configurations check pass"}
	}
	return Condition{Type: ConditionPlacementMisconfigured, Status: ConditionTrue,
		Reason: ReasonMisconfigured, Message: m.Error(), Field: m.field}
}
