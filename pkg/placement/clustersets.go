package placement

import (
	"math/bits"
	"slices"
	"strconv"
)

// availCacheSize bounds how many lists of available clusters a fleet keeps:
// past it, a combination of sets is computed afresh each round.
const availCacheSize = 64

// availableClusters is where a round starts, before any filter: OCM's
// GetValidManagedClusterSetBindings, GetEligibleClusterSets and
// GetAvailableClusters. It returns the indexes of the members of the sets
// bound to the project (and named by the placement, if it names any),
// ascending, in sc's candidate buffer, and what the PlacementSatisfied
// condition says of the sets.
func (f *Fleet) availableClusters(p *Placement, st *PlacementState, sc *roundScratch) ([]int, satisfaction) {
	// A project binds a handful of sets: a sorted, deduplicated slice is
	// cheaper than a map per round.
	bound := sc.bound[:0]
	for _, s := range st.BoundClusterSets {
		if _, ok := f.members[s]; ok {
			bound = append(bound, s)
		}
	}
	slices.Sort(bound)
	bound = slices.Compact(bound)
	sc.bound = bound
	eligible := bound
	if len(p.ClusterSets) > 0 {
		eligible = sc.eligible[:0]
		for _, s := range p.ClusterSets {
			if _, ok := slices.BinarySearch(bound, s); ok {
				eligible = append(eligible, s)
			}
		}
		slices.Sort(eligible)
		eligible = slices.Compact(eligible)
		sc.eligible = eligible
	}
	// Sets overlap (a label-selector set and an exclusive one): OR their
	// bits, then list in index order, so the filters see each cluster once,
	// in name order.
	out := sc.candidates[:0]
	switch len(eligible) {
	case 0:
	case 1:
		out = append(out, f.members[eligible[0]]...)
	default:
		key := sc.key[:0]
		for _, s := range eligible {
			key = append(strconv.AppendInt(key, int64(len(s)), 10), ':')
			key = append(key, s...)
		}
		sc.key = key
		f.avail.Lock()
		m, ok := f.avail.m[string(key)]
		f.avail.Unlock()
		if ok {
			out = append(out, m...)
			break
		}
		words := sc.words
		for _, s := range eligible {
			for w, b := range f.memberBits[s] {
				words[w] |= b
			}
		}
		for w, b := range words {
			for b != 0 {
				out = append(out, w*64+bits.TrailingZeros64(b))
				b &= b - 1
			}
			words[w] = 0
		}
		f.avail.Lock()
		if f.avail.m == nil {
			f.avail.m = map[string][]int{}
		}
		if len(f.avail.m) < availCacheSize {
			f.avail.m[string(key)] = slices.Clone(out)
		}
		f.avail.Unlock()
	}
	return out, satisfaction{specSets: p.ClusterSets, eligible: eligible, bindings: len(bound), available: len(out)}
}
