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
	scores := make([][]int64, len(c.prioritizers))
	totals := make([]int64, len(feasible))
	for k, pr := range c.prioritizers {
		s, expiry := f.score(pr, feasible, inDecision, &st)
		if !expiry.IsZero() && (next.IsZero() || expiry.Before(next)) {
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

// score runs one prioritizer over the feasible clusters. For add-on scores it
// also returns the first moment one of the scores it used expires (zero if
// none will): from then on that score counts as absent, so the decision may
// change without any event. OCM does not requeue for this; see docs/placement.md.
func (f *Fleet) score(pr prioritizer, feasible []int, inDecision []bool, st *PlacementState) ([]int64, time.Time) {
	out := make([]int64, len(feasible))
	var expiry time.Time
	switch pr.kind {
	case kindBalance:
		// OCM's Balance: the max is over every counted decision, not only the
		// feasible clusters; a cluster nobody decided scores 100.
		var maxCount int
		for _, n := range st.OtherDecisions {
			if n > maxCount {
				maxCount = n
			}
		}
		for j, i := range feasible {
			out[j] = MaxClusterScore
			if cnt, ok := st.OtherDecisions[f.clusters[i].Name]; ok && maxCount > 0 {
				usage := float64(cnt) / float64(maxCount)
				// OCM truncates before doubling: 2*int64(100*(0.5-usage)).
				out[j] = 2 * int64(float64(MaxClusterScore)*(0.5-usage))
			}
		}
	case kindSteady:
		for j, i := range feasible {
			if inDecision[i] {
				out[j] = MaxClusterScore
			}
		}
	case kindResource:
		r := resIndex(pr.res)
		minA, maxA, any := math.Inf(1), math.Inf(-1), false
		for _, i := range feasible {
			if c := &f.clusters[i]; c.hasRes[r] {
				any = true
				minA = math.Min(minA, c.alloc[r])
				maxA = math.Max(maxA, c.alloc[r])
			}
		}
		if !any {
			break
		}
		for j, i := range feasible {
			c := &f.clusters[i]
			if !c.hasRes[r] {
				continue // OCM leaves it unscored: it adds 0
			}
			if maxA-minA != 0 {
				ratio := (c.alloc[r] - minA) / (maxA - minA)
				out[j] = int64((ratio - 0.5) * 2.0 * 100.0)
			} else {
				out[j] = MaxClusterScore
			}
		}
	case kindAddOn:
		k := AddOnScoreKey{ResourceName: pr.addOn.ResourceName, ScoreName: pr.addOn.ScoreName}
		for j, i := range feasible {
			k.Cluster = f.clusters[i].Name
			sc, ok := f.scores[k]
			if !ok || (sc.ValidUntil != nil && st.Now.After(*sc.ValidUntil)) {
				continue // absent or expired: 0
			}
			out[j] = clamp(int64(sc.Score))
			if sc.ValidUntil != nil {
				// Valid while now is not after ValidUntil: absent from the next instant.
				if e := sc.ValidUntil.Add(time.Nanosecond); expiry.IsZero() || e.Before(expiry) {
					expiry = e
				}
			}
		}
	}
	return out, expiry
}

// clamp keeps an add-on score in [-100, 100]; OCM trusts the reporter, the
// API is expected to reject such scores, this is the last line of defence.
func clamp(v int64) int64 {
	return max(MinClusterScore, min(MaxClusterScore, v))
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
