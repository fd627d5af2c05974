package placement

import "sort"

// availableClusters is where a round starts, before any filter: OCM's
// GetValidManagedClusterSetBindings, GetEligibleClusterSets and
// GetAvailableClusters. It returns the indexes of the members of the sets
// bound to the project (and named by the placement, if it names any),
// ascending, and what the PlacementSatisfied condition says of the sets.
func (f *Fleet) availableClusters(p *Placement, st *PlacementState) ([]int, satisfaction) {
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
	// Sets overlap (a label-selector set and an exclusive one): mark, then
	// list in index order, so the filters see each cluster once, in name order.
	available := make([]bool, len(f.clusters))
	n := 0
	for _, s := range eligible {
		for _, i := range f.members[s] {
			if !available[i] {
				available[i] = true
				n++
			}
		}
	}
	out := make([]int, 0, n)
	for i, ok := range available {
		if ok {
			out = append(out, i)
		}
	}
	return out, satisfaction{specSets: p.ClusterSets, eligible: eligible, bindings: len(bound), available: n}
}
