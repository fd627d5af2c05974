package rbacsync_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
	"github.com/fleetstream/fleetstream/services/rbac-sync/rbacsync"
)

// names are what one flow case works on, distinct per case so every case shares one hub.
type names struct {
	cluster, other, project, project2, template, ns string
}

type step func(t *testing.T, e *env, n names)

var (
	addTemplate = func(t *testing.T, e *env, n names) {
		e.createTemplate(t, n.template, nil, rule("", "pods", "get", "list"))
	}
	deleteTemplate = func(t *testing.T, e *env, n names) {
		if _, err := e.rbac.DeleteRoleTemplate(bg(), connect.NewRequest(&rbacv1.DeleteRoleTemplateRequest{Name: n.template})); err != nil {
			t.Fatal(err)
		}
	}
	changeTemplate = func(t *testing.T, e *env, n names) {
		if _, err := e.rbac.UpdateRoleTemplate(bg(), connect.NewRequest(&rbacv1.UpdateRoleTemplateRequest{
			Template:   &rbacv1.RoleTemplate{Name: n.template, Rules: []*rbacv1.PolicyRule{rule("", "pods", "get"), rule("", "configmaps", "get")}},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"rules"}},
		})); err != nil {
			t.Fatal(err)
		}
	}
	bindAlice   = func(t *testing.T, e *env, n names) { e.bindRole(t, n.project, user("alice"), n.template) }
	bindBob     = func(t *testing.T, e *env, n names) { e.bindRole(t, n.project, user("bob"), n.template) }
	bindBobIn2  = func(t *testing.T, e *env, n names) { e.bindRole(t, n.project2, user("bob"), n.template) }
	unbindAlice = func(t *testing.T, e *env, n names) { e.unbindRole(t, n.project, user("alice"), n.template) }
	bindNS      = func(t *testing.T, e *env, n names) { e.bindNS(t, n.project, n.cluster, n.ns) }
	// The namespace can go to another project once the agent confirmed its release.
	bindNSTo2 = func(t *testing.T, e *env, n names) {
		e.releaseNS(t, n.cluster, n.ns)
		testkit.Eventually(t, 10*time.Second, func() error {
			_, err := e.projects.BindNamespace(bg(), connect.NewRequest(&projectv1.BindNamespaceRequest{Project: n.project2, Cluster: n.cluster, Namespace: n.ns}))
			return err
		})
	}
	unbindNS  = func(t *testing.T, e *env, n names) { e.unbindNS(t, n.project, n.cluster, n.ns) }
	joinOther = func(t *testing.T, e *env, n names) { e.register(t, n.other) }
	// The late cluster's ClusterRole is written before the next step: a template deleted
	// before the join's fan-out leaves it absent rather than tombstoned (as right for the
	// agent, but not the path the case means to take).
	otherHasTemplate = func(t *testing.T, e *env, n names) { e.waitState(t, crKey(n.other, n.template), "rules:pods") }
	deregister       = func(t *testing.T, e *env, n names) { e.deregister(t, n.cluster) }
)

// TestFlowsInAnyOrder drives the six flows of the spec (template added, PRB added, namespace
// binding added, PRB removed, namespace binding removed, template changed or removed) through
// the real APIs in several orders of arrival, and checks the desired keys the agents would see.
func TestFlowsInAnyOrder(t *testing.T) {
	e := start(t, nil, rbacsync.Config{})
	type want struct {
		cr, rb, crOther string
	}
	pods := "rules:pods"
	cases := []struct {
		name  string
		steps []step
		want  want
	}{
		{"template, binding, namespace", []step{addTemplate, bindAlice, bindNS}, want{pods, "subjects:alice", "absent"}},
		{"template, namespace, binding", []step{addTemplate, bindNS, bindAlice}, want{pods, "subjects:alice", "absent"}},
		{"namespace, template, binding", []step{bindNS, addTemplate, bindAlice}, want{pods, "subjects:alice", "absent"}},
		{"cluster joins after the template", []step{addTemplate, bindNS, bindAlice, joinOther}, want{pods, "subjects:alice", pods}},
		{"second subject shares the RoleBinding", []step{addTemplate, bindNS, bindAlice, bindBob}, want{pods, "subjects:alice,bob", "absent"}},
		{"binding removed", []step{addTemplate, bindNS, bindAlice, unbindAlice}, want{pods, "tombstone", "absent"}},
		{"binding removed, another stays", []step{addTemplate, bindNS, bindAlice, bindBob, unbindAlice}, want{pods, "subjects:bob", "absent"}},
		{"namespace unbound", []step{addTemplate, bindAlice, bindNS, unbindNS}, want{pods, "tombstone", "absent"}},
		{"namespace unbound before any binding", []step{addTemplate, bindNS, unbindNS, bindAlice}, want{pods, "absent", "absent"}},
		{"namespace moves to another project", []step{addTemplate, bindAlice, bindBobIn2, bindNS, unbindNS, bindNSTo2}, want{pods, "subjects:bob", "absent"}},
		{"template changed", []step{addTemplate, bindNS, bindAlice, changeTemplate}, want{"rules:configmaps,pods", "subjects:alice", "absent"}},
		{"template removed", []step{addTemplate, bindNS, bindAlice, joinOther, otherHasTemplate, deleteTemplate}, want{"tombstone", "tombstone", "tombstone"}},
		{"template re-created after its bindings", []step{addTemplate, bindNS, bindAlice, deleteTemplate, addTemplate}, want{pods, "subjects:alice", "absent"}},
		{"cluster deregistered", []step{addTemplate, bindNS, bindAlice, deregister}, want{"absent", "absent", "absent"}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := names{cluster: fmt.Sprintf("c%d", i), other: fmt.Sprintf("c%d-late", i), project: fmt.Sprintf("p%d", i),
				project2: fmt.Sprintf("p%d-b", i), template: fmt.Sprintf("t%d", i), ns: "web"}
			e.register(t, n.cluster)
			e.createProject(t, n.project, n.project2)
			for _, s := range tc.steps {
				s(t, e, n)
			}
			e.waitState(t, crKey(n.cluster, n.template), tc.want.cr)
			e.waitState(t, rbKey(n.cluster, n.ns, n.template), tc.want.rb)
			e.waitState(t, crKey(n.other, n.template), tc.want.crOther)
		})
	}
}

// TestNothingUnchangedIsRewritten checks that recomputation writes only keys whose object
// changed: unrelated changes, a template change (RoleBindings refer to the ClusterRole by name)
// and a restart of the service leave every other key at its revision.
func TestNothingUnchangedIsRewritten(t *testing.T) {
	j := testkit.StartJetStream(t)
	e := start(t, j, rbacsync.Config{})
	e.register(t, "c1", "c2")
	e.createProject(t, "team-a", "team-b")
	e.createTemplate(t, "viewer", nil, rule("", "pods", "get"))
	e.bindNS(t, "team-a", "c1", "web", "api")
	e.bindNS(t, "team-a", "c2", "web")
	e.bindRole(t, "team-a", user("alice"), "viewer")
	keys := []string{crKey("c1", "viewer"), crKey("c2", "viewer"), rbKey("c1", "web", "viewer"), rbKey("c1", "api", "viewer"), rbKey("c2", "web", "viewer")}
	for _, k := range keys[2:] {
		e.waitState(t, k, "subjects:alice")
	}
	revisions := func() map[string]uint64 {
		out := map[string]uint64{}
		for _, k := range keys {
			out[k] = e.get(t, k).revision
		}
		return out
	}
	before := revisions()
	check := func(what string, changed ...string) {
		t.Helper()
		after := revisions()
		for _, k := range keys {
			moved := after[k] != before[k]
			want := false
			for _, c := range changed {
				want = want || c == k
			}
			if moved != want {
				t.Errorf("%s: key %s moved %v (revision %d -> %d), want moved=%v", what, k, moved, before[k], after[k], want)
			}
		}
		before = after
	}

	// Unrelated: another project's binding and namespace, another template.
	e.bindNS(t, "team-b", "c1", "db")
	e.createTemplate(t, "editor", nil, rule("", "pods", "update"))
	e.bindRole(t, "team-b", user("bob"), "viewer")
	e.waitState(t, rbKey("c1", "db", "viewer"), "subjects:bob")
	e.waitState(t, crKey("c2", "editor"), "rules:pods")
	check("unrelated changes")

	// A rule change rewrites the ClusterRoles only.
	if _, err := e.rbac.UpdateRoleTemplate(bg(), connect.NewRequest(&rbacv1.UpdateRoleTemplateRequest{
		Template:   &rbacv1.RoleTemplate{Name: "viewer", Rules: []*rbacv1.PolicyRule{rule("", "pods", "get"), rule("", "services", "get")}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"rules"}},
	})); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, crKey("c1", "viewer"), "rules:pods,services")
	e.waitState(t, crKey("c2", "viewer"), "rules:pods,services")
	check("template rules changed", keys[0], keys[1])

	// An update that changes nothing appends nothing and writes nothing.
	if _, err := e.rbac.UpdateRoleTemplate(bg(), connect.NewRequest(&rbacv1.UpdateRoleTemplateRequest{
		Template:   &rbacv1.RoleTemplate{Name: "viewer", Rules: []*rbacv1.PolicyRule{rule("", "pods", "get"), rule("", "services", "get")}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"rules"}},
	})); err != nil {
		t.Fatal(err)
	}
	check("no-op update")

	// A restarted rbac-sync comes back to the same state without rewriting anything.
	e.stop()
	e2 := start(t, j, rbacsync.Config{})
	e2.waitState(t, rbKey("c1", "web", "viewer"), "subjects:alice")
	e2.bindNS(t, "team-b", "c2", "cache") // a round trip through the fan-out after its reconcile
	e2.waitState(t, rbKey("c2", "cache", "viewer"), "subjects:bob")
	e = e2
	check("restart")
}

// TestStartsBeforeNamespaceBinding: rbac-sync is ready without namespace-binding's view (no
// view, no bindings) and picks the bindings up once namespace-binding runs.
func TestStartsBeforeNamespaceBinding(t *testing.T) {
	j := testkit.StartJetStream(t)
	e := start(t, j, rbacsync.Config{}, withoutNamespaceBinding)
	e.register(t, "c1")
	e.createTemplate(t, "viewer", nil, rule("", "pods", "get"))
	e.bindRole(t, "team-a", user("alice"), "viewer")
	e.waitState(t, crKey("c1", "viewer"), "rules:pods")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	nb, err := namespacebinding.New(ctx, j.JS, namespacebinding.Config{}, testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = nb.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-nb.Ready():
	case <-ctx.Done():
		t.Fatal("namespace-binding not ready")
	}
	if _, err := nb.Projects().CreateProject(ctx, connect.NewRequest(&projectv1.CreateProjectRequest{Name: "team-a"})); err != nil {
		t.Fatal(err)
	}
	if _, err := nb.Projects().BindNamespace(ctx, connect.NewRequest(&projectv1.BindNamespaceRequest{Project: "team-a", Cluster: "c1", Namespace: "web"})); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, rbKey("c1", "web", "viewer"), "subjects:alice")
}
