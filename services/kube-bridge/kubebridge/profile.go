package kubebridge

import (
	"fmt"
	"maps"
	"slices"
	"time"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	inventoryv1alpha1 "github.com/fleetstream/fleetstream/services/kube-bridge/inventory/v1alpha1"
)

// What the bridge writes and how it marks it.
const (
	// ManagerName is Fleetstream's name as a cluster manager: spec.clusterManager.name and the
	// x-k8s.io/cluster-manager label of every ClusterProfile it publishes.
	ManagerName = "fleetstream"
	// FieldManager is the bridge's server-side apply field manager.
	FieldManager = "fleetstream-kube-bridge"
	// LabelManagedBy marks every object the bridge writes (value FieldManager): what it may
	// prune. Objects without it are never deleted or taken over.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// ConditionJoined is the second condition KEP-4322's example and OCM publish.
	ConditionJoined = "Joined"
)

// The facts the registry reports, as property names: claims keep their own names (the reported
// ones end in .fleetstream.io); resources, which are no claims, get names of that reserved
// suffix, so that no claim an admin sets can take them.
const (
	PropertyCPUAllocatable    = "allocatable-cpu.fleetstream.io"
	PropertyCPUCapacity       = "capacity-cpu.fleetstream.io"
	PropertyMemoryAllocatable = "allocatable-memory.fleetstream.io"
	PropertyMemoryCapacity    = "capacity-memory.fleetstream.io"
)

// Reasons of the conditions the registry has no word for.
const (
	reasonNeverConnected = "AgentNeverConnected"
	reasonJoined         = "AgentConnected"
	// conditionAgentConnected is cluster-import's condition (clusterimport.ConditionAgentConnected;
	// not imported: the bridge reads the registry as data, not as code).
	conditionAgentConnected = "AgentConnected"
)

// reservedLabels are the labels the bridge sets on a ClusterProfile itself: a cluster label of
// that key is not copied (it would claim the profile for another manager, or for pruning).
var reservedLabels = []string{inventoryv1alpha1.LabelClusterManagerKey, LabelManagedBy, inventoryv1alpha1.LabelClusterSetKey}

// clusterProfile is what the bridge publishes for c in namespace: labels, spec, and status with
// the conditions' transition times kept from old (the profile as it is, or nil) where the
// status did not change, as meta.SetStatusCondition keeps them. generation is the profile's
// metadata.generation (observedGeneration). dropped names what of c could not be published
// (field paths of the cluster, never its values).
func clusterProfile(c *clusterv1.Cluster, namespace string, old []metav1.Condition, generation int64, now time.Time) (p *inventoryv1alpha1.ClusterProfile, dropped []string) {
	p = &inventoryv1alpha1.ClusterProfile{
		TypeMeta:   metav1.TypeMeta{APIVersion: inventoryv1alpha1.Group + "/" + inventoryv1alpha1.Version, Kind: inventoryv1alpha1.Kind},
		ObjectMeta: metav1.ObjectMeta{Name: c.GetName(), Namespace: namespace, Labels: map[string]string{}},
		Spec: inventoryv1alpha1.ClusterProfileSpec{
			DisplayName:    c.GetName(),
			ClusterManager: inventoryv1alpha1.ClusterManager{Name: ManagerName},
		},
	}
	// Labels: the registry checked them as Kubernetes labels; checked again here, as they
	// cross into another system, and a bad one is left out rather than failing the profile.
	for _, k := range slices.Sorted(maps.Keys(c.GetLabels())) {
		v := c.GetLabels()[k]
		switch {
		case slices.Contains(reservedLabels, k):
			dropped = append(dropped, fmt.Sprintf("labels[%s]: reserved for the bridge", k))
		case len(validation.IsQualifiedName(k)) > 0 || len(validation.IsValidLabelValue(v)) > 0:
			dropped = append(dropped, fmt.Sprintf("labels[%s]: not a Kubernetes label", short(k)))
		default:
			p.Labels[k] = v
		}
	}
	p.Labels[inventoryv1alpha1.LabelClusterManagerKey] = ManagerName
	p.Labels[LabelManagedBy] = FieldManager

	status := c.GetStatus()
	p.Status.Version.Kubernetes = status.GetKubernetesVersion()
	connected := condition(c, conditionAgentConnected)
	var props []inventoryv1alpha1.Property
	add := func(field, name, value string, observed *time.Time) {
		switch {
		case name == "" || len(name) > inventoryv1alpha1.MaxPropertyName:
			dropped = append(dropped, field+": name longer than 253 characters")
		case value == "":
			dropped = append(dropped, field+": empty value")
		case utf8.RuneCountInString(value) > inventoryv1alpha1.MaxPropertyValue:
			dropped = append(dropped, field+": value longer than 1024 characters")
		default:
			prop := inventoryv1alpha1.Property{Name: name, Value: value}
			if observed != nil && !observed.IsZero() {
				prop.LastObservedTime = metav1.NewTime(observed.UTC())
			}
			props = append(props, prop)
		}
	}
	var resourcesAt *time.Time
	if t := status.GetResources().GetReportTime(); t != nil {
		at := t.AsTime()
		resourcesAt = &at
	}
	var connectedAt *time.Time
	if t := connected.GetLastTransitionTime(); t != nil {
		at := t.AsTime()
		connectedAt = &at
	}
	// Claims, as OCM publishes ManagedCluster claims: name and value. The reported ones carry
	// when the registry learnt them.
	for _, k := range slices.Sorted(maps.Keys(c.GetClaims())) {
		var at *time.Time
		switch k {
		case "kubeversion.fleetstream.io":
			at = connectedAt
		case "nodes.fleetstream.io":
			at = resourcesAt
		}
		add(fmt.Sprintf("claims[%s]", short(k)), k, c.GetClaims()[k], at)
	}
	// Resources: only the two the registry knows; an agent's other keys are not published.
	res := status.GetResources()
	for _, r := range []struct{ name, value string }{
		{PropertyCPUAllocatable, res.GetAllocatable()["cpu"]},
		{PropertyCPUCapacity, res.GetCapacity()["cpu"]},
		{PropertyMemoryAllocatable, res.GetAllocatable()["memory"]},
		{PropertyMemoryCapacity, res.GetCapacity()["memory"]},
	} {
		if r.value != "" {
			add("status.resources", r.name, r.value, resourcesAt)
		}
	}
	slices.SortFunc(props, func(a, b inventoryv1alpha1.Property) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	p.Status.Properties = props
	p.Status.Conditions = profileConditions(c, connected, old, generation, now)
	return p, dropped
}

// profileConditions derives ControlPlaneHealthy and Joined from the registry's AgentConnected
// condition (docs/kubernetes.md, *ClusterProfile*):
//
//	agent             ControlPlaneHealthy             Joined
//	never connected   Unknown  AgentNeverConnected    False AgentNeverConnected
//	(AgentConnected absent or Unknown)
//	connected         True     HeartbeatReceived      True  AgentConnected
//	lost              Unknown  HeartbeatTimeout       True  AgentConnected
//
// A lost agent says nothing of the control plane, so its health is Unknown, as OCM sets its
// ManagedCluster's Available when the lease stops; the cluster stays joined until it is
// deregistered, when the profile goes.
func profileConditions(c *clusterv1.Cluster, connected *clusterv1.Condition, old []metav1.Condition, generation int64, now time.Time) []metav1.Condition {
	created := now
	if t := c.GetCreateTime(); t != nil {
		created = t.AsTime()
	}
	since := created
	if t := connected.GetLastTransitionTime(); t != nil {
		since = t.AsTime()
	}
	const never = "the cluster's agent has not connected yet"
	var healthy, joined metav1.Condition
	// The registry marks a new cluster Unknown (AgentNeverConnected) until its agent reports,
	// True while it heartbeats and False once it is lost; never Unknown again.
	neverConnected := connected == nil || connected.Status == clusterv1.ConditionStatus_CONDITION_STATUS_UNKNOWN
	switch {
	case neverConnected:
		healthy = metav1.Condition{Status: metav1.ConditionUnknown, Reason: reasonNeverConnected, Message: never}
		joined = metav1.Condition{Status: metav1.ConditionFalse, Reason: reasonNeverConnected, Message: never}
	case connected.Status == clusterv1.ConditionStatus_CONDITION_STATUS_TRUE:
		healthy = metav1.Condition{Status: metav1.ConditionTrue, Reason: reasonOr(connected.Reason, "HeartbeatReceived"), Message: connected.Message}
		joined = metav1.Condition{Status: metav1.ConditionTrue, Reason: reasonJoined, Message: "the cluster's agent has connected"}
	default:
		healthy = metav1.Condition{Status: metav1.ConditionUnknown, Reason: reasonOr(connected.Reason, "HeartbeatTimeout"), Message: connected.Message}
		joined = metav1.Condition{Status: metav1.ConditionTrue, Reason: reasonJoined, Message: "the cluster's agent has connected"}
	}
	healthy.Type, joined.Type = inventoryv1alpha1.ClusterConditionControlPlaneHealthy, ConditionJoined
	out := []metav1.Condition{healthy, joined}
	for i := range out {
		out[i].ObservedGeneration = generation
		out[i].LastTransitionTime = metav1.NewTime(since.UTC().Truncate(time.Second))
		if connected == nil {
			out[i].LastTransitionTime = metav1.NewTime(created.UTC().Truncate(time.Second))
		}
		for _, o := range old {
			if o.Type == out[i].Type && o.Status == out[i].Status && !o.LastTransitionTime.IsZero() {
				out[i].LastTransitionTime = o.LastTransitionTime
			}
		}
	}
	return out
}

// reasonOr returns reason if it is a condition reason Kubernetes accepts, else fallback.
func reasonOr(reason, fallback string) string {
	if reason == "" || len(reason) > 1024 || !conditionReason.MatchString(reason) {
		return fallback
	}
	return reason
}

func condition(c *clusterv1.Cluster, typ string) *clusterv1.Condition {
	for _, cond := range c.GetStatus().GetConditions() {
		if cond.GetType() == typ {
			return cond
		}
	}
	return nil
}

// short cuts a value of unknown length for a message.
func short(s string) string {
	if len(s) <= 64 {
		return s
	}
	return s[:61] + "..."
}
