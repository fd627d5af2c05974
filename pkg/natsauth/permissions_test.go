package natsauth_test

import (
	"strings"
	"testing"

	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// The table's promises, checked subject by subject with NATS' matching rules.
func TestPermissionTable(t *testing.T) {
	svc := func(name string) natsauth.Permissions {
		p, ok := natsauth.ServicePermissions(name)
		if !ok {
			t.Fatalf("no permissions for service %s", name)
		}
		return p
	}
	type check struct {
		subject string
		sub     bool
		want    bool
	}
	for _, tc := range []struct {
		who    string
		perms  natsauth.Permissions
		checks []check
	}{
		{"namespace-binding", svc(natsauth.ServiceNamespaceBinding), []check{
			{"$KV.desired-namespaces.c1.Namespace.=.a", false, true},
			{"$KV.desired-rbac.c1.ClusterRole.=.a", false, false},
			{"$JS.API.STREAM.INFO.KV_cluster-credentials", false, false},
			{"$JS.API.DIRECT.GET.KV_clusters.$KV.clusters.c1", false, true},
			{"$KV.clusters.c1", false, false},
			{"fleet.ns.project.p1", false, true},
			{"fleet.rbac.template.t", false, false},
			{"$JS.API.STREAM.DELETE.FLEET_CLUSTER", false, false},
			{"_INBOX_svc_namespace-binding.abc", true, true},
			{"_INBOX_svc_cluster-import.abc", true, false},
			{"_INBOX.abc", true, false},
		}},
		{"rbac-sync", svc(natsauth.ServiceRBACSync), []check{
			{"$KV.desired-rbac.c1.ClusterRole.=.a", false, true},
			{"$KV.desired-namespaces.c1.Namespace.=.a", false, false},
			{"$JS.API.CONSUMER.CREATE.KV_ns-bindings.x.$KV.ns-bindings.>", false, true},
			{"$KV.ns-bindings.c1.a", false, false},
			{"$JS.API.STREAM.MSG.GET.KV_agent-tokens", false, false},
		}},
		{"endpoint-collector", svc(natsauth.ServiceEndpointCollector), []check{
			{"$JS.API.CONSUMER.MSG.NEXT.FLEET_AGENT.endpoint-collector", false, true},
			{"fleet.agent.c1.heartbeat", false, false},
			{"fleet.live.*.heartbeat", true, true},
			{"fleet.live.c1.heartbeat", false, false},
			{"$JS.API.DIRECT.GET.KV_cluster-status.$KV.cluster-status.c1", false, true},
			{"$KV.cluster-status.c1", false, false},
			{"$KV.endpoints.ns.svc", false, true},
			{"$KV.agent-limits.c1.endpoint-collector", false, true},
			{"$KV.agent-limits.c1.cluster-import-heartbeat", false, false},
			{"$KV.agent-limits.c1.endpoint-collector-mcs", false, true},
			{"$JS.API.DIRECT.GET.KV_cluster-credentials", false, false},
			// Multi-cluster Services: it writes every cluster's ServiceImports and slices, and
			// no other desired bucket.
			{"$KV.desired-mcs.c1.ServiceImport.multicluster=2Ex-k8s=2Eio.ns.svc", false, true},
			{"$KV.desired-rbac.c1.ClusterRole.=.a", false, false},
			{"$KV.desired-namespaces.c1.Namespace.=.a", false, false},
		}},
		{"hosted-agent", svc(natsauth.ServiceHostedAgent), []check{
			// Finds the clusters to host and asks for their credentials...
			{"$JS.API.CONSUMER.CREATE.KV_clusters.x.$KV.clusters.>", false, true},
			{"$JS.API.CONSUMER.CREATE.KV_cluster-status.x.$KV.cluster-status.>", false, true},
			{"fleet.hosted.credentials.c1", false, true},
			{"$KV.fleet-leases.cluster-agent.hosted", false, true},
			{"_INBOX_svc_hosted-agent.abc", true, true},
			// ...never reads them from the store, writes the registry or acts as an agent.
			{"$JS.API.DIRECT.GET.KV_cluster-credentials.$KV.cluster-credentials.id", false, false},
			{"fleet.hosted.credentials.c1", true, false},
			{"$KV.clusters.c1", false, false},
			{"fleet.agent.c1.heartbeat", false, false},
			{"$KV.desired-rbac.c1.ClusterRole.=.a", false, false},
		}},
		{"kube-bridge", svc(natsauth.ServiceKubeBridge), []check{
			// Mirrors the registry and the decisions...
			{"$JS.API.CONSUMER.CREATE.KV_clusters.x.$KV.clusters.>", false, true},
			{"$JS.API.CONSUMER.CREATE.KV_placement-decisions.x.$KV.placement-decisions.>", false, true},
			{"_INBOX_svc_kube-bridge.abc", true, true},
			// ...holds its own lease (one writer per hub)...
			{"$KV.fleet-leases.kube-bridge.0c5e7a2b-uid", true, false},
			// ...and writes nothing else of Fleetstream's: no view, stream, other lease or dead letter.
			{"$KV.fleet-leases.view.clusters", false, false},
			{"$KV.fleet-leases.endpoint-collector.mcs", false, false},
			{"$KV.clusters.c1", false, false},
			{"$KV.placement-decisions.p.x", false, false},
			{"$JS.API.STREAM.CREATE.KV_clusters", false, false},
			{"$JS.API.STREAM.PURGE.KV_placement-decisions", false, false},
			{"$KV.fleet-leases.kube-bridge", false, false},
			{"fleet.cluster.c1", false, false},
			{"fleet.placement.decision.p.x", false, false},
			{"fleet.dlq.FLEET_CLUSTER.x", false, false},
			{"$JS.API.DIRECT.GET.KV_cluster-credentials.$KV.cluster-credentials.id", false, false},
			{"$JS.API.CONSUMER.CREATE.KV_ns-projects.x.$KV.ns-projects.>", false, false},
			// It serves no API, so nothing an API authorizer reads, and no denied-call rows.
			{"$JS.API.CONSUMER.CREATE.KV_rbac-templates.x.$KV.rbac-templates.>", false, false},
			{"$JS.API.CONSUMER.CREATE.KV_rbac-bindings.x.$KV.rbac-bindings.>", false, false},
			{"$JS.API.CONSUMER.CREATE.KV_ns-bindings.x.$KV.ns-bindings.>", false, false},
			{"fleet.audit.denied.x", false, false},
		}},
		{"cluster-import", svc(natsauth.ServiceClusterImport), []check{
			{"fleet.hosted.credentials.c1", true, true},
			// It answers the hosted agent's credential requests, and no other client's inbox.
			{"_INBOX_svc_hosted-agent.abc", false, true},
			{"_INBOX_svc_namespace-binding.abc", false, false},
			{"_INBOX_c1.abc", false, false},
			{"$JS.API.DIRECT.GET.KV_cluster-credentials.$KV.cluster-credentials.id", false, true},
			{"$KV.desired-rbac.c1.ClusterRole.=.a", false, false},
			{"$KV.ns-projects.p1", false, false},
			{"$KV.import-watch.c1", false, true},
			{"$KV.agent-limits.c1.cluster-import-heartbeat", false, true},
			{"$JS.API.STREAM.PURGE.FLEET_AGENT", false, true},
			{"fleet.agentsecret.c1.ns.s", true, true},
			{"fleet.agentsecret.c1.ns.s", false, false},
			// Every agent's heartbeats, read, never forged.
			{"fleet.live.*.heartbeat", true, true},
			{"fleet.live.c1.heartbeat", false, false},
		}},
		{"agent c1", natsauth.AgentPermissions("c1"), []check{
			{"fleet.agent.c1.heartbeat", false, true},
			{"fleet.agent.c2.heartbeat", false, false},
			// Its heartbeats on core NATS: its own, not another cluster's, and never reading any.
			{"fleet.live.c1.heartbeat", false, true},
			{"fleet.live.c2.heartbeat", false, false},
			{"fleet.live.c1.inventory", false, false},
			{"fleet.live.c1.heartbeat", true, false},
			{"fleet.live.*.heartbeat", true, false},
			// Its namespace inventory, in chunks when large (pkg/nsinventory).
			{"fleet.agent.c1.inventory", false, true},
			{"fleet.agent.c1.inventory.7", false, true},
			{"fleet.agent.c2.inventory.7", false, false},
			{"$JS.API.CONSUMER.CREATE.KV_desired-rbac.x.$KV.desired-rbac.c1.>", false, true},
			{"$JS.API.CONSUMER.CREATE.KV_desired-rbac.x.$KV.desired-rbac.c2.>", false, false},
			{"$JS.API.CONSUMER.CREATE.KV_desired-rbac.x", false, false},
			{"$JS.API.STREAM.INFO.KV_cluster-credentials", false, false},
			{"fleet.>", true, false},
			{"_INBOX_c1.x", true, true},
			{"_INBOX_c2.x", true, false},
			{"fleet.agent.c1.importobject.=.secrets.ns.s", false, true},
			{"fleet.agentsecret.c1.ns.s", false, true},
			{"fleet.agentsecret.c2.ns.s", false, false},
			{"fleet.agentsecret.c1.ns.s", true, false},
			{"$JS.API.CONSUMER.CREATE.KV_import-watch.x.$KV.import-watch.c1", false, true},
			{"$JS.API.CONSUMER.CREATE.KV_import-watch.x.$KV.import-watch.c2", false, false},
			{"$JS.API.CONSUMER.CREATE.KV_import-watch.x", false, false},
			{"$JS.API.DIRECT.GET.KV_import-watch.$KV.import-watch.c2", false, false},
			// Its own import-watch key by name (its replay, pkg/kvfeed), never the batched form.
			{"$JS.API.DIRECT.GET.KV_import-watch.$KV.import-watch.c1", false, true},
			{"$JS.API.DIRECT.GET.KV_import-watch.$KV.import-watch.*", false, false},
			{"$JS.API.DIRECT.GET.KV_import-watch", false, false},
			{"$JS.API.DIRECT.GET.KV_desired-rbac", false, false},
			{"$JS.API.DIRECT.GET.KV_desired-rbac.$KV.desired-rbac.c1.>", false, false},
			{"$KV.import-watch.c1", false, false},
			// Its own keys' changes on the feed, not another cluster's, and never publishing there.
			{"fleet.feed.desired-rbac.c1.ClusterRole.=.a", true, true},
			{"fleet.feed.desired-namespaces.c1.>", true, true},
			{"fleet.feed.import-watch.c1", true, true},
			{"fleet.feed.desired-rbac.c2.ClusterRole.=.a", true, false},
			{"fleet.feed.desired-rbac.>", true, false},
			{"fleet.feed.import-watch.c2", true, false},
			{"fleet.feed.clusters.c1", true, false},
			{"fleet.feed.desired-rbac.c1.ClusterRole.=.a", false, false},
			// Multi-cluster Services: its own ServiceExport reports, its own imports' keys only.
			{"fleet.agent.c1.serviceexports.ns", false, true},
			{"fleet.agent.c2.serviceexports.ns", false, false},
			{"fleet.feed.desired-mcs.c1.ServiceImport.multicluster=2Ex-k8s=2Eio.ns.svc", true, true},
			{"fleet.feed.desired-mcs.c2.ServiceImport.multicluster=2Ex-k8s=2Eio.ns.svc", true, false},
			{"fleet.feed.desired-mcs.>", true, false},
			{"$JS.API.CONSUMER.CREATE.KV_desired-mcs.x.$KV.desired-mcs.c1.>", false, true},
			{"$JS.API.CONSUMER.CREATE.KV_desired-mcs.x.$KV.desired-mcs.c2.>", false, false},
			{"$KV.desired-mcs.c1.ServiceImport.multicluster=2Ex-k8s=2Eio.ns.svc", false, false},
			{"$KV.applied.desired-mcs.c1.ServiceImport.multicluster=2Ex-k8s=2Eio.ns.svc", false, true},
			{"$KV.applied.desired-mcs.c2.ServiceImport.multicluster=2Ex-k8s=2Eio.ns.svc", false, false},
		}},
		{"subscriber audit", natsauth.SubscriberPermissions("audit", []string{subjects.ClusterStream, subjects.AgentStreamName, "KV_cluster-credentials"}), []check{
			{"$JS.API.CONSUMER.CREATE.FLEET_CLUSTER.audit-cluster.fleet.cluster.>", false, true},
			{"$JS.API.CONSUMER.MSG.NEXT.FLEET_CLUSTER.audit-cluster", false, true},
			{"$JS.ACK.FLEET_CLUSTER.audit-cluster.1.2.3.4.5", false, true},
			{"$JS.API.CONSUMER.CREATE.FLEET_CLUSTER.other.fleet.cluster.>", false, false},
			{"$JS.API.CONSUMER.MSG.NEXT.FLEET_CLUSTER.other", false, false},
			{"$JS.ACK.FLEET_CLUSTER.other.1.2.3.4.5", false, false},
			// Streams outside the event streams are never granted, even if asked for.
			{"$JS.API.STREAM.INFO.FLEET_AGENT", false, false},
			{"$JS.API.STREAM.INFO.KV_cluster-credentials", false, false},
			{"fleet.cluster.c1", false, false},
			{"_INBOX_sub_audit.x", true, true},
		}},
	} {
		t.Run(tc.who, func(t *testing.T) {
			for _, c := range tc.checks {
				if got := tc.perms.Allows(c.subject, c.sub); got != c.want {
					t.Errorf("allows(%s, sub=%v) = %v, want %v", c.subject, c.sub, got, c.want)
				}
			}
		})
	}
}

// Only cluster-import's permissions mention the buckets holding secrets.
func TestSecretsOnlyForClusterImport(t *testing.T) {
	secret := []string{subjects.ClusterCredentialsBucket, subjects.AgentTokensBucket, natsauth.SubscribersBucket, natsauth.SubscriberTokensBucket}
	perms := map[string]natsauth.Permissions{
		"agent":      natsauth.AgentPermissions("c1"),
		"subscriber": natsauth.SubscriberPermissions("s", natsauth.SubscriberStreams()),
	}
	for _, s := range natsauth.Services() {
		perms[s], _ = natsauth.ServicePermissions(s)
	}
	for who, p := range perms {
		for _, subj := range append(append([]string{}, p.Publish...), p.Subscribe...) {
			for _, b := range secret {
				if strings.Contains(subj, b) && who != natsauth.ServiceClusterImport {
					t.Errorf("%s may use %s", who, subj)
				}
			}
			if strings.Contains(subj, ">") && strings.HasPrefix(subj, "$JS.API.>") || subj == ">" || subj == "$KV.>" {
				t.Errorf("%s has a blanket grant %s", who, subj)
			}
		}
	}
}

// A user name turns the hosted-agent service's token into one cluster's agent, and nothing else
// into anything.
func TestResolveHostedAgent(t *testing.T) {
	hostedSvc := natsauth.Identity{Kind: natsauth.KindService, Name: natsauth.ServiceHostedAgent}
	otherSvc := natsauth.Identity{Kind: natsauth.KindService, Name: natsauth.ServiceRBACSync}
	agent := natsauth.Identity{Kind: natsauth.KindAgent, Name: "c2"}
	registered := func(c string) (string, bool) { return "id-" + c, c == "c1" || c == "c2" }
	for _, tc := range []struct {
		name   string
		id     natsauth.Identity
		user   string
		want   natsauth.Identity
		wantOK bool
	}{
		{"service without user stays the service", hostedSvc, "", hostedSvc, true},
		{"other user names mean nothing", otherSvc, "ops", otherSvc, true},
		{"hosted agent of a registered cluster", hostedSvc, natsauth.HostedAgentUser("c1"), natsauth.Identity{Kind: natsauth.KindAgent, Name: "c1", Instance: "id-c1"}, true},
		{"hosted agent of an unknown cluster", hostedSvc, natsauth.HostedAgentUser("nope"), natsauth.Identity{}, false},
		{"hosted agent without a cluster", hostedSvc, natsauth.HostedAgentUser(""), natsauth.Identity{}, false},
		{"another service cannot host", otherSvc, natsauth.HostedAgentUser("c1"), natsauth.Identity{}, false},
		{"an agent cannot become another", agent, natsauth.HostedAgentUser("c1"), natsauth.Identity{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := natsauth.ResolveHostedAgent(tc.id, tc.user, registered)
			if ok != tc.wantOK || got.Kind != tc.want.Kind || got.Name != tc.want.Name || got.Instance != tc.want.Instance {
				t.Errorf("ResolveHostedAgent(%v, %q) = %v, %v; want %v, %v", tc.id, tc.user, got, ok, tc.want, tc.wantOK)
			}
		})
	}
}
