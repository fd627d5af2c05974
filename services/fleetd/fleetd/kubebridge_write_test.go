package fleetd_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1/rbacv1connect"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-agent/agent"
	"github.com/fleetstream/fleetstream/services/cluster-agent/desired"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
	"github.com/fleetstream/fleetstream/services/kube-bridge/kubebridge"
)

const bridgeAPIToken = "kube-bridge-api-token"

func withToken(token string) connect.ClientOption {
	return connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("Authorization", "Bearer "+token)
			return next(ctx, req)
		}
	}))
}

// readyOf returns the Ready condition of a fleetstream.io object: status, reason, message and
// whether it observes the object's generation.
func readyOf(u *unstructured.Unstructured) (status, reason, message string, current bool) {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Ready" {
			gen, _, _ := unstructured.NestedInt64(m, "observedGeneration")
			return fmt.Sprint(m["status"]), fmt.Sprint(m["reason"]), fmt.Sprint(m["message"]), gen == u.GetGeneration()
		}
	}
	return "", "", "", false
}

// waitReady waits until the object's Ready condition, for its current generation, has
// status and reason, and returns the object.
func waitReady(t *testing.T, ctx context.Context, dyn dynamic.Interface, gvr schema.GroupVersionResource, ns, name, status, reason string) *unstructured.Unstructured {
	t.Helper()
	var u *unstructured.Unstructured
	testkit.Eventually(t, 30*time.Second, func() error {
		var err error
		u, err = dyn.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s, r, m, current := readyOf(u)
		if s != status || r != reason || !current {
			return fmt.Errorf("%s %s/%s: Ready %s/%s (current %v): %s", gvr.Resource, ns, name, s, r, current, m)
		}
		return nil
	})
	return u
}

func object(kind, ns, name string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "fleetstream.io/v1alpha1", "kind": kind,
		"metadata": map[string]any{"name": name},
		"spec":     spec,
	}}
	if ns != "" {
		u.SetNamespace(ns)
	}
	return u
}

// TestKubeBridgeWritesIntoFleetstream: fleetstream.io objects created on the hub (as kubectl
// apply would) reach Fleetstream through its API under the bridge's limited identity, with
// their Ready condition; an object of hub namespace team-a naming project team-b is Forbidden
// and nothing is done; what the schema refuses, the hub refuses; deleting an object removes it
// from Fleetstream.
func TestKubeBridgeWritesIntoFleetstream(t *testing.T) {
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
	ctx := testkit.Context(t, 120*time.Second)
	dyn, err := dynamic.NewForConfig(hub.Config)
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + inst.Addr
	projects := projectv1connect.NewProjectServiceClient(http.DefaultClient, url, withToken(apiToken))
	rbac := rbacv1connect.NewRBACServiceClient(http.DefaultClient, url, withToken(apiToken))
	reg, err := clusters.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c1"}))
	if err != nil {
		t.Fatal(err)
	}
	// c1's agent runs against a member apiserver of its own (not the hub: the agent labels a
	// bound namespace fleetstream.io/project, the hub's mapping label): what the objects grant
	// lands as RoleBindings there.
	member := testkit.StartKube(t)
	memberDyn, err := dynamic.NewForConfig(member.Config)
	if err != nil {
		t.Fatal(err)
	}
	startAgent(t, ctx, inst, "c1", reg.Msg.AgentToken, func(ajs jetstream.JetStream) (agentRunner, error) {
		a, err := agent.New(agent.Config{ClusterName: "c1", HeartbeatInterval: 500 * time.Millisecond, InventoryDebounce: 100 * time.Millisecond}, ajs, member.Client, testkit.Logger(t))
		if err != nil {
			return nil, err
		}
		applier, err := desired.New(desired.Config{ClusterName: "c1"}, ajs, memberDyn, member.Client.Discovery(), testkit.Logger(t))
		if err != nil {
			return nil, err
		}
		a.Add(applier)
		return a, nil
	})
	for ns, project := range map[string]string{"team-a": "team-a", "team-b": "team-b", "loose": ""} {
		n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
		if project != "" {
			n.Labels = map[string]string{kubebridge.LabelProject: project}
		}
		if _, err := hub.Client.CoreV1().Namespaces().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create := func(u *unstructured.Unstructured, gvr schema.GroupVersionResource) error {
		_, err := dyn.Resource(gvr).Namespace(u.GetNamespace()).Create(ctx, u, metav1.CreateOptions{FieldValidation: "Strict"})
		return err
	}

	// Projects: cluster-scoped, under the platform identity the operator gave for them.
	for _, p := range []string{"team-a", "team-b"} {
		if err := create(object("Project", "", p, map[string]any{"displayName": "Team " + p,
			"budgets": []any{map[string]any{"cluster": "c1", "hard": map[string]any{"cpu": "8"}}}}), kubebridge.ProjectGVR); err != nil {
			t.Fatal(err)
		}
		waitReady(t, ctx, dyn, kubebridge.ProjectGVR, "", p, "True", kubebridge.ReasonApplied)
	}
	got, err := projects.GetProject(ctx, connect.NewRequest(&projectv1.GetProjectRequest{Name: "team-a"}))
	if err != nil {
		t.Fatal(err)
	}
	if got.Msg.Project.DisplayName != "Team team-a" || len(got.Msg.Project.Budgets) != 1 || got.Msg.Project.Budgets[0].Hard["cpu"] != "8" {
		t.Fatalf("project team-a in Fleetstream: %v", got.Msg.Project)
	}

	// The bridge's own identity is no owner anywhere yet: the API refuses it, and the status
	// says so in the API's words.
	web := object("NamespaceBinding", "team-a", "web", map[string]any{"cluster": "c1", "hard": map[string]any{"cpu": "2"}})
	if err := create(web, kubebridge.NamespaceBindingGVR); err != nil {
		t.Fatal(err)
	}
	u := waitReady(t, ctx, dyn, kubebridge.NamespaceBindingGVR, "team-a", "web", "False", kubebridge.ReasonForbidden)
	if _, _, msg, _ := readyOf(u); !strings.Contains(msg, `"kube-bridge"`) || !strings.Contains(msg, "permission_denied") {
		t.Fatalf("Forbidden by the API: want its message, got %q", msg)
	}
	// The platform admin makes it owner of team-a alone (docs/kubernetes.md).
	if _, err := rbac.BindProjectRole(ctx, connect.NewRequest(&rbacv1.BindProjectRoleRequest{Project: "team-a", RoleTemplate: "project-owner",
		Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: "kube-bridge"}})); err != nil {
		t.Fatal(err)
	}
	// No Sync: an object the API refused as Forbidden is retried with backoff.
	u = waitReady(t, ctx, dyn, kubebridge.NamespaceBindingGVR, "team-a", "web", "True", kubebridge.ReasonApplied)
	if !slices.Contains(u.GetFinalizers(), kubebridge.Finalizer) {
		t.Fatalf("finalizers %v", u.GetFinalizers())
	}
	wantBinding := func(project, ns, cpu string) func() error {
		return func() error {
			res, err := projects.ListNamespaceBindings(ctx, connect.NewRequest(&projectv1.ListNamespaceBindingsRequest{Project: project}))
			if err != nil {
				return err
			}
			for _, b := range res.Msg.Bindings {
				if b.Namespace == ns && b.Cluster == "c1" {
					if cpu == "" {
						if b.Phase == projectv1.BindingPhase_BINDING_PHASE_TERMINATING {
							return nil // unbound: c1 has no agent to release it yet
						}
						return fmt.Errorf("%s still bound in %s: %v", ns, project, b)
					}
					if b.Hard["cpu"] != cpu {
						return fmt.Errorf("%s in %s: hard %v, want cpu %s", ns, project, b.Hard, cpu)
					}
					return nil
				}
			}
			if cpu == "" {
				return nil
			}
			return fmt.Errorf("%s not bound in %s: %v", ns, project, res.Msg.Bindings)
		}
	}
	testkit.Eventually(t, 10*time.Second, wantBinding("team-a", "web", "2"))

	// A change of the quota reaches the binding; the condition observes the new generation.
	if err := unstructured.SetNestedField(u.Object, "3", "spec", "hard", "cpu"); err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(kubebridge.NamespaceBindingGVR).Namespace("team-a").Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ctx, dyn, kubebridge.NamespaceBindingGVR, "team-a", "web", "True", kubebridge.ReasonApplied)
	testkit.Eventually(t, 10*time.Second, wantBinding("team-a", "web", "3"))

	// The attack: a writer of hub namespace team-a names project team-b. Forbidden, and
	// nothing is done: no binding in team-b, no finalizer on the object.
	steal := object("NamespaceBinding", "team-a", "steal", map[string]any{"project": "team-b", "cluster": "c1"})
	if err := create(steal, kubebridge.NamespaceBindingGVR); err != nil {
		t.Fatal(err)
	}
	u = waitReady(t, ctx, dyn, kubebridge.NamespaceBindingGVR, "team-a", "steal", "False", kubebridge.ReasonForbidden)
	if _, _, msg, _ := readyOf(u); !strings.Contains(msg, "mapped to project team-a, not team-b") {
		t.Fatalf("Forbidden: %q", msg)
	}
	stealRB := object("ProjectRoleBinding", "team-a", "steal-owner", map[string]any{"project": "team-b", "roleTemplate": "project-owner",
		"subject": map[string]any{"kind": "SUBJECT_KIND_USER", "name": "mallory"}})
	if err := create(stealRB, kubebridge.ProjectRoleBindingGVR); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ctx, dyn, kubebridge.ProjectRoleBindingGVR, "team-a", "steal-owner", "False", kubebridge.ReasonForbidden)
	// An unmapped namespace acts nowhere.
	if err := create(object("NamespaceBinding", "loose", "web", map[string]any{"project": "team-a", "cluster": "c1"}), kubebridge.NamespaceBindingGVR); err != nil {
		t.Fatal(err)
	}
	u = waitReady(t, ctx, dyn, kubebridge.NamespaceBindingGVR, "loose", "web", "False", kubebridge.ReasonForbidden)
	if len(u.GetFinalizers()) != 0 {
		t.Fatalf("a Forbidden object got finalizers %v", u.GetFinalizers())
	}
	// team-b is mapped, but the bridge is no owner there: the API is the second wall.
	if err := create(object("NamespaceBinding", "team-b", "api", map[string]any{"cluster": "c1", "hard": map[string]any{"cpu": "1"}}), kubebridge.NamespaceBindingGVR); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ctx, dyn, kubebridge.NamespaceBindingGVR, "team-b", "api", "False", kubebridge.ReasonForbidden)
	if err := wantBinding("team-b", "steal", "")(); err != nil {
		t.Fatal(err)
	}
	if err := wantBinding("team-b", "api", "")(); err != nil {
		t.Fatal(err)
	}
	if res, err := rbac.ListProjectRoleBindings(ctx, connect.NewRequest(&rbacv1.ListProjectRoleBindingsRequest{Project: "team-b"})); err != nil || len(res.Msg.Bindings) != 0 {
		t.Fatalf("team-b's members: %v %v", res, err)
	}
	// Now the bridge is owner in team-b too: the second wall is gone for team-b, and the
	// mapping alone keeps team-a's writers out of it.
	if _, err := rbac.BindProjectRole(ctx, connect.NewRequest(&rbacv1.BindProjectRoleRequest{Project: "team-b", RoleTemplate: "project-owner",
		Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: "kube-bridge"}})); err != nil {
		t.Fatal(err)
	}
	// No Sync: an object the API refused as Forbidden is retried with backoff.
	waitReady(t, ctx, dyn, kubebridge.NamespaceBindingGVR, "team-b", "api", "True", kubebridge.ReasonApplied)
	testkit.Eventually(t, 10*time.Second, wantBinding("team-b", "api", "1"))
	waitReady(t, ctx, dyn, kubebridge.NamespaceBindingGVR, "team-a", "steal", "False", kubebridge.ReasonForbidden)
	waitReady(t, ctx, dyn, kubebridge.ProjectRoleBindingGVR, "team-a", "steal-owner", "False", kubebridge.ReasonForbidden)
	if err := wantBinding("team-b", "steal", "")(); err != nil {
		t.Fatal(err)
	}
	if res, err := rbac.ListProjectRoleBindings(ctx, connect.NewRequest(&rbacv1.ListProjectRoleBindingsRequest{Project: "team-b",
		Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: "mallory"}})); err != nil || len(res.Msg.Bindings) != 0 {
		t.Fatalf("mallory in team-b: %v %v", res, err)
	}

	// A ProjectRoleBinding reaches the project's members.
	if err := create(object("ProjectRoleBinding", "team-a", "alice-viewer", map[string]any{"roleTemplate": "project-viewer",
		"subject": map[string]any{"kind": "SUBJECT_KIND_USER", "name": "alice"}}), kubebridge.ProjectRoleBindingGVR); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ctx, dyn, kubebridge.ProjectRoleBindingGVR, "team-a", "alice-viewer", "True", kubebridge.ReasonApplied)
	aliceBound := func() (bool, error) {
		res, err := rbac.ListProjectRoleBindings(ctx, connect.NewRequest(&rbacv1.ListProjectRoleBindingsRequest{Project: "team-a",
			Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: "alice"}}))
		if err != nil {
			return false, err
		}
		return len(res.Msg.Bindings) == 1 && res.Msg.Bindings[0].RoleTemplate == "project-viewer", nil
	}
	if ok, err := aliceBound(); !ok || err != nil {
		t.Fatalf("alice's binding in Fleetstream: %v %v", ok, err)
	}
	// On the member cluster: the role bound in the project's namespace, and the apiserver agrees.
	aliceMayRead := func() (bool, error) {
		sar, err := member.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: "alice", ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: "web", Verb: "list", Resource: "pods"}}}, metav1.CreateOptions{})
		if err != nil {
			return false, err
		}
		return sar.Status.Allowed, nil
	}
	testkit.Eventually(t, 30*time.Second, func() error {
		rb, err := member.Client.RbacV1().RoleBindings("web").Get(ctx, "fleetstream:project-viewer", metav1.GetOptions{})
		if err != nil {
			res, _ := projects.ListNamespaceBindings(ctx, connect.NewRequest(&projectv1.ListNamespaceBindingsRequest{Project: "team-a"}))
			rbs, _ := member.Client.RbacV1().RoleBindings("web").List(ctx, metav1.ListOptions{})
			return fmt.Errorf("%w (bindings %v; rolebindings in web %d)", err, res.Msg.GetBindings(), len(rbs.Items))
		}
		if len(rb.Subjects) != 1 || rb.Subjects[0].Name != "alice" {
			return fmt.Errorf("RoleBinding web/fleetstream:project-viewer: subjects %v", rb.Subjects)
		}
		if ok, err := aliceMayRead(); !ok || err != nil {
			return fmt.Errorf("SubjectAccessReview: alice may not list pods in web (%v)", err)
		}
		return nil
	})

	// The hub refuses what the schema refuses, with the schema's message, before the bridge
	// sees anything.
	for _, tc := range []struct {
		name string
		obj  *unstructured.Unstructured
		gvr  schema.GroupVersionResource
		want string
	}{
		{"unknown field", object("NamespaceBinding", "team-a", "x1", map[string]any{"cluster": "c1", "unbindPolicy": "DELETE"}), kubebridge.NamespaceBindingGVR, `unknown field "spec.unbindPolicy"`},
		{"wrong type", object("NamespaceBinding", "team-a", "x2", map[string]any{"cluster": "c1", "hard": "lots"}), kubebridge.NamespaceBindingGVR, "spec.hard: Invalid value"},
		{"bad enum", object("ProjectRoleBinding", "team-a", "x3", map[string]any{"roleTemplate": "project-viewer",
			"subject": map[string]any{"kind": "ROBOT", "name": "r"}}), kubebridge.ProjectRoleBindingGVR, `spec.subject.kind: Unsupported value: "ROBOT"`},
		{"bad project name", object("NamespaceBinding", "team-a", "x4", map[string]any{"project": "Team_A", "cluster": "c1"}), kubebridge.NamespaceBindingGVR, "spec.project: Invalid value"},
		{"output-only field", object("Project", "", "x5", map[string]any{"budgets": []any{map[string]any{"cluster": "c1", "allocated": map[string]any{"cpu": "1"}}}}), kubebridge.ProjectGVR, `unknown field "spec.budgets[0].allocated"`},
	} {
		err := create(tc.obj, tc.gvr)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: want the hub to refuse with %q, got %v", tc.name, tc.want, err)
		}
	}
	// What a binding binds cannot change; the hub says so.
	u, err = dyn.Resource(kubebridge.NamespaceBindingGVR).Namespace("team-a").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(u.Object, "c2", "spec", "cluster")
	if _, err := dyn.Resource(kubebridge.NamespaceBindingGVR).Namespace("team-a").Update(ctx, u, metav1.UpdateOptions{}); err == nil || !strings.Contains(err.Error(), "spec.cluster cannot be changed") {
		t.Errorf("changing spec.cluster: %v", err)
	}

	// Deleting the objects removes them from Fleetstream, then from the hub.
	del := func(gvr schema.GroupVersionResource, ns, name string) {
		t.Helper()
		if err := dyn.Resource(gvr).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, 30*time.Second, func() error {
			if _, err := dyn.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
				return fmt.Errorf("%s %s/%s still on the hub", gvr.Resource, ns, name)
			}
			return nil
		})
	}
	del(kubebridge.ProjectRoleBindingGVR, "team-a", "alice-viewer")
	if ok, err := aliceBound(); ok || err != nil {
		t.Fatalf("alice still bound in team-a: %v", err)
	}
	testkit.Eventually(t, 30*time.Second, func() error {
		if ok, err := aliceMayRead(); ok || err != nil {
			return fmt.Errorf("alice may still list pods in web (%v)", err)
		}
		return nil
	})
	del(kubebridge.NamespaceBindingGVR, "team-a", "web")
	testkit.Eventually(t, 30*time.Second, wantBinding("team-a", "web", ""))
	// A Forbidden object goes at once (it never had a finalizer), and touched nothing.
	del(kubebridge.NamespaceBindingGVR, "team-a", "steal")
	del(kubebridge.NamespaceBindingGVR, "team-b", "api")
	testkit.Eventually(t, 30*time.Second, wantBinding("team-b", "api", ""))
	del(kubebridge.ProjectGVR, "", "team-b")
	if _, err := projects.GetProject(ctx, connect.NewRequest(&projectv1.GetProjectRequest{Name: "team-b"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("project team-b after its object was deleted: %v", err)
	}

	// An object that was never applied never owned what Fleetstream holds under its name: a
	// Project refused (the project exists with another display name) goes, and the project
	// stays (found in review: its deletion deleted the project it had never adopted).
	if _, err := projects.CreateProject(ctx, connect.NewRequest(&projectv1.CreateProjectRequest{Name: "legacy", DisplayName: "Legacy"})); err != nil {
		t.Fatal(err)
	}
	if err := create(object("Project", "", "legacy", map[string]any{"displayName": "Other"}), kubebridge.ProjectGVR); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ctx, dyn, kubebridge.ProjectGVR, "", "legacy", "False", kubebridge.ReasonRefused)
	del(kubebridge.ProjectGVR, "", "legacy")
	if _, err := projects.GetProject(ctx, connect.NewRequest(&projectv1.GetProjectRequest{Name: "legacy"})); err != nil {
		t.Fatalf("project legacy after the refused object was deleted: %v", err)
	}
}
