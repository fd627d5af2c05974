// Package placement is the placement scheduler core: a pure function from a
// fleet snapshot (clusters, cluster sets, add-on scores) and one placement
// (with its project's bound sets and its previous decision) to a decision.
//
// It follows Open Cluster Management's scheduler (open-cluster-management-io/ocm,
// pkg/placement) rule for rule so that OCM placements translate one to one; the
// deliberate differences are listed in docs/placement.md. The package does no
// I/O: the caller (the namespace-binding service) feeds it from its views and
// turns its output into events, pages and a timer.
//
// Field names mirror fleetstream.placement.v1 so that wiring is a mechanical
// mapping from the protobuf messages.
package placement

import (
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Well-known names shared with the rest of Fleetstream.
const (
	// ClusterSetLabel names the exclusive cluster set of a cluster.
	ClusterSetLabel = "fleetstream.io/clusterset"
	// DefaultClusterSet holds every cluster without ClusterSetLabel.
	DefaultClusterSet = "default"
	// GlobalClusterSet is a label-selector set with an empty selector: all clusters.
	GlobalClusterSet = "global"

	// TaintUnreachable is set by cluster-import while a cluster's agent has not reported.
	TaintUnreachable = "fleetstream.io/unreachable"
	// TaintUnavailable is set by cluster-import while a cluster reports itself unavailable.
	TaintUnavailable = "fleetstream.io/unavailable"

	// MaxClusterScore and MinClusterScore bound every prioritizer's score.
	MaxClusterScore int64 = 100
	MinClusterScore int64 = -100
	// MaxWeight and MinWeight bound a prioritizer's weight.
	MaxWeight int32 = 10
	MinWeight int32 = -10

	// MaxDecisionsPerPage is OCM's maxNumOfClusterDecisions: clusters per PlacementDecision.
	MaxDecisionsPerPage = 100
)

// The built-in prioritizer names (OCM's, verbatim) are declared with their
// rules, in prioritizer_*.go.

// TaintEffect says what a taint does to placements that do not tolerate it.
type TaintEffect string

const (
	// TaintEffectNoSelect: never selected unless tolerated; an existing decision is dropped.
	TaintEffectNoSelect TaintEffect = "NoSelect"
	// TaintEffectNoSelectIfNew: not newly selected unless tolerated; existing decisions stay.
	TaintEffectNoSelectIfNew TaintEffect = "NoSelectIfNew"
	// TaintEffectPreferNoSelect: selectable; OCM does not score it either (see docs).
	TaintEffectPreferNoSelect TaintEffect = "PreferNoSelect"
)

// Taint marks a cluster. TimeAdded starts the clock of a toleration's TolerationSeconds.
type Taint struct {
	Key       string
	Value     string
	Effect    TaintEffect
	TimeAdded time.Time
}

// BuiltInTaint returns the NoSelect taint cluster-import sets for key
// (TaintUnreachable or TaintUnavailable) since the given moment.
func BuiltInTaint(key string, since time.Time) Taint {
	return Taint{Key: key, Effect: TaintEffectNoSelect, TimeAdded: since}
}

// ResourceName names an allocatable/capacity resource.
type ResourceName string

const (
	ResourceCPU    ResourceName = "cpu"
	ResourceMemory ResourceName = "memory"
)

// Cluster is what the scheduler needs to know of a member cluster.
type Cluster struct {
	Name   string
	Labels map[string]string
	// Claims are the cluster's claims (name → value), e.g. kubeversion.fleetstream.io.
	Claims map[string]string
	Taints []Taint
	// Allocatable and Capacity are summed over the cluster's Ready nodes. A
	// resource prioritizer scores a cluster only when both carry the resource.
	Allocatable map[ResourceName]resource.Quantity
	Capacity    map[ResourceName]resource.Quantity
}

// ClusterSetSelectorType is how a cluster set picks its members.
type ClusterSetSelectorType string

const (
	// SelectorExclusiveLabel: members carry ClusterSetLabel=<set name>
	// (for DefaultClusterSet: or no such label at all).
	SelectorExclusiveLabel ClusterSetSelectorType = "EXCLUSIVE_LABEL"
	// SelectorLabelSelector: members match LabelSelector; nil selects none, empty selects all.
	SelectorLabelSelector ClusterSetSelectorType = "LABEL_SELECTOR"
)

// ClusterSetSelector selects the members of a cluster set.
type ClusterSetSelector struct {
	// Type defaults to SelectorExclusiveLabel when empty, as OCM's does.
	Type          ClusterSetSelectorType
	LabelSelector *metav1.LabelSelector
}

// ClusterSet is a named group of clusters.
type ClusterSet struct {
	Name     string
	Selector ClusterSetSelector
}

// AddOnScoreKey identifies one add-on score of one cluster.
type AddOnScoreKey struct {
	Cluster      string
	ResourceName string
	ScoreName    string
}

// AddOnScore is a score another system computed for a cluster (OCM's
// AddOnPlacementScore item). An expired score counts as absent (score 0).
type AddOnScore struct {
	AddOnScoreKey
	Score int32
	// ValidUntil is optional; the score is valid while now is not after it.
	ValidUntil *time.Time
}

// TolerationOperator compares a toleration with a taint.
type TolerationOperator string

const (
	TolerationOpEqual  TolerationOperator = "Equal"
	TolerationOpExists TolerationOperator = "Exists"
)

// Toleration lets a placement select clusters with matching taints.
type Toleration struct {
	// Key empty matches every key and requires Operator Exists.
	Key string
	// Operator defaults to Equal when empty.
	Operator TolerationOperator
	// Value must be empty with Exists.
	Value string
	// Effect empty matches every effect.
	Effect TaintEffect
	// TolerationSeconds, if set, tolerates while now is strictly before the
	// taint's TimeAdded plus these seconds.
	TolerationSeconds *int64
}

// ClaimSelector matches a cluster's claims.
type ClaimSelector struct {
	MatchExpressions []metav1.LabelSelectorRequirement
}

// CELSelector is OCM's celSelector: CEL expressions over managedCluster, ANDed
// (filter_cel.go).
type CELSelector struct {
	CELExpressions []string
}

// ClusterSelector is a label selector AND a claim selector AND a CEL selector.
type ClusterSelector struct {
	LabelSelector metav1.LabelSelector
	ClaimSelector ClaimSelector
	CELSelector   CELSelector
}

// Predicate is one alternative of a placement's predicates (they are ORed).
type Predicate struct {
	RequiredClusterSelector ClusterSelector
}

// PrioritizerPolicyMode is Additive (default) or Exact.
type PrioritizerPolicyMode string

const (
	PrioritizerPolicyModeAdditive PrioritizerPolicyMode = "Additive"
	PrioritizerPolicyModeExact    PrioritizerPolicyMode = "Exact"
)

// ScoreCoordinateType says where a prioritizer's score comes from.
type ScoreCoordinateType string

const (
	ScoreCoordinateTypeBuiltIn ScoreCoordinateType = "BuiltIn"
	ScoreCoordinateTypeAddOn   ScoreCoordinateType = "AddOn"
)

// AddOnScoreCoordinate names an add-on score.
type AddOnScoreCoordinate struct {
	ResourceName string
	ScoreName    string
}

// ScoreCoordinate names a prioritizer.
type ScoreCoordinate struct {
	// Type defaults to BuiltIn when empty (OCM's CRD default).
	Type    ScoreCoordinateType
	BuiltIn string
	AddOn   *AddOnScoreCoordinate
}

// PrioritizerConfig weights one prioritizer. Weight 0 disables it.
type PrioritizerConfig struct {
	ScoreCoordinate *ScoreCoordinate
	Weight          int32
}

// PrioritizerPolicy chooses and weights prioritizers.
type PrioritizerPolicy struct {
	Mode           PrioritizerPolicyMode
	Configurations []PrioritizerConfig
}

// GroupClusterSelector picks the clusters of a named decision group.
type GroupClusterSelector struct {
	LabelSelector metav1.LabelSelector
	ClaimSelector ClaimSelector
}

// DecisionGroup is a named group of the decision strategy.
type DecisionGroup struct {
	GroupName            string
	GroupClusterSelector GroupClusterSelector
}

// DecisionStrategy splits the decision into groups.
type DecisionStrategy struct {
	Groups []DecisionGroup
	// ClustersPerDecisionGroup is a count or a percentage ("25%") of the
	// selected clusters; zero or out of range means one group per selector.
	ClustersPerDecisionGroup intstr.IntOrString
}

// Placement is a placement's spec.
type Placement struct {
	Project string
	Name    string
	// ClusterSets, if given, is intersected with the project's bound sets.
	ClusterSets []string
	// NumberOfClusters nil selects every cluster that passes.
	NumberOfClusters  *int32
	Predicates        []Predicate
	Tolerations       []Toleration
	PrioritizerPolicy PrioritizerPolicy
	DecisionStrategy  DecisionStrategy
}

// PlacementState is what the scheduler needs beyond the spec and the fleet.
type PlacementState struct {
	// BoundClusterSets are the names of the sets bound to the placement's
	// project. Bindings of sets that do not exist are ignored (OCM's "valid bindings").
	BoundClusterSets []string
	// PreviousDecision is this placement's current decision (for Steady and NoSelectIfNew).
	PreviousDecision []string
	// OtherDecisions counts, per cluster, the decisions of every other placement
	// (OCM's Balance counts PlacementDecisions not labelled with this placement).
	OtherDecisions map[string]int
	// Now is the evaluation moment; required (the package reads no clock).
	Now time.Time
}

// ConditionStatus is True or False.
type ConditionStatus string

const (
	ConditionTrue  ConditionStatus = "True"
	ConditionFalse ConditionStatus = "False"
)

// Condition types and reasons (OCM's, verbatim).
const (
	ConditionPlacementSatisfied     = "PlacementSatisfied"
	ConditionPlacementMisconfigured = "PlacementMisconfigured"

	ReasonNoManagedClusterSetBindings = "NoManagedClusterSetBindings"
	ReasonNoIntersection              = "NoIntersection"
	ReasonAllManagedClusterSetsEmpty  = "AllManagedClusterSetsEmpty"
	ReasonNoManagedClusterMatched     = "NoManagedClusterMatched"
	ReasonAllDecisionsScheduled       = "AllDecisionsScheduled"
	ReasonNotAllDecisionsScheduled    = "NotAllDecisionsScheduled"
	ReasonMisconfigured               = "Misconfigured"
	ReasonSucceedconfigured           = "Succeedconfigured"
)

// Condition is a placement status condition.
type Condition struct {
	Type    string
	Status  ConditionStatus
	Reason  string
	Message string
	// Field is the offending field path of a PlacementMisconfigured=True condition.
	Field string
	// Unscheduled is how many decisions are missing (NotAllDecisionsScheduled).
	Unscheduled int
}

// PrioritizerResult names an active prioritizer and its weight.
type PrioritizerResult struct {
	// Name is the built-in name or "AddOn/<resource_name>/<score_name>".
	Name   string
	Weight int32
}

// ClusterDecision is one selected cluster with its scores.
type ClusterDecision struct {
	ClusterName string
	// Scores are aligned with Decision.Prioritizers (unweighted, in
	// [-100, 100]; 0 where a prioritizer had nothing to score, as in OCM).
	Scores []int64
	// Total is the sum of score × weight.
	Total int64
}

// DecisionPage is one page (OCM's PlacementDecision object) of at most
// MaxDecisionsPerPage clusters.
type DecisionPage struct {
	Clusters []ClusterDecision
}

// DecisionGroupStatus is one decision group with its pages.
type DecisionGroupStatus struct {
	DecisionGroupIndex int32
	DecisionGroupName  string
	ClustersCount      int32
	// Pages holds at least one (possibly empty) page, as OCM keeps one empty
	// PlacementDecision when nothing is selected.
	Pages []DecisionPage
}

// Decision is the scheduler's output for one placement.
type Decision struct {
	// Clusters are the selected clusters, best first (total desc, then name).
	Clusters                 []ClusterDecision
	NumberOfSelectedClusters int32
	// Prioritizers are the active prioritizers (weight ≠ 0), sorted by name.
	Prioritizers   []PrioritizerResult
	DecisionGroups []DecisionGroupStatus
	// Conditions are PlacementSatisfied and PlacementMisconfigured.
	Conditions []Condition
	// NextEvaluation is the earliest moment after Now at which the decision
	// may change with no other input changing: a toleration that holds now
	// runs out, or an add-on score in use expires. Zero when there is none.
	// The caller sets a timer for it rather than polling.
	NextEvaluation time.Time
}

// Condition returns the condition of type t, or false.
func (d *Decision) Condition(t string) (Condition, bool) {
	for _, c := range d.Conditions {
		if c.Type == t {
			return c, true
		}
	}
	return Condition{}, false
}

// ClusterNames returns the selected cluster names, best first.
func (d *Decision) ClusterNames() []string {
	out := make([]string, len(d.Clusters))
	for i, c := range d.Clusters {
		out[i] = c.ClusterName
	}
	return out
}
