package placement

import "time"

// A placement rule is a filter or a prioritizer, one per file
// (filter_*.go, prioritizer_*.go), as OCM keeps one plugin per folder under
// pkg/placement/plugins. Rules are pure and index-based: they read the
// round's fleet, placement and state and work on cluster indexes into
// Fleet.clusters (ascending, that is in name order), not on lists of names,
// so one round stays a few passes over slices (Balance and AddOn still look
// their inputs up by the cluster's name: those come keyed by name). They are package-private because
// they read the fleet's precomputed index (label sets, parsed resources).
//
// Adding a prioritizer is one file with its type and score method, one line
// in builtInPrioritizers and its case in rules_test.go; adding a filter is one
// file with its type, filter and why methods, one entry in filters and its
// case in rules_test.go (docs/architecture.md, "Where things live").

// round is one placement's scheduling round as the rules see it.
type round struct {
	fleet     *Fleet
	placement *Placement
	compiled  *compiled
	state     PlacementState
	// inDecision is indexed by cluster: whether the cluster is in the
	// placement's previous decision (Steady, NoSelectIfNew).
	inDecision []bool
}

// filter is OCM's Filter plugin.
type filter interface {
	// filter returns the candidates (cluster indexes, ascending) that pass,
	// in order; it may reuse the candidates' array. It also returns the
	// earliest moment at which a kept cluster may stop passing with no
	// input changing (zero if none): the caller turns it into NextEvaluation.
	filter(r *round, candidates []int) ([]int, time.Time)
	// why says why the filter dropped cluster i, for Explain (ExplainPlacement). It is
	// asked only about clusters the filter dropped in the same round, so it re-derives the
	// reason, never the verdict.
	why(r *round, i int) *NotSelected
}

// filters run in this order, each on what the previous ones kept
// (OCM's Predicate, then TaintToleration), after the cluster sets have
// narrowed the fleet to the available clusters (clustersets.go).
var filters = []filter{predicates{}, taintToleration{}}

// prioritizer is OCM's Prioritizer plugin.
type prioritizer interface {
	// score sets out[j] to the score of cluster feasible[j], in
	// [MinClusterScore, MaxClusterScore]; out comes zeroed and a cluster the
	// rule has nothing to say about keeps 0, as in OCM. It returns the
	// earliest moment at which a score it gave may change with no input
	// changing (zero if none): the caller turns it into NextEvaluation.
	score(r *round, feasible []int, out []int64) time.Time
}

// builtInPrioritizers maps the built-in names a placement's
// score_coordinate.built_in may use to their rules. It is never written.
var builtInPrioritizers = map[string]prioritizer{
	PrioritizerBalance:                   balance{},
	PrioritizerSteady:                    steady{},
	PrioritizerResourceAllocatableCPU:    resourceAllocatable{res: ResourceCPU},
	PrioritizerResourceAllocatableMemory: resourceAllocatable{res: ResourceMemory},
}
