package placement

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
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

	sc := f.getScratch()
	defer f.putScratch(sc)

	// The bound sets narrow the fleet to the available clusters; the filters then narrow those.
	candidates, sat := f.availableClusters(p, &st, sc)
	d := &Decision{}

	c, mis := compileInto(p, &sc.compiled)
	if mis != nil {
		// OCM: a Misconfigured status leaves the schedule result empty, the
		// decision is written empty and Satisfied says nothing matched.
		d.DecisionGroups = f.groups(nil, nil, nil, nil)
		d.Conditions = []Condition{sat.condition(0, 0), misconfiguredCondition(mis)}
		return d, nil
	}

	for _, n := range st.PreviousDecision {
		if i, ok := f.byName[n]; ok {
			sc.inDecision[i] = true
			sc.prev = append(sc.prev, i)
		}
	}

	sc.round = round{fleet: f, placement: p, compiled: c, state: st, inDecision: sc.inDecision}
	r := &sc.round

	feasible, next := runFilters(r, candidates, nil)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("schedule placement %s/%s: %w", p.Project, p.Name, err)
	}

	// Prioritizers: each scores the feasible clusters; the total is Σ score×weight.
	nf, np := len(feasible), len(c.prioritizers)
	totals := sc.int64s(&sc.totals, nf)
	buf := sc.int64s(&sc.scores, np*nf)
	d.Prioritizers = runPrioritizers(r, feasible, totals, buf, &next)

	n := nf
	unscheduled := 0
	if p.NumberOfClusters != nil {
		want := int(*p.NumberOfClusters)
		if want < n {
			n = want
		}
		unscheduled = want - n
	}
	order := sc.rank(totals, n)
	d.Clusters = make([]ClusterDecision, n)
	// One array holds every selected cluster's scores.
	perCluster := make([]int64, n*np)
	selIdx := sc.sel[:0]
	for r := 0; r < n; r++ {
		j := order[r].j
		cd := ClusterDecision{ClusterName: f.names[feasible[j]], Total: totals[j]}
		if np > 0 {
			cd.Scores = perCluster[r*np : (r+1)*np : (r+1)*np]
			for k := range np {
				cd.Scores[k] = buf[k*nf+j]
			}
		}
		d.Clusters[r] = cd
		selIdx = append(selIdx, feasible[j])
	}
	sc.sel = selIdx
	d.NumberOfSelectedClusters = int32(n) //nolint:gosec // n ≤ number of clusters
	d.DecisionGroups = f.groups(c, p, selIdx, d.Clusters)
	d.NextEvaluation = next
	d.Conditions = []Condition{sat.condition(n, unscheduled), misconfiguredCondition(nil)}
	return d, nil
}

var errNoNow = errors.New("state.Now is required")

// runFilters runs the filters in order, each on what the previous ones kept (in name order),
// and returns the feasible clusters and the earliest moment one of them may stop passing.
// rejected, when not nil, is told of each cluster a filter drops, with that filter: the one
// place Explain learns why, so it cannot disagree with Schedule.
func runFilters(r *round, candidates []int, rejected func(fl filter, i int)) ([]int, time.Time) {
	feasible := candidates
	var next, before []int
	var at time.Time
	for _, fl := range filters {
		if rejected != nil {
			before = append(before[:0], feasible...)
		}
		var requeue time.Time
		next, requeue = fl.filter(r, feasible)
		at = earliest(at, requeue)
		if rejected != nil {
			k := 0
			for _, i := range before {
				if k < len(next) && next[k] == i {
					k++
					continue
				}
				rejected(fl, i)
			}
		}
		feasible = next
	}
	return feasible, at
}

// runPrioritizers scores the feasible clusters with each active prioritizer into
// scores[k*nf+j] (zeroed) and adds score×weight into totals[j] (zeroed); it moves *next to the
// earliest moment a score may change and returns the prioritizers.
func runPrioritizers(r *round, feasible []int, totals, scores []int64, next *time.Time) []PrioritizerResult {
	nf := len(feasible)
	var out []PrioritizerResult
	if len(r.compiled.prioritizers) > 0 {
		out = make([]PrioritizerResult, len(r.compiled.prioritizers))
	}
	for k, pr := range r.compiled.prioritizers {
		s := scores[k*nf : (k+1)*nf : (k+1)*nf]
		*next = earliest(*next, pr.rule.score(r, feasible, s))
		for j, v := range s {
			totals[j] += v * int64(pr.weight)
		}
		out[k] = PrioritizerResult{Name: pr.name, Weight: pr.weight}
	}
	return out
}

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

// roundScratch is one round's working memory, recycled through the fleet's
// pool; nothing in a Decision points into it.
type roundScratch struct {
	round      round
	compiled   compiled
	candidates []int    // cap = number of clusters: the filters narrow it in place
	inDecision []bool   // by cluster; only the entries listed in prev are true
	prev       []int    // clusters marked in inDecision, to unmark them
	words      []uint64 // a zeroed bit set over the clusters
	key        []byte
	bound      []string
	eligible   []string
	totals     []int64
	scores     []int64
	order      []ranked
	sel        []int
}

// ranked is a feasible cluster's total beside its position, so sorting
// compares in place rather than through the totals slice.
type ranked struct {
	total int64
	j     int
}

// before is the decision order: total desc, then by name. Feasible clusters
// are in name order, so the position breaks ties (OCM's sort.SliceStable
// with the same rule).
func (a ranked) before(b ranked) bool {
	return a.total > b.total || (a.total == b.total && a.j < b.j)
}

// topInsertMax is the most clusters rank keeps by insertion rather than
// by sorting every feasible cluster.
const topInsertMax = 32

// rank returns the first n positions of totals in the decision order. A
// placement usually wants a few clusters of many feasible ones: those are
// kept by insertion, one comparison for most clusters, instead of a sort
// of all of them; the result is the same.
func (sc *roundScratch) rank(totals []int64, n int) []ranked {
	out := sc.order[:0]
	if n > topInsertMax || n >= len(totals) {
		for j, t := range totals {
			out = append(out, ranked{total: t, j: j})
		}
		slices.SortFunc(out, func(a, b ranked) int {
			if a.total != b.total {
				return cmp.Compare(b.total, a.total)
			}
			return cmp.Compare(a.j, b.j)
		})
		sc.order = out
		return out[:n]
	}
	for j, t := range totals {
		x := ranked{total: t, j: j}
		if len(out) == n {
			if n == 0 || !x.before(out[n-1]) {
				continue
			}
			out = out[:n-1]
		}
		k := len(out)
		out = append(out, x)
		for k > 0 && x.before(out[k-1]) {
			out[k] = out[k-1]
			k--
		}
		out[k] = x
	}
	sc.order = out
	return out
}

func (f *Fleet) getScratch() *roundScratch {
	if sc, ok := f.scratch.Get().(*roundScratch); ok {
		return sc
	}
	n := len(f.clusters)
	return &roundScratch{candidates: make([]int, 0, n), inDecision: make([]bool, n), words: make([]uint64, wordsFor(n))}
}

func (f *Fleet) putScratch(sc *roundScratch) {
	for _, i := range sc.prev {
		sc.inDecision[i] = false
	}
	sc.prev = sc.prev[:0]
	sc.round = round{} // hold on to no placement or state
	f.scratch.Put(sc)
}

// int64s returns *buf resized to n and zeroed, growing it if needed.
func (sc *roundScratch) int64s(buf *[]int64, n int) []int64 {
	if cap(*buf) < n {
		*buf = make([]int64, n)
	}
	s := (*buf)[:n]
	clear(s)
	return s
}
