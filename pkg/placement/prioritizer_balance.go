package placement

import "time"

// PrioritizerBalance favours clusters that fewer other placements decided.
const PrioritizerBalance = "Balance"

// balance is OCM's Balance (plugins/balance).
type balance struct{}

func (balance) score(r *round, feasible []int, out []int64) time.Time {
	// The max is over every counted decision, not only the feasible
	// clusters; a cluster nobody decided scores 100.
	var maxCount int
	for _, n := range r.state.OtherDecisions {
		if n > maxCount {
			maxCount = n
		}
	}
	for j, i := range feasible {
		out[j] = MaxClusterScore
		if cnt, ok := r.state.OtherDecisions[r.fleet.names[i]]; ok && maxCount > 0 {
			usage := float64(cnt) / float64(maxCount)
			// OCM truncates before doubling: 2*int64(100*(0.5-usage)).
			out[j] = 2 * int64(float64(MaxClusterScore)*(0.5-usage))
		}
	}
	return time.Time{}
}
