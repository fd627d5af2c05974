package kubebridge

import (
	"connectrpc.com/connect"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetstream/fleetstream/pkg/daemon"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
)

var (
	created   = time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	connected = time.Date(2026, 11, 27, 10, 5, 0, 0, time.UTC)
	lost      = time.Date(2026, 11, 27, 11, 0, 0, 0, time.UTC)
	reported  = time.Date(2026, 11, 27, 10, 6, 0, 0, time.UTC)
)

func agentCondition(status clusterv1.ConditionStatus, reason string, at time.Time) []*clusterv1.Condition {
	return []*clusterv1.Condition{{Type: conditionAgentConnected, Status: status, Reason: reason, Message: "m", LastTransitionTime: timestamppb.New(at)}}
}

func TestProfileConditions(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		conds                     []*clusterv1.Condition
		old                       []metav1.Condition
		healthy, healthyReason    string
		joined, joinedReason      string
		healthySince, joinedSince time.Time
	}{
		{name: "no condition yet", healthy: "Unknown", healthyReason: "AgentNeverConnected", joined: "False", joinedReason: "AgentNeverConnected",
			healthySince: created, joinedSince: created},
		{name: "registered, never connected",
			conds:   agentCondition(clusterv1.ConditionStatus_CONDITION_STATUS_UNKNOWN, "AgentNeverConnected", created),
			healthy: "Unknown", healthyReason: "AgentNeverConnected", joined: "False", joinedReason: "AgentNeverConnected",
			healthySince: created, joinedSince: created},
		{name: "connected",
			conds:   agentCondition(clusterv1.ConditionStatus_CONDITION_STATUS_TRUE, "HeartbeatReceived", connected),
			healthy: "True", healthyReason: "HeartbeatReceived", joined: "True", joinedReason: "AgentConnected",
			healthySince: connected, joinedSince: connected},
		{name: "lost: health unknown, still joined since it connected",
			conds: agentCondition(clusterv1.ConditionStatus_CONDITION_STATUS_FALSE, "HeartbeatTimeout", lost),
			old: []metav1.Condition{{Type: "ControlPlaneHealthy", Status: "True", LastTransitionTime: metav1.NewTime(connected)},
				{Type: "Joined", Status: "True", LastTransitionTime: metav1.NewTime(connected)}},
			healthy: "Unknown", healthyReason: "HeartbeatTimeout", joined: "True", joinedReason: "AgentConnected",
			healthySince: lost, joinedSince: connected},
		{name: "a reason the hub would refuse is replaced",
			conds:   agentCondition(clusterv1.ConditionStatus_CONDITION_STATUS_TRUE, "not a reason!", connected),
			healthy: "True", healthyReason: "HeartbeatReceived", joined: "True", joinedReason: "AgentConnected",
			healthySince: connected, joinedSince: connected},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &clusterv1.Cluster{Name: "c1", CreateTime: timestamppb.New(created), Status: &clusterv1.ClusterStatus{Conditions: tc.conds}}
			got := profileConditions(c, condition(c, conditionAgentConnected), tc.old, 3, lost.Add(time.Hour))
			if len(got) != 2 {
				t.Fatalf("conditions %+v", got)
			}
			for i, w := range []struct {
				typ, status, reason string
				since               time.Time
			}{{"ControlPlaneHealthy", tc.healthy, tc.healthyReason, tc.healthySince}, {"Joined", tc.joined, tc.joinedReason, tc.joinedSince}} {
				g := got[i]
				if g.Type != w.typ || string(g.Status) != w.status || g.Reason != w.reason || g.ObservedGeneration != 3 || !g.LastTransitionTime.Time.Equal(w.since) {
					t.Errorf("%s = %s %s gen %d since %v, want %s %s gen 3 since %v", g.Type, g.Status, g.Reason, g.ObservedGeneration, g.LastTransitionTime, w.status, w.reason, w.since)
				}
			}
		})
	}
}

func TestClusterProfileProperties(t *testing.T) {
	long := strings.Repeat("x", 1025)
	longName := strings.Repeat("a", 250) + ".io/" + strings.Repeat("b", 10)
	c := &clusterv1.Cluster{
		Name: "west", CreateTime: timestamppb.New(created),
		Labels: map[string]string{"env": "prod", "x-k8s.io/cluster-manager": "other", "app.kubernetes.io/managed-by": "x", "bad key!": "v"},
		Claims: map[string]string{"region": "eu", "empty": "", "huge": long, longName: "v", "unicode": strings.Repeat("ü", 1024),
			"kubeversion.fleetstream.io": "v1.34.4", "nodes.fleetstream.io": "3"},
		Status: &clusterv1.ClusterStatus{
			KubernetesVersion: "v1.34.4",
			Conditions:        agentCondition(clusterv1.ConditionStatus_CONDITION_STATUS_TRUE, "HeartbeatReceived", connected),
			Resources: &clusterv1.ClusterResources{ReportTime: timestamppb.New(reported),
				Allocatable: map[string]string{"cpu": "3500m", "memory": "15Gi", "nvidia.com/gpu": "8"},
				Capacity:    map[string]string{"cpu": "4", "memory": "16Gi"}},
		},
	}
	p, dropped := clusterProfile(c, "ns", nil, 1, lost)
	if p.Name != "west" || p.Namespace != "ns" || p.Spec.ClusterManager.Name != "fleetstream" || p.Spec.DisplayName != "west" {
		t.Errorf("meta/spec %+v %+v", p.ObjectMeta, p.Spec)
	}
	wantLabels := map[string]string{"env": "prod", "x-k8s.io/cluster-manager": "fleetstream", "app.kubernetes.io/managed-by": "fleetstream-kube-bridge"}
	if len(p.Labels) != len(wantLabels) {
		t.Errorf("labels %v, want %v", p.Labels, wantLabels)
	}
	for k, v := range wantLabels {
		if p.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, p.Labels[k], v)
		}
	}
	type prop struct {
		value string
		at    time.Time
	}
	want := map[string]prop{
		"region": {"eu", time.Time{}}, "unicode": {strings.Repeat("ü", 1024), time.Time{}},
		"kubeversion.fleetstream.io": {"v1.34.4", connected}, "nodes.fleetstream.io": {"3", reported},
		PropertyCPUAllocatable: {"3500m", reported}, PropertyCPUCapacity: {"4", reported},
		PropertyMemoryAllocatable: {"15Gi", reported}, PropertyMemoryCapacity: {"16Gi", reported},
	}
	if len(p.Status.Properties) != len(want) {
		t.Errorf("properties %+v", p.Status.Properties)
	}
	for i, pr := range p.Status.Properties {
		if i > 0 && p.Status.Properties[i-1].Name >= pr.Name {
			t.Errorf("properties not sorted by name: %s after %s", pr.Name, p.Status.Properties[i-1].Name)
		}
		w, ok := want[pr.Name]
		if !ok || pr.Value != w.value || !pr.LastObservedTime.Time.Equal(w.at) {
			t.Errorf("property %s = %q at %v, want %+v", pr.Name, pr.Value, pr.LastObservedTime, w)
		}
	}
	if p.Status.Version.Kubernetes != "v1.34.4" {
		t.Errorf("version %q", p.Status.Version.Kubernetes)
	}
	// Each left-out item is named by its field, never by its value.
	wantDropped := []string{"labels[app.kubernetes.io/managed-by]", "labels[bad key!]", "labels[x-k8s.io/cluster-manager]",
		"claims[" + short(longName) + "]", "claims[empty]", "claims[huge]"}
	if len(dropped) != len(wantDropped) {
		t.Errorf("dropped %q, want %q", dropped, wantDropped)
	}
	for _, d := range dropped {
		if strings.Contains(d, long) {
			t.Errorf("a dropped value is in the message: %.80s", d)
		}
	}
	for _, w := range wantDropped {
		found := false
		for _, d := range dropped {
			found = found || strings.HasPrefix(d, w)
		}
		if !found {
			t.Errorf("dropped %q lacks %s", dropped, w)
		}
	}
}

func TestPlacementDecisionsAreOCMs(t *testing.T) {
	page := func(clusters ...string) *placementv1.DecisionPage {
		p := &placementv1.DecisionPage{}
		for _, c := range clusters {
			p.Clusters = append(p.Clusters, &placementv1.ClusterDecision{ClusterName: c})
		}
		return p
	}
	d := &placementv1.PlacementDecisions{Project: "team-a", Name: "web", Groups: []*placementv1.DecisionGroupDecisions{
		{DecisionGroupIndex: 0, DecisionGroupName: "canary", Pages: []*placementv1.DecisionPage{page("c1")}},
		{DecisionGroupIndex: 1, Pages: []*placementv1.DecisionPage{page("c2", "c3"), page("c4")}},
		{DecisionGroupIndex: 2, DecisionGroupName: "Not a label value!", Pages: []*placementv1.DecisionPage{page()}},
	}}
	pds, dropped := placementDecisions(d, "hub-a")
	want := []struct {
		name, index, group string
		clusters           []string
	}{
		{"web-decision-1", "0", "canary", []string{"c1"}},
		{"web-decision-2", "1", "", []string{"c2", "c3"}},
		{"web-decision-3", "1", "", []string{"c4"}},
		{"web-decision-4", "2", "", nil},
	}
	if len(pds) != len(want) {
		t.Fatalf("%d PlacementDecisions, want %d", len(pds), len(want))
	}
	for i, w := range want {
		pd := pds[i]
		l := pd.Labels
		if pd.Name != w.name || pd.Namespace != "hub-a" || l["cluster.open-cluster-management.io/placement"] != "web" ||
			l["cluster.open-cluster-management.io/decision-group-index"] != w.index || l["cluster.open-cluster-management.io/decision-group-name"] != w.group ||
			l[LabelProject] != "team-a" || l[LabelManagedBy] != FieldManager {
			t.Errorf("%d: %s/%s %v, want %+v", i, pd.Namespace, pd.Name, l, w)
		}
		if pd.Status.Decisions == nil || len(pd.Status.Decisions) != len(w.clusters) {
			t.Errorf("%s decisions %+v, want %v (an empty page is an empty list, as OCM's)", pd.Name, pd.Status.Decisions, w.clusters)
			continue
		}
		for j, c := range w.clusters {
			if pd.Status.Decisions[j].ClusterName != c {
				t.Errorf("%s decisions %+v, want %v", pd.Name, pd.Status.Decisions, w.clusters)
			}
		}
	}
	if len(dropped) != 1 || !strings.Contains(dropped[0], "groups[2].decision_group_name") {
		t.Errorf("dropped %q", dropped)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		err  string
	}{
		{name: "off", cfg: Config{}},
		{name: "on with the default namespace", cfg: Config{Kubeconfig: "/hub.kubeconfig"}},
		{name: "namespace", cfg: Config{Kubeconfig: "/hub.kubeconfig", Namespace: "fleet"}},
		{name: "bad namespace", cfg: Config{Kubeconfig: "/k", Namespace: "Fleet_NS"}, err: "--kube-bridge-namespace"},
		{name: "negative resync", cfg: Config{Resync: -time.Second}, err: "--kube-bridge-resync"},
		{name: "write side", cfg: Config{Kubeconfig: "/k", APITokenFile: "/t", ProjectsTokenFile: "/p"}},
		{name: "in cluster", cfg: Config{InCluster: true}},
		{name: "two hubs", cfg: Config{InCluster: true, Kubeconfig: "/k"}, err: "--kube-bridge-in-cluster and --kube-bridge-kubeconfig"},
		{name: "projects identity alone", cfg: Config{Kubeconfig: "/k", ProjectsTokenFile: "/p"}, err: "--kube-bridge-projects-token-file needs --kube-bridge-api-token-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("Validate = %v, want an error naming %s", err, tc.err)
			}
		})
	}
}

func TestToMapDropsNulls(t *testing.T) {
	p, _ := clusterProfile(&clusterv1.Cluster{Name: "c", Claims: map[string]string{"a": "b"}}, "ns", nil, 0, created)
	m, err := toMap(p)
	if err != nil {
		t.Fatal(err)
	}
	meta := m["metadata"].(map[string]any)
	if _, ok := meta["creationTimestamp"]; ok {
		t.Errorf("metadata %v keeps a null creationTimestamp", meta)
	}
	props := m["status"].(map[string]any)["properties"].([]any)
	if _, ok := props[0].(map[string]any)["lastObservedTime"]; ok {
		t.Errorf("property %v keeps a null lastObservedTime (an apply would remove the field)", props[0])
	}
}

// TestClassify: what the API answers decides the Ready reason, and whether the bridge retries.
func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{connect.NewError(connect.CodePermissionDenied, errors.New(`user "kube-bridge" may not create namespacebindings`)), ReasonForbidden},
		{connect.NewError(connect.CodeUnauthenticated, errors.New("bad token")), ReasonForbidden},
		{connect.NewError(connect.CodeInvalidArgument, errors.New("namespace: not a DNS label")), ReasonRefused},
		{connect.NewError(connect.CodeFailedPrecondition, errors.New("cluster c9 is not registered")), ReasonRefused},
		{connect.NewError(connect.CodeUnavailable, errors.New("no")), ReasonAPIUnavailable},
		{errors.New("dial tcp: connection refused"), ReasonAPIUnavailable},
		{&refusal{ReasonRefused, "spec: x"}, ReasonRefused},
	} {
		r := classify(tc.err)
		if r.reason != tc.want || !strings.Contains(r.message, strings.TrimPrefix(tc.err.Error(), "permission_denied: ")) {
			t.Errorf("classify(%v) = %s %q, want %s with the API's message", tc.err, r.reason, r.message, tc.want)
		}
	}
}

// TestBinaryLeaseReplicas: the binary's --replicas is the lease bucket's, should the bridge be
// the first to create it (a compose or chart hub of three NATS nodes keeps it on all three).
func TestBinaryLeaseReplicas(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "hub.kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte("apiVersion: v1\nkind: Config\nclusters: [{name: hub, cluster: {server: \"https://127.0.0.1:1\"}}]\n"+
		"contexts: [{name: hub, context: {cluster: hub}}]\ncurrent-context: hub\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := NewFromEnv(context.Background(), &daemon.Env{Options: &daemon.Options{Replicas: 3}, Log: zap.NewNop()}, Config{Kubeconfig: kubeconfig})
	if err != nil {
		t.Fatal(err)
	}
	if b.cfg.leaseReplicas != 3 {
		t.Fatalf("lease replicas %d, want the binary's --replicas 3", b.cfg.leaseReplicas)
	}
}
