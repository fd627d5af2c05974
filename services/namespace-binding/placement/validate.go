package placement

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	core "github.com/fleetstream/fleetstream/pkg/placement"
	"github.com/fleetstream/fleetstream/pkg/roles"
)

// Validation of the API's requests, with field paths: what a handler checks before anything is
// appended.

// validateSetSelector checks a set's selector and returns it canonical: the type always set,
// a label selector only with LABEL_SELECTOR. A nil selector is OCM's default, EXCLUSIVE_LABEL.
func validateSetSelector(v *apierr.Violations, field string, sel *placementv1.ClusterSetSelector) *placementv1.ClusterSetSelector {
	out := proto.CloneOf(sel)
	if out == nil {
		out = &placementv1.ClusterSetSelector{}
	}
	switch out.Type {
	case placementv1.SelectorType_SELECTOR_TYPE_UNSPECIFIED, placementv1.SelectorType_SELECTOR_TYPE_EXCLUSIVE_LABEL:
		out.Type = placementv1.SelectorType_SELECTOR_TYPE_EXCLUSIVE_LABEL
		if out.LabelSelector != nil {
			v.Add(field+".label_selector", "only with type LABEL_SELECTOR: an EXCLUSIVE_LABEL set holds the clusters labelled %s=<set name>", core.ClusterSetLabel)
		}
	case placementv1.SelectorType_SELECTOR_TYPE_LABEL_SELECTOR:
		if out.LabelSelector != nil {
			if _, err := metav1.LabelSelectorAsSelector(toMetaSelector(out.LabelSelector)); err != nil {
				v.Add(field+".label_selector", "%v", err)
			}
		}
	default:
		v.Add(field+".type", "unknown type %d: EXCLUSIVE_LABEL or LABEL_SELECTOR", out.Type)
	}
	return out
}

// validateSetRoleRef checks a set role binding's identity, with field paths.
func validateSetRoleRef(v *apierr.Violations, set string, s *rbacv1.Subject, role string) {
	v.DNSLabel("cluster_set", set)
	switch {
	case s == nil:
		v.Add("subject", "required")
	case s.Kind != rbacv1.SubjectKind_SUBJECT_KIND_USER && s.Kind != rbacv1.SubjectKind_SUBJECT_KIND_GROUP:
		// A service account is a Kubernetes identity: it never calls Fleetstream's API.
		v.Add("subject.kind", "USER or GROUP: set roles are rights on Fleetstream's API")
	default:
		if strings.TrimSpace(s.Name) == "" {
			v.Add("subject.name", "required")
		} else if len(s.Name) > 253 {
			v.Add("subject.name", "at most 253 characters")
		}
		if s.Namespace != "" {
			v.Add("subject.namespace", "only a ServiceAccount has a namespace")
		}
	}
	if _, ok := roles.ClusterSetRoleRules(role); !ok {
		v.Add("role", "%q is not a set role: %s or %s", role, roles.ClusterSetAdmin, roles.ClusterSetView)
	}
}

// validatePlacementSpec checks what OCM's CRD schema checks (names, enums, ranges, formats) and
// the syntax of every selector, with field paths under field. What OCM's scheduler reports as
// PlacementMisconfigured instead of refusing (an unknown built-in prioritizer name) is left to
// the scheduler, so a placement written for a prioritizer this version lacks can still be stored.
func validatePlacementSpec(v *apierr.Violations, field string, p *placementv1.Placement) {
	v.DNSLabel(field+".project", p.GetProject())
	v.DNSLabel(field+".name", p.GetName())
	if p == nil {
		return
	}
	for i, s := range p.ClusterSets {
		v.DNSLabel(fmt.Sprintf("%s.cluster_sets[%d]", field, i), s)
	}
	if p.NumberOfClusters != nil && *p.NumberOfClusters < 0 {
		v.Add(field+".number_of_clusters", "must not be negative, got %d", *p.NumberOfClusters)
	}
	for i, pr := range p.Predicates {
		f := fmt.Sprintf("%s.predicates[%d].required_cluster_selector", field, i)
		cs := pr.GetRequiredClusterSelector()
		validateSelector(v, f+".label_selector", toMetaSelector(cs.GetLabelSelector()))
		validateSelector(v, f+".claim_selector", claimAsLabelSelector(cs.GetClaimSelector()))
		for j, e := range cs.GetCelSelector().GetCelExpressions() {
			if err := core.CheckCELExpression(e); err != nil {
				v.Add(fmt.Sprintf("%s.cel_selector.cel_expressions[%d]", f, j), "%v", err)
			}
		}
	}
	for i, t := range p.Tolerations {
		f := fmt.Sprintf("%s.tolerations[%d]", field, i)
		switch core.TolerationOperator(t.Operator) {
		case "", core.TolerationOpEqual, core.TolerationOpExists:
		default:
			v.Add(f+".operator", "unknown operator %q: Equal or Exists", t.Operator)
		}
		switch core.TaintEffect(t.Effect) {
		case "", core.TaintEffectNoSelect, core.TaintEffectNoSelectIfNew, core.TaintEffectPreferNoSelect:
		default:
			v.Add(f+".effect", "unknown effect %q: NoSelect, NoSelectIfNew or PreferNoSelect", t.Effect)
		}
		if t.Key == "" && t.Operator != string(core.TolerationOpExists) {
			v.Add(f+".key", "required unless the operator is Exists")
		}
		if t.Operator == string(core.TolerationOpExists) && t.Value != "" {
			v.Add(f+".value", "must be empty with operator Exists")
		}
		if t.TolerationSeconds != nil && *t.TolerationSeconds < 0 {
			v.Add(f+".toleration_seconds", "must not be negative, got %d", *t.TolerationSeconds)
		}
	}
	pp := p.GetPrioritizerPolicy()
	switch core.PrioritizerPolicyMode(pp.GetMode()) {
	case "", core.PrioritizerPolicyModeAdditive, core.PrioritizerPolicyModeExact:
	default:
		v.Add(field+".prioritizer_policy.mode", "unknown mode %q: Additive or Exact", pp.GetMode())
	}
	for i, c := range pp.GetConfigurations() {
		f := fmt.Sprintf("%s.prioritizer_policy.configurations[%d]", field, i)
		if c.Weight != nil && (*c.Weight < core.MinWeight || *c.Weight > core.MaxWeight) {
			v.Add(f+".weight", "must be in [%d, %d], got %d", core.MinWeight, core.MaxWeight, *c.Weight)
		}
		sc := c.GetScoreCoordinate()
		switch {
		case sc == nil:
			v.Add(f+".score_coordinate", "required")
		case sc.Type == placementv1.ScoreCoordinateType_SCORE_COORDINATE_TYPE_ADD_ON:
			if sc.GetAddOn().GetResourceName() == "" {
				v.Add(f+".score_coordinate.add_on.resource_name", "required")
			}
			if sc.GetAddOn().GetScoreName() == "" {
				v.Add(f+".score_coordinate.add_on.score_name", "required")
			}
		case sc.Type == placementv1.ScoreCoordinateType_SCORE_COORDINATE_TYPE_UNSPECIFIED,
			sc.Type == placementv1.ScoreCoordinateType_SCORE_COORDINATE_TYPE_BUILT_IN:
			if sc.BuiltIn == "" {
				v.Add(f+".score_coordinate.built_in", "required: Balance, Steady, ResourceAllocatableCPU or ResourceAllocatableMemory")
			}
		default:
			v.Add(f+".score_coordinate.type", "unknown type %d: BUILT_IN or ADD_ON", sc.Type)
		}
	}
	ds := p.GetDecisionStrategy()
	if n := ds.GetClustersPerDecisionGroup(); n != "" {
		if _, err := parseGroupSize(n); err != nil {
			v.Add(field+".decision_strategy.clusters_per_decision_group", "%v", err)
		}
	}
	for i, g := range ds.GetGroups() {
		f := fmt.Sprintf("%s.decision_strategy.groups[%d]", field, i)
		if g.GroupName != "" && !groupName.MatchString(g.GroupName) {
			v.Add(f+".group_name", "%q: want OCM's group name pattern %s", g.GroupName, groupName)
		}
		gs := g.GetGroupClusterSelector()
		validateSelector(v, f+".group_cluster_selector.label_selector", toMetaSelector(gs.GetLabelSelector()))
		validateSelector(v, f+".group_cluster_selector.claim_selector", claimAsLabelSelector(gs.GetClaimSelector()))
	}
}

// groupName is OCM's DecisionGroup.GroupName pattern (its CRD schema), so every OCM group name
// is accepted as it is.
var groupName = regexp.MustCompile(`^[a-zA-Z0-9][-A-Za-z0-9_.]{0,61}[a-zA-Z0-9]$`)

func validateSelector(v *apierr.Violations, field string, ls *metav1.LabelSelector) {
	if ls == nil {
		return
	}
	if _, err := metav1.LabelSelectorAsSelector(ls); err != nil {
		v.Add(field, "%v", err)
	}
}

func claimAsLabelSelector(cs *placementv1.ClaimSelector) *metav1.LabelSelector {
	if cs == nil {
		return nil
	}
	return toMetaSelector(&placementv1.LabelSelector{MatchExpressions: cs.MatchExpressions})
}

// parseGroupSize reads clusters_per_decision_group: a positive count or a percentage in
// (0%, 100%].
func parseGroupSize(s string) (intstr.IntOrString, error) {
	if pct, ok := strings.CutSuffix(s, "%"); ok {
		f, err := strconv.ParseFloat(pct, 64)
		if err != nil || f <= 0 || f > 100 {
			return intstr.IntOrString{}, fmt.Errorf("%q: want a count like 3 or a percentage in (0%%, 100%%] like 25%%", s)
		}
		return intstr.FromString(s), nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return intstr.IntOrString{}, fmt.Errorf("%q: want a count like 3 or a percentage in (0%%, 100%%] like 25%%", s)
	}
	return intstr.FromInt32(int32(n)), nil
}
