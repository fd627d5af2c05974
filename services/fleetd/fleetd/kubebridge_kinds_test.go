package fleetd_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	corev1 "k8s.io/api/core/v1"
	k8srbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1/endpointv1connect"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1/placementv1connect"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1/rbacv1connect"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
	"github.com/fleetstream/fleetstream/services/kube-bridge/kubebridge"
)

// TestKubeBridgeWritesPlacementsRoleTemplatesAndClusterSets: the other manifest kinds (and
// ServiceWeights) as
// fleetstream.io objects. Cluster-scoped RoleTemplates and ClusterSets act with the platform
// identity; namespaced Placements and ClusterSetBindings with the bridge's own, in the project
// their hub namespace is mapped to. A hub user whose RBAC is namespace team-a alone cannot reach
// team-b through the bridge — not even with the bridge owner of team-b and admin of the cluster
// set — and every Ready condition observes the object's generation.
func TestKubeBridgeWritesPlacementsRoleTemplatesAndClusterSets(t *testing.T) {
	hub := testkit.StartKube(t)
	kubeconfig := leastPrivilegeKubeconfig(t, hub)
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	bridgeTokenFile := filepath.Join(dir, "bridge-token")
	adminTokenFile := filepath.Join(dir, "admin-token")
	for file, content := range map[string]string{
		tokens:          apiToken + ",admin\n" + bridgeAPIToken + ",kube-bridge\n",
		bridgeTokenFile: bridgeAPIToken + "\n",
		adminTokenFile:  apiToken + "\n",
	} {
		if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	inst, clusters := startFleetd(t, func(cfg *fleetd.Config) {
		cfg.Server.TokenFile = tokens
		cfg.KubeBridge = kubebridge.Config{Kubeconfig: kubeconfig, Namespace: bridgeNamespace, Resync: time.Minute,
			APITokenFile: bridgeTokenFile, ProjectsTokenFile: adminTokenFile}
	})
	select {
	case <-inst.KubeBridge.Ready():
	case <-time.After(60 * time.Second):
		t.Fatal("kube bridge not ready")
	}
	ctx := testkit.Context(t, 150*time.Second)
	dyn, err := dynamic.NewForConfig(hub.Config)
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + inst.Addr
	projects := projectv1connect.NewProjectServiceClient(http.DefaultClient, url, withToken(apiToken))
	rbac := rbacv1connect.NewRBACServiceClient(http.DefaultClient, url, withToken(apiToken))
	placements := placementv1connect.NewPlacementServiceClient(http.DefaultClient, url, withToken(apiToken))
	sets := placementv1connect.NewClusterSetServiceClient(http.DefaultClient, url, withToken(apiToken))
	if _, err := clusters.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c1", Labels: map[string]string{"env": "prod"}})); err != nil {
		t.Fatal(err)
	}
	// The platform admin's part: the projects, the mapping, and the bridge's grants — owner of
	// both projects, so that only the mapping keeps team-a's writers out of team-b.
	for _, p := range []string{"team-a", "team-b"} {
		if _, err := projects.CreateProject(ctx, connect.NewRequest(&projectv1.CreateProjectRequest{Name: p})); err != nil {
			t.Fatal(err)
		}
		if _, err := rbac.BindProjectRole(ctx, connect.NewRequest(&rbacv1.BindProjectRoleRequest{Project: p, RoleTemplate: "project-owner",
			Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: "kube-bridge"}})); err != nil {
			t.Fatal(err)
		}
		if _, err := hub.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: p,
			Labels: map[string]string{kubebridge.LabelProject: p}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// mallory may write fleetstream.io objects in hub namespace team-a, and nothing else.
	if _, err := hub.Client.RbacV1().Roles("team-a").Create(ctx, &k8srbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "fleet-writer"},
		Rules: []k8srbacv1.PolicyRule{{APIGroups: []string{"fleetstream.io"}, Resources: []string{"*"}, Verbs: []string{"*"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := hub.Client.RbacV1().RoleBindings("team-a").Create(ctx, &k8srbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "mallory"},
		RoleRef:  k8srbacv1.RoleRef{APIGroup: k8srbacv1.GroupName, Kind: "Role", Name: "fleet-writer"},
		Subjects: []k8srbacv1.Subject{{Kind: k8srbacv1.UserKind, APIGroup: k8srbacv1.GroupName, Name: "mallory"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mc := rest.CopyConfig(hub.Config)
	mc.Impersonate = rest.ImpersonationConfig{UserName: "mallory"}
	mallory, err := dynamic.NewForConfig(mc)
	if err != nil {
		t.Fatal(err)
	}
	create := func(d dynamic.Interface, u *unstructured.Unstructured, gvr schema.GroupVersionResource) error {
		_, err := d.Resource(gvr).Namespace(u.GetNamespace()).Create(ctx, u, metav1.CreateOptions{FieldValidation: "Strict"})
		return err
	}

	// Cluster-scoped: a ClusterSet and a RoleTemplate, with the platform identity.
	if err := create(dyn, object("ClusterSet", "", "prod", map[string]any{"selector": map[string]any{
		"type": "SELECTOR_TYPE_LABEL_SELECTOR", "labelSelector": map[string]any{"matchLabels": map[string]any{"env": "prod"}}}}), kubebridge.ClusterSetGVR); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ctx, dyn, kubebridge.ClusterSetGVR, "", "prod", "True", kubebridge.ReasonApplied)
	set, err := sets.GetClusterSet(ctx, connect.NewRequest(&placementv1.GetClusterSetRequest{Name: "prod"}))
	if err != nil || set.Msg.ClusterSet.GetSelector().GetLabelSelector().GetMatchLabels()["env"] != "prod" {
		t.Fatalf("cluster set prod in Fleetstream: %v, %v", set, err)
	}
	rules := func(verbs ...string) []any {
		return []any{map[string]any{"apiGroups": []any{"apps"}, "resources": []any{"deployments"}, "verbs": toAny(verbs)}}
	}
	if err := create(dyn, object("RoleTemplate", "", "deployer", map[string]any{"displayName": "Deployer", "rules": rules("get", "list")}), kubebridge.RoleTemplateGVR); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ctx, dyn, kubebridge.RoleTemplateGVR, "", "deployer", "True", kubebridge.ReasonApplied)
	wantVerbs := func(want ...string) {
		t.Helper()
		testkit.Eventually(t, 30*time.Second, func() error {
			tpl, err := rbac.GetRoleTemplate(ctx, connect.NewRequest(&rbacv1.GetRoleTemplateRequest{Name: "deployer"}))
			if err != nil {
				return err
			}
			if r := tpl.Msg.Template.GetRules(); len(r) != 1 || !slices.Equal(r[0].Verbs, want) {
				return fmt.Errorf("role template deployer in Fleetstream: %v, want verbs %v", r, want)
			}
			return nil
		})
	}
	wantVerbs("get", "list")
	// A change: the next generation is applied and observed.
	tpl, err := dyn.Resource(kubebridge.RoleTemplateGVR).Get(ctx, "deployer", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedSlice(tpl.Object, rules("get", "list", "watch"), "spec", "rules")
	if tpl, err = dyn.Resource(kubebridge.RoleTemplateGVR).Update(ctx, tpl, metav1.UpdateOptions{}); err != nil || tpl.GetGeneration() != 2 {
		t.Fatalf("update role template: generation %d, %v", tpl.GetGeneration(), err)
	}
	waitReady(t, ctx, dyn, kubebridge.RoleTemplateGVR, "", "deployer", "True", kubebridge.ReasonApplied)
	wantVerbs("get", "list", "watch")
	// mallory, a namespace's writer, cannot create cluster-scoped kinds at all (the hub refuses).
	if err := create(mallory, object("RoleTemplate", "", "evil", map[string]any{"rules": rules("*")}), kubebridge.RoleTemplateGVR); !apierrors.IsForbidden(err) {
		t.Fatalf("mallory creating a RoleTemplate: %v, want the hub's Forbidden", err)
	}

	// Namespaced, as mallory in team-a: a ClusterSetBinding is Forbidden by the API until the
	// platform admin makes the bridge admin of the set; then it binds, in team-a.
	if err := create(mallory, object("ClusterSetBinding", "team-a", "prod", map[string]any{"clusterSet": "prod"}), kubebridge.ClusterSetBindingGVR); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ctx, dyn, kubebridge.ClusterSetBindingGVR, "team-a", "prod", "False", kubebridge.ReasonForbidden)
	if _, err := sets.BindClusterSetRole(ctx, connect.NewRequest(&placementv1.BindClusterSetRoleRequest{ClusterSet: "prod", Role: "clusterset-admin",
		Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: "kube-bridge"}})); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ctx, dyn, kubebridge.ClusterSetBindingGVR, "team-a", "prod", "True", kubebridge.ReasonApplied)
	if err := create(mallory, object("Placement", "team-a", "web", map[string]any{"clusterSets": []any{"prod"}, "numberOfClusters": int64(1)}), kubebridge.PlacementGVR); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ctx, dyn, kubebridge.PlacementGVR, "team-a", "web", "True", kubebridge.ReasonApplied)
	p, err := placements.GetPlacement(ctx, connect.NewRequest(&placementv1.GetPlacementRequest{Project: "team-a", Name: "web"}))
	if err != nil || p.Msg.Placement.GetNumberOfClusters() != 1 || !slices.Equal(p.Msg.Placement.GetClusterSets(), []string{"prod"}) {
		t.Fatalf("placement team-a/web in Fleetstream: %v, %v", p, err)
	}
	// A change of the placement follows, observed at its generation.
	pu, err := mallory.Resource(kubebridge.PlacementGVR).Namespace("team-a").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(pu.Object, int64(2), "spec", "numberOfClusters")
	if _, err := mallory.Resource(kubebridge.PlacementGVR).Namespace("team-a").Update(ctx, pu, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ctx, dyn, kubebridge.PlacementGVR, "team-a", "web", "True", kubebridge.ReasonApplied)
	testkit.Eventually(t, 30*time.Second, func() error {
		p, err := placements.GetPlacement(ctx, connect.NewRequest(&placementv1.GetPlacementRequest{Project: "team-a", Name: "web"}))
		if err != nil {
			return err
		}
		if p.Msg.Placement.GetNumberOfClusters() != 2 {
			return fmt.Errorf("numberOfClusters %d, want 2", p.Msg.Placement.GetNumberOfClusters())
		}
		return nil
	})

	// Settled objects cost reads only: a resync of everything makes no write call to the API
	// (what the API fills in by default is not taken for a difference).
	before := apiWrites(t, inst)
	if err := inst.KubeBridge.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if after := apiWrites(t, inst); after != before {
		t.Fatalf("a resync of settled objects made %v write calls to the API", after-before)
	}

	// The attack: mallory writes in team-b's hub namespace (the hub refuses), then names
	// project team-b from team-a (Forbidden, nothing done).
	if err := create(mallory, object("Placement", "team-b", "evil", map[string]any{"clusterSets": []any{"prod"}}), kubebridge.PlacementGVR); !apierrors.IsForbidden(err) {
		t.Fatalf("mallory creating in hub namespace team-b: %v, want the hub's Forbidden", err)
	}
	for _, o := range []struct {
		u   *unstructured.Unstructured
		gvr schema.GroupVersionResource
	}{
		{object("Placement", "team-a", "evil", map[string]any{"project": "team-b", "clusterSets": []any{"prod"}}), kubebridge.PlacementGVR},
		{object("ClusterSetBinding", "team-a", "evil", map[string]any{"project": "team-b", "clusterSet": "prod"}), kubebridge.ClusterSetBindingGVR},
	} {
		if err := create(mallory, o.u, o.gvr); err != nil {
			t.Fatal(err)
		}
		u := waitReady(t, ctx, dyn, o.gvr, "team-a", "evil", "False", kubebridge.ReasonForbidden)
		if _, _, msg, _ := readyOf(u); !strings.Contains(msg, "mapped to project team-a, not team-b") {
			t.Fatalf("%s team-a/evil: Forbidden %q, want the mapping's reason", o.gvr.Resource, msg)
		}
		if slices.Contains(u.GetFinalizers(), kubebridge.Finalizer) {
			t.Fatalf("%s team-a/evil got the finalizer: something was done", o.gvr.Resource)
		}
	}
	if _, err := placements.GetPlacement(ctx, connect.NewRequest(&placementv1.GetPlacementRequest{Project: "team-b", Name: "evil"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("team-b's placement evil: %v, want not found", err)
	}
	bound, err := sets.ListClusterSetBindings(ctx, connect.NewRequest(&placementv1.ListClusterSetBindingsRequest{Project: "team-b"}))
	if err != nil || len(bound.Msg.Bindings) != 0 {
		t.Fatalf("team-b's cluster set bindings: %v, %v; want none", bound, err)
	}

	// del deletes an object on the hub and waits until it is gone (its finalizer released).
	del := func(gvr schema.GroupVersionResource, ns, name string) {
		t.Helper()
		if err := dyn.Resource(gvr).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, 30*time.Second, func() error {
			_, err := dyn.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
			if !apierrors.IsNotFound(err) {
				return fmt.Errorf("%s %s/%s still on the hub: %v", gvr.Resource, ns, name, err)
			}
			return nil
		})
	}
	// ServiceWeights: namespaced on the hub, acting only in clusters where its member-cluster
	// namespace is the mapped project's. payments is team-a's on c1 and team-b's on c2.
	if _, err := clusters.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c2"})); err != nil {
		t.Fatal(err)
	}
	for c, p := range map[string]string{"c1": "team-a", "c2": "team-b"} {
		if _, err := projects.BindNamespace(ctx, connect.NewRequest(&projectv1.BindNamespaceRequest{Project: p, Cluster: c, Namespace: "payments"})); err != nil {
			t.Fatal(err)
		}
	}
	endpoints := endpointv1connect.NewEndpointServiceClient(http.DefaultClient, url, withToken(apiToken))
	weightsOf := func(name string) map[string]uint32 {
		t.Helper()
		res, err := endpoints.ListServiceWeights(ctx, connect.NewRequest(&endpointv1.ListServiceWeightsRequest{Namespace: "payments"}))
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range res.Msg.Weights {
			if w.Name == name {
				return w.ClusterWeights
			}
		}
		return nil
	}
	if err := create(mallory, object("ServiceWeights", "team-a", "api", map[string]any{"namespace": "payments", "clusterWeights": map[string]any{"c1": int64(0)}}), kubebridge.ServiceWeightsGVR); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ctx, dyn, kubebridge.ServiceWeightsGVR, "team-a", "api", "True", kubebridge.ReasonApplied)
	if w := weightsOf("api"); len(w) != 1 || w["c1"] != 0 {
		t.Fatalf("weights of payments/api: %v, want c1 drained", w)
	}
	// The attack: draining team-b's cluster of the namespace from team-a.
	if err := create(mallory, object("ServiceWeights", "team-a", "checkout", map[string]any{"namespace": "payments", "clusterWeights": map[string]any{"c2": int64(0)}}), kubebridge.ServiceWeightsGVR); err != nil {
		t.Fatal(err)
	}
	u := waitReady(t, ctx, dyn, kubebridge.ServiceWeightsGVR, "team-a", "checkout", "False", kubebridge.ReasonForbidden)
	if _, _, msg, _ := readyOf(u); !strings.Contains(msg, "namespace payments on cluster c2 is not bound to project team-a") {
		t.Fatalf("ServiceWeights team-a/checkout: Forbidden %q, want the namespace's reason", msg)
	}
	if w := weightsOf("checkout"); w != nil {
		t.Fatalf("weights of payments/checkout after the attack: %v, want none", w)
	}
	// Settled weights, and a refused object, make no write call either.
	before = apiWrites(t, inst)
	if err := inst.KubeBridge.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if after := apiWrites(t, inst); after != before {
		t.Fatalf("a resync with settled weights made %v write calls to the API", after-before)
	}
	del(kubebridge.ServiceWeightsGVR, "team-a", "api")
	if w := weightsOf("api"); w != nil {
		t.Fatalf("weights of payments/api after its object was deleted: %v, want the defaults", w)
	}
	del(kubebridge.ServiceWeightsGVR, "team-a", "checkout")

	// Deleting removes from Fleetstream what each object made.
	del(kubebridge.PlacementGVR, "team-a", "web")
	if _, err := placements.GetPlacement(ctx, connect.NewRequest(&placementv1.GetPlacementRequest{Project: "team-a", Name: "web"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("placement team-a/web after its object was deleted: %v", err)
	}
	del(kubebridge.ClusterSetBindingGVR, "team-a", "prod")
	if bound, err := sets.ListClusterSetBindings(ctx, connect.NewRequest(&placementv1.ListClusterSetBindingsRequest{Project: "team-a"})); err != nil || len(bound.Msg.Bindings) != 0 {
		t.Fatalf("team-a's cluster set bindings after the object was deleted: %v, %v", bound, err)
	}
	del(kubebridge.RoleTemplateGVR, "", "deployer")
	if _, err := rbac.GetRoleTemplate(ctx, connect.NewRequest(&rbacv1.GetRoleTemplateRequest{Name: "deployer"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("role template deployer after its object was deleted: %v", err)
	}
	// The objects mallory's attack left never made anything: deleting them removes nothing.
	del(kubebridge.PlacementGVR, "team-a", "evil")
	del(kubebridge.ClusterSetBindingGVR, "team-a", "evil")
}

// apiWrites is how many calls fleetd's API has answered to the write procedures the bridge makes
// (create, update, set, bind, unbind, delete), from its metrics.
func apiWrites(t *testing.T, inst *fleetd.Instance) float64 {
	t.Helper()
	var n float64
	for _, line := range strings.Split(scrape(t, inst), "\n") {
		if !strings.HasPrefix(line, "fleetstream_rpc_requests_total{") {
			continue
		}
		_, proc, _ := strings.Cut(line, `procedure="`)
		proc, _, _ = strings.Cut(proc, `"`)
		method := proc[strings.LastIndex(proc, "/")+1:]
		for _, verb := range []string{"Create", "Update", "Set", "Bind", "Unbind", "Delete"} {
			if strings.HasPrefix(method, verb) {
				f := strings.Fields(line)
				v, err := strconv.ParseFloat(f[len(f)-1], 64)
				if err != nil {
					t.Fatalf("metric line %q: %v", line, err)
				}
				n += v
				break
			}
		}
	}
	return n
}

func toAny(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}
