package fleetd_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
	ocmv1beta1 "open-cluster-management.io/api/cluster/v1beta1"
	"sigs.k8s.io/yaml"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-agent/agent"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
	inventoryv1alpha1 "github.com/fleetstream/fleetstream/services/kube-bridge/inventory/v1alpha1"
	"github.com/fleetstream/fleetstream/services/kube-bridge/kubebridge"
)

const bridgeNamespace = "fleet-inventory"

// startBridgedFleetd starts fleetd with the kube bridge publishing to a fresh hub apiserver.
func startBridgedFleetd(t *testing.T) (*fleetd.Instance, clusterv1connect.ClusterServiceClient, *testkit.Kube, dynamic.Interface) {
	t.Helper()
	hub := testkit.StartKube(t)
	kubeconfig := leastPrivilegeKubeconfig(t, hub)
	inst, client := startFleetd(t, func(cfg *fleetd.Config) {
		cfg.KubeBridge = kubebridge.Config{Kubeconfig: kubeconfig, Namespace: bridgeNamespace, Resync: time.Minute}
	})
	select {
	case <-inst.KubeBridge.Ready():
	case <-time.After(60 * time.Second):
		t.Fatal("kube bridge not ready")
	}
	dyn, err := dynamic.NewForConfig(hub.Config)
	if err != nil {
		t.Fatal(err)
	}
	return inst, client, hub, dyn
}

// leastPrivilegeKubeconfig binds the ClusterRole the hub chart gives the bridge
// (deploy/helm/fleetstream/files/kube-bridge-clusterrole-rules.yaml, which docs/kubernetes.md
// shows: the two must agree) to a user of its own on hub and returns a kubeconfig acting as that
// user: the bridge runs with what the chart grants and the documentation says, and no more.
func leastPrivilegeKubeconfig(t *testing.T, hub *testkit.Kube) string {
	t.Helper()
	root := filepath.Join("..", "..", "..")
	data, err := os.ReadFile(filepath.Join(root, "deploy", "helm", "fleetstream", "files", "kube-bridge-clusterrole-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	role := rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "fleetstream-kube-bridge"}}
	if err := yaml.UnmarshalStrict(data, &role.Rules); err != nil || len(role.Rules) == 0 {
		t.Fatalf("the chart's kube-bridge rules: %v (%d rules)", err, len(role.Rules))
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "kubernetes.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "```yaml\n")
	block, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("docs/kubernetes.md has no yaml block with the bridge's ClusterRole")
	}
	var documented rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict([]byte(block), &documented); err != nil || documented.Kind != "ClusterRole" {
		t.Fatalf("docs/kubernetes.md's ClusterRole: %v (%s)", err, documented.Kind)
	}
	if !reflect.DeepEqual(documented.Rules, role.Rules) {
		t.Fatalf("docs/kubernetes.md's ClusterRole\n%v\nis not the chart's rules\n%v", documented.Rules, role.Rules)
	}
	ctx := testkit.Context(t, 30*time.Second)
	if _, err := hub.Client.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const user = "fleetstream-kube-bridge"
	if _, err := hub.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.Load(hub.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range cfg.AuthInfos {
		ai.Impersonate = user
	}
	path := filepath.Join(t.TempDir(), "bridge.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func getProfile(ctx context.Context, dyn dynamic.Interface, name string) (*inventoryv1alpha1.ClusterProfile, *unstructured.Unstructured, error) {
	u, err := dyn.Resource(inventoryv1alpha1.GroupVersionResource).Namespace(bridgeNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, nil, err
	}
	var p inventoryv1alpha1.ClusterProfile
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &p); err != nil {
		return nil, nil, err
	}
	return &p, u, nil
}

func profileCondition(p *inventoryv1alpha1.ClusterProfile, typ string) *metav1.Condition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == typ {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

func property(p *inventoryv1alpha1.ClusterProfile, name string) (string, bool) {
	for _, pr := range p.Status.Properties {
		if pr.Name == name {
			return pr.Value, true
		}
	}
	return "", false
}

// wantConditions checks ControlPlaneHealthy and Joined (status/reason each) and that they
// observe the profile's generation.
func wantConditions(p *inventoryv1alpha1.ClusterProfile, healthy, healthyReason, joined, joinedReason string) error {
	for _, w := range []struct{ typ, status, reason string }{
		{inventoryv1alpha1.ClusterConditionControlPlaneHealthy, healthy, healthyReason},
		{kubebridge.ConditionJoined, joined, joinedReason},
	} {
		c := profileCondition(p, w.typ)
		switch {
		case c == nil:
			return fmt.Errorf("no %s condition: %+v", w.typ, p.Status.Conditions)
		case string(c.Status) != w.status || c.Reason != w.reason:
			return fmt.Errorf("%s = %s (%s), want %s (%s)", w.typ, c.Status, c.Reason, w.status, w.reason)
		case c.ObservedGeneration != p.Generation:
			return fmt.Errorf("%s observes generation %d of %d", w.typ, c.ObservedGeneration, p.Generation)
		case c.LastTransitionTime.IsZero():
			return fmt.Errorf("%s has no lastTransitionTime", w.typ)
		}
	}
	return nil
}

// The ClusterProfile follows its cluster through its life: registered (never connected),
// connected (properties and version from the agent), lost, deregistered. What a hostile
// registration puts in a label or claim stays data; a profile edited or deleted by hand is put
// back; another cluster manager's profile of the same name is never taken over.
func TestKubeBridgePublishesClusterProfiles(t *testing.T) {
	inst, client, hub, dyn := startBridgedFleetd(t)
	ctx := testkit.Context(t, 3*time.Minute)
	profiles := dyn.Resource(inventoryv1alpha1.GroupVersionResource).Namespace(bridgeNamespace)

	// Another manager's profile of a name the fleet will register.
	other := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile",
		"metadata": map[string]any{"name": "east", "namespace": bridgeNamespace,
			"labels": map[string]any{inventoryv1alpha1.LabelClusterManagerKey: "open-cluster-management"}},
		"spec": map[string]any{"displayName": "east", "clusterManager": map[string]any{"name": "open-cluster-management"}},
	}}
	if _, err := profiles.Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	hostile := "a\"b'c\n$(rm -rf /)`id`<script>alert(1)</script>; DROP TABLE--ü\u202e"
	reg, err := client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "west",
		Labels: map[string]string{"env": "prod", "tier.example.com/x_y-z.1": "a-b_c.d",
			// A cluster label claiming the profile for another manager: not copied.
			inventoryv1alpha1.LabelClusterManagerKey: "evil", kubebridge.LabelManagedBy: "someone"},
		Claims: map[string]string{"region": "eu-west-1", "note.example.com/free": hostile}}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "east"})); err != nil {
		t.Fatal(err)
	}

	// Registered, never connected.
	testkit.Eventually(t, 30*time.Second, func() error {
		p, _, err := getProfile(ctx, dyn, "west")
		if err != nil {
			return err
		}
		if p.Spec.ClusterManager.Name != "fleetstream" || p.Spec.DisplayName != "west" {
			return fmt.Errorf("spec %+v", p.Spec)
		}
		if p.Labels[inventoryv1alpha1.LabelClusterManagerKey] != "fleetstream" || p.Labels[kubebridge.LabelManagedBy] != kubebridge.FieldManager ||
			p.Labels["env"] != "prod" || p.Labels["tier.example.com/x_y-z.1"] != "a-b_c.d" {
			return fmt.Errorf("labels %v", p.Labels)
		}
		if v, _ := property(p, "note.example.com/free"); v != hostile {
			return fmt.Errorf("hostile claim came out as %q", v)
		}
		if v, _ := property(p, "region"); v != "eu-west-1" {
			return fmt.Errorf("properties %+v", p.Status.Properties)
		}
		return wantConditions(p, "Unknown", "AgentNeverConnected", "False", "AgentNeverConnected")
	})

	// The cluster's agent connects (against the hub apiserver as its cluster), with a Ready
	// node: version, reported claims and resources arrive as properties.
	node, err := hub.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status = corev1.NodeStatus{
		Capacity:    corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("16Gi")},
		Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3500m"), corev1.ResourceMemory: resource.MustParse("15Gi")},
		Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"}},
	}
	if _, err := hub.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	ag := startAgent(t, ctx, inst, "west", reg.Msg.AgentToken, func(js jetstream.JetStream) (agentRunner, error) {
		return agent.New(agent.Config{ClusterName: "west", HeartbeatInterval: 500 * time.Millisecond, InventoryDebounce: 100 * time.Millisecond}, js, hub.Client, testkit.Logger(t))
	})
	var connectedAt metav1.Time
	testkit.Eventually(t, 60*time.Second, func() error {
		p, _, err := getProfile(ctx, dyn, "west")
		if err != nil {
			return err
		}
		if !strings.HasPrefix(p.Status.Version.Kubernetes, "v1.34") {
			return fmt.Errorf("version %q", p.Status.Version.Kubernetes)
		}
		for name, want := range map[string]string{
			"nodes.fleetstream.io":               "1",
			kubebridge.PropertyCPUAllocatable:    "3500m",
			kubebridge.PropertyCPUCapacity:       "4",
			kubebridge.PropertyMemoryAllocatable: "15Gi",
			kubebridge.PropertyMemoryCapacity:    "16Gi",
			"kubeversion.fleetstream.io":         p.Status.Version.Kubernetes,
			"region":                             "eu-west-1",
		} {
			if got, _ := property(p, name); got != want {
				return fmt.Errorf("property %s = %q, want %q (%+v)", name, got, want, p.Status.Properties)
			}
		}
		if err := wantConditions(p, "True", "HeartbeatReceived", "True", "AgentConnected"); err != nil {
			return err
		}
		connectedAt = profileCondition(p, kubebridge.ConditionJoined).LastTransitionTime
		return nil
	})

	// Drift: a label changed by hand comes back, a profile deleted by hand is published again.
	if _, err := profiles.Patch(ctx, "west", "application/merge-patch+json",
		[]byte(`{"metadata":{"labels":{"env":"dev","x-k8s.io/cluster-manager":"mallory"}}}`), metav1.PatchOptions{FieldManager: "mallory"}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, func() error {
		p, _, err := getProfile(ctx, dyn, "west")
		if err != nil {
			return err
		}
		if p.Labels["env"] != "prod" || p.Labels[inventoryv1alpha1.LabelClusterManagerKey] != "fleetstream" {
			return fmt.Errorf("labels %v", p.Labels)
		}
		return nil
	})
	if err := profiles.Delete(ctx, "west", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, func() error {
		p, _, err := getProfile(ctx, dyn, "west")
		if err != nil {
			return err
		}
		return wantConditions(p, "True", "HeartbeatReceived", "True", "AgentConnected")
	})

	// The agent goes away: the cluster is lost, its control plane's health unknown; it stays
	// joined, and Joined keeps its transition time.
	_ = ag.Stop()
	testkit.Eventually(t, 30*time.Second, func() error {
		p, _, err := getProfile(ctx, dyn, "west")
		if err != nil {
			return err
		}
		if err := wantConditions(p, "Unknown", "HeartbeatTimeout", "True", "AgentConnected"); err != nil {
			return err
		}
		if j := profileCondition(p, kubebridge.ConditionJoined); !j.LastTransitionTime.Equal(&connectedAt) {
			return fmt.Errorf("Joined moved from %v to %v while it stayed True", connectedAt, j.LastTransitionTime)
		}
		return nil
	})

	// Settled, a resync of every key writes nothing: each object is compared with what is
	// stored before anything is applied.
	assertIdleResync(t, ctx, inst)

	// East's name belongs to another manager: left as it was.
	p, u, err := getProfile(ctx, dyn, "east")
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.ClusterManager.Name != "open-cluster-management" || p.Labels[inventoryv1alpha1.LabelClusterManagerKey] != "open-cluster-management" ||
		len(p.Status.Conditions) != 0 {
		t.Fatalf("another manager's profile was taken over: %v", u.Object)
	}
	for _, mf := range u.GetManagedFields() {
		if mf.Manager == kubebridge.FieldManager {
			t.Fatalf("the bridge wrote another manager's profile: %+v", mf)
		}
	}
	// Both refusals are counted.
	metrics := scrape(t, inst)
	for _, series := range []string{`fleetstream_kube_bridge_foreign_objects_total{kind="ClusterProfile"}`,
		`fleetstream_kube_bridge_left_out_total{kind="ClusterProfile"}`} {
		if !strings.Contains(metrics, series+" ") || strings.Contains(metrics, series+" 0\n") {
			t.Errorf("/metrics has no count for %s", series)
		}
	}

	// Deregistered: west's profile goes; east's (not the bridge's) stays.
	for _, name := range []string{"west", "east"} {
		if _, err := client.DeregisterCluster(ctx, connect.NewRequest(&clusterv1.DeregisterClusterRequest{Name: name})); err != nil {
			t.Fatal(err)
		}
	}
	testkit.Eventually(t, 30*time.Second, func() error {
		if _, _, err := getProfile(ctx, dyn, "west"); err == nil {
			return errors.New("west's profile is still there")
		}
		return nil
	})
	if err := inst.KubeBridge.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := getProfile(ctx, dyn, "east"); err != nil {
		t.Fatalf("another manager's profile: %v", err)
	}
}

// assertIdleResync checks that reconciling every key of a settled bridge applies nothing.
func assertIdleResync(t *testing.T, ctx context.Context, inst *fleetd.Instance) {
	t.Helper()
	if err := inst.KubeBridge.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	before := inst.KubeBridge.Applies()
	for range 2 {
		if err := inst.KubeBridge.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := inst.KubeBridge.Applies() - before; n != 0 {
		t.Fatalf("a resync of a settled bridge made %d applies, want none", n)
	}
}

// scrape returns fleetd's /metrics.
func scrape(t *testing.T, inst *fleetd.Instance) string {
	t.Helper()
	res, err := http.Get("http://" + inst.Addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// callAPI makes a Connect JSON call to fleetd as the test's admin and fails on an error.
func callAPI(t *testing.T, inst *fleetd.Instance, proc, body string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+inst.Addr+proc, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+apiToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", proc, err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: HTTP %d %s", proc, body, res.StatusCode, data)
	}
}

// placementDecisionsOf lists the PlacementDecisions of a placement, in every namespace, by OCM's
// label, as name → namespace/decided clusters/group index/group name.
func placementDecisionsOf(ctx context.Context, dyn dynamic.Interface, placement string) (map[string]string, error) {
	list, err := dyn.Resource(kubebridge.PlacementDecisionGVR).List(ctx, metav1.ListOptions{LabelSelector: ocmv1beta1.PlacementLabel + "=" + placement})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, u := range list.Items {
		var pd ocmv1beta1.PlacementDecision
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &pd); err != nil {
			return nil, err
		}
		var clusters []string
		for _, d := range pd.Status.Decisions {
			clusters = append(clusters, d.ClusterName)
		}
		slices.Sort(clusters)
		out[pd.Name] = fmt.Sprintf("%s %v group %s %q", pd.Namespace, clusters,
			pd.Labels[ocmv1beta1.DecisionGroupIndexLabel], pd.Labels[ocmv1beta1.DecisionGroupNameLabel])
	}
	return out, nil
}

func wantDecisions(ctx context.Context, dyn dynamic.Interface, placement string, want map[string]string) func() error {
	return func() error {
		got, err := placementDecisionsOf(ctx, dyn, placement)
		if err != nil {
			return err
		}
		if !maps.Equal(got, want) {
			return fmt.Errorf("PlacementDecisions of %s: %v, want %v", placement, got, want)
		}
		return nil
	}
}

// Each page of a placement's decision is an OCM PlacementDecision in the hub namespace mapped to
// its project, named and labelled as OCM's scheduler does; they follow the decision, move with
// the mapping and go with the placement. A project mapped nowhere publishes nothing, and an
// object of that name someone else wrote is not taken over.
func TestKubeBridgePublishesPlacementDecisions(t *testing.T) {
	inst, client, hub, dyn := startBridgedFleetd(t)
	ctx := testkit.Context(t, 3*time.Minute)
	for _, c := range []struct{ name, ring string }{{"c1", "canary"}, {"c2", "main"}, {"c3", "main"}} {
		if _, err := client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: c.name,
			Labels: map[string]string{"ring": c.ring}})); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"team-a", "team-b"} {
		callAPI(t, inst, "/fleetstream.project.v1.ProjectService/CreateProject", `{"name":"`+p+`"}`)
		callAPI(t, inst, "/fleetstream.placement.v1.ClusterSetService/BindClusterSet", `{"project":"`+p+`","clusterSet":"global"}`)
	}
	mapNamespace := func(name, project string) {
		t.Helper()
		ns, err := hub.Client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			ns, err = hub.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
		}
		if ns.Labels == nil {
			ns.Labels = map[string]string{}
		}
		if project == "" {
			delete(ns.Labels, kubebridge.LabelProject)
		} else {
			ns.Labels[kubebridge.LabelProject] = project
		}
		if _, err := hub.Client.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mapNamespace("team-a-hub", "team-a")
	// Someone else's PlacementDecision of the name a placement of team-a will have.
	theirs := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "PlacementDecision",
		"metadata": map[string]any{"name": "api-decision-1", "namespace": "team-a-hub",
			"labels": map[string]any{ocmv1beta1.PlacementLabel: "ocm-api"}},
	}}
	if _, err := dyn.Resource(kubebridge.PlacementDecisionGVR).Namespace("team-a-hub").Create(ctx, theirs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Clusters that never connected are tainted unreachable: the placements tolerate it.
	const tolerate = `"tolerations":[{"key":"fleetstream.io/unreachable","operator":"Exists"}]`
	callAPI(t, inst, "/fleetstream.placement.v1.PlacementService/CreatePlacement", `{"placement":{"project":"team-a","name":"web",`+tolerate+
		`,"decisionStrategy":{"groups":[{"groupName":"canary","groupClusterSelector":{"labelSelector":{"matchLabels":{"ring":"canary"}}}}]}}}`)
	testkit.Eventually(t, 30*time.Second, wantDecisions(ctx, dyn, "web", map[string]string{
		"web-decision-1": `team-a-hub [c1] group 0 "canary"`,
		"web-decision-2": `team-a-hub [c2 c3] group 1 ""`,
	}))
	pd, err := dyn.Resource(kubebridge.PlacementDecisionGVR).Namespace("team-a-hub").Get(ctx, "web-decision-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l := pd.GetLabels(); l[kubebridge.LabelProject] != "team-a" || l[kubebridge.LabelManagedBy] != kubebridge.FieldManager {
		t.Fatalf("labels %v", l)
	}

	// The decision shrinks: the page that went is deleted.
	callAPI(t, inst, "/fleetstream.placement.v1.PlacementService/UpdatePlacement", `{"placement":{"project":"team-a","name":"web",`+tolerate+
		`,"numberOfClusters":1}}`)
	testkit.Eventually(t, 30*time.Second, wantDecisions(ctx, dyn, "web", map[string]string{
		"web-decision-1": `team-a-hub [c1] group 0 ""`,
	}))

	// The project is mapped to another namespace: the decisions move.
	mapNamespace("team-a-hub", "")
	mapNamespace("team-a-new", "team-a")
	testkit.Eventually(t, 30*time.Second, wantDecisions(ctx, dyn, "web", map[string]string{
		"web-decision-1": `team-a-new [c1] group 0 ""`,
	}))

	// Two namespaces claim the project: the bridge cannot tell which is meant and publishes in
	// neither (a platform admin must label one).
	mapNamespace("team-a-hub", "team-a")
	testkit.Eventually(t, 30*time.Second, wantDecisions(ctx, dyn, "web", map[string]string{}))
	mapNamespace("team-a-hub", "")
	testkit.Eventually(t, 30*time.Second, wantDecisions(ctx, dyn, "web", map[string]string{
		"web-decision-1": `team-a-new [c1] group 0 ""`,
	}))

	// A placement whose first decision's name another writer holds in the namespace: that object
	// is left as it was.
	mapNamespace("team-a-hub", "team-a")
	mapNamespace("team-a-new", "")
	callAPI(t, inst, "/fleetstream.placement.v1.PlacementService/CreatePlacement", `{"placement":{"project":"team-a","name":"api",`+tolerate+`}}`)
	// team-b is mapped nowhere: its placement's decision is published nowhere.
	callAPI(t, inst, "/fleetstream.placement.v1.PlacementService/CreatePlacement", `{"placement":{"project":"team-b","name":"batch",`+tolerate+`}}`)
	testkit.Eventually(t, 30*time.Second, wantDecisions(ctx, dyn, "web", map[string]string{
		"web-decision-1": `team-a-hub [c1] group 0 ""`,
	}))
	if err := inst.KubeBridge.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := dyn.Resource(kubebridge.PlacementDecisionGVR).Namespace("team-a-hub").Get(ctx, "api-decision-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetLabels()[ocmv1beta1.PlacementLabel] != "ocm-api" || got.GetLabels()[kubebridge.LabelManagedBy] != "" {
		t.Fatalf("another writer's PlacementDecision was taken over: %v", got.Object)
	}
	if err := wantDecisions(ctx, dyn, "batch", map[string]string{})(); err != nil {
		t.Fatal(err)
	}

	assertIdleResync(t, ctx, inst)

	// The placement goes: so do its PlacementDecisions.
	callAPI(t, inst, "/fleetstream.placement.v1.PlacementService/DeletePlacement", `{"project":"team-a","name":"web"}`)
	testkit.Eventually(t, 30*time.Second, wantDecisions(ctx, dyn, "web", map[string]string{}))
}

// hubLink is a TCP relay to the hub's apiserver that the test can cut: while down it refuses
// new connections and has closed the open ones, as a hub gone from the network.
type hubLink struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	up     bool
	conns  map[net.Conn]struct{}
}

func startHubLink(t *testing.T, target string) *hubLink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &hubLink{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	t.Cleanup(func() { _ = ln.Close(); l.set(false) })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go l.relay(c)
		}
	}()
	return l
}

func (l *hubLink) relay(c net.Conn) {
	l.mu.Lock()
	if !l.up {
		l.mu.Unlock()
		_ = c.Close()
		return
	}
	u, err := net.Dial("tcp", l.target)
	if err != nil {
		l.mu.Unlock()
		_ = c.Close()
		return
	}
	l.conns[c], l.conns[u] = struct{}{}, struct{}{}
	l.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(u, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, u); done <- struct{}{} }()
	<-done
	_, _ = c.Close(), u.Close()
	l.mu.Lock()
	delete(l.conns, c)
	delete(l.conns, u)
	l.mu.Unlock()
}

func (l *hubLink) set(up bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.up = up
	if !up {
		for c := range l.conns {
			_ = c.Close()
		}
	}
}

// A hub that cannot be reached when the bridge starts, and again later for a while, delays
// the bridge, never stops it: once the hub is back it installs its CRDs and publishes, and after
// an outage during which clusters came and went, the hub converges to the fleet with nothing
// written twice.
func TestKubeBridgeConvergesAfterTheHubWasAway(t *testing.T) {
	hub := testkit.StartKube(t)
	u, err := url.Parse(hub.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	link := startHubLink(t, u.Host)
	cfg, err := clientcmd.Load(hub.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		c.Server = "https://" + link.ln.Addr().String()
	}
	kubeconfig := filepath.Join(t.TempDir(), "hub-via-link.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, kubeconfig); err != nil {
		t.Fatal(err)
	}
	inst, client := startFleetd(t, func(cfg *fleetd.Config) {
		cfg.KubeBridge = kubebridge.Config{Kubeconfig: kubeconfig, Namespace: bridgeNamespace, Resync: time.Minute}
	})
	dyn, err := dynamic.NewForConfig(hub.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testkit.Context(t, 3*time.Minute)
	register := func(name string) {
		t.Helper()
		if _, err := client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: name})); err != nil {
			t.Fatal(err)
		}
	}
	profilesAre := func(want ...string) func() error {
		return func() error {
			list, err := dyn.Resource(inventoryv1alpha1.GroupVersionResource).Namespace(bridgeNamespace).List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			var got []string
			for _, p := range list.Items {
				got = append(got, p.GetName())
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				return fmt.Errorf("ClusterProfiles %v, want %v", got, want)
			}
			return nil
		}
	}

	register("a")
	select {
	case <-inst.KubeBridge.Ready():
		t.Fatal("the bridge is ready with no hub to publish to")
	case <-time.After(3 * time.Second):
	}
	link.set(true)
	select {
	case <-inst.KubeBridge.Ready():
	case <-time.After(60 * time.Second):
		t.Fatal("kube bridge not ready once the hub is reachable")
	}
	testkit.Eventually(t, 30*time.Second, profilesAre("a"))

	// The hub goes away; the fleet changes meanwhile.
	link.set(false)
	register("b")
	register("c")
	if _, err := client.DeregisterCluster(ctx, connect.NewRequest(&clusterv1.DeregisterClusterRequest{Name: "a"})); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // the bridge's requests fail and back off
	link.set(true)
	testkit.Eventually(t, 60*time.Second, profilesAre("b", "c"))
	testkit.Eventually(t, 30*time.Second, func() error {
		for _, name := range []string{"b", "c"} {
			p, _, err := getProfile(ctx, dyn, name)
			if err != nil {
				return err
			}
			if err := wantConditions(p, "Unknown", "AgentNeverConnected", "False", "AgentNeverConnected"); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		return nil
	})
	assertIdleResync(t, ctx, inst)
}
