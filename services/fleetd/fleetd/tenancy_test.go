package fleetd_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetstream/fleetstream/pkg/testkit"
)

const (
	procListProjects  = "/fleetstream.project.v1.ProjectService/ListProjects"
	procListBindings  = "/fleetstream.project.v1.ProjectService/ListNamespaceBindings"
	procBindNS        = "/fleetstream.project.v1.ProjectService/BindNamespace"
	procCreateProject = "/fleetstream.project.v1.ProjectService/CreateProject"
	procDeleteProject = "/fleetstream.project.v1.ProjectService/DeleteProject"
	procClusterWeight = "/fleetstream.endpoint.v1.EndpointService/SetClusterWeight"
	procBindRole      = "/fleetstream.rbac.v1.RBACService/BindProjectRole"
	procUnbindRole    = "/fleetstream.rbac.v1.RBACService/UnbindProjectRole"
	procCreateRole    = "/fleetstream.rbac.v1.RBACService/CreateRoleTemplate"
	procDeleteRole    = "/fleetstream.rbac.v1.RBACService/DeleteRoleTemplate"
	procListMembers   = "/fleetstream.rbac.v1.RBACService/ListProjectRoleBindings"
	procRegister      = "/fleetstream.cluster.v1.ClusterService/RegisterCluster"
	procDeregister    = "/fleetstream.cluster.v1.ClusterService/DeregisterCluster"
)

func grantBody(project, kind, name, role string) string {
	return fmt.Sprintf(`{"project":%q,"subject":{"kind":%q,"name":%q},"roleTemplate":%q}`, project, kind, name, role)
}

func weightBody(ns string) string {
	return `{"namespace":"` + ns + `","name":"frontend","cluster":"c1","weight":0}`
}

// The abuses the tenancy issue reported, each now refused, and the refusals' messages.
func TestTenantsCannotTouchOtherTenants(t *testing.T) {
	api := startTenants(t)
	for _, tc := range []struct {
		name, caller, proc, body string
		want                     []string // in the message
	}{
		{"bind into another team's project", roleOther, procBindNS, `{"project":"team-a","cluster":"c1","namespace":"steal"}`,
			[]string{`user "other"`, "create", "namespacebindings.fleetstream.io", `project "team-a"`}},
		{"drain another team's service", roleOther, procClusterWeight, weightBody("web"),
			[]string{`user "other"`, "update", "serviceweights.fleetstream.io", `namespace "web" on cluster "c1"`}},
		{"drain a service no project owns", roleOwner, procClusterWeight, weightBody("kube-system"),
			[]string{`namespace "kube-system"`}},
		{"force-delete another team's project", roleOther, procDeleteProject, `{"name":"team-a","force":true}`,
			[]string{"delete", "projects.fleetstream.io", "platform admins only"}},
		{"deregister a cluster", roleOwner, procDeregister, `{"name":"c1"}`, []string{"clusters.fleetstream.io"}},
		{"grant in another team's project", roleOther, procBindRole, grantBody("team-a", "SUBJECT_KIND_USER", "other", "project-owner"),
			[]string{"rolebindings.rbac.authorization.k8s.io", `project "team-a"`}},
		{"member grants owner (escalation)", roleMember, procBindRole, grantBody("team-a", "SUBJECT_KIND_USER", "member", "project-owner"),
			[]string{`user "member"`, "create", "rolebindings"}},
		{"no role at all", roleNobody, procBindNS, `{"project":"team-a","cluster":"c1","namespace":"x"}`, []string{`user "nobody"`}},
		{"a system: name is nobody special", roleNobody, procCreateProject, `{"name":"system-x"}`, []string{"platform admins only"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := api.callFull(t, tc.caller, tc.proc, tc.body)
			if code != "permission_denied" {
				t.Fatalf("got %q (%s), want permission_denied", code, body)
			}
			var e struct{ Message string }
			_ = json.Unmarshal(body, &e)
			for _, w := range tc.want {
				if !strings.Contains(e.Message, w) {
					t.Errorf("message %q does not name %q", e.Message, w)
				}
			}
		})
	}
	// The legitimate counterparts go through.
	if code, body := api.callFull(t, roleMember, procClusterWeight, weightBody("web")); code != "" {
		t.Fatalf("member draining its own service: %s %s", code, body)
	}
	if code, body := api.callFull(t, roleOwner, procBindRole, grantBody("team-a", "SUBJECT_KIND_USER", "zed", "project-member")); code != "" {
		t.Fatalf("owner adding a member: %s %s", code, body)
	}
}

func TestOwnerCannotGrantRulesItDoesNotHold(t *testing.T) {
	api := startTenants(t)
	if code, body := api.callFull(t, roleAdmin, procCreateRole, `{"template":{"name":"node-admin","rules":[{"verbs":["*"],"apiGroups":[""],"resources":["nodes"]}]}}`); code != "" {
		t.Fatalf("create template: %s %s", code, body)
	}
	code, body := api.callFull(t, roleOwner, procBindRole, grantBody("team-a", "SUBJECT_KIND_USER", "zed", "node-admin"))
	if code != "permission_denied" || !strings.Contains(string(body), "no privilege escalation") {
		t.Fatalf("owner granting node-admin: %s %s", code, body)
	}
}

func TestBuiltinRolesCannotBeChanged(t *testing.T) {
	api := startTenants(t)
	for _, role := range []string{"project-owner", "project-member", "project-viewer"} {
		if code, _ := api.callFull(t, roleAdmin, procDeleteRole, `{"name":"`+role+`"}`); code != "failed_precondition" {
			t.Errorf("delete %s: %q, want failed_precondition", role, code)
		}
	}
}

func TestReadsShowOnlyWhatTheCallerOwns(t *testing.T) {
	api := startTenants(t)
	names := func(caller, proc, field, key string) []string {
		t.Helper()
		code, body := api.callFull(t, caller, proc, `{}`)
		if code != "" {
			t.Fatalf("%s %s: %s %s", caller, proc, code, body)
		}
		var res map[string][]map[string]any
		if err := json.Unmarshal(body, &res); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, item := range res[field] {
			out = append(out, fmt.Sprint(item[key]))
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	for _, tc := range []struct {
		caller, proc, field, key string
		want                     []string
	}{
		{roleAdmin, procListProjects, "projects", "name", []string{"team-a", "team-b"}},
		{roleViewer, procListProjects, "projects", "name", []string{"team-a"}},
		{roleOther, procListProjects, "projects", "name", []string{"team-b"}},
		{roleNobody, procListProjects, "projects", "name", nil},
		{roleOwner, procListBindings, "bindings", "namespace", []string{"web"}},
		{roleOther, procListBindings, "bindings", "namespace", []string{"shop"}},
		{roleOther, procListMembers, "bindings", "project", []string{"team-b"}},
		{roleNobody, procListMembers, "bindings", "project", nil},
	} {
		if got := names(tc.caller, tc.proc, tc.field, tc.key); !slices.Equal(got, tc.want) {
			t.Errorf("%s %s: %v, want %v", tc.caller, tc.proc, got, tc.want)
		}
	}
}

// Rights held through a group binding and platform-admin groups; losing a grant loses access
// at once.
func TestGroupsAndRevocation(t *testing.T) {
	api := startTenants(t)
	if code, body := api.callFull(t, "ops", procCreateProject, `{"name":"team-c"}`); code != "" {
		t.Fatalf("a member of a platform-admin group: %s %s", code, body)
	}
	if code := api.call(t, "dev", procClusterWeight, weightBody("web")); code != "permission_denied" {
		t.Fatalf("dev before its group is granted: %q", code)
	}
	if code, body := api.callFull(t, roleAdmin, procBindRole, grantBody("team-a", "SUBJECT_KIND_GROUP", "team-a-devs", "project-member")); code != "" {
		t.Fatalf("grant group: %s %s", code, body)
	}
	// The grant was confirmed: it holds on the very next call.
	if code, body := api.callFull(t, "dev", procClusterWeight, weightBody("web")); code != "" {
		t.Fatalf("dev through its group: %s %s", code, body)
	}
	if code := api.call(t, "dev", procClusterWeight, weightBody("shop")); code != "permission_denied" {
		t.Fatalf("dev in another team's namespace: %q", code)
	}
	// Revoke the member's grant: its next calls are refused.
	if code, body := api.callFull(t, roleAdmin, procUnbindRole, grantBody("team-a", "SUBJECT_KIND_USER", "member", "project-member")); code != "" {
		t.Fatalf("revoke: %s %s", code, body)
	}
	testkit.Eventually(t, 2*time.Second, func() error {
		if code := api.call(t, roleMember, procClusterWeight, weightBody("web")); code != "permission_denied" {
			return fmt.Errorf("a revoked member still sets weights after the revocation was confirmed: %q", code)
		}
		return nil
	})
	if code, body := api.callFull(t, roleMember, procListProjects, `{}`); code != "" || strings.Contains(string(body), "team-a") {
		t.Fatalf("a revoked member still lists team-a: %s %s", code, body)
	}
}

// Oversized requests are refused before they are read whole, and no error echoes its input.
func TestOversizedRequestsAreRefusedShortly(t *testing.T) {
	api := startTenants(t)
	huge := `{"name":"c9","labels":{"a":"` + strings.Repeat("x", 20<<20) + `"}}`
	code, body := api.callFull(t, roleAdmin, procRegister, huge)
	if code != "resource_exhausted" || len(body) > 1024 {
		t.Fatalf("20 MB body: %q with %d bytes of answer", code, len(body))
	}
	var b strings.Builder
	b.WriteString(`{"name":"c9","labels":{`)
	for i := range 100_000 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"k%d":"v"`, i)
	}
	b.WriteString(`}}`)
	code, body = api.callFull(t, roleAdmin, procRegister, b.String())
	if code != "invalid_argument" || len(body) > 4096 || !strings.Contains(string(body), "labels") {
		t.Fatalf("100,000 labels: %q with %d bytes: %.300s", code, len(body), body)
	}
	bad := `{"name":"` + strings.Repeat("X", 100_000) + `"}`
	code, body = api.callFull(t, roleAdmin, procRegister, bad)
	if code != "invalid_argument" || len(body) > 2048 {
		t.Fatalf("100 kB name: %q with %d bytes", code, len(body))
	}
	if code := api.call(t, roleAdmin, "/fleetstream.cluster.v1.ClusterService/GetCluster", `{"name":"c9"}`); code != "not_found" {
		t.Fatalf("a refused registration left something behind: %q", code)
	}
}
