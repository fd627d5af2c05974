package placement

import "time"

// PrioritizerSteady favours the clusters of the placement's previous decision.
const PrioritizerSteady = "Steady"

// steady is OCM's Steady (plugins/steady).
type steady struct{}

func (steady) score(r *round, feasible []int, out []int64) time.Time {
	for j, i := range feasible {
		if r.inDecision[i] {
			out[j] = MaxClusterScore
		}
	}
	return time.Time{}
}
