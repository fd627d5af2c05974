package placement

import (
	"context"
	"fmt"
	"slices"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	core "github.com/fleetstream/fleetstream/pkg/placement"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// ExplainPlacement runs the scheduler's round (core.Fleet.Explain: Schedule's own sets, filters,
// prioritizers and ranking) on the inputs of the placement's last decision, the fleet as it is
// now: the registered clusters, the sets, the add-on scores and the sets bound to the project
// from this replica's views, every other placement's decision (Balance), and the decision the
// last one was made after (Steady, NoSelectIfNew; the last decision event's clusters less the
// ones it added, plus the ones it removed). While none of those changed since the last decision,
// this is its explanation, scores included; otherwise it is the decision the scheduler is about
// to make. Authorization is GetPlacement's (pkg/authz): a project's viewers explain its
// placements.
func (s *PlacementAPI) ExplainPlacement(ctx context.Context, req *connect.Request[placementv1.ExplainPlacementRequest]) (*connect.Response[placementv1.ExplainPlacementResponse], error) {
	m := req.Msg
	p, err := s.getPlacement(ctx, m.Project, m.Name)
	if err != nil {
		return nil, err
	}
	// A fresh fleetInputs: the scheduler's is its worker's alone, and this may run on any replica.
	var fi fleetInputs
	fleet, _, err := fi.build(s.clusters.List(nil), s.clusterSets.List(nil), s.addOnScores.List(nil), nil)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	key := placementKey(p.Project, p.Name)
	prev, err := s.decidedBeforeLast(ctx, p.Project, p.Name)
	if err != nil {
		return nil, err
	}
	others := map[string]int{}
	for _, e := range s.decisions.Entries(nil) {
		if e.Key == key {
			continue
		}
		for _, c := range decidedClusters(e.Value) {
			others[c]++
		}
	}
	var bound []string
	for _, b := range s.setBindings.Lookup(byProject(p.Project)) {
		bound = append(bound, b.ClusterSet)
	}
	now := s.now()
	ex, err := fleet.Explain(ctx, toCorePlacement(p), core.PlacementState{
		BoundClusterSets: bound, PreviousDecision: prev, OtherDecisions: others, Now: now})
	if err != nil {
		return nil, fmt.Errorf("explain placement %s/%s: %w", p.Project, p.Name, err)
	}
	return connect.NewResponse(toExplanation(p, ex, now)), nil
}

// decideNow is a dry run's answer for placement p as given: the clusters the scheduler would
// decide for it now, from the same inputs ExplainPlacement reads, with p's current decision (if
// it exists) as the previous one.
func (s *Service) decideNow(ctx context.Context, p *placementv1.Placement) ([]string, error) {
	var fi fleetInputs
	fleet, _, err := fi.build(s.clusters.List(nil), s.clusterSets.List(nil), s.addOnScores.List(nil), nil)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	key := placementKey(p.Project, p.Name)
	others := map[string]int{}
	var prev []string
	for _, e := range s.decisions.Entries(nil) {
		if e.Key == key {
			prev = decidedClusters(e.Value)
			continue
		}
		for _, c := range decidedClusters(e.Value) {
			others[c]++
		}
	}
	var bound []string
	for _, b := range s.setBindings.Lookup(byProject(p.Project)) {
		bound = append(bound, b.ClusterSet)
	}
	ex, err := fleet.Explain(ctx, toCorePlacement(p), core.PlacementState{
		BoundClusterSets: bound, PreviousDecision: prev, OtherDecisions: others, Now: s.now()})
	if err != nil {
		return nil, apierr.Internal(fmt.Errorf("decide placement %s/%s: %w", p.Project, p.Name, err))
	}
	var out []string
	for _, c := range ex.Clusters {
		if c.Selected {
			out = append(out, c.ClusterName)
		}
	}
	slices.Sort(out)
	return out, nil
}

func toExplanation(p *placementv1.Placement, ex *core.Explanation, now time.Time) *placementv1.ExplainPlacementResponse {
	out := &placementv1.ExplainPlacementResponse{Project: p.Project, Name: p.Name, Misconfigured: ex.Misconfigured,
		EvaluatedAt: timestamppb.New(now)}
	for _, pr := range ex.Prioritizers {
		out.Prioritizers = append(out.Prioritizers, &placementv1.PrioritizerWeight{Name: pr.Name, Weight: pr.Weight})
	}
	for _, c := range ex.Clusters {
		out.Clusters = append(out.Clusters, &placementv1.ClusterExplanation{ClusterName: c.ClusterName, Selected: c.Selected,
			Scores: c.Scores, Total: c.Total, Rank: int32(c.Rank), Reason: toReason(c.Reason)}) //nolint:gosec // rank ≤ clusters
	}
	return out
}

var reasonKinds = map[core.NotSelectedKind]placementv1.NotSelectedReasonKind{
	core.NotInClusterSets:      placementv1.NotSelectedReasonKind_NOT_SELECTED_REASON_KIND_NOT_IN_CLUSTER_SETS,
	core.PredicateNotMatched:   placementv1.NotSelectedReasonKind_NOT_SELECTED_REASON_KIND_PREDICATE_NOT_MATCHED,
	core.TaintNotTolerated:     placementv1.NotSelectedReasonKind_NOT_SELECTED_REASON_KIND_TAINT_NOT_TOLERATED,
	core.CutByNumberOfClusters: placementv1.NotSelectedReasonKind_NOT_SELECTED_REASON_KIND_CUT_BY_NUMBER_OF_CLUSTERS,
	core.Misconfigured:         placementv1.NotSelectedReasonKind_NOT_SELECTED_REASON_KIND_MISCONFIGURED,
}

var taintEffects = map[core.TaintEffect]clusterv1.TaintEffect{
	core.TaintEffectNoSelect:       clusterv1.TaintEffect_TAINT_EFFECT_NO_SELECT,
	core.TaintEffectNoSelectIfNew:  clusterv1.TaintEffect_TAINT_EFFECT_NO_SELECT_IF_NEW,
	core.TaintEffectPreferNoSelect: clusterv1.TaintEffect_TAINT_EFFECT_PREFER_NO_SELECT,
}

func toReason(r *core.NotSelected) *placementv1.NotSelectedReason {
	if r == nil {
		return nil
	}
	out := &placementv1.NotSelectedReason{Kind: reasonKinds[r.Kind], Message: r.Message, EligibleClusterSets: r.EligibleSets,
		NumberOfClusters: r.NumberOfClusters, LastSelectedTotal: r.LastSelectedTotal}
	for _, m := range r.Predicates {
		out.Predicates = append(out.Predicates, &placementv1.PredicateMismatch{Predicate: int32(m.Predicate), Selector: m.Selector, Requirement: m.Requirement}) //nolint:gosec // a placement's predicates
	}
	if t := r.Taint; t != nil {
		out.Taint = &clusterv1.Taint{Key: t.Key, Value: t.Value, Effect: taintEffects[t.Effect]}
		if !t.TimeAdded.IsZero() {
			out.Taint.TimeAdded = timestamppb.New(t.TimeAdded)
		}
	}
	return out
}

// decidedBeforeLast is the decision the placement's last decision was made after: its clusters,
// less those it added, plus those it removed (nil before the first decision).
func (s *Service) decidedBeforeLast(ctx context.Context, project, name string) ([]string, error) {
	_, last, err := events.Last(ctx, s.stream, subjects.PlacementDecision(project, name))
	if err != nil {
		return nil, apierr.Internal(fmt.Errorf("last decision of placement %s/%s: %w", project, name, err))
	}
	ch, ok := events.PayloadOf(last).(*placementv1.PlacementDecisionsChanged)
	if !ok {
		return nil, nil
	}
	added := map[string]bool{}
	for _, c := range ch.Added {
		added[c] = true
	}
	var out []string
	for _, c := range decidedClusters(ch.Decisions) {
		if !added[c] {
			out = append(out, c)
		}
	}
	return append(out, ch.Removed...), nil
}
