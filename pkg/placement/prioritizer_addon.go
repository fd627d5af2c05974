package placement

import "time"

// addOnScore is OCM's AddOn prioritizer (plugins/addon): the add-on score
// another system reported for the cluster. It is named by its coordinate,
// not built in, so it has no entry in builtInPrioritizers.
type addOnScore struct {
	coord AddOnScoreCoordinate
}

// addOnPrioritizerName is the name an add-on prioritizer has in a decision.
func addOnPrioritizerName(c AddOnScoreCoordinate) string {
	return "AddOn/" + c.ResourceName + "/" + c.ScoreName
}

// score also returns the first moment one of the scores it used expires:
// from then on that score counts as absent, so the decision may change
// without any event. OCM does not requeue for this; see docs/placement.md.
func (p addOnScore) score(r *round, feasible []int, out []int64) time.Time {
	var expiry time.Time
	k := AddOnScoreKey{ResourceName: p.coord.ResourceName, ScoreName: p.coord.ScoreName}
	for j, i := range feasible {
		k.Cluster = r.fleet.names[i]
		sc, ok := r.fleet.scores[k]
		if !ok || (sc.ValidUntil != nil && r.state.Now.After(*sc.ValidUntil)) {
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
	return expiry
}

// clamp keeps an add-on score in [-100, 100]; OCM trusts the reporter, the
// API is expected to reject such scores, this is the last line of defence.
func clamp(v int64) int64 {
	return max(MinClusterScore, min(MaxClusterScore, v))
}
