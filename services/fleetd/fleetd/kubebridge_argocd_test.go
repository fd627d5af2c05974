package fleetd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"

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
	"github.com/fleetstream/fleetstream/services/cluster-agent/agent"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
	"github.com/fleetstream/fleetstream/services/kube-bridge/kubebridge"
)

// argoFolder is the folder of Fleetstream objects the Argo CD Application example syncs
// (examples/argocd/application.yaml's spec.source.path).
const argoFolder = "examples/argocd/fleet"

// readArgoFolder decodes every object of the folder's YAML files (recursively, as the
// Application's directory.recurse), in file order.
func readArgoFolder(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	root := filepath.Join("..", "..", "..", argoFolder)
	var out []*unstructured.Unstructured
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(path) != ".yaml" {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		dec := k8syaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var m map[string]any
			if err := dec.Decode(&m); errors.Is(err, io.EOF) {
				return nil
			} else if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			if len(m) > 0 {
				out = append(out, &unstructured.Unstructured{Object: m})
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("%s holds no objects", argoFolder)
	}
	return out
}

// TestKubeBridgeArgoCDExample syncs the Argo CD example's folder into a hub as Argo CD does with
// ServerSideApply=true (server-side apply, its field manager, wave by wave of
// argocd.argoproj.io/sync-wave, each wave healthy before the next), with the platform admin's
// one-time grants of docs/kubernetes.md between the fleet-wide wave and the team's: every
// object turns Ready and Fleetstream holds what the folder declares. A folder object the CRDs'
// schemas refuse, or one the bridge cannot apply, fails it.
func TestKubeBridgeArgoCDExample(t *testing.T) {
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
	ctx := testkit.Context(t, 4*time.Minute)
	dyn, err := dynamic.NewForConfig(hub.Config)
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + inst.Addr
	projects := projectv1connect.NewProjectServiceClient(http.DefaultClient, url, withToken(apiToken))
	rbac := rbacv1connect.NewRBACServiceClient(http.DefaultClient, url, withToken(apiToken))
	placements := placementv1connect.NewPlacementServiceClient(http.DefaultClient, url, withToken(apiToken))
	sets := placementv1connect.NewClusterSetServiceClient(http.DefaultClient, url, withToken(apiToken))
	endpoints := endpointv1connect.NewEndpointServiceClient(http.DefaultClient, url, withToken(apiToken))
	// The fleet the example is written for: two prod clusters whose agents heartbeat (a
	// placement passes over clusters that never connected). Heartbeats are all the test needs
	// of them, so both report from one member apiserver and apply nothing.
	member := testkit.StartKube(t)
	for _, c := range []string{"eu-1", "eu-2"} {
		reg, err := clusters.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: c, Labels: map[string]string{"env": "prod"}}))
		if err != nil {
			t.Fatal(err)
		}
		startAgent(t, ctx, inst, c, reg.Msg.AgentToken, func(ajs jetstream.JetStream) (agentRunner, error) {
			return agent.New(agent.Config{ClusterName: c, HeartbeatInterval: 500 * time.Millisecond, InventoryDebounce: 100 * time.Millisecond}, ajs, member.Client, testkit.Logger(t))
		})
	}

	gvrs := map[string]schema.GroupVersionResource{"Namespace": {Version: "v1", Resource: "namespaces"},
		"Project": kubebridge.ProjectGVR, "RoleTemplate": kubebridge.RoleTemplateGVR, "ClusterSet": kubebridge.ClusterSetGVR,
		"NamespaceBinding": kubebridge.NamespaceBindingGVR, "ProjectRoleBinding": kubebridge.ProjectRoleBindingGVR,
		"Placement": kubebridge.PlacementGVR, "ClusterSetBinding": kubebridge.ClusterSetBindingGVR, "ServiceWeights": kubebridge.ServiceWeightsGVR}
	waves := map[int][]*unstructured.Unstructured{}
	for _, u := range readArgoFolder(t) {
		if _, ok := gvrs[u.GetKind()]; !ok {
			t.Fatalf("%s %s: a kind the test does not know", u.GetKind(), u.GetName())
		}
		w, err := strconv.Atoi(u.GetAnnotations()["argocd.argoproj.io/sync-wave"])
		if err != nil {
			t.Fatalf("%s %s: sync-wave: %v", u.GetKind(), u.GetName(), err)
		}
		waves[w] = append(waves[w], u)
	}
	sync := func(wave int) {
		t.Helper()
		for _, u := range waves[wave] {
			data, err := json.Marshal(u.Object)
			if err != nil {
				t.Fatal(err)
			}
			force := true
			if _, err := dyn.Resource(gvrs[u.GetKind()]).Namespace(u.GetNamespace()).Patch(ctx, u.GetName(), types.ApplyPatchType, data,
				metav1.PatchOptions{FieldManager: "argocd-controller", Force: &force, FieldValidation: metav1.FieldValidationStrict}); err != nil {
				t.Fatalf("sync wave %d: %s %s/%s: %v", wave, u.GetKind(), u.GetNamespace(), u.GetName(), err)
			}
		}
		for _, u := range waves[wave] {
			if u.GetKind() != "Namespace" {
				waitReadyWithin(t, ctx, 90*time.Second, dyn, gvrs[u.GetKind()], u.GetNamespace(), u.GetName(), "True", kubebridge.ReasonApplied)
			}
		}
	}
	order := slices.Sorted(func(yield func(int) bool) {
		for w := range waves {
			if !yield(w) {
				return
			}
		}
	})
	for _, w := range order {
		sync(w)
		if w == 0 {
			// The platform admin's one-time grants (docs/kubernetes.md), once the project and
			// the set exist: the bridge's identity owns team-a and administers prod.
			if _, err := rbac.BindProjectRole(ctx, connect.NewRequest(&rbacv1.BindProjectRoleRequest{Project: "team-a", RoleTemplate: "project-owner",
				Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: "kube-bridge"}})); err != nil {
				t.Fatal(err)
			}
			if _, err := sets.BindClusterSetRole(ctx, connect.NewRequest(&placementv1.BindClusterSetRoleRequest{ClusterSet: "prod", Role: "clusterset-admin",
				Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: "kube-bridge"}})); err != nil {
				t.Fatal(err)
			}
		}
	}

	// Fleetstream holds what the folder declares.
	p, err := projects.GetProject(ctx, connect.NewRequest(&projectv1.GetProjectRequest{Name: "team-a"}))
	if err != nil || p.Msg.Project.DisplayName != "Team A" {
		t.Fatalf("project team-a: %v, %v", p, err)
	}
	if _, err := rbac.GetRoleTemplate(ctx, connect.NewRequest(&rbacv1.GetRoleTemplateRequest{Name: "deployer"})); err != nil {
		t.Fatalf("role template deployer: %v", err)
	}
	pl, err := placements.GetPlacement(ctx, connect.NewRequest(&placementv1.GetPlacementRequest{Project: "team-a", Name: "web"}))
	if err != nil || pl.Msg.Placement.GetNumberOfClusters() != 2 {
		t.Fatalf("placement team-a/web: %v, %v", pl, err)
	}
	nbs, err := projects.ListNamespaceBindings(ctx, connect.NewRequest(&projectv1.ListNamespaceBindingsRequest{Project: "team-a"}))
	if err != nil {
		t.Fatal(err)
	}
	bound := map[string]bool{}
	for _, nb := range nbs.Msg.Bindings {
		if nb.Namespace == "web" {
			bound[nb.Cluster] = true
		}
	}
	if !bound["eu-1"] || !bound["eu-2"] {
		t.Fatalf("namespace web of team-a is bound on %v, want eu-1 and eu-2 (the placement's)", bound)
	}
	rbs, err := rbac.ListProjectRoleBindings(ctx, connect.NewRequest(&rbacv1.ListProjectRoleBindingsRequest{Project: "team-a", RoleTemplate: "project-viewer"}))
	if err != nil || len(rbs.Msg.Bindings) != 1 || rbs.Msg.Bindings[0].GetSubject().GetName() != "alice" {
		t.Fatalf("team-a's project-viewer bindings: %v, %v", rbs, err)
	}
	ws, err := endpoints.ListServiceWeights(ctx, connect.NewRequest(&endpointv1.ListServiceWeightsRequest{Namespace: "web"}))
	if err != nil || len(ws.Msg.Weights) != 1 || ws.Msg.Weights[0].Name != "api" || ws.Msg.Weights[0].ClusterWeights["eu-2"] != 50 {
		t.Fatalf("weights of web/api: %v, %v", ws, err)
	}
}

// waitReadyWithin is waitReady with a longer patience: an object synced while its namespace's
// bindings are still being decided is retried by the bridge with backoff.
func waitReadyWithin(t *testing.T, ctx context.Context, d time.Duration, dyn dynamic.Interface, gvr schema.GroupVersionResource, ns, name, status, reason string) {
	t.Helper()
	testkit.Eventually(t, d, func() error {
		u, err := dyn.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s, r, m, current := readyOf(u)
		if s != status || r != reason || !current {
			return fmt.Errorf("%s %s/%s: Ready %s/%s (current %v): %s", gvr.Resource, ns, name, s, r, current, m)
		}
		return nil
	})
}
