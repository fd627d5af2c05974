package namespacebinding

import (
	"bytes"
	"fmt"
	"sort"

	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/api/resource"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
)

// Reasons of the phases this service derives itself (agents' reasons pass through).
const (
	ReasonWaitingForAgent    = "WaitingForAgent"
	ReasonClusterUnreachable = "ClusterUnreachable"
	ReasonRepairing          = "Repairing"
	ReasonApplied            = "Applied"
	ReasonRemoving           = "Removing"
)

// objState is what the cluster's agent made of one desired object.
type objState struct {
	current bool // the desired bucket holds what the binding asks for
	applied *desiredv1.AppliedStatus
	// caughtUp: the agent's status is about the desired revision now in the bucket.
	caughtUp bool
}

// state compares the desired object at key with want (bytes of the manifest, or a tombstone)
// and with the agent's report about it.
func (s *Service) state(key string, want *desiredv1.DesiredObject) objState {
	var st objState
	d, ok := s.desired.GetEntry(key)
	if !ok || d.Value.Tombstone != want.Tombstone || !bytes.Equal(d.Value.Manifest, want.Manifest) ||
		(want.Tombstone && d.Value.DeletionPolicy != want.DeletionPolicy) {
		return st
	}
	st.current = true
	if a, ok := s.applied.Get(appliedKey(key)); ok {
		st.applied = a
		st.caughtUp = a.DesiredRevision >= d.KVRevision
	}
	return st
}

// desiredPart is one desired object of a binding.
type desiredPart struct {
	what string
	key  string
	want *desiredv1.DesiredObject
}

// present returns b with its phase, reason, message and usage as the cluster reports them.
func (s *Service) present(b *projectv1.NamespaceBinding) *projectv1.NamespaceBinding {
	out := proto.CloneOf(b)
	out.Hard = canonicalHard(b.Hard)
	if q, ok := s.applied.Get(appliedKey(quotaDesiredKey(b.Cluster, b.Namespace))); ok && len(b.Hard) > 0 {
		if st, err := parseQuotaStatus(q.StatusJson); err == nil && len(st.Used) > 0 {
			out.Used = canonicalHard(st.Used)
		}
	}
	if b.Phase == projectv1.BindingPhase_BINDING_PHASE_TERMINATING {
		out.Reason, out.Message = s.terminatingReason(b)
		return out
	}
	out.Phase, out.Reason, out.Message = s.livePhase(b)
	return out
}

// livePhase is the phase, reason and message present gives b, which is not Terminating,
// without the copy of b and the usage present adds, for the status
// recorder, which needs only these and runs for every change of a binding or its objects.
func (s *Service) livePhase(b *projectv1.NamespaceBinding) (phase projectv1.BindingPhase, reason, message string) {
	objs := []desiredPart{{"namespace", namespaceDesiredKey(b.Cluster, b.Namespace), namespaceObject(b.Project, b.Namespace)}}
	if len(b.Hard) > 0 {
		objs = append(objs, desiredPart{"quota", quotaDesiredKey(b.Cluster, b.Namespace), quotaObject(b.Project, b.Namespace, b.Hard)})
	}
	phase = projectv1.BindingPhase_BINDING_PHASE_AVAILABLE
	reason, message = ReasonApplied, fmt.Sprintf("namespace %s exists on cluster %s for project %s", b.Namespace, b.Cluster, b.Project)
	if len(b.Hard) > 0 {
		message += " with its quota"
	}
	for _, o := range objs {
		st := s.state(o.key, o.want)
		switch {
		case !st.current || !st.caughtUp:
			if phase == projectv1.BindingPhase_BINDING_PHASE_FAILED {
				continue
			}
			phase = projectv1.BindingPhase_BINDING_PHASE_PENDING
			reason, message = s.waitingReason(b.Cluster, o.what)
		case st.applied.Phase == desiredv1.Phase_PHASE_FAILED:
			phase = projectv1.BindingPhase_BINDING_PHASE_FAILED
			reason, message = st.applied.Reason, st.applied.Message
			if reason == "" {
				reason = "ApplyFailed"
			}
		case st.applied.Absent:
			if phase == projectv1.BindingPhase_BINDING_PHASE_AVAILABLE {
				phase = projectv1.BindingPhase_BINDING_PHASE_PENDING
				reason, message = ReasonRepairing, fmt.Sprintf("the %s is missing on cluster %s; the agent is recreating it", o.what, b.Cluster)
			}
		}
	}
	return phase, reason, message
}

func (s *Service) waitingReason(cluster, what string) (string, string) {
	if !s.clusterReachable(cluster) {
		return ReasonClusterUnreachable, fmt.Sprintf("cluster %s is unreachable; its agent applies the %s when it reconnects", cluster, what)
	}
	return ReasonWaitingForAgent, fmt.Sprintf("waiting for the agent of cluster %s to apply the %s", cluster, what)
}

func (s *Service) terminatingReason(b *projectv1.NamespaceBinding) (string, string) {
	st := s.state(namespaceDesiredKey(b.Cluster, b.Namespace), tombstone(b.Project, deletionPolicy(b.UnbindPolicy)))
	if st.current && st.caughtUp && st.applied.Phase == desiredv1.Phase_PHASE_FAILED {
		return st.applied.Reason, st.applied.Message
	}
	if !s.clusterReachable(b.Cluster) {
		return ReasonClusterUnreachable, fmt.Sprintf("cluster %s is unreachable; its agent releases the namespace when it reconnects", b.Cluster)
	}
	what := "release"
	if b.UnbindPolicy == projectv1.UnbindPolicy_UNBIND_POLICY_DELETE {
		what = "delete"
	}
	return ReasonRemoving, fmt.Sprintf("waiting for the agent of cluster %s to %s namespace %s", b.Cluster, what, b.Namespace)
}

// clusterReachable reports whether the cluster is registered and its agent connected.
func (s *Service) clusterReachable(name string) bool {
	c, ok := s.clusters.Get(keys.Encode(name))
	if !ok {
		return false
	}
	for _, cond := range c.GetStatus().GetConditions() {
		if cond.Type == "AgentConnected" {
			return cond.Status == clusterv1.ConditionStatus_CONDITION_STATUS_TRUE
		}
	}
	return false
}

// released reports whether every tombstone of a Terminating binding has been carried out.
func (s *Service) released(b *projectv1.NamespaceBinding) bool {
	ns := s.state(namespaceDesiredKey(b.Cluster, b.Namespace), tombstone(b.Project, deletionPolicy(b.UnbindPolicy)))
	if !ns.current || !ns.caughtUp || !removed(ns.applied) {
		return false
	}
	qk := quotaDesiredKey(b.Cluster, b.Namespace)
	if d, ok := s.desired.GetEntry(qk); ok {
		// The quota's tombstone comes with the unbind (or with an earlier removal of the limits).
		if !d.Value.Tombstone {
			return false
		}
		a, ok := s.applied.Get(appliedKey(qk))
		if !ok || a.DesiredRevision < d.KVRevision || !removed(a) {
			return false
		}
	}
	return true
}

// reasonDeleting is what an agent reports while a deleted object still exists (a namespace
// waits for its contents to go).
const reasonDeleting = "Deleting"

// reasonOwnedByOther is what an agent reports when the live object is labelled for another
// owner; for a tombstone it means none of ours is there to remove.
const reasonOwnedByOther = "OwnedByOther"

// removed reports whether an agent's status says a tombstone has been carried out: released,
// deleted and gone (not merely deleting), or never ours (a binding that failed because the
// namespace belongs to another project is unbound without touching it).
func removed(st *desiredv1.AppliedStatus) bool {
	if st.Phase == desiredv1.Phase_PHASE_FAILED {
		return st.Reason == reasonOwnedByOther
	}
	return st.Phase == desiredv1.Phase_PHASE_APPLIED && (st.Absent || st.Reason != reasonDeleting)
}

// presentProject returns p with its status summed from its current bindings. Everything is
// recomputed on each read, so a changed limit replaces the old figure and nothing is counted
// twice however often agents report.
func (s *Service) presentProject(p *projectv1.Project) *projectv1.Project {
	out := proto.CloneOf(p)
	st := &projectv1.ProjectStatus{}
	type sums struct {
		n          int32
		hard, used map[string]resource.Quantity
	}
	perCluster := map[string]*sums{}
	for _, it := range s.bindings.Lookup(byProject(p.Name)) {
		b := s.present(it)
		switch b.Phase {
		case projectv1.BindingPhase_BINDING_PHASE_TERMINATING:
			st.TerminatingCount++
			continue
		case projectv1.BindingPhase_BINDING_PHASE_PENDING:
			st.PendingCount++
		case projectv1.BindingPhase_BINDING_PHASE_AVAILABLE:
			st.AvailableCount++
		case projectv1.BindingPhase_BINDING_PHASE_FAILED:
			st.FailedCount++
		}
		st.NamespaceCount++
		c := perCluster[b.Cluster]
		if c == nil {
			c = &sums{hard: map[string]resource.Quantity{}, used: map[string]resource.Quantity{}}
			perCluster[b.Cluster] = c
		}
		c.n++
		addQuantities(c.hard, b.Hard)
		addQuantities(c.used, b.Used)
	}
	names := make([]string, 0, len(perCluster))
	for n := range perCluster {
		names = append(names, n)
	}
	sort.Strings(names)
	allocated := make(map[string]map[string]resource.Quantity, len(perCluster))
	for _, n := range names {
		c := perCluster[n]
		st.Clusters = append(st.Clusters, &projectv1.ClusterQuotaStatus{Cluster: n, NamespaceCount: c.n,
			Hard: renderQuantities(c.hard), Used: renderQuantities(c.used)})
		allocated[n] = c.hard
	}
	out.Status = st
	// The same sums the budget checks make: every binding but Terminating ones.
	out.Budgets = presentBudgets(p.Budgets, allocated)
	return out
}

func addQuantities(sum map[string]resource.Quantity, add map[string]string) {
	for k, v := range add {
		q, err := resource.ParseQuantity(v)
		if err != nil {
			continue // validated on the way in; an agent's odd report is skipped, not fatal
		}
		cur := sum[k]
		cur.Add(q)
		sum[k] = cur
	}
}

func renderQuantities(m map[string]resource.Quantity) map[string]string {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, q := range m {
		out[k] = q.String()
	}
	return out
}

func clusterOfKey(key string) string {
	parts, err := keys.Split(key)
	if err != nil || len(parts) == 0 {
		return ""
	}
	return parts[0]
}
