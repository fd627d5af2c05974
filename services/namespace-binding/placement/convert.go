package placement

import (
	"slices"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	core "github.com/fleetstream/fleetstream/pkg/placement"
)

// Conversions between the placement API (fleetstream.placement.v1) and the scheduler core
// (pkg/placement).

func toMetaSelector(ls *placementv1.LabelSelector) *metav1.LabelSelector {
	return core.MetaSelector(ls)
}

func toPlacementSet(c *placementv1.ClusterSet) core.ClusterSet { return core.SetFromProto(c) }

// placementSpec returns p's spec only: what a PlacementCreated/Updated event carries.
func placementSpec(p *placementv1.Placement) *placementv1.Placement {
	out := proto.CloneOf(p)
	out.Status, out.CreateTime, out.UpdateTime, out.Revision = nil, nil, nil, 0
	return out
}

// toCorePlacement converts a validated placement for the scheduler.
func toCorePlacement(p *placementv1.Placement) *core.Placement {
	out := &core.Placement{Project: p.Project, Name: p.Name, ClusterSets: p.ClusterSets, NumberOfClusters: p.NumberOfClusters}
	for _, pr := range p.Predicates {
		cs := pr.GetRequiredClusterSelector()
		out.Predicates = append(out.Predicates, core.Predicate{RequiredClusterSelector: core.ClusterSelector{
			LabelSelector: derefSelector(toMetaSelector(cs.GetLabelSelector())),
			ClaimSelector: toCoreClaims(cs.GetClaimSelector()),
			CELSelector:   core.CELSelector{CELExpressions: cs.GetCelSelector().GetCelExpressions()},
		}})
	}
	for _, t := range p.Tolerations {
		out.Tolerations = append(out.Tolerations, core.Toleration{Key: t.Key, Operator: core.TolerationOperator(t.Operator),
			Value: t.Value, Effect: core.TaintEffect(t.Effect), TolerationSeconds: t.TolerationSeconds})
	}
	pp := p.GetPrioritizerPolicy()
	out.PrioritizerPolicy.Mode = core.PrioritizerPolicyMode(pp.GetMode())
	for _, c := range pp.GetConfigurations() {
		w := int32(1) // OCM's CRD default
		if c.Weight != nil {
			w = *c.Weight
		}
		cfg := core.PrioritizerConfig{Weight: w}
		if sc := c.GetScoreCoordinate(); sc != nil {
			cfg.ScoreCoordinate = &core.ScoreCoordinate{Type: core.ScoreCoordinateTypeBuiltIn, BuiltIn: sc.BuiltIn}
			if sc.Type == placementv1.ScoreCoordinateType_SCORE_COORDINATE_TYPE_ADD_ON {
				cfg.ScoreCoordinate = &core.ScoreCoordinate{Type: core.ScoreCoordinateTypeAddOn,
					AddOn: &core.AddOnScoreCoordinate{ResourceName: sc.GetAddOn().GetResourceName(), ScoreName: sc.GetAddOn().GetScoreName()}}
			}
		}
		out.PrioritizerPolicy.Configurations = append(out.PrioritizerPolicy.Configurations, cfg)
	}
	ds := p.GetDecisionStrategy()
	if n := ds.GetClustersPerDecisionGroup(); n != "" {
		out.DecisionStrategy.ClustersPerDecisionGroup, _ = parseGroupSize(n)
	}
	for _, g := range ds.GetGroups() {
		gs := g.GetGroupClusterSelector()
		out.DecisionStrategy.Groups = append(out.DecisionStrategy.Groups, core.DecisionGroup{GroupName: g.GroupName,
			GroupClusterSelector: core.GroupClusterSelector{
				LabelSelector: derefSelector(toMetaSelector(gs.GetLabelSelector())),
				ClaimSelector: toCoreClaims(gs.GetClaimSelector()),
			}})
	}
	return out
}

func derefSelector(ls *metav1.LabelSelector) metav1.LabelSelector {
	if ls == nil {
		return metav1.LabelSelector{}
	}
	return *ls
}

func toCoreClaims(cs *placementv1.ClaimSelector) core.ClaimSelector {
	ls := claimAsLabelSelector(cs)
	if ls == nil {
		return core.ClaimSelector{}
	}
	return core.ClaimSelector{MatchExpressions: ls.MatchExpressions}
}

// toCoreCluster converts a registry entry for the scheduler. Taints without an effect are
// NoSelect (the safe reading); resources the agent reported unparsable are left out.
func toCoreCluster(c *clusterv1.Cluster) core.Cluster {
	out := core.Cluster{Name: c.Name, Labels: c.Labels, Claims: c.Claims}
	for _, t := range c.Taints {
		eff := core.TaintEffectNoSelect
		switch t.Effect {
		case clusterv1.TaintEffect_TAINT_EFFECT_NO_SELECT_IF_NEW:
			eff = core.TaintEffectNoSelectIfNew
		case clusterv1.TaintEffect_TAINT_EFFECT_PREFER_NO_SELECT:
			eff = core.TaintEffectPreferNoSelect
		}
		var added time.Time
		if t.TimeAdded != nil {
			added = t.TimeAdded.AsTime()
		}
		out.Taints = append(out.Taints, core.Taint{Key: t.Key, Value: t.Value, Effect: eff, TimeAdded: added})
	}
	if r := c.GetStatus().GetResources(); r != nil {
		out.Allocatable, out.Capacity = quantities(r.Allocatable), quantities(r.Capacity)
	}
	return out
}

func quantities(m map[string]string) map[core.ResourceName]resource.Quantity {
	if len(m) == 0 {
		return nil
	}
	out := make(map[core.ResourceName]resource.Quantity, len(m))
	for k, v := range m {
		if q, err := resource.ParseQuantity(v); err == nil {
			out[core.ResourceName(k)] = q
		}
	}
	return out
}

func toCoreScore(s *placementv1.AddOnScore) core.AddOnScore {
	out := core.AddOnScore{AddOnScoreKey: core.AddOnScoreKey{Cluster: s.Cluster, ResourceName: s.ResourceName, ScoreName: s.ScoreName},
		Score: s.Score}
	if s.ValidUntil != nil {
		t := s.ValidUntil.AsTime()
		out.ValidUntil = &t
	}
	return out
}

// toDecisions renders the scheduler's decision as the API's, keeping the transition times of
// conditions whose status did not change since prev.
func toDecisions(project, name string, d *core.Decision, prev *placementv1.PlacementDecisions, now time.Time) *placementv1.PlacementDecisions {
	out := &placementv1.PlacementDecisions{Project: project, Name: name, DecideTime: timestamppb.New(now), Status: toStatus(d, prev.GetStatus(), now)}
	for _, p := range d.Prioritizers {
		out.Prioritizers = append(out.Prioritizers, &placementv1.PrioritizerWeight{Name: p.Name, Weight: p.Weight})
	}
	for _, g := range d.DecisionGroups {
		og := &placementv1.DecisionGroupDecisions{DecisionGroupIndex: g.DecisionGroupIndex, DecisionGroupName: g.DecisionGroupName, ClustersCount: g.ClustersCount}
		for _, pg := range g.Pages {
			op := &placementv1.DecisionPage{}
			for _, c := range pg.Clusters {
				op.Clusters = append(op.Clusters, &placementv1.ClusterDecision{ClusterName: c.ClusterName, Scores: c.Scores, Total: c.Total})
			}
			og.Pages = append(og.Pages, op)
		}
		out.Groups = append(out.Groups, og)
	}
	return out
}

func toStatus(d *core.Decision, prev *placementv1.PlacementStatus, now time.Time) *placementv1.PlacementStatus {
	st := &placementv1.PlacementStatus{NumberOfSelectedClusters: d.NumberOfSelectedClusters}
	for _, g := range d.DecisionGroups {
		st.DecisionGroups = append(st.DecisionGroups, &placementv1.DecisionGroupStatus{DecisionGroupIndex: g.DecisionGroupIndex,
			DecisionGroupName: g.DecisionGroupName, ClustersCount: g.ClustersCount})
	}
	for _, c := range d.Conditions {
		oc := &placementv1.PlacementCondition{Type: c.Type, Status: string(c.Status), Reason: c.Reason, Message: c.Message,
			Field: c.Field, Unscheduled: int32(c.Unscheduled), LastTransitionTime: timestamppb.New(now)}
		for _, pc := range prev.GetConditions() {
			if pc.Type == c.Type && pc.Status == oc.Status {
				oc.LastTransitionTime = pc.LastTransitionTime
			}
		}
		st.Conditions = append(st.Conditions, oc)
	}
	return st
}

// decidedClusters lists a decision's clusters, best first within each group, groups in order.
func decidedClusters(d *placementv1.PlacementDecisions) []string {
	var out []string
	for _, g := range d.GetGroups() {
		for _, p := range g.Pages {
			for _, c := range p.Clusters {
				out = append(out, c.ClusterName)
			}
		}
	}
	return out
}

// sameDecision reports whether two decisions select the same clusters in each group with the
// same conditions (ignoring transition times): whether followers have anything to act on.
// Scores alone changing (an add-on score moving, and with it the order of a group) is not a
// new decision, as in OCM; it is a new evaluation (sameEvaluation), stored at a bounded rate.
func sameDecision(a, b *placementv1.PlacementDecisions) bool {
	if a == nil || b == nil {
		return a == b
	}
	type group struct {
		index    int32
		name     string
		clusters []string
	}
	strip := func(d *placementv1.PlacementDecisions) ([]group, *placementv1.PlacementStatus) {
		st := proto.CloneOf(d.Status)
		for _, c := range st.GetConditions() {
			c.LastTransitionTime = nil
		}
		var gs []group
		for _, g := range d.Groups {
			og := group{index: g.DecisionGroupIndex, name: g.DecisionGroupName}
			for _, p := range g.Pages {
				for _, c := range p.Clusters {
					og.clusters = append(og.clusters, c.ClusterName)
				}
			}
			slices.Sort(og.clusters)
			gs = append(gs, og)
		}
		return gs, st
	}
	ga, sa := strip(a)
	gb, sb := strip(b)
	return proto.Equal(sa, sb) && slices.EqualFunc(ga, gb, func(x, y group) bool {
		return x.index == y.index && x.name == y.name && slices.Equal(x.clusters, y.clusters)
	})
}

// sameEvaluation reports whether two decisions also agree in what the API shows beyond the
// clusters: the prioritizers, every cluster's scores and order, and the next evaluation. When
// and from which inputs they were made does not count.
func sameEvaluation(a, b *placementv1.PlacementDecisions) bool {
	strip := func(d *placementv1.PlacementDecisions) *placementv1.PlacementDecisions {
		d = proto.CloneOf(d)
		d.DecideTime, d.Revision, d.InputDigest = nil, 0, nil
		for _, c := range d.GetStatus().GetConditions() {
			c.LastTransitionTime = nil
		}
		return d
	}
	return proto.Equal(strip(a), strip(b))
}
