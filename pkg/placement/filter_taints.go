package placement

import (
	"fmt"
	"time"
)

// taintToleration is OCM's TaintToleration filter (plugins/tainttoleration):
// a cluster passes if the placement tolerates each of its taints. It reports
// the earliest moment a toleration in use runs out, when a kept cluster
// would no longer pass.
type taintToleration struct{}

func (taintToleration) filter(r *round, candidates []int) ([]int, time.Time) {
	kept := candidates[:0]
	var next time.Time
	for _, i := range candidates {
		if !r.fleet.tainted[i] {
			kept = append(kept, i)
			continue
		}
		ok, requeue := clusterTolerated(&r.fleet.clusters[i], r.placement.Tolerations, r.inDecision[i], r.state.Now)
		if !ok {
			continue
		}
		next = earliest(next, requeue)
		kept = append(kept, i)
	}
	return kept, next
}

// validateTolerations names the first toleration OCM would reject.
func validateTolerations(tols []Toleration) *misconfig {
	for i, t := range tols {
		f := func(s string) string { return fmt.Sprintf("tolerations[%d]%s", i, s) }
		switch t.Operator {
		case "", TolerationOpEqual, TolerationOpExists:
		default:
			return &misconfig{field: f(".operator"), msg: fmt.Sprintf("unknown operator %q, want Equal or Exists", t.Operator)}
		}
		switch t.Effect {
		case "", TaintEffectNoSelect, TaintEffectNoSelectIfNew, TaintEffectPreferNoSelect:
		default:
			return &misconfig{field: f(".effect"), msg: fmt.Sprintf("unknown effect %q", t.Effect)}
		}
		// OCM's TaintToleration messages, verbatim.
		if t.Key == "" && t.Operator != TolerationOpExists {
			return &misconfig{field: f(".key"), msg: "If the key is empty, operator must be Exists."}
		}
		if t.Operator == TolerationOpExists && t.Value != "" {
			return &misconfig{field: f(".value"), msg: "If the operator is Exists, the value should be empty."}
		}
	}
	return nil
}

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

// why names the first taint of cluster i the placement does not tolerate.
func (taintToleration) why(r *round, i int) *NotSelected {
	c := &r.fleet.clusters[i]
	for k := range c.Taints {
		t := c.Taints[k]
		if ok, _ := taintTolerated(&t, r.placement.Tolerations, r.inDecision[i], r.state.Now); ok {
			continue
		}
		msg := fmt.Sprintf("taint %s:%s is not tolerated", t.Key, t.Effect)
		switch t.Key {
		case TaintUnreachable:
			msg += " (the cluster's agent is not connected)"
		case TaintUnavailable:
			msg += " (the cluster reports itself unavailable)"
		}
		return &NotSelected{Kind: TaintNotTolerated, Taint: &t, Message: msg}
	}
	return &NotSelected{Kind: TaintNotTolerated, Message: "a taint is not tolerated"}
}
