package cli

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1/rbacv1connect"
)

func TestParseRule(t *testing.T) {
	r := func(verbs, groups, resources, names []string) *rbacv1.PolicyRule {
		return &rbacv1.PolicyRule{Verbs: verbs, ApiGroups: groups, Resources: resources, ResourceNames: names}
	}
	l := func(s ...string) []string { return s }
	cases := []struct {
		in      string
		want    []*rbacv1.PolicyRule
		wantErr string
	}{
		{"get,list:pods", []*rbacv1.PolicyRule{r(l("get", "list"), l(""), l("pods"), nil)}, ""},
		{"get:pods,pods/log", []*rbacv1.PolicyRule{r(l("get"), l(""), l("pods", "pods/log"), nil)}, ""},
		{"*:deployments.apps,services", []*rbacv1.PolicyRule{r(l("*"), l("apps"), l("deployments"), nil), r(l("*"), l(""), l("services"), nil)}, ""},
		{"get:ingresses.networking.k8s.io", []*rbacv1.PolicyRule{r(l("get"), l("networking.k8s.io"), l("ingresses"), nil)}, ""},
		{"get:configmaps:app-config,flags", []*rbacv1.PolicyRule{r(l("get"), l(""), l("configmaps"), l("app-config", "flags"))}, ""},
		{"*:*.*", []*rbacv1.PolicyRule{r(l("*"), l("*"), l("*"), nil)}, ""},
		{"get:/healthz,/metrics", []*rbacv1.PolicyRule{{Verbs: l("get"), NonResourceUrls: l("/healthz", "/metrics")}}, ""},
		{"get", nil, "want VERBS:RESOURCES"},
		{":pods", nil, "want VERBS:RESOURCES"},
		{"get:pods,/healthz", nil, "mixes"},
		{"get:/healthz:x", nil, "no resource names"},
		{"a:b:c:d", nil, "want VERBS:RESOURCES"},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseRule(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, %v; want error with %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || len(got) != len(tc.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
			for i := range got {
				if !proto.Equal(got[i], tc.want[i]) {
					t.Fatalf("rule %d = %v, want %v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

func TestSubjectFlags(t *testing.T) {
	cases := []struct {
		name     string
		flags    subjectFlags
		optional bool
		want     string
		wantErr  string
	}{
		{"user", subjectFlags{user: "alice"}, false, "User:alice", ""},
		{"group", subjectFlags{group: "ops"}, false, "Group:ops", ""},
		{"service account", subjectFlags{serviceAccount: "ci:deployer"}, false, "ServiceAccount:ci:deployer", ""},
		{"service account without namespace", subjectFlags{serviceAccount: "deployer"}, false, "", "NAMESPACE:NAME"},
		{"two", subjectFlags{user: "a", group: "b"}, false, "", "only one"},
		{"none", subjectFlags{}, false, "", "give one"},
		{"none optional", subjectFlags{}, true, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := tc.flags.subject(tc.optional)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, %v; want error with %q", s, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s == nil && tc.want != "" || s != nil && formatSubject(s) != tc.want {
				t.Fatalf("got %v, want %s", s, tc.want)
			}
		})
	}
}

func TestParseTime(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"2026-11-21T10:00:00Z": time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC),
		"2h":                   now.Add(-2 * time.Hour),
		"90m":                  now.Add(-90 * time.Minute),
	} {
		if got, err := parseTime(in, now); err != nil || !got.Equal(want) {
			t.Errorf("parseTime(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "yesterday", "-2h", "2026-11-21"} {
		if _, err := parseTime(bad, now); err == nil {
			t.Errorf("parseTime(%q) accepted", bad)
		}
	}
}

// fakeRBAC records the requests fleetctl sends and answers with canned responses: these tests
// are about what the CLI builds and prints; the service's behaviour is tested in rbac-sync.
type fakeRBAC struct {
	rbacv1connect.UnimplementedRBACServiceHandler
	mu   sync.Mutex
	reqs []proto.Message
}

func (f *fakeRBAC) record(m proto.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs = append(f.reqs, m)
}

func (f *fakeRBAC) last() proto.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reqs[len(f.reqs)-1]
}

func (f *fakeRBAC) CreateRoleTemplate(_ context.Context, req *connect.Request[rbacv1.CreateRoleTemplateRequest]) (*connect.Response[rbacv1.CreateRoleTemplateResponse], error) {
	f.record(req.Msg)
	t := proto.CloneOf(req.Msg.Template)
	t.EffectiveRules = t.Rules
	return connect.NewResponse(&rbacv1.CreateRoleTemplateResponse{Template: t}), nil
}

func (f *fakeRBAC) UpdateRoleTemplate(_ context.Context, req *connect.Request[rbacv1.UpdateRoleTemplateRequest]) (*connect.Response[rbacv1.UpdateRoleTemplateResponse], error) {
	f.record(req.Msg)
	return connect.NewResponse(&rbacv1.UpdateRoleTemplateResponse{Template: req.Msg.Template}), nil
}

func (f *fakeRBAC) BindProjectRole(_ context.Context, req *connect.Request[rbacv1.BindProjectRoleRequest]) (*connect.Response[rbacv1.BindProjectRoleResponse], error) {
	f.record(req.Msg)
	if req.Msg.RoleTemplate == "secret-admin" {
		return nil, connect.NewError(connect.CodePermissionDenied, errString(`"alice" may not grant role template "secret-admin"`))
	}
	return connect.NewResponse(&rbacv1.BindProjectRoleResponse{
		Binding: &rbacv1.ProjectRoleBinding{Project: req.Msg.Project, Subject: req.Msg.Subject, RoleTemplate: req.Msg.RoleTemplate},
		Plan: []*rbacv1.PlannedChange{
			{Cluster: "c1", Namespace: "web", Name: "fleetstream:" + req.Msg.RoleTemplate, Action: rbacv1.ChangeAction_CHANGE_ACTION_CREATE, SubjectsAfter: []*rbacv1.Subject{req.Msg.Subject}},
			{Cluster: "c2", Namespace: "web", Name: "fleetstream:" + req.Msg.RoleTemplate, Action: rbacv1.ChangeAction_CHANGE_ACTION_UPDATE, SubjectsAfter: []*rbacv1.Subject{req.Msg.Subject}},
		},
	}), nil
}

func (f *fakeRBAC) WhoCan(_ context.Context, req *connect.Request[rbacv1.WhoCanRequest]) (*connect.Response[rbacv1.WhoCanResponse], error) {
	f.record(req.Msg)
	return connect.NewResponse(&rbacv1.WhoCanResponse{Project: "team-a", Grants: []*rbacv1.Grant{{
		Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: "alice"}, Project: "team-a",
		Cluster: req.Msg.Cluster, Namespace: req.Msg.Namespace, RoleTemplate: "pod-reader", RoleBinding: "fleetstream:pod-reader",
		Rules: []*rbacv1.PolicyRule{{Verbs: []string{"get", "list"}, ApiGroups: []string{""}, Resources: []string{"pods"}}},
	}}}), nil
}

func (f *fakeRBAC) AccessAt(_ context.Context, req *connect.Request[rbacv1.AccessAtRequest]) (*connect.Response[rbacv1.AccessAtResponse], error) {
	f.record(req.Msg)
	return connect.NewResponse(&rbacv1.AccessAtResponse{}), nil
}

type errString string

func (e errString) Error() string { return string(e) }

func startFakeRBAC(t *testing.T) (*fakeRBAC, func(args ...string) result) {
	t.Helper()
	fake := &fakeRBAC{}
	mux := http.NewServeMux()
	mux.Handle(rbacv1connect.NewRBACServiceHandler(fake))
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	return fake, func(args ...string) result {
		var out, errOut bytes.Buffer
		code := Run(context.Background(), IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut}, append([]string{"--server", hs.URL}, args...))
		return result{code: code, stdout: out.String(), stderr: errOut.String()}
	}
}

func TestRoleMemberAccessCommands(t *testing.T) {
	fake, run := startFakeRBAC(t)

	out := run("role", "create", "deployer", "--inherits", "pod-reader", "--rule", "*:deployments.apps,services", "--display-name", "Deployer").ok(t)
	create := fake.last().(*rbacv1.CreateRoleTemplateRequest).Template
	if create.Name != "deployer" || len(create.Rules) != 2 || create.Inherits[0] != "pod-reader" || create.DisplayName != "Deployer" {
		t.Fatalf("create request %v", create)
	}
	if !strings.Contains(out.stdout, "fleetstream:deployer") {
		t.Fatalf("create output %q", out.stdout)
	}

	run("role", "update", "deployer", "--locked").ok(t)
	upd := fake.last().(*rbacv1.UpdateRoleTemplateRequest)
	if !upd.Template.Locked || len(upd.UpdateMask.Paths) != 1 || upd.UpdateMask.Paths[0] != "locked" {
		t.Fatalf("update request %v", upd)
	}
	run("role", "update", "deployer").fails(t, "error: nothing to update")

	out = run("member", "add", "team-a", "--service-account", "ci:deployer", "--role", "deployer", "--dry-run").ok(t)
	bind := fake.last().(*rbacv1.BindProjectRoleRequest)
	if !bind.DryRun || bind.Subject.Kind != rbacv1.SubjectKind_SUBJECT_KIND_SERVICE_ACCOUNT || bind.Subject.Namespace != "ci" || bind.Project != "team-a" {
		t.Fatalf("bind request %v", bind)
	}
	for _, want := range []string{"would be granted (dry run)", "c1", "create", "c2", "update", "ServiceAccount:ci:deployer"} {
		if !strings.Contains(out.stdout, want) {
			t.Fatalf("dry run output lacks %q:\n%s", want, out.stdout)
		}
	}
	run("member", "add", "team-a", "--user", "bob", "--role", "secret-admin").fails(t, "error: permission_denied: ")
	run("member", "add", "team-a", "--role", "x").fails(t, "error: give one of")

	out = run("access", "who-can", "c1", "web", "list", "pods").ok(t)
	who := fake.last().(*rbacv1.WhoCanRequest)
	if who.Verb != "list" || who.Resource != "pods" || who.Cluster != "c1" {
		t.Fatalf("who-can request %v", who)
	}
	if !strings.Contains(out.stdout, "User:alice") || !strings.Contains(out.stdout, "get,list:pods") {
		t.Fatalf("who-can output %q", out.stdout)
	}
	run("access", "who-can", "c1").fails(t, "error: want CLUSTER NAMESPACE")

	before := time.Now()
	run("access", "at", "--group", "ops", "--time", "2h").ok(t)
	at := fake.last().(*rbacv1.AccessAtRequest)
	if got := at.Time.AsTime(); got.After(before.Add(-2*time.Hour+time.Minute)) || got.Before(before.Add(-2*time.Hour-time.Minute)) {
		t.Fatalf("access at time %v", got)
	}
	if at.Subject.Kind != rbacv1.SubjectKind_SUBJECT_KIND_GROUP {
		t.Fatalf("access at subject %v", at.Subject)
	}
}
