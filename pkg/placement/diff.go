package placement

import "sort"

// DecisionDiff returns the clusters a new decision adds to and removes from
// the previous one, each sorted by name: the payload of the
// PlacementDecisionsChanged event, and what namespaces that follow a
// placement act on. Both empty means the decision did not change, so no
// event is due.
func DecisionDiff(previous []string, d *Decision) (added, removed []string) {
	return Diff(previous, d.ClusterNames())
}

// Diff returns the names in next but not in previous, and those in previous
// but not in next, each sorted.
func Diff(previous, next []string) (added, removed []string) {
	prev := make(map[string]bool, len(previous))
	for _, n := range previous {
		prev[n] = true
	}
	now := make(map[string]bool, len(next))
	for _, n := range next {
		now[n] = true
		if !prev[n] {
			added = append(added, n)
		}
	}
	for n := range prev {
		if !now[n] {
			removed = append(removed, n)
		}
	}
	sort.Strings(added)
	sort.Strings(removed)
	return added, removed
}
