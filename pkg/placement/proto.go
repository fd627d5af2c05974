package placement

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
)

// SetFromProto is a cluster set of the API as the scheduler reads it. Every reader of set
// membership (the scheduler, the set API, the authorization of set roles) converts with it, so
// that they agree on which clusters a set holds.
func SetFromProto(c *placementv1.ClusterSet) ClusterSet {
	out := ClusterSet{Name: c.GetName(), Selector: ClusterSetSelector{Type: SelectorExclusiveLabel}}
	if c.GetSelector().GetType() == placementv1.SelectorType_SELECTOR_TYPE_LABEL_SELECTOR {
		out.Selector = ClusterSetSelector{Type: SelectorLabelSelector, LabelSelector: MetaSelector(c.Selector.LabelSelector)}
	}
	return out
}

// MetaSelector is an API label selector as Kubernetes' type; nil stays nil (selects nothing).
func MetaSelector(ls *placementv1.LabelSelector) *metav1.LabelSelector {
	if ls == nil {
		return nil
	}
	out := &metav1.LabelSelector{MatchLabels: ls.MatchLabels}
	for _, r := range ls.MatchExpressions {
		out.MatchExpressions = append(out.MatchExpressions, metav1.LabelSelectorRequirement{
			Key: r.Key, Operator: metav1.LabelSelectorOperator(r.Operator), Values: r.Values})
	}
	return out
}
