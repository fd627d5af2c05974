package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/rbac-sync/rbacsync"
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

// startRBACHub runs the real rbac-sync on the hub, with alice (the default token) as the one
// platform admin; bob is an ordinary user.
func startRBACHub(t *testing.T) *hubEnv {
	t.Helper()
	return startHub(t, rbacSync(t))
}

// rbacSync is the real rbac-sync as a hub service.
func rbacSync(t *testing.T) newHubService {
	return func(ctx context.Context, js *testkit.JetStream) (hubService, error) {
		svc, err := rbacsync.New(ctx, js.JS, rbacsync.Config{}, testkit.Logger(t))
		if err != nil {
			return nil, err
		}
		return svc, nil
	}
}

type ruleJSON struct {
	Verbs     []string `json:"verbs"`
	APIGroups []string `json:"apiGroups"`
	Resources []string `json:"resources"`
}

type roleJSON struct {
	Name           string     `json:"name"`
	DisplayName    string     `json:"displayName"`
	Rules          []ruleJSON `json:"rules"`
	Inherits       []string   `json:"inherits"`
	Locked         bool       `json:"locked"`
	EffectiveRules []ruleJSON `json:"effectiveRules"`
}

type grantJSON struct {
	Subject struct {
		Kind string `json:"kind"`
		Name string `json:"name"`
	} `json:"subject"`
	Project      string `json:"project"`
	Cluster      string `json:"cluster"`
	Namespace    string `json:"namespace"`
	RoleTemplate string `json:"roleTemplate"`
}

func TestRoleMemberAccessCommands(t *testing.T) {
	h := startRBACHub(t)
	// Team-a owns namespace web on two clusters: its role bindings land in both.
	h.run(t, "cluster", "register", "c1").ok(t)
	h.run(t, "cluster", "register", "c2").ok(t)
	h.run(t, "project", "create", "team-a").ok(t)
	h.run(t, "namespace", "bind", "web", "-p", "team-a", "-c", "c1").ok(t)
	h.run(t, "namespace", "bind", "web", "-p", "team-a", "-c", "c2").ok(t)

	// Role templates: the flags become the stored template.
	h.run(t, "role", "create", "pod-reader", "--rule", "get,list:pods").ok(t)
	out := h.run(t, "role", "create", "deployer", "--inherits", "pod-reader", "--rule", "*:deployments.apps,services", "--display-name", "Deployer").ok(t)
	if !strings.Contains(out.stdout, "fleetstream:deployer") {
		t.Fatalf("create output %q", out.stdout)
	}
	create := jsonOf[roleJSON](t, h.run(t, "-o", "json", "role", "get", "deployer").ok(t))
	if create.Name != "deployer" || len(create.Rules) != 2 || len(create.Inherits) != 1 || create.Inherits[0] != "pod-reader" ||
		create.DisplayName != "Deployer" || len(create.EffectiveRules) != 3 {
		t.Fatalf("created template %+v", create)
	}
	if r := create.Rules[0]; strings.Join(r.APIGroups, ",") != "apps" || strings.Join(r.Resources, ",") != "deployments" || strings.Join(r.Verbs, ",") != "*" {
		t.Fatalf("rule 0 = %+v", r)
	}
	h.run(t, "role", "create", "pod-reader", "--rule", "get:pods").fails(t, "error: already_exists: ")
	// Only platform admins manage templates.
	h.runAs(t, bobToken, "role", "create", "bobs", "--rule", "get:pods").fails(t, "error: permission_denied: ")

	// Update replaces only the fields whose flags are given: locking keeps the rules.
	h.run(t, "role", "update", "deployer", "--locked").ok(t)
	upd := jsonOf[roleJSON](t, h.run(t, "-o", "json", "role", "get", "deployer").ok(t))
	if !upd.Locked || len(upd.Rules) != 2 || len(upd.Inherits) != 1 || upd.DisplayName != "Deployer" {
		t.Fatalf("updated template %+v", upd)
	}
	h.run(t, "role", "update", "deployer").fails(t, "error: nothing to update")
	// A locked template takes no new bindings.
	h.run(t, "member", "add", "team-a", "--user", "bob", "--role", "deployer").fails(t, "error: failed_precondition: ")
	h.run(t, "role", "update", "deployer", "--locked=false").ok(t)

	// A dry run lists the RoleBindings per cluster and changes nothing. The plan comes from the
	// fan-out's model, which follows the namespace bindings asynchronously.
	dryRun := func(wantAction string) string {
		t.Helper()
		var stdout string
		testkit.Eventually(t, 10*time.Second, func() error {
			stdout = h.run(t, "member", "add", "team-a", "--service-account", "ci:deployer", "--role", "deployer", "--dry-run").ok(t).stdout
			for _, want := range []string{"would be granted (dry run)", "c1", "c2", "web", "fleetstream:deployer", wantAction, "ServiceAccount:ci:deployer"} {
				if !strings.Contains(stdout, want) {
					return fmt.Errorf("dry run output lacks %q:\n%s", want, stdout)
				}
			}
			return nil
		})
		return stdout
	}
	dryRun("create")
	if r := h.run(t, "member", "list", "team-a").ok(t); strings.Contains(r.stdout, "ServiceAccount:ci:deployer") {
		t.Fatalf("the dry run bound:\n%s", r.stdout)
	}
	// With bob bound, the service account would be added to the existing RoleBindings.
	out = h.run(t, "member", "add", "team-a", "--user", "bob", "--role", "deployer").ok(t)
	if !strings.Contains(out.stdout, `User:bob granted role "deployer" in project "team-a"`) {
		t.Fatalf("member add output:\n%s", out.stdout)
	}
	if after := dryRun("update"); !strings.Contains(after, "User:bob") {
		t.Fatalf("dry run after binding bob lacks him:\n%s", after)
	}
	r := h.run(t, "member", "list", "team-a", "--user", "bob").ok(t)
	if !strings.Contains(r.stdout, "User:bob") || !strings.Contains(r.stdout, "deployer") || !strings.Contains(r.stdout, "alice") {
		t.Fatalf("member list:\n%s", r.stdout)
	}

	// Bob is no platform admin and may not manage role bindings in team-a.
	h.run(t, "role", "create", "secret-admin", "--rule", "*:secrets").ok(t)
	r = h.runAs(t, bobToken, "member", "add", "team-a", "--user", "bob", "--role", "secret-admin")
	r.fails(t, "error: permission_denied: ")
	if !strings.Contains(r.stderr, `"bob" may not`) {
		t.Fatalf("permission denied does not name the caller: %s", r.stderr)
	}
	h.run(t, "member", "add", "team-a", "--role", "x").fails(t, "error: give one of")
	h.run(t, "member", "add", "team-a", "--user", "bob", "--role", "nope").fails(t, "error: not_found: ")

	// Who can: the grants in a namespace, filtered by verb and resource.
	h.run(t, "member", "add", "team-a", "--user", "alice", "--role", "pod-reader").ok(t)
	testkit.Eventually(t, 10*time.Second, func() error {
		out := h.run(t, "access", "who-can", "c1", "web", "list", "pods").ok(t).stdout
		for _, want := range []string{`belongs to project "team-a"`, "User:alice", "get,list:pods", "User:bob", "fleetstream:pod-reader"} {
			if !strings.Contains(out, want) {
				return fmt.Errorf("who-can output lacks %q:\n%s", want, out)
			}
		}
		return nil
	})
	out = h.run(t, "access", "who-can", "c1", "web", "delete", "pods").ok(t)
	if strings.Contains(out.stdout, "User:") {
		t.Fatalf("who-can delete pods:\n%s", out.stdout)
	}
	out = h.run(t, "access", "who-can", "c1", "web", "update", "deployments", "--api-group", "apps").ok(t)
	if !strings.Contains(out.stdout, "User:bob") || strings.Contains(out.stdout, "User:alice") {
		t.Fatalf("who-can update deployments.apps:\n%s", out.stdout)
	}
	out = h.run(t, "access", "who-can", "c1", "other").ok(t)
	if !strings.Contains(out.stdout, "c1/other belongs to no project") {
		t.Fatalf("who-can in an unowned namespace:\n%s", out.stdout)
	}
	h.run(t, "access", "who-can", "c1").fails(t, "error: want CLUSTER NAMESPACE")

	// Access at a moment, answered from the event log: two hours ago nothing existed; now the
	// group holds its role in web on both clusters.
	h.run(t, "member", "add", "team-a", "--group", "ops", "--role", "pod-reader").ok(t)
	before := time.Now()
	out = h.run(t, "access", "at", "--group", "ops", "--time", "2h").ok(t)
	header, _, _ := strings.Cut(out.stdout, "\n")
	at, err := time.Parse(time.RFC3339, strings.TrimSuffix(strings.TrimPrefix(header, "Group:ops at "), ":"))
	if err != nil || at.After(before.Add(-2*time.Hour+time.Minute)) || at.Before(before.Add(-2*time.Hour-time.Minute)) {
		t.Fatalf("access at header %q: %v", header, err)
	}
	if past := jsonOf[struct {
		Grants []grantJSON `json:"grants"`
	}](t, h.run(t, "-o", "json", "access", "at", "--group", "ops", "--time", "2h").ok(t)); len(past.Grants) != 0 {
		t.Fatalf("grants two hours ago: %+v", past.Grants)
	}
	now := jsonOf[struct {
		Grants []grantJSON `json:"grants"`
	}](t, h.run(t, "-o", "json", "access", "at", "--group", "ops", "--time", "0s").ok(t))
	var places []string
	for _, g := range now.Grants {
		if g.Subject.Kind != "SUBJECT_KIND_GROUP" || g.Subject.Name != "ops" || g.Project != "team-a" || g.RoleTemplate != "pod-reader" {
			t.Fatalf("grant %+v", g)
		}
		places = append(places, g.Cluster+"/"+g.Namespace)
	}
	if slices.Sort(places); strings.Join(places, " ") != "c1/web c2/web" {
		t.Fatalf("grants now at %v", places)
	}
	out = h.run(t, "access", "at", "--group", "ops", "--time", "0s").ok(t)
	for _, want := range []string{"Group:ops at ", "CLUSTER", "c1", "c2", "web", "team-a", "pod-reader", "get,list:pods"} {
		if !strings.Contains(out.stdout, want) {
			t.Fatalf("access at output lacks %q:\n%s", want, out.stdout)
		}
	}
}
