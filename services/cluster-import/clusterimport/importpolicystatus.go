package clusterimport

import (
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/importpolicy"
)

// A policy's status (clusterv1.ImportPolicyStatus) is computed when it is read, from the
// inventory cluster agent's latest ImportWatchStatus and the lifecycles of the last pass: an
// unserved source type shows as soon as the agent reports it, without a pass.

// Policy condition types and reasons. Validated and FailedNegotiateSourceResource are
// Clusterpedia's; ReferencesResolved is the lifecycles' condition, summed up.
const (
	ConditionValidated     = "Validated"
	ConditionSourceWatched = "SourceWatched"

	ReasonFailedNegotiateSourceResource = "FailedNegotiateSourceResource"
	reasonValidated                     = "Validated"
	reasonUnsupportedSource             = "UnsupportedSource"
	reasonWaitingForAgent               = "WaitingForAgent"
	reasonWatched                       = "Watched"
	reasonSyncing                       = "Syncing"
	reasonNoReferences                  = "NoReferences"
	reasonNoLifecycles                  = "NoLifecycles"
	reasonResolved                      = "Resolved"
	reasonReferencesNotResolved         = "ReferencesNotResolved"
)

// The reasons an agent gives in agentv1.WatchedTypeStatus (cluster-agent's importstatus.go).
const (
	agentWatchNotServed = "NotServed"
	agentWatchFailed    = "WatchFailed"
)

var agentWatchReasons = map[string]bool{agentWatchNotServed: true, "Forbidden": true, "Unauthorized": true, agentWatchFailed: true}

// Bounds of an ImportWatchStatus: the agent keeps within them; what exceeds them is dropped.
const (
	maxWatchStatusTypes   = 256
	maxWatchStatusMessage = 512
)

type watchTypeKey struct {
	source                     bool
	group, resource, namespace string
}

// agentWatchStatus is an ImportWatchStatus as the hub keeps it, checked.
type agentWatchStatus struct {
	session string
	types   map[watchTypeKey]*agentv1.WatchedTypeStatus
}

// checkWatchStatus keeps what an agent says about the types it watches within bounds: at most
// maxWatchStatusTypes types whose names could be Kubernetes names, a known reason (else
// WatchFailed), a message of at most maxWatchStatusMessage bytes of UTF-8, and a time not
// after now. The agent's cluster is its subject's, checked by the caller; its types matter
// only to the policies of that cluster that name them. problems say what was dropped.
func checkWatchStatus(in *agentv1.ImportWatchStatus, now time.Time) (*agentWatchStatus, []string) {
	out := &agentWatchStatus{types: map[watchTypeKey]*agentv1.WatchedTypeStatus{}}
	var problems []string
	if len(in.SessionId) <= maxSessionIDLen {
		out.session = in.SessionId
	}
	for i, t := range in.Types {
		if len(out.types) == maxWatchStatusTypes {
			problems = append(problems, fmt.Sprintf("types: %d, more than %d", len(in.Types), maxWatchStatusTypes))
			break
		}
		if len(t.Group) > 253 || len(t.Resource) > 253 || len(t.Namespace) > 63 || len(t.Version) > 63 {
			problems = append(problems, fmt.Sprintf("types[%d]: a name longer than Kubernetes allows", i))
			continue
		}
		c := &agentv1.WatchedTypeStatus{Group: t.Group, Resource: t.Resource, Namespace: t.Namespace, Source: t.Source,
			Version: t.Version, Reason: t.Reason, Synced: t.Synced, Since: t.Since,
			Message: strings.ToValidUTF8(truncate(t.Message, maxWatchStatusMessage), "?")}
		if c.Reason != "" && !agentWatchReasons[c.Reason] {
			problems = append(problems, fmt.Sprintf("types[%d].reason: not one of NotServed, Forbidden, Unauthorized, WatchFailed", i))
			c.Reason = agentWatchFailed
		}
		if c.Since == nil || c.Since.AsTime().After(now) {
			c.Since = timestamppb.New(now)
		}
		out.types[watchTypeKey{t.Source, t.Group, t.Resource, t.Namespace}] = c
	}
	return out, problems
}

// policyInputs is what a policy's status is computed from.
type policyInputs struct {
	// compileErr: the policy's templates do not compile.
	compileErr error
	// agent is the inventory cluster agent's latest status, nil if it has sent none.
	agent *agentWatchStatus
	// lifecycles are the policy's lifecycles of the last pass, sourceObjects the source
	// objects the agent reported then.
	lifecycles    []*clusterv1.ImportLifecycle
	sourceObjects int
}

// policyStatus computes pol's status.
func policyStatus(pol *clusterv1.ImportPolicy, in policyInputs) *clusterv1.ImportPolicyStatus {
	src := pol.GetSource()
	inv := src.GetCluster()
	typ := src.GetResource()
	if src.GetGroup() != "" {
		typ += "." + src.GetGroup()
	}
	if src.GetNamespace() != "" {
		typ += " in namespace " + src.GetNamespace()
	}
	cond := func(kind string, st clusterv1.ConditionStatus, reason, msg string, since *timestamppb.Timestamp) *clusterv1.Condition {
		return &clusterv1.Condition{Type: kind, Status: st, Reason: reason, Message: msg, LastTransitionTime: since}
	}
	const (
		yes     = clusterv1.ConditionStatus_CONDITION_STATUS_TRUE
		no      = clusterv1.ConditionStatus_CONDITION_STATUS_FALSE
		unknown = clusterv1.ConditionStatus_CONDITION_STATUS_UNKNOWN
	)
	var entry *agentv1.WatchedTypeStatus
	if in.agent != nil {
		entry = in.agent.types[watchTypeKey{true, src.GetGroup(), src.GetResource(), src.GetNamespace()}]
	}
	waiting := fmt.Sprintf("the agent of cluster %q has not reported on %s yet", inv, typ)

	var validated, watched *clusterv1.Condition
	switch {
	case in.compileErr != nil:
		validated = cond(ConditionValidated, no, importpolicy.ReasonInvalidPolicy, fmt.Sprintf("the policy does not compile: %v", in.compileErr), nil)
	case src.GetGroup() == "" && src.GetResource() == "secrets":
		validated = cond(ConditionValidated, no, reasonUnsupportedSource, "core Secrets cannot be an import source: the hub never stores them", nil)
	case entry == nil:
		validated = cond(ConditionValidated, unknown, reasonWaitingForAgent, waiting, nil)
	case entry.Reason == agentWatchNotServed:
		validated = cond(ConditionValidated, no, ReasonFailedNegotiateSourceResource,
			fmt.Sprintf("cluster %q does not serve %s: %s", inv, typ, entry.Message), entry.Since)
	case entry.Version == "":
		validated = cond(ConditionValidated, unknown, entry.Reason, fmt.Sprintf("cluster %q: %s", inv, entry.Message), entry.Since)
	default:
		validated = cond(ConditionValidated, yes, reasonValidated, fmt.Sprintf("cluster %q serves %s, version %s", inv, typ, entry.Version), entry.Since)
	}
	switch {
	case validated.Status == no && entry == nil:
		watched = cond(ConditionSourceWatched, no, validated.Reason, "not watched: the policy is not valid", nil)
	case entry == nil:
		watched = cond(ConditionSourceWatched, unknown, reasonWaitingForAgent, waiting, nil)
	case entry.Reason != "":
		watched = cond(ConditionSourceWatched, no, entry.Reason, fmt.Sprintf("cluster %q cannot watch %s: %s", inv, typ, entry.Message), entry.Since)
	case !entry.Synced:
		watched = cond(ConditionSourceWatched, unknown, reasonSyncing, fmt.Sprintf("the agent of cluster %q is listing %s", inv, typ), entry.Since)
	default:
		watched = cond(ConditionSourceWatched, yes, reasonWatched, fmt.Sprintf("the agent of cluster %q watches %s", inv, typ), entry.Since)
	}

	st := &clusterv1.ImportPolicyStatus{SourceObjects: int32(in.sourceObjects), Lifecycles: int32(len(in.lifecycles))}
	unresolved, first := 0, ""
	for _, lc := range in.lifecycles {
		switch lc.Mode {
		case clusterv1.ImportMode_IMPORT_MODE_CREATED:
			st.ClustersCreated++
		case clusterv1.ImportMode_IMPORT_MODE_ADOPTED:
			st.ClustersAdopted++
		}
		for _, c := range lc.Conditions {
			if c.Type == importpolicy.ConditionReferencesResolved && c.Status != yes {
				if unresolved++; first == "" {
					first = fmt.Sprintf("%s: %s: %s", sourceName(lc.Source), c.Reason, c.Message)
				}
			}
		}
	}
	var refs *clusterv1.Condition
	if bad := referenceTypeProblem(pol, in.agent); bad != nil {
		refs = cond(importpolicy.ConditionReferencesResolved, no, bad.Reason, fmt.Sprintf("cluster %q cannot watch %s: %s", inv, describeType(bad), bad.Message), bad.Since)
	}
	switch {
	case refs != nil:
	case len(pol.GetReferences()) == 0:
		refs = cond(importpolicy.ConditionReferencesResolved, yes, reasonNoReferences, "the policy has no references", nil)
	case len(in.lifecycles) == 0:
		refs = cond(importpolicy.ConditionReferencesResolved, unknown, reasonNoLifecycles, "no source object is selected", nil)
	case unresolved > 0:
		refs = cond(importpolicy.ConditionReferencesResolved, no, reasonReferencesNotResolved,
			fmt.Sprintf("%d of %d lifecycles cannot resolve their references; first %s", unresolved, len(in.lifecycles), first), nil)
	default:
		refs = cond(importpolicy.ConditionReferencesResolved, yes, reasonResolved, fmt.Sprintf("every one of %d lifecycles resolved its references", len(in.lifecycles)), nil)
	}
	st.Conditions = []*clusterv1.Condition{validated, watched, refs}
	return st
}

// referenceTypeProblem returns the first type of pol's references that the agent reports it
// cannot watch (in any namespace: the namespaces are rendered), nil if none.
func referenceTypeProblem(pol *clusterv1.ImportPolicy, agent *agentWatchStatus) *agentv1.WatchedTypeStatus {
	if agent == nil {
		return nil
	}
	var first *agentv1.WatchedTypeStatus
	for k, t := range agent.types {
		if k.source || t.Reason == "" {
			continue
		}
		for _, r := range pol.GetReferences() {
			if r.Group == k.group && r.Resource == k.resource && (first == nil || describeType(t) < describeType(first)) {
				first = t
			}
		}
	}
	return first
}

func describeType(t *agentv1.WatchedTypeStatus) string {
	s := t.Resource
	if t.Group != "" {
		s += "." + t.Group
	}
	if t.Namespace != "" {
		s += " in namespace " + t.Namespace
	}
	return s
}

func sourceName(s *clusterv1.ImportSourceRef) string {
	if s.GetNamespace() == "" {
		return s.GetName()
	}
	return s.GetNamespace() + "/" + s.GetName()
}

// withStatus returns a copy of pol (the view's are shared) with its status as this replica
// sees it.
func (l *lifecycles) withStatus(pol *clusterv1.ImportPolicy) *clusterv1.ImportPolicy {
	out := proto.CloneOf(pol)
	l.mu.Lock()
	in := policyInputs{lifecycles: l.status[pol.Name], sourceObjects: l.sourceObjects[pol.Name]}
	l.mu.Unlock()
	in.compileErr = l.compile(pol).err
	in.agent = l.sources.watchStatusOf(pol.GetSource().GetCluster())
	out.Status = policyStatus(pol, in)
	return out
}
