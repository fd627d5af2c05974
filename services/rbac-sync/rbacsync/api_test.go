package rbacsync_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/roles"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/rbac-sync/rbacsync"
)

func TestInvalidInputNamesTheField(t *testing.T) {
	e := start(t, nil, rbacsync.Config{})
	ctx := testkit.Context(t, 30*time.Second)
	e.createTemplate(t, "base", nil, rule("", "pods", "get"))
	ok := rule("", "pods", "get")
	tmpl := func(mut func(*rbacv1.RoleTemplate)) *rbacv1.RoleTemplate {
		t := &rbacv1.RoleTemplate{Name: "x", Rules: []*rbacv1.PolicyRule{proto.CloneOf(ok)}}
		mut(t)
		return t
	}
	cases := []struct {
		name  string
		t     *rbacv1.RoleTemplate
		field string
	}{
		{"no template", nil, "template"},
		{"empty name", tmpl(func(t *rbacv1.RoleTemplate) { t.Name = "" }), "template.name"},
		{"colon in name", tmpl(func(t *rbacv1.RoleTemplate) { t.Name = "a:b" }), "template.name"},
		{"no rules nor inherits", tmpl(func(t *rbacv1.RoleTemplate) { t.Rules = nil }), "template.rules"},
		{"rule without verbs", tmpl(func(t *rbacv1.RoleTemplate) { t.Rules[0].Verbs = nil }), "template.rules[0].verbs"},
		{"rule without api groups", tmpl(func(t *rbacv1.RoleTemplate) { t.Rules[0].ApiGroups = nil }), "template.rules[0].api_groups"},
		{"rule without resources", tmpl(func(t *rbacv1.RoleTemplate) { t.Rules[0].Resources = nil }), "template.rules[0].resources"},
		{"empty verb", tmpl(func(t *rbacv1.RoleTemplate) { t.Rules[0].Verbs = []string{"get", ""} }), "template.rules[0].verbs[1]"},
		{"resources and urls", tmpl(func(t *rbacv1.RoleTemplate) { t.Rules[0].NonResourceUrls = []string{"/healthz"} }), "template.rules[0].non_resource_urls"},
		{"relative url", tmpl(func(t *rbacv1.RoleTemplate) {
			t.Rules = append(t.Rules, &rbacv1.PolicyRule{Verbs: []string{"get"}, NonResourceUrls: []string{"healthz"}})
		}), "template.rules[1].non_resource_urls[0]"},
		{"long display name", tmpl(func(t *rbacv1.RoleTemplate) { t.DisplayName = strings.Repeat("x", 300) }), "template.display_name"},
		{"inherits itself", tmpl(func(t *rbacv1.RoleTemplate) { t.Inherits = []string{"x"} }), "template.inherits[0]"},
		{"inherits twice", tmpl(func(t *rbacv1.RoleTemplate) { t.Inherits = []string{"base", "base"} }), "template.inherits[1]"},
		{"inherits unknown", tmpl(func(t *rbacv1.RoleTemplate) { t.Inherits = []string{"base", "nope"} }), "template.inherits[1]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.rbac.CreateRoleTemplate(ctx, connect.NewRequest(&rbacv1.CreateRoleTemplateRequest{Template: tc.t}))
			if code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.field+":") {
				t.Fatalf("got %v, want InvalidArgument naming %s", err, tc.field)
			}
		})
	}
	bindCases := []struct {
		name  string
		req   *rbacv1.BindProjectRoleRequest
		field string
	}{
		{"no project", &rbacv1.BindProjectRoleRequest{Subject: user("a"), RoleTemplate: "base"}, "project"},
		{"no subject", &rbacv1.BindProjectRoleRequest{Project: "p", RoleTemplate: "base"}, "subject"},
		{"no kind", &rbacv1.BindProjectRoleRequest{Project: "p", Subject: &rbacv1.Subject{Name: "a"}, RoleTemplate: "base"}, "subject.kind"},
		{"user with namespace", &rbacv1.BindProjectRoleRequest{Project: "p", Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: "a", Namespace: "x"}, RoleTemplate: "base"}, "subject.namespace"},
		{"service account without namespace", &rbacv1.BindProjectRoleRequest{Project: "p", Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_SERVICE_ACCOUNT, Name: "ci"}, RoleTemplate: "base"}, "subject.namespace"},
		{"bad service account", &rbacv1.BindProjectRoleRequest{Project: "p", Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_SERVICE_ACCOUNT, Name: "CI", Namespace: "ci"}, RoleTemplate: "base"}, "subject.name"},
		{"no role", &rbacv1.BindProjectRoleRequest{Project: "p", Subject: user("a")}, "role_template"},
	}
	for _, tc := range bindCases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.rbac.BindProjectRole(ctx, connect.NewRequest(tc.req))
			if code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.field+":") {
				t.Fatalf("got %v, want InvalidArgument naming %s", err, tc.field)
			}
		})
	}
	// Nothing half-written: base and the three built-in project roles only.
	list, err := e.rbac.ListRoleTemplates(ctx, connect.NewRequest(&rbacv1.ListRoleTemplatesRequest{}))
	if err != nil || len(list.Msg.Templates) != 1+len(roles.Builtin()) {
		t.Fatalf("after invalid requests: %v %v", list, err)
	}
	if _, err := e.rbac.UpdateRoleTemplate(ctx, connect.NewRequest(&rbacv1.UpdateRoleTemplateRequest{Template: &rbacv1.RoleTemplate{Name: "base"},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"name"}}})); code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "update_mask.paths[0]") {
		t.Fatalf("update of name: %v", err)
	}
	if _, err := e.rbac.BindProjectRole(ctx, connect.NewRequest(&rbacv1.BindProjectRoleRequest{Project: "p", Subject: user("a"), RoleTemplate: "nope"})); code(err) != connect.CodeNotFound {
		t.Fatalf("bind of unknown template: %v", err)
	}
}

func TestInheritanceUnionAndCycles(t *testing.T) {
	e := start(t, nil, rbacsync.Config{})
	ctx := testkit.Context(t, 30*time.Second)
	e.register(t, "c1")
	e.createTemplate(t, "a", nil, rule("", "pods", "get"))
	e.createTemplate(t, "b", []string{"a"}, rule("", "services", "get"))
	c := e.createTemplate(t, "c", []string{"b"}, rule("apps", "deployments", "get"), rule("", "pods", "get"))
	if len(c.EffectiveRules) != 3 {
		t.Fatalf("effective rules of c: %v", c.EffectiveRules)
	}
	e.waitState(t, crKey("c1", "c"), "rules:deployments,pods,services")

	cases := []struct {
		name     string
		template string
		inherits []string
		field    string
		path     string
	}{
		{"direct", "a", []string{"c"}, "template.inherits[0]", "a → c → b → a"},
		{"second entry", "b", []string{"a", "c"}, "template.inherits[1]", "b → c → b"},
		{"self", "a", []string{"a"}, "template.inherits[0]", "itself"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.rbac.UpdateRoleTemplate(ctx, connect.NewRequest(&rbacv1.UpdateRoleTemplateRequest{
				Template: &rbacv1.RoleTemplate{Name: tc.template, Inherits: tc.inherits}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"inherits"}}}))
			if code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.field+":") || !strings.Contains(err.Error(), tc.path) {
				t.Fatalf("got %v, want InvalidArgument naming %s with %q", err, tc.field, tc.path)
			}
		})
	}
	// A change to an ancestor reaches every heir's ClusterRole.
	if _, err := e.rbac.UpdateRoleTemplate(ctx, connect.NewRequest(&rbacv1.UpdateRoleTemplateRequest{
		Template: &rbacv1.RoleTemplate{Name: "a", Rules: []*rbacv1.PolicyRule{rule("", "secrets", "get")}}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"rules"}}})); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, crKey("c1", "c"), "rules:deployments,pods,secrets,services")
	e.waitState(t, crKey("c1", "b"), "rules:secrets,services")
	// An inherited template cannot go; a leaf can.
	if _, err := e.rbac.DeleteRoleTemplate(ctx, connect.NewRequest(&rbacv1.DeleteRoleTemplateRequest{Name: "b"})); code(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "c") {
		t.Fatalf("delete of inherited template: %v", err)
	}
	if _, err := e.rbac.DeleteRoleTemplate(ctx, connect.NewRequest(&rbacv1.DeleteRoleTemplateRequest{Name: "c"})); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, crKey("c1", "c"), "tombstone")
}

// TestNoPrivilegeEscalation: only platform admins manage templates; anyone else binds a role
// in a project only with permission to manage role bindings there and only if it holds every
// rule of the role there itself.
func TestNoPrivilegeEscalation(t *testing.T) {
	e := start(t, nil, rbacsync.Config{})
	ctx := testkit.Context(t, 30*time.Second)
	e.createTemplate(t, "pod-reader", nil, rule("", "pods", "get", "list"))
	e.createTemplate(t, "secret-reader", nil, rule("", "secrets", "get"))
	e.createTemplate(t, "binder", []string{"pod-reader"}, rule("rbac.authorization.k8s.io", "rolebindings", "create", "delete"))
	e.createTemplate(t, "secret-binder", nil, rule("rbac.authorization.k8s.io", "clusterroles", "bind"), rule("rbac.authorization.k8s.io", "rolebindings", "create"))
	e.bindRole(t, "team-a", user("alice"), "binder")
	e.bindRole(t, "team-a", user("carol"), "secret-binder")
	e.bindRole(t, "team-a", &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_GROUP, Name: "binders"}, "binder")

	if _, err := e.as["alice"].CreateRoleTemplate(ctx, connect.NewRequest(&rbacv1.CreateRoleTemplateRequest{Template: &rbacv1.RoleTemplate{Name: "mine", Rules: []*rbacv1.PolicyRule{rule("", "pods", "get")}}})); code(err) != connect.CodePermissionDenied {
		t.Fatalf("non-admin created a template: %v", err)
	}
	bind := func(as, project, role string, s *rbacv1.Subject) error {
		_, err := e.as[as].BindProjectRole(ctx, connect.NewRequest(&rbacv1.BindProjectRoleRequest{Project: project, Subject: s, RoleTemplate: role}))
		return err
	}
	cases := []struct {
		name, as, project, role string
		want                    connect.Code
		says                    string
	}{
		{"holds every rule", "alice", "team-a", "pod-reader", 0, ""},
		{"lacks a rule", "alice", "team-a", "secret-reader", connect.CodePermissionDenied, "resources=secrets"},
		{"its own role", "alice", "team-a", "binder", 0, ""},
		{"another project", "alice", "team-b", "pod-reader", connect.CodePermissionDenied, "rolebindings"},
		{"no bindings at all", "bob", "team-a", "pod-reader", connect.CodePermissionDenied, "rolebindings"},
		{"bind permission instead of the rules", "carol", "team-a", "secret-reader", 0, ""},
		{"admin", "admin", "team-b", "secret-reader", 0, ""},
		{"holds the rules through a group", "dave", "team-a", "pod-reader", 0, ""},
		{"a group does not lift the rule check", "dave", "team-a", "secret-reader", connect.CodePermissionDenied, "resources=secrets"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := bind(tc.as, tc.project, tc.role, user("u"+string(rune('a'+i))))
			if tc.want == 0 && err != nil || tc.want != 0 && (code(err) != tc.want || !strings.Contains(err.Error(), tc.says)) {
				t.Fatalf("got %v, want %v saying %q", err, tc.want, tc.says)
			}
		})
	}
	// Unbinding needs delete on rolebindings: alice has it, carol does not.
	if _, err := e.as["carol"].UnbindProjectRole(ctx, connect.NewRequest(&rbacv1.UnbindProjectRoleRequest{Project: "team-a", Subject: user("ua"), RoleTemplate: "pod-reader"})); code(err) != connect.CodePermissionDenied {
		t.Fatalf("carol unbound: %v", err)
	}
	if _, err := e.as["alice"].UnbindProjectRole(ctx, connect.NewRequest(&rbacv1.UnbindProjectRoleRequest{Project: "team-a", Subject: user("ua"), RoleTemplate: "pod-reader"})); err != nil {
		t.Fatalf("alice unbind: %v", err)
	}
	// The events name who did it.
	list, err := e.rbac.ListProjectRoleBindings(ctx, connect.NewRequest(&rbacv1.ListProjectRoleBindingsRequest{Project: "team-a", RoleTemplate: "binder"}))
	if err != nil || len(list.Msg.Bindings) != 3 { // alice, group binders, and uc granted by alice
		t.Fatalf("list: %v %v", list, err)
	}
	for _, b := range list.Msg.Bindings {
		if b.Subject.Name == "uc" && b.Creator != "alice" {
			t.Fatalf("binding made by alice attributed to %q", b.Creator)
		}
	}
}

func TestLockedTemplateKeepsBindingsButTakesNoNewOnes(t *testing.T) {
	e := start(t, nil, rbacsync.Config{})
	ctx := testkit.Context(t, 30*time.Second)
	e.register(t, "c1")
	e.createProject(t, "team-a")
	e.bindNS(t, "team-a", "c1", "web")
	e.createTemplate(t, "legacy", nil, rule("", "pods", "get"))
	e.bindRole(t, "team-a", user("alice"), "legacy")
	if _, err := e.rbac.UpdateRoleTemplate(ctx, connect.NewRequest(&rbacv1.UpdateRoleTemplateRequest{
		Template: &rbacv1.RoleTemplate{Name: "legacy", Locked: true}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"locked"}}})); err != nil {
		t.Fatal(err)
	}
	_, err := e.rbac.BindProjectRole(ctx, connect.NewRequest(&rbacv1.BindProjectRoleRequest{Project: "team-a", Subject: user("bob"), RoleTemplate: "legacy"}))
	if code(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "locked") {
		t.Fatalf("bind of locked template: %v", err)
	}
	e.waitState(t, rbKey("c1", "web", "legacy"), "subjects:alice")
	// Existing bindings can still be removed.
	e.unbindRole(t, "team-a", user("alice"), "legacy")
	e.waitState(t, rbKey("c1", "web", "legacy"), "tombstone")
}

func TestDryRunListsRoleBindingChangesAndWritesNothing(t *testing.T) {
	e := start(t, nil, rbacsync.Config{})
	ctx := testkit.Context(t, 30*time.Second)
	e.register(t, "c1", "c2")
	e.createProject(t, "team-a")
	e.bindNS(t, "team-a", "c1", "web", "api")
	e.bindNS(t, "team-a", "c2", "web")
	e.createTemplate(t, "viewer", nil, rule("", "pods", "get"))

	type change struct{ cluster, ns, action string }
	planOf := func(p []*rbacv1.PlannedChange) []change {
		var out []change
		for _, c := range p {
			out = append(out, change{c.Cluster, c.Namespace, strings.TrimPrefix(c.Action.String(), "CHANGE_ACTION_")})
		}
		return out
	}
	want := []change{{"c1", "api", "CREATE"}, {"c1", "web", "CREATE"}, {"c2", "web", "CREATE"}}
	// The namespace bindings are namespace-binding's; rbac-sync sees them through their view a
	// moment later, so the plan is asked until it covers them (a dry run writes nothing).
	testkit.Eventually(t, 10*time.Second, func() error {
		dry, err := e.rbac.BindProjectRole(ctx, connect.NewRequest(&rbacv1.BindProjectRoleRequest{Project: "team-a", Subject: user("alice"), RoleTemplate: "viewer", DryRun: true}))
		if err != nil {
			return err
		}
		if got := planOf(dry.Msg.Plan); !equal(got, want) {
			return fmt.Errorf("dry run plan %v, want %v", got, want)
		}
		return nil
	})
	e.settle(t) // so a RoleBinding the dry run caused would be written by now
	list, _ := e.rbac.ListProjectRoleBindings(ctx, connect.NewRequest(&rbacv1.ListProjectRoleBindingsRequest{}))
	if len(list.Msg.Bindings) != 0 || e.get(t, rbKey("c1", "web", "viewer")).present {
		t.Fatal("dry run wrote something")
	}
	real := e.bindRole(t, "team-a", user("alice"), "viewer")
	if got := planOf(real.Plan); !equal(got, want) {
		t.Fatalf("plan %v, want %v", got, want)
	}
	e.waitState(t, rbKey("c2", "web", "viewer"), "subjects:alice")

	dry, err := e.rbac.BindProjectRole(ctx, connect.NewRequest(&rbacv1.BindProjectRoleRequest{Project: "team-a", Subject: user("bob"), RoleTemplate: "viewer", DryRun: true}))
	if err != nil {
		t.Fatal(err)
	}
	if got := planOf(dry.Msg.Plan); !equal(got, []change{{"c1", "api", "UPDATE"}, {"c1", "web", "UPDATE"}, {"c2", "web", "UPDATE"}}) {
		t.Fatalf("second subject plan %v", got)
	}
	if s := dry.Msg.Plan[0]; len(s.SubjectsBefore) != 1 || len(s.SubjectsAfter) != 2 {
		t.Fatalf("subjects before/after: %v", s)
	}
	undo, err := e.rbac.UnbindProjectRole(ctx, connect.NewRequest(&rbacv1.UnbindProjectRoleRequest{Project: "team-a", Subject: user("alice"), RoleTemplate: "viewer", DryRun: true}))
	if err != nil {
		t.Fatal(err)
	}
	if got := planOf(undo.Msg.Plan); !equal(got, []change{{"c1", "api", "DELETE"}, {"c1", "web", "DELETE"}, {"c2", "web", "DELETE"}}) {
		t.Fatalf("unbind plan %v", got)
	}
	e.waitState(t, rbKey("c1", "web", "viewer"), "subjects:alice")
}

func equal[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestWhoCanAndAccessAt(t *testing.T) {
	e := start(t, nil, rbacsync.Config{})
	ctx := testkit.Context(t, 30*time.Second)
	e.register(t, "c1", "c2")
	e.createProject(t, "team-a", "team-b")
	// The same namespace name on two clusters belongs to two projects.
	e.bindNS(t, "team-a", "c1", "web")
	e.bindNS(t, "team-b", "c2", "web")
	e.createTemplate(t, "viewer", nil, rule("", "pods", "get", "list"))
	e.createTemplate(t, "editor", []string{"viewer"}, rule("", "pods", "update"))

	// AccessAt answers for points in time: the sleeps keep t0, t1 and t2 apart from the event
	// times around them.
	t0 := time.Now()
	time.Sleep(20 * time.Millisecond)
	e.bindRole(t, "team-a", user("alice"), "editor")
	e.bindRole(t, "team-b", user("bob"), "viewer")
	ci := &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_SERVICE_ACCOUNT, Name: "ci", Namespace: "tools"}
	e.bindRole(t, "team-a", ci, "viewer")
	time.Sleep(20 * time.Millisecond)
	t1 := time.Now()
	time.Sleep(20 * time.Millisecond)
	e.unbindRole(t, "team-a", user("alice"), "editor")
	e.unbindNS(t, "team-b", "c2", "web")
	time.Sleep(20 * time.Millisecond)
	t2 := time.Now()

	who := func(cluster, ns, verb, resource string) (string, []string) {
		res, err := e.rbac.WhoCan(ctx, connect.NewRequest(&rbacv1.WhoCanRequest{Cluster: cluster, Namespace: ns, Verb: verb, Resource: resource}))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, g := range res.Msg.Grants {
			out = append(out, g.Subject.Name+"="+g.RoleTemplate)
		}
		return res.Msg.Project, out
	}
	// Namespace bindings are namespace-binding's: rbac-sync sees them through their view a
	// moment later, so its answers about them are waited for.
	eventually := func(check func() error) { testkit.Eventually(t, 10*time.Second, check) }
	eventually(func() error {
		if p, got := who("c1", "web", "", ""); p != "team-a" || join(got) != "ci=viewer" {
			return fmt.Errorf("who can in c1/web: %s %v", p, got)
		}
		return nil
	})
	eventually(func() error {
		if p, got := who("c2", "web", "", ""); p != "" || len(got) != 0 {
			return fmt.Errorf("who can in unbound c2/web: %s %v", p, got)
		}
		return nil
	})
	e.bindRole(t, "team-a", user("carol"), "editor")
	eventually(func() error {
		if _, got := who("c1", "web", "update", "pods"); join(got) != "carol=editor" {
			return fmt.Errorf("who can update pods: %v", got)
		}
		return nil
	})
	if _, err := e.rbac.WhoCan(ctx, connect.NewRequest(&rbacv1.WhoCanRequest{Cluster: "c1", Namespace: "web", Verb: "get"})); code(err) != connect.CodeInvalidArgument {
		t.Fatalf("verb without resource: %v", err)
	}

	at := func(s *rbacv1.Subject, when time.Time) []string {
		res, err := e.rbac.AccessAt(ctx, connect.NewRequest(&rbacv1.AccessAtRequest{Subject: s, Time: timestamppb.New(when)}))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, g := range res.Msg.Grants {
			out = append(out, g.Cluster+"/"+g.Namespace+"="+g.RoleTemplate+":"+g.Project+":"+string(rune('0'+len(g.Rules))))
		}
		return out
	}
	cases := []struct {
		name string
		s    *rbacv1.Subject
		when time.Time
		want string
	}{
		{"alice before", user("alice"), t0, ""},
		{"alice while bound", user("alice"), t1, "c1/web=editor:team-a:2"},
		{"alice after unbind", user("alice"), t2, ""},
		{"bob while bound", user("bob"), t1, "c2/web=viewer:team-b:1"},
		{"bob after namespace unbound", user("bob"), t2, ""},
		{"service account", ci, t2, "c1/web=viewer:team-a:1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := join(at(tc.s, tc.when)); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
	// The stream positions count every tenant's changes: only a platform admin learns them.
	asked := connect.NewRequest(&rbacv1.AccessAtRequest{Subject: user("carol"), Time: timestamppb.Now()})
	if res, err := e.rbac.AccessAt(ctx, asked); err != nil || res.Msg.RbacSequence == 0 || res.Msg.ProjectSequence == 0 {
		t.Fatalf("an admin's AccessAt: %v %v", res, err)
	}
	if res, err := e.as["carol"].AccessAt(ctx, asked); err != nil || res.Msg.RbacSequence != 0 || res.Msg.ProjectSequence != 0 {
		t.Fatalf("a project member's AccessAt shows fleet-wide positions: %v %v", res, err)
	}
}

func TestPropagationStatusFollowsAgentReports(t *testing.T) {
	e := start(t, nil, rbacsync.Config{})
	ctx := testkit.Context(t, 30*time.Second)
	e.register(t, "c1", "c2")
	e.createProject(t, "team-a")
	e.bindNS(t, "team-a", "c1", "web")
	e.createTemplate(t, "viewer", nil, rule("", "pods", "get"))
	e.bindRole(t, "team-a", user("alice"), "viewer")
	e.waitState(t, rbKey("c1", "web", "viewer"), "subjects:alice")
	e.waitState(t, crKey("c2", "viewer"), "rules:pods")

	applied, err := e.js.JS.KeyValue(ctx, subjects.AppliedBucket)
	if err != nil {
		t.Fatal(err)
	}
	// What the agents of c1 and c2 would report.
	report := func(key string, rev uint64, phase desiredv1.Phase, reason string) {
		data, _ := proto.Marshal(&desiredv1.AppliedStatus{DesiredRevision: rev, Phase: phase, Reason: reason, Time: timestamppb.Now()})
		if _, err := applied.Put(ctx, subjects.AppliedKey(subjects.DesiredRBACBucket, key), data); err != nil {
			t.Fatal(err)
		}
	}
	report(crKey("c1", "viewer"), e.get(t, crKey("c1", "viewer")).revision, desiredv1.Phase_PHASE_APPLIED, "")
	report(crKey("c2", "viewer"), e.get(t, crKey("c2", "viewer")).revision, desiredv1.Phase_PHASE_FAILED, "Forbidden")
	report(rbKey("c1", "web", "viewer"), e.get(t, rbKey("c1", "web", "viewer")).revision, desiredv1.Phase_PHASE_APPLIED, "")

	status := func(req *rbacv1.GetPropagationStatusRequest) *rbacv1.GetPropagationStatusResponse {
		res, err := e.rbac.GetPropagationStatus(ctx, connect.NewRequest(req))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg
	}
	byTemplate := &rbacv1.GetPropagationStatusRequest{Target: &rbacv1.GetPropagationStatusRequest_RoleTemplate{RoleTemplate: "viewer"}}
	testkit.Eventually(t, 10*time.Second, func() error {
		st := status(byTemplate)
		if st.UpToDate != 1 || st.Failed != 1 || len(st.Clusters) != 2 || st.Clusters[1].Reason != "Forbidden" {
			return fmt.Errorf("template status %v", st)
		}
		return nil
	})
	byBinding := &rbacv1.GetPropagationStatusRequest{Target: &rbacv1.GetPropagationStatusRequest_Binding{Binding: &rbacv1.BindingRef{Project: "team-a", Subject: user("alice"), RoleTemplate: "viewer"}}}
	// Each report reaches the status cache on its own; wait for the RoleBinding's too.
	testkit.Eventually(t, 10*time.Second, func() error {
		if st := status(byBinding); st.UpToDate != 1 || len(st.Clusters) != 1 || st.Clusters[0].Namespace != "web" {
			return fmt.Errorf("binding status %v", st)
		}
		return nil
	})
	// A new desired revision is pending until the agent reports it.
	e.bindRole(t, "team-a", user("bob"), "viewer")
	e.waitState(t, rbKey("c1", "web", "viewer"), "subjects:alice,bob")
	testkit.Eventually(t, 10*time.Second, func() error {
		if st := status(byBinding); st.Pending != 1 || st.Clusters[0].UpToDate {
			return fmt.Errorf("binding status after change %v", st)
		}
		return nil
	})
}

// TestTemplateDryRunListsClusterRolesAndWritesNothing: a role template's dry run decides as the
// write (the same refusals), lists the ClusterRoles that would change on each registered
// cluster (the template's own and its heirs' whose effective rules change; none for a display
// name) and writes nothing.
func TestTemplateDryRunListsClusterRolesAndWritesNothing(t *testing.T) {
	e := start(t, nil, rbacsync.Config{})
	ctx := testkit.Context(t, 30*time.Second)
	e.register(t, "c1", "c2")
	viewer := e.createTemplate(t, "viewer", nil, rule("", "pods", "get"))
	e.createTemplate(t, "editor", []string{"viewer"}, rule("", "pods", "delete"))
	e.createTemplate(t, "other", nil, rule("", "services", "get"))

	type change struct{ cluster, name, action string }
	planOf := func(p []*rbacv1.PlannedChange) []change {
		var out []change
		for _, c := range p {
			if c.Namespace != "" {
				t.Fatalf("a template's plan names a namespace: %v", c)
			}
			out = append(out, change{c.Cluster, c.Name, strings.TrimPrefix(c.Action.String(), "CHANGE_ACTION_")})
		}
		return out
	}
	update := func(fields []string, tmpl *rbacv1.RoleTemplate) (*connect.Response[rbacv1.UpdateRoleTemplateResponse], error) {
		return e.rbac.UpdateRoleTemplate(ctx, connect.NewRequest(&rbacv1.UpdateRoleTemplateRequest{Template: tmpl,
			UpdateMask: &fieldmaskpb.FieldMask{Paths: fields}, DryRun: true}))
	}
	want := []change{{"c1", "fleetstream:viewer", "UPDATE"}, {"c1", "fleetstream:editor", "UPDATE"},
		{"c2", "fleetstream:viewer", "UPDATE"}, {"c2", "fleetstream:editor", "UPDATE"}}
	// The clusters reach rbac-sync through cluster-import's view a moment later.
	testkit.Eventually(t, 10*time.Second, func() error {
		res, err := update([]string{"rules"}, &rbacv1.RoleTemplate{Name: "viewer", Rules: []*rbacv1.PolicyRule{rule("", "pods", "get", "list")}})
		if err != nil {
			return err
		}
		if got := planOf(res.Msg.Plan); !equal(got, want) {
			return fmt.Errorf("plan %v, want %v", got, want)
		}
		return nil
	})
	if res, err := update([]string{"display_name"}, &rbacv1.RoleTemplate{Name: "viewer", DisplayName: "Viewer"}); err != nil || len(res.Msg.Plan) != 0 {
		t.Fatalf("display name dry run: plan %v, %v; want no ClusterRole change", res.Msg.GetPlan(), err)
	}
	created, err := e.rbac.CreateRoleTemplate(ctx, connect.NewRequest(&rbacv1.CreateRoleTemplateRequest{
		Template: &rbacv1.RoleTemplate{Name: "auditor", Inherits: []string{"viewer"}}, DryRun: true}))
	if err != nil {
		t.Fatal(err)
	}
	if got := planOf(created.Msg.Plan); !equal(got, []change{{"c1", "fleetstream:auditor", "CREATE"}, {"c2", "fleetstream:auditor", "CREATE"}}) {
		t.Fatalf("create plan %v", got)
	}
	if len(created.Msg.Template.EffectiveRules) != 1 {
		t.Fatalf("dry run's effective rules %v, want viewer's", created.Msg.Template.EffectiveRules)
	}

	// Refusals are the write's own.
	cycle := &rbacv1.RoleTemplate{Name: "viewer", Inherits: []string{"editor"}}
	_, dryErr := update([]string{"inherits"}, cycle)
	_, realErr := e.rbac.UpdateRoleTemplate(ctx, connect.NewRequest(&rbacv1.UpdateRoleTemplateRequest{Template: cycle, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"inherits"}}}))
	if dryErr == nil || realErr == nil || dryErr.Error() != realErr.Error() {
		t.Fatalf("cycle: dry run %v, write %v; want the same refusal", dryErr, realErr)
	}
	_, dryErr = e.rbac.DeleteRoleTemplate(ctx, connect.NewRequest(&rbacv1.DeleteRoleTemplateRequest{Name: "viewer", DryRun: true}))
	_, realErr = e.rbac.DeleteRoleTemplate(ctx, connect.NewRequest(&rbacv1.DeleteRoleTemplateRequest{Name: "viewer"}))
	if connect.CodeOf(dryErr) != connect.CodeFailedPrecondition || dryErr.Error() != realErr.Error() {
		t.Fatalf("delete of an inherited template: dry run %v, write %v; want the same refusal", dryErr, realErr)
	}
	if _, err := e.rbac.DeleteRoleTemplate(ctx, connect.NewRequest(&rbacv1.DeleteRoleTemplateRequest{Name: "other", DryRun: true})); err != nil {
		t.Fatal(err)
	}

	e.settle(t)
	got, err := e.rbac.GetRoleTemplate(ctx, connect.NewRequest(&rbacv1.GetRoleTemplateRequest{Name: "viewer"}))
	if err != nil {
		t.Fatal(err)
	}
	if got.Msg.Template.Revision != viewer.Revision || got.Msg.Template.DisplayName != "" {
		t.Fatalf("a dry run changed viewer: %v", got.Msg.Template)
	}
	list, err := e.rbac.ListRoleTemplates(ctx, connect.NewRequest(&rbacv1.ListRoleTemplatesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, tmpl := range list.Msg.Templates {
		if tmpl.Name == "auditor" {
			t.Fatal("a dry run created auditor")
		}
	}
	if _, err := e.rbac.GetRoleTemplate(ctx, connect.NewRequest(&rbacv1.GetRoleTemplateRequest{Name: "other"})); err != nil {
		t.Fatalf("a dry run deleted other: %v", err)
	}
}
