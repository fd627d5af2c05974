package clusterimport

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/events"
	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/nsinventory"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// Built-in taint and condition names.
const (
	TaintUnreachable        = "fleetstream.io/unreachable"
	ConditionAgentConnected = "AgentConnected"
	systemTaintPrefix       = "fleetstream.io/"
)

// Claims the cluster's agent reports, named like Open Cluster Management's reserved claims
// (kubeversion.open-cluster-management.io). Every claim name ending in ReservedClaimSuffix is
// kept for reported facts: the API refuses them, and an update of the other claims keeps them.
const (
	ReservedClaimSuffix = ".fleetstream.io"
	// ClaimKubeVersion is the Kubernetes version ("v1.34.4") of the latest heartbeat.
	ClaimKubeVersion = "kubeversion" + ReservedClaimSuffix
	// ClaimNodes is the number of Ready nodes ("3") of the latest reported resources.
	ClaimNodes = "nodes" + ReservedClaimSuffix
)

// clustersProjection folds FLEET_CLUSTER into bucket `clusters`, one entry per cluster name.
// Bump Version whenever applyCluster changes meaning: the view is then rebuilt from the stream.
// Version 2: reported claims (kubeversion and nodes.fleetstream.io) and resources.
// Version 3: a ClusterImported naming an adopter hands the cluster over (out of adopted_by).
func clustersProjection() view.Projection {
	return view.Projection{
		Name:     "clusters",
		Version:  3,
		Stream:   subjects.ClusterStream,
		Subjects: []string{subjects.ClusterPrefix + ".>"},
		Bucket:   bucketConfig(subjects.ClustersBucket, "Cluster registry view (projection of FLEET_CLUSTER)."),
		New:      func() proto.Message { return &clusterv1.Cluster{} },
		Apply:    applyCluster,
	}
}

func clusterKey(name string) string { return keys.Encode(name) }

func applyCluster(ev *events.Event) ([]view.Change, error) {
	tok := ev.Subject[len(subjects.ClusterPrefix)+1:]
	if strings.Contains(tok, ".") {
		return nil, nil // a subscriber's event (subscriberSubject), not a cluster's
	}
	name, err := keys.Decode(tok)
	if err != nil {
		return nil, fmt.Errorf("cluster subject %s: %w", ev.Subject, err)
	}
	at := ev.GetTime()
	change := func(f func(c *clusterv1.Cluster) *clusterv1.Cluster) []view.Change {
		return []view.Change{view.ChangeOf(clusterKey(name), func(c *clusterv1.Cluster) *clusterv1.Cluster {
			if next := f(c); next != nil {
				next.UpdateTime = at
				return next
			}
			return nil
		})}
	}
	switch p := ev.Payload.(type) {
	case *clusterv1.ClusterRegistered:
		if p.Name != name {
			return nil, fmt.Errorf("ClusterRegistered for %q on subject of %q", p.Name, name)
		}
		return change(func(*clusterv1.Cluster) *clusterv1.Cluster {
			c := &clusterv1.Cluster{
				Id: p.Id, Name: p.Name, Labels: p.Labels, Claims: withoutReported(p.Claims), Taints: p.Taints,
				CreateTime: at, ImportedBy: p.ImportedBy,
				Status: &clusterv1.ClusterStatus{
					CredentialsSet:         p.CredentialsFingerprint != "",
					CredentialsFingerprint: p.CredentialsFingerprint,
				},
			}
			// Until its agent reports, a cluster is unreachable: placements must not pick it.
			setTaint(c, &clusterv1.Taint{Key: TaintUnreachable, Effect: clusterv1.TaintEffect_TAINT_EFFECT_NO_SELECT, TimeAdded: at})
			setCondition(c, ConditionAgentConnected, clusterv1.ConditionStatus_CONDITION_STATUS_UNKNOWN,
				"AgentNeverConnected", "no heartbeat received from the cluster's agent yet", at)
			return c
		}), nil
	case *clusterv1.ClusterUpdated:
		return change(func(c *clusterv1.Cluster) *clusterv1.Cluster {
			if c == nil {
				return nil
			}
			for _, f := range p.Fields {
				switch f {
				case "labels":
					c.Labels = p.Labels
				case "claims":
					// Admins' claims are replaced; the reported ones stay.
					claims := withoutReported(p.Claims)
					for k, v := range c.Claims {
						if isReportedClaim(k) {
							if claims == nil {
								claims = map[string]string{}
							}
							claims[k] = v
						}
					}
					c.Claims = claims
				case "taints":
					// User taints are replaced; the system's own taints stay.
					kept := slices.DeleteFunc(c.Taints, func(t *clusterv1.Taint) bool { return !isSystemTaint(t.Key) })
					c.Taints = append(kept, p.Taints...)
				}
			}
			return c
		}), nil
	case *clusterv1.ClusterCredentialsRotated:
		return change(func(c *clusterv1.Cluster) *clusterv1.Cluster {
			if c == nil {
				return nil
			}
			c.Status.CredentialsSet = p.CredentialsFingerprint != ""
			c.Status.CredentialsFingerprint = p.CredentialsFingerprint
			return c
		}), nil
	case *clusterv1.ClusterAgentConnected:
		return change(func(c *clusterv1.Cluster) *clusterv1.Cluster {
			if c == nil {
				return nil
			}
			removeTaint(c, TaintUnreachable)
			setCondition(c, ConditionAgentConnected, clusterv1.ConditionStatus_CONDITION_STATUS_TRUE,
				"HeartbeatReceived", "the cluster's agent is sending heartbeats", p.Time)
			c.Status.AgentHosted = p.Hosted
			c.Status.KubernetesVersion = p.KubernetesVersion
			c.Status.AgentVersion = p.AgentVersion
			setReportedClaim(c, ClaimKubeVersion, p.KubernetesVersion)
			return c
		}), nil
	case *clusterv1.ClusterResourcesReported:
		return change(func(c *clusterv1.Cluster) *clusterv1.Cluster {
			if c == nil {
				return nil
			}
			if c.Status == nil {
				c.Status = &clusterv1.ClusterStatus{}
			}
			c.Status.Resources = p.Resources
			setReportedClaim(c, ClaimNodes, strconv.Itoa(int(p.GetResources().GetNodeCount())))
			return c
		}), nil
	case *clusterv1.ClusterAgentLost:
		return change(func(c *clusterv1.Cluster) *clusterv1.Cluster {
			if c == nil {
				return nil
			}
			setTaint(c, &clusterv1.Taint{Key: TaintUnreachable, Effect: clusterv1.TaintEffect_TAINT_EFFECT_NO_SELECT, TimeAdded: p.Time})
			setCondition(c, ConditionAgentConnected, clusterv1.ConditionStatus_CONDITION_STATUS_FALSE,
				"HeartbeatTimeout", "no heartbeat since "+p.LastSeen.AsTime().UTC().Format("2006-01-02T15:04:05Z"), p.Time)
			return c
		}), nil
	case *clusterv1.ClusterDeregistered:
		return change(func(*clusterv1.Cluster) *clusterv1.Cluster { return nil }), nil
	case *clusterv1.ClusterImported:
		return change(func(c *clusterv1.Cluster) *clusterv1.Cluster {
			if c == nil || c.Id != p.Id {
				return c // another cluster of that name since: not its event
			}
			// After a registration it names the creator again; later, an adopter that
			// takes over from the creator that left (handOver): it adopts no more.
			c.ImportedBy = p.Origin
			c.AdoptedBy = slices.DeleteFunc(c.AdoptedBy, func(o *clusterv1.ImportOrigin) bool { return sameOrigin(o, p.Origin) })
			return c
		}), nil
	case *clusterv1.ClusterAdopted:
		return change(func(c *clusterv1.Cluster) *clusterv1.Cluster {
			if c == nil || c.Id != p.Id {
				return c
			}
			if !slices.ContainsFunc(c.AdoptedBy, func(o *clusterv1.ImportOrigin) bool { return sameOrigin(o, p.Origin) }) {
				c.AdoptedBy = append(c.AdoptedBy, p.Origin)
			}
			return c
		}), nil
	case *clusterv1.ImportedClusterRemoved:
		return change(func(c *clusterv1.Cluster) *clusterv1.Cluster {
			if c == nil || c.Id != p.Id {
				return c
			}
			c.AdoptedBy = slices.DeleteFunc(c.AdoptedBy, func(o *clusterv1.ImportOrigin) bool { return sameOrigin(o, p.Origin) })
			if !p.Adopted && sameOrigin(c.ImportedBy, p.Origin) {
				c.ImportedBy = nil
			}
			return c
		}), nil
	}
	return nil, fmt.Errorf("unexpected event %s on %s", ev.Type, ev.Subject)
}

// sameOrigin reports whether a and b name the same lifecycle (the source's version aside: it
// is only how the object was read).
func sameOrigin(a, b *clusterv1.ImportOrigin) bool {
	if a == nil || b == nil {
		return a == b
	}
	x, y := a.GetSource(), b.GetSource()
	return a.Policy == b.Policy && x.GetCluster() == y.GetCluster() && x.GetGroup() == y.GetGroup() &&
		x.GetResource() == y.GetResource() && x.GetNamespace() == y.GetNamespace() && x.GetName() == y.GetName()
}

func isSystemTaint(key string) bool { return strings.HasPrefix(key, systemTaintPrefix) }

func isReportedClaim(name string) bool { return strings.HasSuffix(name, ReservedClaimSuffix) }

// withoutReported drops reported claim names from claims an admin gave. The API refuses them;
// events written before they were reserved may still carry them, and the facts win.
func withoutReported(claims map[string]string) map[string]string {
	for k := range claims {
		if isReportedClaim(k) {
			delete(claims, k)
		}
	}
	return claims
}

// setReportedClaim sets a reported claim, or removes it when the agent reported nothing.
func setReportedClaim(c *clusterv1.Cluster, name, value string) {
	if value == "" {
		delete(c.Claims, name)
		return
	}
	if c.Claims == nil {
		c.Claims = map[string]string{}
	}
	c.Claims[name] = value
}

func setTaint(c *clusterv1.Cluster, t *clusterv1.Taint) {
	for _, cur := range c.Taints {
		if cur.Key == t.Key && cur.Effect == t.Effect {
			return // keep the original time added: tolerationSeconds count from it
		}
	}
	c.Taints = append(c.Taints, t)
}

func removeTaint(c *clusterv1.Cluster, key string) {
	c.Taints = slices.DeleteFunc(c.Taints, func(t *clusterv1.Taint) bool { return t.Key == key })
}

func setCondition(c *clusterv1.Cluster, typ string, status clusterv1.ConditionStatus, reason, msg string, at *timestamppb.Timestamp) {
	if c.Status == nil {
		c.Status = &clusterv1.ClusterStatus{}
	}
	for _, cond := range c.Status.Conditions {
		if cond.Type == typ {
			if cond.Status != status {
				cond.LastTransitionTime = at
			}
			cond.Status, cond.Reason, cond.Message = status, reason, msg
			return
		}
	}
	c.Status.Conditions = append(c.Status.Conditions, &clusterv1.Condition{
		Type: typ, Status: status, Reason: reason, Message: msg, LastTransitionTime: at,
	})
}

// Condition returns the condition of type typ, or nil.
func Condition(c *clusterv1.Cluster, typ string) *clusterv1.Condition {
	for _, cond := range c.GetStatus().GetConditions() {
		if cond.Type == typ {
			return cond
		}
	}
	return nil
}

// inventoryProjection keeps each cluster's latest namespace inventory from FLEET_AGENT: one
// entry per chunk the agent reported (subjects.ClusterInventoryKey), which readers merge with
// nsinventory.Assemble.
// Version 2: chunked inventories (fleet.agent.<cluster>.inventory.<i>), and every entry
// carries its generation, chunk and chunk count. Version 3: invalid names, labels and phases
// are dropped (checkNamespaces), also from inventories stored before.
func inventoryProjection() view.Projection { return inventoryProjectionReporting(nil) }

// inventoryProjectionReporting is inventoryProjection telling report, when not nil, what each
// chunk applied had dropped (agentlimits.go).
func inventoryProjectionReporting(report func(cluster string, chunk uint32, problems []string)) view.Projection {
	return view.Projection{
		Name:     "cluster-inventory",
		Version:  3,
		Stream:   subjects.AgentStreamName,
		Subjects: []string{subjects.AgentPrefix + ".*.inventory", subjects.AgentPrefix + ".*.inventory.*"},
		Bucket:   bucketConfig(subjects.ClusterInventoryBucket, "Latest namespace inventory per cluster, one entry per chunk."),
		New:      func() proto.Message { return &clusterv1.NamespaceInventory{} },
		Apply:    func(ev *events.Event) ([]view.Change, error) { return applyInventory(ev, report) },
	}
}

func applyInventory(ev *events.Event, report func(cluster string, chunk uint32, problems []string)) ([]view.Change, error) {
	p, ok := ev.Payload.(*agentv1.NamespaceInventory)
	if !ok {
		return nil, fmt.Errorf("unexpected %s on %s", ev.Type, ev.Subject)
	}
	// The subject, not the payload, says which cluster and chunk: NATS permissions pin an
	// agent to its own subjects, while the payload is whatever the agent wrote.
	toks := strings.Split(ev.Subject, ".")
	if len(toks) < 4 || len(toks) > 5 {
		return nil, fmt.Errorf("subject %s is not an inventory subject", ev.Subject)
	}
	tok := toks[2]
	name, err := keys.Decode(tok)
	if err != nil {
		return nil, err
	}
	var chunk uint32
	if len(toks) == 5 {
		i, err := strconv.ParseUint(toks[4], 10, 32)
		if err != nil || i == 0 || strconv.FormatUint(i, 10) != toks[4] {
			return nil, fmt.Errorf("subject %s: chunk %q is not a positive number", ev.Subject, toks[4])
		}
		chunk = uint32(i)
	}
	if p.GetChunk() != chunk {
		return nil, fmt.Errorf("subject %s carries chunk %d", ev.Subject, p.GetChunk())
	}
	inv := &clusterv1.NamespaceInventory{ClusterName: name, ObservedTime: ev.GetTime(),
		Generation: nsinventory.Generation(p), Chunk: chunk, Chunks: p.GetChunks()}
	// What Kubernetes could not have reported is dropped (checkNamespaces).
	var problems []string
	inv.Namespaces, problems = checkNamespaces(p.Namespaces)
	if report != nil {
		report(name, chunk, problems)
	}
	return []view.Change{{Key: subjects.ClusterInventoryKey(tok, chunk), Update: func(proto.Message) proto.Message { return inv }}}, nil
}

func subjectToken(subject string, i int) (string, error) {
	toks := strings.Split(subject, ".")
	if i >= len(toks) {
		return "", fmt.Errorf("subject %s has no token %d", subject, i)
	}
	return toks[i], nil
}

// inventoryIndex lists every chunk of an inventory under its cluster's key, so that
// Lookup(clusterKey(name)) returns the chunks nsinventory.Assemble merges.
func inventoryIndex(key string, _ *clusterv1.NamespaceInventory) []string {
	return []string{subjects.ClusterInventoryKeyCluster(key)}
}
