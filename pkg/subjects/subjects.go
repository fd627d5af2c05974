// Package subjects is the contract between services: the names of streams, subjects and KV
// buckets. A service writes only what it owns (see docs/architecture.md); the others read.
package subjects

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetstream/fleetstream/pkg/keys"
)

// Cluster registry, owned by cluster-import.
const (
	ClusterStream  = "FLEET_CLUSTER"
	ClusterPrefix  = "fleet.cluster"
	ClustersBucket = "clusters"
	// ClusterCredentialsBucket holds connection credentials, apart from the registry view.
	ClusterCredentialsBucket = "cluster-credentials"
	// ClusterStatusBucket holds what agents report continuously (last seen), not event-sourced.
	ClusterStatusBucket = "cluster-status"
	// ClusterInventoryBucket holds each cluster's latest namespace inventory, one entry per
	// chunk (ClusterInventoryKey).
	ClusterInventoryBucket = "cluster-inventory"
	// AgentTokensBucket maps a digest of each agent's NATS token to its cluster.
	AgentTokensBucket = "agent-tokens"
)

// Import policies, owned by cluster-import: events on FLEET_CLUSTER under
// fleet.cluster.importpolicy.<name>, a view, and one claim per policy source.
const (
	ImportPoliciesBucket = "import-policies"
	// ImportPolicySourcesBucket holds which policy imports each (cluster, group, resource).
	ImportPolicySourcesBucket = "import-policy-sources"
)

// ImportPolicy returns the subject of import policy name's events.
func ImportPolicy(name string) string { return ClusterPrefix + ".importpolicy." + keys.Encode(name) }

// Cluster returns the subject of cluster name's events.
func Cluster(name string) string { return ClusterPrefix + "." + keys.Encode(name) }

// Agent reports, written by each cluster's agent under its own prefix only.
const (
	AgentStreamName = "FLEET_AGENT"
	AgentPrefix     = "fleet.agent"
)

// AgentPrefixFor returns the subject prefix agent of cluster may publish under.
func AgentPrefixFor(cluster string) string { return AgentPrefix + "." + keys.Encode(cluster) }

// AgentHeartbeat returns the subject of cluster's heartbeats.
func AgentHeartbeat(cluster string) string { return AgentPrefixFor(cluster) + ".heartbeat" }

// LivePrefix is where agents' heartbeats go, on core NATS: never stored, each superseded by the
// next. Stored on FLEET_AGENT (as agents before this one still do) they were most of an idle
// hub's CPU: 200 stored messages, deliveries and acks a second at 1,000 clusters (docs/scale.md).
const LivePrefix = "fleet.live"

// AgentLiveHeartbeat returns the core NATS subject of cluster's heartbeats.
func AgentLiveHeartbeat(cluster string) string {
	return LivePrefix + "." + keys.Encode(cluster) + ".heartbeat"
}

// AgentLiveHeartbeats matches every cluster's heartbeats on core NATS.
const AgentLiveHeartbeats = LivePrefix + ".*.heartbeat"

// AgentInventory returns the subject of cluster's namespace inventory (its chunk 0).
func AgentInventory(cluster string) string { return AgentPrefixFor(cluster) + ".inventory" }

// AgentInventoryChunk returns the subject of chunk i of cluster's namespace inventory:
// AgentInventory for chunk 0, <AgentInventory>.<i> for the others (see pkg/nsinventory).
func AgentInventoryChunk(cluster string, i uint32) string {
	if i == 0 {
		return AgentInventory(cluster)
	}
	return AgentInventory(cluster) + "." + strconv.FormatUint(uint64(i), 10)
}

// ClusterInventoryKey returns the key of chunk i of the inventory in ClusterInventoryBucket
// whose cluster encodes to token tok (keys.Encode): tok for chunk 0, as before chunking
// existed, <tok>.<i> for the others.
func ClusterInventoryKey(tok string, i uint32) string {
	if i == 0 {
		return tok
	}
	return tok + "." + strconv.FormatUint(uint64(i), 10)
}

// ClusterInventoryKeyCluster returns the cluster token of a ClusterInventoryBucket key, the
// term under which readers index every chunk of one cluster.
func ClusterInventoryKeyCluster(key string) string {
	tok, _, _ := strings.Cut(key, ".")
	return tok
}

// Import sources: cluster-import writes, per inventory cluster, what its agent must report for
// the import policies (agentv1.ImportWatch); the agent reports each object on FLEET_AGENT, except
// core Secrets, which go on core NATS under AgentSecretPrefix and are never persisted.
const (
	ImportWatchBucket = "import-watch"
	AgentSecretPrefix = "fleet.agentsecret"
)

// ImportWatchKey returns cluster's key in ImportWatchBucket.
func ImportWatchKey(cluster string) string { return keys.Encode(cluster) }

// AgentImportObject returns the subject of one reported object of cluster.
func AgentImportObject(cluster, group, resource, namespace, name string) string {
	return AgentPrefixFor(cluster) + ".importobject." + keys.Join(group, resource, namespace, name)
}

// AgentImportSync returns the subject of the "every object reported" marker of one source type.
func AgentImportSync(cluster, group, resource, namespace string) string {
	return AgentPrefixFor(cluster) + ".importsync." + keys.Join(group, resource, namespace)
}

// AgentImportWatchStatus returns the subject of cluster's agentv1.ImportWatchStatus: how its
// agent fares with the types its ImportWatch names.
func AgentImportWatchStatus(cluster string) string { return AgentPrefixFor(cluster) + ".importstatus" }

// AgentSecret returns the core NATS subject of one Secret the agent of cluster reports.
func AgentSecret(cluster, namespace, name string) string {
	return AgentSecretPrefix + "." + keys.Join(cluster, namespace, name)
}

// Hub-hosted agents (cluster-agent --hosted) ask cluster-import for a member cluster's
// connection credentials on core NATS, one request per cluster, never persisted.
const HostedCredentialsPrefix = "fleet.hosted.credentials"

// HostedCredentials returns the request subject for cluster's credentials.
func HostedCredentials(cluster string) string {
	return HostedCredentialsPrefix + "." + keys.Encode(cluster)
}

// Desired state for member clusters: one bucket, keys <cluster>.<kind>.<namespace>.<name>,
// written by the owning service of each kind, watched by the cluster's agent under <cluster>.>.
const (
	DesiredBucket = "desired"
	// AppliedBucket holds what agents applied, same keys, written by the agent.
	AppliedBucket = "applied"
)

// DesiredKey returns the key of one desired object; namespace is "" for cluster-scoped ones.
func DesiredKey(cluster, kind, namespace, name string) string {
	return keys.Join(cluster, kind, namespace, name)
}

// AgentStream is the stream agents report into. Every report is a snapshot (a heartbeat, the
// whole namespace list, one EndpointSlice), so only the latest message per subject is kept.
// Reports that something is gone (an EndpointSlice's tombstone) carry a per-message TTL, so
// the stream does not keep one message per object ever deleted.
func AgentStream() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              AgentStreamName,
		Description:       "Reports from cluster agents; the latest per subject.",
		Subjects:          []string{AgentPrefix + ".>"},
		Storage:           jetstream.FileStorage,
		MaxMsgsPerSubject: 1,
		// Each subject holds one message: this bounds what one subject can hold. What one
		// cluster holds is bounded by cluster-import (--max-agent-report-bytes-per-cluster).
		MaxMsgSize:  AgentMaxMsgSize,
		Duplicates:  time.Minute,
		AllowMsgTTL: true,
	}
}

// AgentMaxMsgSize is the largest report FLEET_AGENT stores: the max_payload of fleetd's
// embedded server and of deploy/nats, which agents size their largest reports (import objects,
// inventory chunks) by.
const AgentMaxMsgSize = 8 << 20

// AgentLimitsBucket holds, per cluster and hub reader, why that reader refuses part of what the
// cluster's agent reports (over a limit, or invalid): a clusterv1.Condition of type
// ConditionAgentWithinLimits, status false, under AgentLimitsKey. A reader deletes its key when
// the agent is back within its limits; cluster-import shows the entries as the cluster's
// condition. Several services ensure it with AgentLimitsBucketConfig; each writes only its own
// reader's keys.
const (
	AgentLimitsBucket          = "agent-limits"
	ConditionAgentWithinLimits = "AgentWithinLimits"
)

// AgentLimitsBucketConfig is bucket AgentLimitsBucket's configuration.
func AgentLimitsBucketConfig() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: AgentLimitsBucket, Description: "Why hub readers refuse part of an agent's reports, by cluster and reader.",
		History: 1, Storage: jetstream.FileStorage}
}

// AgentLimitsKey returns the key under which reader records cluster's refusals.
func AgentLimitsKey(cluster, reader string) string {
	return keys.Encode(cluster) + "." + keys.Encode(reader)
}

// AgentLimitsKeyCluster returns the cluster token (keys.Encode) of an AgentLimitsBucket key.
func AgentLimitsKeyCluster(key string) string {
	tok, _, _ := strings.Cut(key, ".")
	return tok
}

// Endpoint collection, owned by endpoint-collector. Agents report EndpointSlices on FLEET_AGENT.
const (
	EndpointStream = "FLEET_ENDPOINT"
	EndpointPrefix = "fleet.endpoint"
	// EndpointsBucket holds the merged multi-cluster view per service, key <namespace>.<name>.
	EndpointsBucket = "endpoints"
	// EndpointWeightsBucket holds the weight overrides per service (projection of FLEET_ENDPOINT).
	EndpointWeightsBucket = "endpoint-weights"
)

// EndpointWeight returns the subject of the weight events of service namespace/name.
func EndpointWeight(namespace, name string) string {
	return EndpointPrefix + ".weight." + keys.Join(namespace, name)
}

// AgentEndpointSlice returns the subject of one EndpointSlice report of cluster.
func AgentEndpointSlice(cluster, namespace, slice string) string {
	return AgentPrefixFor(cluster) + ".endpointslice." + keys.Join(namespace, slice)
}

// AgentEndpointSync returns the subject of cluster's "relist complete" EndpointSlice marker.
func AgentEndpointSync(cluster string) string { return AgentPrefixFor(cluster) + ".endpointsync" }

// AgentServiceExportsKind is the subject token of multi-cluster ServiceExport reports.
const AgentServiceExportsKind = "serviceexports"

// AgentServiceExports returns the subject of cluster's report of the ServiceExports
// (multicluster.x-k8s.io, KEP-1645) of one namespace: one snapshot per namespace.
func AgentServiceExports(cluster, namespace string) string {
	return AgentPrefixFor(cluster) + "." + AgentServiceExportsKind + "." + keys.Encode(namespace)
}

// AgentServiceExportsSync returns the subject of cluster's "every namespace with exports
// reported" marker.
func AgentServiceExportsSync(cluster string) string {
	return AgentPrefixFor(cluster) + ".serviceexportsync"
}

// Desired buckets, one per owning service (a bucket has a single writer).
const (
	DesiredNamespacesBucket = "desired-namespaces"
	DesiredRBACBucket       = "desired-rbac"
	// DesiredMCSBucket holds the multi-cluster Services' ServiceImports and EndpointSlices of
	// each member cluster, written by endpoint-collector (docs/kubernetes.md).
	DesiredMCSBucket = "desired-mcs"
)

// DesiredBuckets lists every desired bucket an agent watches.
func DesiredBuckets() []string {
	return []string{DesiredNamespacesBucket, DesiredRBACBucket, DesiredMCSBucket}
}

// Buckets agents watch (the desired buckets and ImportWatchBucket) republish every stored
// message on core NATS under FeedPrefix: an agent receives its own cluster's changes through a
// plain subscription to its subjects, so a change costs work for that cluster only and the hub
// holds no JetStream consumer per agent (pkg/kvfeed, docs/architecture.md).
const FeedPrefix = "fleet.feed"

// FeedSubject returns the core NATS subject key of bucket is republished on; key may end in a
// wildcard.
func FeedSubject(bucket, key string) string { return FeedPrefix + "." + bucket + "." + key }

// FeedRePublish is the RePublish of a bucket agents watch: every stored message, headers and
// data, to FeedSubject(bucket, key).
func FeedRePublish(bucket string) *jetstream.RePublish {
	return &jetstream.RePublish{Source: "$KV." + bucket + ".>", Destination: FeedSubject(bucket, ">")}
}

// FeedBucketConfig is the configuration of a bucket agents watch: on disk, republished to the
// feed, keeping the latest two values per key.
//
// Two, not one, for the agents' replays (pkg/kvfeed): nats-server starts a deliver-last-per-
// subject consumer on a stream of MaxMsgsPerSubject 1 at its first sequence and matches every
// stored subject against the consumer's filter, so each agent's replay of its own keys walked
// every cluster's keys — O(N) per replay, N² per hub-restart storm. With 2 it looks the last
// sequence of each subject under the filter up in its subject index (MultiLastSeqs) and loads
// only those: at 5,000 clusters × 10 keys a replay took 2.2 ms instead of 18.6 ms
// (BenchmarkReplayOneCluster, docs/scale.md). The price is one earlier revision kept per changed
// key; nothing reads it.
func FeedBucketConfig(bucket, desc string) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: bucket, Description: desc, History: FeedBucketHistory, Storage: jetstream.FileStorage, RePublish: FeedRePublish(bucket)}
}

// FeedBucketHistory is the History of the buckets agents watch (FeedBucketConfig).
const FeedBucketHistory = 2

// AppliedKey returns the key in AppliedBucket of a desired key of bucket.
func AppliedKey(bucket, desiredKey string) string { return keys.Encode(bucket) + "." + desiredKey }

// Projects and namespace bindings, owned by namespace-binding; rbac-sync reads the bindings.
const (
	NamespaceStream = "FLEET_NS"
	NamespacePrefix = "fleet.ns"
	// ProjectsBucket is the projects view, key keys.Encode(project).
	ProjectsBucket = "ns-projects"
	// NamespaceBindingsBucket is the bindings view, key keys.Join(cluster, namespace).
	NamespaceBindingsBucket = "ns-bindings"
	// NamespaceClaimsBucket holds one claim per owned (cluster, namespace).
	NamespaceClaimsBucket = "ns-claims"
)

// Cluster sets and their bindings to projects, owned by namespace-binding (placement; see
// docs/placement.md).
const (
	PlacementStream = "FLEET_PLACEMENT"
	PlacementPrefix = "fleet.placement"
	// ClusterSetsBucket is the cluster sets view, key keys.Encode(set).
	ClusterSetsBucket = "placement-clustersets"
	// ClusterSetBindingsBucket is the set bindings view, key keys.Join(project, set).
	ClusterSetBindingsBucket = "placement-clusterset-bindings"
	// ClusterSetRolesBucket is the set role bindings view, key ClusterSetRoleKey.
	ClusterSetRolesBucket = "placement-clusterset-roles"
	// PlacementsBucket is the placements view, key keys.Join(project, name).
	PlacementsBucket = "placement-placements"
	// PlacementDecisionsBucket is the decisions view, key keys.Join(project, name).
	PlacementDecisionsBucket = "placement-decisions"
	// AddOnScoresBucket is the add-on scores view, key keys.Join(cluster, resource, score).
	AddOnScoresBucket = "placement-addon-scores"
	// PlacementNamespacesBucket holds the namespaces that follow a placement, key
	// keys.Join(project, namespace).
	PlacementNamespacesBucket = "placement-namespaces"
)

// Placement returns the subject of the spec events of placement name in project.
func Placement(project, name string) string {
	return PlacementPrefix + ".placement." + keys.Join(project, name)
}

// PlacementDecision returns the subject of the decisions of placement name in project.
func PlacementDecision(project, name string) string {
	return PlacementPrefix + ".decision." + keys.Join(project, name)
}

// AddOnScore returns the subject of one add-on score of a cluster.
func AddOnScore(cluster, resourceName, scoreName string) string {
	return PlacementPrefix + ".addonscore." + keys.Join(cluster, resourceName, scoreName)
}

// PlacementNamespace returns the subject of the events of namespace following a placement
// in project.
func PlacementNamespace(project, namespace string) string {
	return PlacementPrefix + ".namespace." + keys.Join(project, namespace)
}

// ClusterSet returns the subject of cluster set name's events.
func ClusterSet(name string) string { return PlacementPrefix + ".clusterset." + keys.Encode(name) }

// ClusterSetBinding returns the subject of the events of the binding of set to project.
func ClusterSetBinding(project, set string) string {
	return PlacementPrefix + ".binding." + keys.Join(project, set)
}

// ClusterSetRoleKey is the identity of one set role binding: its key in ClusterSetRolesBucket and
// its subject's suffix. kind is the subject's kind as Kubernetes names it (User, Group).
func ClusterSetRoleKey(set, kind, name, role string) string { return keys.Join(set, kind, name, role) }

// ClusterSetRole returns the subject of the events of one set role binding.
func ClusterSetRole(set, kind, name, role string) string {
	return PlacementPrefix + ".setrole." + ClusterSetRoleKey(set, kind, name, role)
}

// Role templates and project role bindings, owned by rbac-sync.
const (
	RBACStream          = "FLEET_RBAC"
	RBACPrefix          = "fleet.rbac"
	RBACTemplatesBucket = "rbac-templates"
	RBACBindingsBucket  = "rbac-bindings"
	// RBACAccessSnapshotsBucket holds AccessAt's snapshots of the RBAC and namespace histories.
	RBACAccessSnapshotsBucket = "rbac-access-snapshots"
)

// AppliedBucketConfig is the configuration of the bucket agents report into. It belongs to no
// single hub service (agents write it; namespace-binding and rbac-sync read it), so each reader
// ensures it with this one configuration and the same replicas.
func AppliedBucketConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      AppliedBucket,
		Description: "What agents applied, per desired key (<bucket>.<cluster>.<kind>.<ns>.<name>).",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	}
}

// NameUnder decodes the one token of subject after prefix (the name a per-object subject
// carries, keys.Encode'd), or says why subject is not one of prefix's.
func NameUnder(subject, prefix string) (string, error) {
	tok, ok := strings.CutPrefix(subject, prefix)
	if !ok || tok == "" || strings.Contains(tok, ".") {
		return "", fmt.Errorf("subject %s is not under %s", subject, prefix)
	}
	name, err := keys.Decode(tok)
	if err != nil {
		return "", fmt.Errorf("subject %s: %w", subject, err)
	}
	return name, nil
}

// The audit trail (pkg/audit): the activity index, one record per event of the domain streams
// and one per denied API call, served by AuditService.
const (
	AuditStream = "FLEET_AUDIT"
	AuditPrefix = "fleet.audit"
	// AuditCheckpointsBucket holds, per domain stream, the sequence up to which the index is
	// written (key: the stream's name).
	AuditCheckpointsBucket = "audit-checkpoints"
)

// AuditActivity is the subject of one activity record: class ("event" or "denied"), then the
// row's project, cluster, object kind, object name and actor, each keys.Encode'd ("=" for
// empty), so a query filters on any of them with the stream's own subject index.
func AuditActivity(class, project, cluster, kind, name, actor string) string {
	return AuditPrefix + "." + class + "." + keys.Join(project, cluster, kind, name, actor)
}
