package kubebridge

import (
	"fmt"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	ocmv1beta1 "open-cluster-management.io/api/cluster/v1beta1"

	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
)

// LabelProject names the Fleetstream project of a hub namespace (set by a platform admin: the
// namespace-to-project mapping) and of every PlacementDecision the bridge writes there.
const LabelProject = "fleetstream.io/project"

// placementDecisions are the PlacementDecision objects of d in namespace, as OCM's scheduler
// writes them: one per page of at most 100 clusters, named <placement>-decision-<n> with n
// counting pages from 1 across the groups, labelled with the placement's name and the page's
// decision group index and name. A decision with no page has none (OCM keeps one empty page per
// group, and so does the scheduler: every group has at least one). dropped names what could not
// be published.
func placementDecisions(d *placementv1.PlacementDecisions, namespace string) (out []*ocmv1beta1.PlacementDecision, dropped []string) {
	n := 0
	for gi, g := range d.GetGroups() {
		groupName := g.GetDecisionGroupName()
		if len(validation.IsValidLabelValue(groupName)) > 0 {
			// The placement API checks group names; this is the second line, at the boundary.
			dropped = append(dropped, fmt.Sprintf("groups[%d].decision_group_name: not a label value", gi))
			groupName = ""
		}
		for _, page := range g.GetPages() {
			n++
			pd := &ocmv1beta1.PlacementDecision{
				TypeMeta: metav1.TypeMeta{APIVersion: ocmv1beta1.GroupVersion.String(), Kind: "PlacementDecision"},
				ObjectMeta: metav1.ObjectMeta{
					Name:      fmt.Sprintf("%s-decision-%d", d.GetName(), n),
					Namespace: namespace,
					Labels: map[string]string{
						ocmv1beta1.PlacementLabel:          d.GetName(),
						ocmv1beta1.DecisionGroupIndexLabel: strconv.Itoa(int(g.GetDecisionGroupIndex())),
						ocmv1beta1.DecisionGroupNameLabel:  groupName,
						LabelProject:                       d.GetProject(),
						LabelManagedBy:                     FieldManager,
					},
				},
				Status: ocmv1beta1.PlacementDecisionStatus{Decisions: []ocmv1beta1.ClusterDecision{}},
			}
			for _, c := range page.GetClusters() {
				pd.Status.Decisions = append(pd.Status.Decisions, ocmv1beta1.ClusterDecision{ClusterName: c.GetClusterName()})
			}
			out = append(out, pd)
		}
	}
	return out, dropped
}
