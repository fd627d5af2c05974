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

	// The bound sets narrow the fleet to the available clusters; the filters then narrow those.
	candidates, sat := f.availableClusters(p, &st)
	d := &Decision{}

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

	r := &round{fleet: f, placement: p, compiled: c, state: st, inDecision: inDecision}

	// Filters: each keeps, in name order, the candidates that pass.
	feasible := candidates
	var next time.Time
	for _, fl := range filters {
		var requeue time.Time
		feasible, requeue = fl.filter(r, feasible)
		next = earliest(next, requeue)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("schedule placement %s/%s: %w", p.Project, p.Name, err)
	}

	// Prioritizers: each scores the feasible clusters; the total is Σ score×weight.
	scores := make([][]int64, len(c.prioritizers))
	totals := make([]int64, len(feasible))
	buf := make([]int64, len(c.prioritizers)*len(feasible))
	for k, pr := range c.prioritizers {
		s := buf[k*len(feasible) : (k+1)*len(feasible) : (k+1)*len(feasible)]
		next = earliest(next, pr.rule.score(r, feasible, s))
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

// earliest returns the earlier of two moments, where zero means never.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
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
