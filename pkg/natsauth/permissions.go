package natsauth

import (
	"slices"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/lease"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/topology"
)

// This file is the one permission table of Fleetstream on NATS: what every identity (each hub
// service, the agent of a cluster, a downstream subscriber) may publish and subscribe to.
// fleetd's embedded server and the auth callout responder both grant from it.

// Permissions are the subjects an identity may publish to and subscribe to; everything else is
// denied.
type Permissions struct {
	Publish   []string
	Subscribe []string
}

// Server returns p for a server.Authentication (fleetd's embedded server).
func (p Permissions) Server() *server.Permissions {
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: slices.Clone(p.Publish)},
		Subscribe: &server.SubjectPermission{Allow: slices.Clone(p.Subscribe)},
	}
}

// JWT returns p as user JWT permissions (the auth callout's answer).
func (p Permissions) JWT() jwt.Permissions {
	var out jwt.Permissions
	out.Pub.Allow.Add(p.Publish...)
	out.Sub.Allow.Add(p.Subscribe...)
	return out
}

// Allows reports whether p lets subject be published (sub=false) or subscribed (sub=true),
// with NATS wildcard semantics. Tests and documentation use it; the server decides for real.
func (p Permissions) Allows(subject string, sub bool) bool {
	list := p.Publish
	if sub {
		list = p.Subscribe
	}
	for _, pattern := range list {
		if subjectMatches(pattern, subject) {
			return true
		}
	}
	return false
}

func subjectMatches(pattern, subject string) bool {
	pt, st := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, p := range pt {
		if p == ">" {
			return len(st) > i
		}
		if i >= len(st) || (p != "*" && p != st[i]) {
			return false
		}
	}
	return len(pt) == len(st)
}

// The hub services, by the name each runs as (its binary, its daemon.Main name).
const (
	ServiceClusterImport     = "cluster-import"
	ServiceNamespaceBinding  = "namespace-binding"
	ServiceRBACSync          = "rbac-sync"
	ServiceEndpointCollector = "endpoint-collector"
	// ServiceHostedAgent is cluster-agent --hosted, which runs the agents of member clusters
	// that have stored credentials and no agent of their own. Its own connection only finds
	// those clusters and fetches their credentials; each hosted agent connects as that
	// cluster's agent (HostedAgentUser).
	ServiceHostedAgent = "hosted-agent"
	// ServiceKubeBridge publishes the fleet onto a hub Kubernetes API server
	// (services/kube-bridge): it reads the registry's and the scheduler's views and writes no
	// stream or bucket, so nothing the hub tells it reaches Fleetstream.
	ServiceKubeBridge = "kube-bridge"
)

// Services lists every hub service the table knows.
func Services() []string {
	return []string{ServiceClusterImport, ServiceNamespaceBinding, ServiceRBACSync, ServiceEndpointCollector, ServiceHostedAgent, ServiceKubeBridge}
}

// SubscribersBucket holds the downstream subscribers, owned by cluster-import.
const SubscribersBucket = "subscribers"

// SubscriberTokensBucket maps a digest of each subscriber's NATS token to its name.
const SubscriberTokensBucket = "subscriber-tokens"

// access is what one service may do with one stream (a KV bucket is stream KV_<bucket>).
type access int

const (
	// read: stream info, message and direct gets, consumers of its own (create, fetch, ack,
	// flow control, delete).
	read access = 1 << iota
	// ensure: create and update the stream's configuration (several services ensure a shared
	// stream with one configuration).
	ensure
	// write: publish to the stream's subjects.
	write
	// manage: delete and purge the stream and delete messages; only its owner.
	manage
	own = read | ensure | write | manage
)

type grant struct {
	stream string
	access access
	// subjects is what write allows: the stream's subjects, or a narrower part of them.
	subjects []string
}

func kv(bucket string) string { return "KV_" + bucket }

func ownBucket(bucket string) grant {
	return grant{stream: kv(bucket), access: own, subjects: []string{"$KV." + bucket + ".>"}}
}

func readBucket(bucket string) grant { return grant{stream: kv(bucket), access: read} }

// Every service that runs a view engine or a leased writer writes the lease bucket (and creates
// it if missing). Lease keys are not namespaced per service: a service could disturb another's
// leases, never read or write its data.
func leases() grant {
	return grant{stream: kv(lease.Bucket), access: read | ensure | write, subjects: []string{"$KV." + lease.Bucket + ".>"}}
}

// Several services ensure the shared dead-letter stream; each writes only its own consumers'
// subjects (fleet.dlq.<stream>.<consumer>).
func deadLetter(consumers ...string) grant {
	g := grant{stream: topology.DeadLetterStreamName, access: ensure | read}
	for _, c := range consumers {
		g.access |= write
		g.subjects = append(g.subjects, topology.DeadLetterSubjectPrefix+"."+c)
	}
	return g
}

// viewDeadLetters is where the view engines of a service park the poison events of stream
// (pkg/view dead-letters to fleet.dlq.<stream>.view-<view>): without it a poison event under
// the callout would be a permission violation and its view would stall retrying.
func viewDeadLetters(stream string) string { return stream + ".*" }

// serviceGrants is the table: every stream and bucket each hub service uses. Derived from each
// service's Topology(), its view engines and caches and the buckets of others it opens.
var serviceGrants = map[string][]grant{
	ServiceClusterImport: {
		{stream: subjects.ClusterStream, access: own, subjects: []string{subjects.ClusterPrefix + ".>"}},
		// Agents write FLEET_AGENT; cluster-import ensures it, folds heartbeats and
		// inventories out of it and purges the report subjects of a cluster over its limits.
		{stream: subjects.AgentStreamName, access: read | ensure | manage},
		ownBucket(subjects.AgentLimitsBucket),
		ownBucket(subjects.ClustersBucket),
		ownBucket(subjects.ClusterInventoryBucket),
		ownBucket(subjects.ClusterStatusBucket),
		// Nobody else reads these two.
		ownBucket(subjects.ClusterCredentialsBucket),
		ownBucket(subjects.AgentTokensBucket),
		ownBucket(SubscribersBucket),
		ownBucket(SubscriberTokensBucket),
		ownBucket(subjects.ImportPoliciesBucket),
		ownBucket(subjects.ImportPolicySourcesBucket),
		// What each inventory cluster's agent reports for import policies (one key per cluster).
		ownBucket(subjects.ImportWatchBucket),
		deadLetter(subjects.AgentStreamName+".cluster-import-heartbeats", viewDeadLetters(subjects.ClusterStream), viewDeadLetters(subjects.AgentStreamName)),
		leases(),
	},
	ServiceNamespaceBinding: {
		{stream: subjects.NamespaceStream, access: own, subjects: []string{subjects.NamespacePrefix + ".>"}},
		ownBucket(subjects.ProjectsBucket),
		ownBucket(subjects.NamespaceBindingsBucket),
		ownBucket(subjects.NamespaceClaimsBucket),
		ownBucket(subjects.DesiredNamespacesBucket),
		// Cluster sets, set bindings, placements, decisions, add-on scores and the namespaces
		// following placements (docs/placement.md).
		{stream: subjects.PlacementStream, access: own, subjects: []string{subjects.PlacementPrefix + ".>"}},
		ownBucket(subjects.ClusterSetsBucket),
		ownBucket(subjects.ClusterSetBindingsBucket),
		ownBucket(subjects.ClusterSetRolesBucket),
		ownBucket(subjects.PlacementsBucket),
		ownBucket(subjects.PlacementDecisionsBucket),
		ownBucket(subjects.AddOnScoresBucket),
		ownBucket(subjects.PlacementNamespacesBucket),
		// Agents write `applied`; namespace-binding ensures it and reads its own statuses.
		{stream: kv(subjects.AppliedBucket), access: read | ensure},
		readBucket(subjects.ClustersBucket),
		readBucket(subjects.ClusterInventoryBucket),
		// A cluster's last event confirms its deregistration before its bindings are released.
		{stream: subjects.ClusterStream, access: read},
		deadLetter(viewDeadLetters(subjects.NamespaceStream), viewDeadLetters(subjects.PlacementStream)),
		leases(),
	},
	ServiceRBACSync: {
		{stream: subjects.RBACStream, access: own, subjects: []string{subjects.RBACPrefix + ".>"}},
		ownBucket(subjects.RBACTemplatesBucket),
		ownBucket(subjects.RBACBindingsBucket),
		ownBucket(subjects.DesiredRBACBucket),
		// AccessAt's snapshots of the RBAC and namespace histories.
		ownBucket(subjects.RBACAccessSnapshotsBucket),
		{stream: kv(subjects.AppliedBucket), access: read | ensure},
		// Namespace bindings decide where roles go; the history replays FLEET_NS (WhoCan at a time).
		{stream: subjects.NamespaceStream, access: read},
		readBucket(subjects.NamespaceBindingsBucket),
		readBucket(subjects.ClustersBucket),
		deadLetter(viewDeadLetters(subjects.RBACStream)),
		leases(),
		// The audit trail (pkg/audit): its index of every domain stream, and its checkpoints.
		{stream: subjects.AuditStream, access: own, subjects: []string{subjects.AuditPrefix + ".>"}},
		ownBucket(subjects.AuditCheckpointsBucket),
		{stream: subjects.ClusterStream, access: read},
		{stream: subjects.PlacementStream, access: read},
		{stream: subjects.EndpointStream, access: read},
	},
	ServiceEndpointCollector: {
		{stream: subjects.EndpointStream, access: own, subjects: []string{subjects.EndpointPrefix + ".>"}},
		ownBucket(subjects.EndpointsBucket),
		ownBucket(subjects.EndpointWeightsBucket),
		// Multi-cluster Services' ServiceImports and EndpointSlices for each member cluster;
		// agents' statuses say when a tombstone there may be collected.
		ownBucket(subjects.DesiredMCSBucket),
		readBucket(subjects.AppliedBucket),
		// EndpointSlice and ServiceExport reports and heartbeats come from agents.
		{stream: subjects.AgentStreamName, access: read | ensure},
		// Which clusters' agents are over its limits: its own key of each cluster.
		{stream: kv(subjects.AgentLimitsBucket), access: read | ensure | write, subjects: []string{
			"$KV." + subjects.AgentLimitsBucket + ".*." + ServiceEndpointCollector,
			// Its multi-cluster Services' reader (package mcs: export reports refused or cut).
			"$KV." + subjects.AgentLimitsBucket + ".*." + ServiceEndpointCollector + "-mcs",
		}},
		readBucket(subjects.ClustersBucket),
		// When each agent was last heard, as cluster-import recorded it: where a restarted
		// collector starts from, heartbeats not being stored.
		readBucket(subjects.ClusterStatusBucket),
		// A cluster's last event confirms its deregistration before its endpoints are evicted.
		{stream: subjects.ClusterStream, access: read},
		deadLetter(subjects.AgentStreamName+".endpoint-collector", viewDeadLetters(subjects.EndpointStream)),
		leases(),
	},
	ServiceHostedAgent: {
		// Which clusters have credentials, and whether their own agent heartbeats.
		readBucket(subjects.ClustersBucket),
		readBucket(subjects.ClusterStatusBucket),
		leases(),
	},
	ServiceKubeBridge: {
		// The fleet it publishes (ClusterProfiles, PlacementDecisions), read only: no dead
		// letters, no write of any stream or bucket of Fleetstream's.
		readBucket(subjects.ClustersBucket),
		readBucket(subjects.PlacementDecisionsBucket),
		// Its own leases alone, kube-bridge.<hub> (one writer per hub API server): unlike the
		// other services' leases() it cannot disturb another service's lease.
		{stream: kv(lease.Bucket), access: read | ensure | write, subjects: []string{"$KV." + lease.Bucket + "." + ServiceKubeBridge + ".>"}},
	},
}

// servicesWithoutAPI serve no API, so their daemons start no authorizer (pkg/daemon's NoAPI):
// they get neither what it reads nor the audit stream's denied rows.
var servicesWithoutAPI = map[string]bool{ServiceKubeBridge: true}

// serviceCoreSubscribes are the core NATS subjects (no stream) a service subscribes to.
var serviceCoreSubscribes = map[string][]string{
	// Secrets agents report for import policies and hosted agents' credential requests: kept in
	// memory only, never in a stream.
	ServiceClusterImport: {subjects.AgentSecretPrefix + ".>", subjects.HostedCredentialsPrefix + ".*", subjects.AgentLiveHeartbeats},
	// Agents' heartbeats: when each cluster was last heard, for staleness and eviction.
	ServiceEndpointCollector: {subjects.AgentLiveHeartbeats},
}

// serviceCorePublishes are the core NATS subjects (no stream) a service publishes to.
var serviceCorePublishes = map[string][]string{
	ServiceHostedAgent: {subjects.HostedCredentialsPrefix + ".*"},
	// The answers to the hosted agent's credential requests go to its inbox, and only there: no
	// other client can receive a cluster's credentials.
	ServiceClusterImport: {ServiceInboxPrefix(ServiceHostedAgent) + ".>"},
}

// ServiceInboxPrefix is the reply-subject prefix service must use (nats.CustomInboxPrefix). Each
// service has its own so that none can read another's replies (cluster-import's carry
// credentials). The "svc_" keeps it apart from agents' prefixes, which are cluster names (DNS
// labels never hold '_').
func ServiceInboxPrefix(service string) string { return "_INBOX_svc_" + keys.Encode(service) }

// ServicePermissions returns what hub service may do; ok is false for an unknown service.
func ServicePermissions(service string) (p Permissions, ok bool) {
	grants, ok := serviceGrants[service]
	if !ok {
		return Permissions{}, false
	}
	p.Publish = []string{"$JS.API.INFO"}
	all := slices.Clone(grants)
	if !servicesWithoutAPI[service] {
		all = append(append(all, authorizerReads()...), deniedCalls())
	}
	for _, g := range all {
		p.Publish = append(p.Publish, streamAPI(g)...)
	}
	p.Publish = append(p.Publish, serviceCorePublishes[service]...)
	p.Subscribe = append([]string{ServiceInboxPrefix(service) + ".>"}, serviceCoreSubscribes[service]...)
	return Merge(p), true
}

// authorizerReads is what every service's API authorizer (pkg/authz, started by pkg/daemon)
// reads to decide who may call what: role templates, project role bindings, namespace bindings,
// and, for cluster set roles, the set role bindings, the sets and the registry (a cluster's
// sets follow from its labels).
func authorizerReads() []grant {
	return []grant{
		readBucket(subjects.RBACTemplatesBucket),
		readBucket(subjects.RBACBindingsBucket),
		readBucket(subjects.NamespaceBindingsBucket),
		readBucket(subjects.ClusterSetRolesBucket),
		readBucket(subjects.ClusterSetsBucket),
		readBucket(subjects.ClustersBucket),
	}
}

// deniedCalls is where every service's authorizer records the calls it denies (pkg/audit's
// DenialRecorder): the audit stream's denied rows only.
func deniedCalls() grant {
	return grant{stream: subjects.AuditStream, access: write, subjects: []string{subjects.AuditPrefix + ".denied.>"}}
}

func streamAPI(g grant) []string {
	s := g.stream
	var out []string
	if g.access&read != 0 {
		out = append(out,
			"$JS.API.STREAM.INFO."+s,
			"$JS.API.STREAM.MSG.GET."+s,
			"$JS.API.DIRECT.GET."+s,
			"$JS.API.DIRECT.GET."+s+".>",
			// Consumers: created with or without a filter in the subject, then fetched from,
			// inspected, deleted; acks and flow-control replies go to the stream's subjects.
			"$JS.API.CONSUMER.CREATE."+s,
			"$JS.API.CONSUMER.CREATE."+s+".>",
			"$JS.API.CONSUMER.DURABLE.CREATE."+s+".*",
			"$JS.API.CONSUMER.INFO."+s+".*",
			"$JS.API.CONSUMER.DELETE."+s+".*",
			"$JS.API.CONSUMER.MSG.NEXT."+s+".*",
			"$JS.ACK."+s+".>",
			"$JS.FC."+s+".>",
		)
	}
	if g.access&ensure != 0 {
		out = append(out, "$JS.API.STREAM.CREATE."+s, "$JS.API.STREAM.UPDATE."+s)
	}
	if g.access&manage != 0 {
		out = append(out, "$JS.API.STREAM.DELETE."+s, "$JS.API.STREAM.PURGE."+s, "$JS.API.STREAM.MSG.DELETE."+s)
	}
	if g.access&write != 0 {
		out = append(out, g.subjects...)
	}
	return out
}

// CalloutResponderPermissions are the extra rights of the connection answering the auth
// callout: the server's requests and its replies to them.
func CalloutResponderPermissions() Permissions {
	return Permissions{Publish: []string{"$SYS._INBOX.>"}, Subscribe: []string{server.AuthCalloutSubject}}
}

// Merge returns the union of ps.
func Merge(ps ...Permissions) Permissions {
	var out Permissions
	for _, p := range ps {
		for _, s := range p.Publish {
			if !slices.Contains(out.Publish, s) {
				out.Publish = append(out.Publish, s)
			}
		}
		for _, s := range p.Subscribe {
			if !slices.Contains(out.Subscribe, s) {
				out.Subscribe = append(out.Subscribe, s)
			}
		}
	}
	return out
}

// AgentInboxPrefix is the reply-subject prefix an agent of cluster must use
// (nats.CustomInboxPrefix): replies to it are all it may subscribe to besides its desired state.
func AgentInboxPrefix(cluster string) string { return "_INBOX_" + keys.Encode(cluster) }

// AgentPermissions allows an agent to publish its own reports and applied statuses and to read
// its own cluster's desired state, nothing else.
func AgentPermissions(cluster string) Permissions {
	enc := keys.Encode(cluster)
	pub := []string{
		subjects.AgentPrefixFor(cluster) + ".>",
		// Its heartbeats, on core NATS (never stored).
		subjects.AgentLiveHeartbeat(cluster),
		"$JS.API.INFO",
		"$JS.FC.>",
		"$JS.API.STREAM.INFO.KV_" + subjects.AppliedBucket,
		// Secrets referenced by import policies, on core NATS (never persisted).
		subjects.AgentSecretPrefix + "." + enc + ".>",
		// What to report for import policies: its own key of the import-watch bucket.
		"$JS.API.STREAM.INFO.KV_" + subjects.ImportWatchBucket,
		"$JS.API.CONSUMER.CREATE.KV_" + subjects.ImportWatchBucket + ".*.$KV." + subjects.ImportWatchBucket + "." + enc,
		"$JS.API.CONSUMER.DELETE.KV_" + subjects.ImportWatchBucket + ".*",
		"$JS.API.CONSUMER.INFO.KV_" + subjects.ImportWatchBucket + ".*",
		// Its replay (pkg/kvfeed): a direct get of that one key, the subject naming it, so
		// that no other cluster's key can be asked for. (The batched form, multi_last, carries
		// its subjects in the request body, where permissions cannot see them: never granted.)
		"$JS.API.DIRECT.GET.KV_" + subjects.ImportWatchBucket + ".$KV." + subjects.ImportWatchBucket + "." + subjects.ImportWatchKey(cluster),
	}
	for _, b := range subjects.DesiredBuckets() {
		stream := "KV_" + b
		pub = append(pub,
			// An ordered consumer on the bucket filtered to this cluster's keys.
			"$JS.API.CONSUMER.CREATE."+stream+".*.$KV."+b+"."+enc+".>",
			"$JS.API.CONSUMER.DELETE."+stream+".*",
			"$JS.API.CONSUMER.INFO."+stream+".*",
			"$JS.API.STREAM.INFO."+stream,
			"$JS.ACK."+stream+".>",
			// Its statuses for this bucket's keys: written, and read back (direct get of the
			// last value) so that an unchanged status is not written again after a restart.
			"$KV."+subjects.AppliedBucket+"."+keys.Encode(b)+"."+enc+".>",
			"$JS.API.DIRECT.GET.KV_"+subjects.AppliedBucket+".$KV."+subjects.AppliedBucket+"."+keys.Encode(b)+"."+enc+".>",
		)
	}
	sub := []string{
		AgentInboxPrefix(cluster) + ".>",
		// Changes of its own keys, republished by the buckets it watches (pkg/kvfeed).
		subjects.FeedSubject(subjects.ImportWatchBucket, subjects.ImportWatchKey(cluster)),
	}
	for _, b := range subjects.DesiredBuckets() {
		sub = append(sub, subjects.FeedSubject(b, enc+".>"))
	}
	return Permissions{Publish: pub, Subscribe: sub}
}

// SubscriberStreams are the event streams a downstream subscriber may be given. Agent reports
// (FLEET_AGENT) and buckets (KV_*) are never among them: they hold desired state, statuses and
// credentials.
func SubscriberStreams() []string {
	return []string{subjects.ClusterStream, subjects.NamespaceStream, subjects.RBACStream, subjects.EndpointStream, subjects.PlacementStream}
}

// SubscriberInboxPrefix is the reply-subject prefix subscriber name must use
// (nats.CustomInboxPrefix). "sub_" keeps it apart from agents' and services' prefixes.
func SubscriberInboxPrefix(name string) string { return "_INBOX_sub_" + keys.Encode(name) }

// SubscriberConsumer is the name of the one durable consumer subscriber name may create, use and
// delete on stream. NATS permissions match whole subject tokens, so "any consumer whose name
// starts with <name>-" cannot be granted; one fixed name per stream can.
func SubscriberConsumer(name, stream string) string {
	return name + "-" + strings.ToLower(strings.TrimPrefix(stream, "FLEET_"))
}

// SubscriberPermissions allows subscriber name to read the given event streams through its own
// durable consumers (SubscriberConsumer), and nothing else: no publishing to any stream, no
// buckets, no other consumer. Streams outside SubscriberStreams are ignored.
func SubscriberPermissions(name string, streams []string) Permissions {
	pub := []string{"$JS.API.INFO"}
	for _, s := range streams {
		if !slices.Contains(SubscriberStreams(), s) {
			continue
		}
		c := SubscriberConsumer(name, s)
		pub = append(pub,
			"$JS.API.STREAM.INFO."+s,
			// Created with one filter subject in the API subject, or with none or several.
			"$JS.API.CONSUMER.CREATE."+s+"."+c,
			"$JS.API.CONSUMER.CREATE."+s+"."+c+".>",
			"$JS.API.CONSUMER.DURABLE.CREATE."+s+"."+c,
			"$JS.API.CONSUMER.INFO."+s+"."+c,
			"$JS.API.CONSUMER.DELETE."+s+"."+c,
			"$JS.API.CONSUMER.MSG.NEXT."+s+"."+c,
			// Acks are $JS.ACK.<stream>.<consumer>.…: only its own consumer's messages.
			"$JS.ACK."+s+"."+c+".>",
			"$JS.FC."+s+"."+c+".>",
		)
	}
	return Permissions{Publish: pub, Subscribe: []string{SubscriberInboxPrefix(name) + ".>"}}
}
