package placement

import "slices"

// groups is OCM's generateDecisionGroups + generateDecision: clusters go to
// the first group whose selector matches them (in decision order), the rest
// to unnamed groups; each group is cut into groups of the computed length
// and each of those into pages of at most MaxDecisionsPerPage. Inside a
// group clusters are sorted by name, not by score, as in OCM.
//
// sel holds the fleet indexes of the selected clusters, parallel to cds.
// c nil (a misconfigured placement) or nothing selected gives one empty group.
func (f *Fleet) groups(c *compiled, p *Placement, sel []int, cds []ClusterDecision) []DecisionGroupStatus {
	type rawGroup struct {
		name    string
		members []int // positions in cds
	}
	var raw []rawGroup
	if c != nil && len(sel) > 0 {
		// compile already validated the value, so the error cannot occur.
		length, _ := groupLength(p.DecisionStrategy.ClustersPerDecisionGroup, len(sel))
		divide := func(name string, matched []int) {
			// The fleet is in name order, so a cluster's index orders by name.
			slices.SortFunc(matched, func(a, b int) int { return sel[a] - sel[b] })
			for len(matched) > 0 {
				n := min(length, len(matched))
				raw = append(raw, rawGroup{name: name, members: matched[:n:n]})
				matched = matched[n:]
			}
		}
		var taken []bool // nil: no named groups, nothing taken
		if len(p.DecisionStrategy.Groups) > 0 {
			taken = make([]bool, len(sel))
		}
		for gi, g := range p.DecisionStrategy.Groups {
			var matched []int
			for r, i := range sel {
				if !taken[r] && c.groups[gi].matches(f, i) {
					taken[r] = true
					matched = append(matched, r)
				}
			}
			divide(g.GroupName, matched)
		}
		rest := make([]int, 0, len(sel))
		for r := range sel {
			if taken == nil || !taken[r] {
				rest = append(rest, r)
			}
		}
		divide("", rest)
	}
	if len(raw) == 0 {
		raw = []rawGroup{{}}
	}
	out := make([]DecisionGroupStatus, len(raw))
	// Every page is a window on one array: a cluster is in exactly one page.
	all := make([]ClusterDecision, 0, len(sel))
	for gi, g := range raw {
		gs := DecisionGroupStatus{
			DecisionGroupIndex: int32(gi), //nolint:gosec // bounded by cluster count
			DecisionGroupName:  g.name,
			ClustersCount:      int32(len(g.members)), //nolint:gosec // bounded by cluster count
		}
		for start := 0; start < len(g.members) || start == 0; start += MaxDecisionsPerPage {
			end := min(start+MaxDecisionsPerPage, len(g.members))
			from := len(all)
			for _, r := range g.members[start:end] {
				all = append(all, cds[r])
			}
			gs.Pages = append(gs.Pages, DecisionPage{Clusters: all[from:len(all):len(all)]})
			if end == len(g.members) {
				break
			}
		}
		out[gi] = gs
	}
	return out
}
