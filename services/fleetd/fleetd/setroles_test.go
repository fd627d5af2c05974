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

// The holders of cluster set roles: alice administers sets a and c, bob set b; carol views set
// a through her group.
const (
	setAdminA       = "alice"
	setAdminB       = "bob"
	setViewerA      = "carol"
	setViewersGroup = "set-a-viewers"
)

const (
	procUpdateCluster   = "/fleetstream.cluster.v1.ClusterService/UpdateCluster"
	procCreateSet       = "/fleetstream.placement.v1.ClusterSetService/CreateClusterSet"
	procUpdateSet       = "/fleetstream.placement.v1.ClusterSetService/UpdateClusterSet"
	procDeleteSet       = "/fleetstream.placement.v1.ClusterSetService/DeleteClusterSet"
	procGetSet          = "/fleetstream.placement.v1.ClusterSetService/GetClusterSet"
	procBindSet         = "/fleetstream.placement.v1.ClusterSetService/BindClusterSet"
	procUnbindSet       = "/fleetstream.placement.v1.ClusterSetService/UnbindClusterSet"
	procListSetBindings = "/fleetstream.placement.v1.ClusterSetService/ListClusterSetBindings"
	procBindSetRole     = "/fleetstream.placement.v1.ClusterSetService/BindClusterSetRole"
	procUnbindSetRole   = "/fleetstream.placement.v1.ClusterSetService/UnbindClusterSetRole"
	procListSetRoles    = "/fleetstream.placement.v1.ClusterSetService/ListClusterSetRoleBindings"
)

func setRoleBody(set, kind, name, role string) string {
	return fmt.Sprintf(`{"clusterSet":%q,"subject":{"kind":%q,"name":%q},"role":%q}`, set, kind, name, role)
}

func labelsBody(cluster string, labels map[string]string) string {
	l, _ := json.Marshal(labels)
	return fmt.Sprintf(`{"name":%q,"labels":%s,"updateMask":"labels"}`, cluster, l)
}

func taintBody(cluster, key string) string {
	return fmt.Sprintf(`{"name":%q,"taints":[{"key":%q,"effect":"TAINT_EFFECT_NO_SELECT"}],"updateMask":"taints"}`, cluster, key)
}

func inSet(set string, more ...string) map[string]string {
	out := map[string]string{"fleetstream.io/clusterset": set}
	for i := 0; i+1 < len(more); i += 2 {
		out[more[i]] = more[i+1]
	}
	return out
}

// startSetRoles is startTenants plus clusters in sets a, b and default, a label-selector set
// prod, and the set roles of alice, bob and carol's group; alice also owns project team-a.
func startSetRoles(t *testing.T) *rawClient {
	t.Helper()
	api := startTenants(t)
	mustOK := func(proc, body string) {
		t.Helper()
		if code, res := api.callFull(t, roleAdmin, proc, body); code != "" {
			t.Fatalf("setup %s %s: %s %s", proc, body, code, res)
		}
	}
	for _, set := range []string{"a", "b", "c"} {
		mustOK(procCreateSet, `{"name":"`+set+`"}`)
	}
	mustOK(procCreateSet, `{"name":"prod","selector":{"type":"SELECTOR_TYPE_LABEL_SELECTOR","labelSelector":{"matchLabels":{"env":"prod"}}}}`)
	for name, set := range map[string]string{"a1": "a", "a2": "a", "b1": "b"} {
		l, _ := json.Marshal(inSet(set))
		mustOK(procRegister, fmt.Sprintf(`{"name":%q,"labels":%s}`, name, l))
	}
	mustOK(procRegister, `{"name":"d1"}`)
	mustOK(procBindSetRole, setRoleBody("a", "SUBJECT_KIND_USER", setAdminA, "clusterset-admin"))
	mustOK(procBindSetRole, setRoleBody("c", "SUBJECT_KIND_USER", setAdminA, "clusterset-admin"))
	mustOK(procBindSetRole, setRoleBody("b", "SUBJECT_KIND_USER", setAdminB, "clusterset-admin"))
	mustOK(procBindSetRole, setRoleBody("a", "SUBJECT_KIND_GROUP", setViewersGroup, "clusterset-view"))
	mustOK(procBindRole, grantBody("team-a", "SUBJECT_KIND_USER", setAdminA, "project-owner"))
	return api
}

// A set admin gets nothing on the clusters of other sets, nor beyond what a set admin may do on
// its own; a set viewer changes nothing.
func TestClusterSetRoleAttacks(t *testing.T) {
	api := startSetRoles(t)
	for _, tc := range []struct {
		name, caller, proc, body string
		want                     []string // in the message
	}{
		{"relabel another set's cluster", setAdminA, procUpdateCluster, labelsBody("b1", inSet("b", "x", "y")),
			[]string{`user "alice"`, "update", "clusters.fleetstream.io", `cluster "b1"`, "[b global]"}},
		{"taint another set's cluster", setAdminA, procUpdateCluster, taintBody("b1", "evil"), []string{`cluster "b1"`}},
		{"pull another set's cluster into its own", setAdminA, procUpdateCluster, labelsBody("b1", inSet("a")), []string{`cluster "b1"`}},
		{"push its cluster into another set", setAdminA, procUpdateCluster, labelsBody("a1", inSet("b")),
			[]string{`cluster "a1"`, `cluster set "b"`, "clusterset-admin"}},
		{"push its cluster into default", setAdminA, procUpdateCluster, labelsBody("a1", map[string]string{}), []string{`cluster set "default"`}},
		{"make its cluster join a label-selector set", setAdminA, procUpdateCluster, labelsBody("a1", inSet("a", "env", "prod")),
			[]string{`cluster set "prod"`}},
		{"rotate its cluster's credentials", setAdminA, procUpdateCluster, `{"name":"a1","credentials":{"server":"https://evil"},"updateMask":"credentials"}`,
			[]string{"labels and taints only, not credentials"}},
		{"change its cluster's claims", setAdminA, procUpdateCluster, `{"name":"a1","claims":{"region":"x"},"updateMask":"claims"}`,
			[]string{"not claims"}},
		{"deregister its cluster", setAdminA, procDeregister, `{"name":"a1"}`, []string{"platform admins only"}},
		{"register a cluster into its set", setAdminA, procRegister, `{"name":"a9","labels":{"fleetstream.io/clusterset":"a"}}`, []string{"platform admins only"}},
		{"widen its set's selector", setAdminA, procUpdateSet, `{"name":"a","selector":{"type":"SELECTOR_TYPE_LABEL_SELECTOR","labelSelector":{}}}`,
			[]string{"platform admins only"}},
		{"delete its set", setAdminA, procDeleteSet, `{"name":"a"}`, []string{"platform admins only"}},
		{"grant itself a role on another set", setAdminA, procBindSetRole, setRoleBody("b", "SUBJECT_KIND_USER", setAdminA, "clusterset-admin"),
			[]string{"create", "clustersetroles.fleetstream.io", `cluster set "b"`}},
		{"revoke another set's admin", setAdminA, procUnbindSetRole, setRoleBody("b", "SUBJECT_KIND_USER", setAdminB, "clusterset-admin"),
			[]string{`cluster set "b"`}},
		{"bind another set to its project", setAdminA, procBindSet, `{"project":"team-a","clusterSet":"b"}`,
			[]string{"clustersets/bind.fleetstream.io", `cluster set "b"`}},
		{"bind its set to a project it does not own", setAdminA, procBindSet, `{"project":"team-b","clusterSet":"a"}`,
			[]string{`create placements.fleetstream.io in project "team-b"`}},
		{"unbind another set", setAdminA, procUnbindSet, `{"project":"team-a","clusterSet":"b"}`, []string{`cluster set "b"`}},
		{"list another set's roles", setAdminA, procListSetRoles, `{"clusterSet":"b"}`, []string{`cluster set "b"`}},
		{"another set's admin taints its cluster", setAdminB, procUpdateCluster, taintBody("a1", "evil"), []string{`cluster "a1"`}},
		{"a viewer relabels", setViewerA, procUpdateCluster, labelsBody("a1", inSet("a", "x", "y")), []string{`user "carol"`, `cluster "a1"`}},
		{"a viewer grants itself admin", setViewerA, procBindSetRole, setRoleBody("a", "SUBJECT_KIND_USER", setViewerA, "clusterset-admin"),
			[]string{`cluster set "a"`}},
		{"a viewer binds the set", setViewerA, procBindSet, `{"project":"team-a","clusterSet":"a"}`, []string{`cluster set "a"`}},
		{"a project owner relabels", roleOwner, procUpdateCluster, labelsBody("a1", inSet("a", "x", "y")), []string{`cluster "a1"`}},
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
	// Nothing of the above changed a cluster.
	for _, c := range []string{"a1", "b1"} {
		code, body := api.callFull(t, roleAdmin, "/fleetstream.cluster.v1.ClusterService/GetCluster", `{"name":"`+c+`"}`)
		if code != "" || strings.Contains(string(body), "evil") || strings.Contains(string(body), `"x"`) || strings.Contains(string(body), "prod") {
			t.Errorf("%s after the attacks: %s %s", c, code, body)
		}
	}
}

// What a set's admins and viewers may do, and that a revoked admin may no longer.
func TestClusterSetRolesGrant(t *testing.T) {
	api := startSetRoles(t)
	ok := func(caller, proc, body string) []byte {
		t.Helper()
		code, res := api.callFull(t, caller, proc, body)
		if code != "" {
			t.Fatalf("%s %s %s: %s %s", caller, proc, body, code, res)
		}
		return res
	}
	members := func(set string) []string {
		var res struct {
			ClusterSet struct {
				Status struct{ Members []string }
			}
		}
		_ = json.Unmarshal(ok(setViewerA, procGetSet, `{"name":"`+set+`"}`), &res)
		return res.ClusterSet.Status.Members
	}
	ok(setAdminA, procUpdateCluster, labelsBody("a1", inSet("a", "tier", "gold")))
	ok(setAdminA, procUpdateCluster, taintBody("a1", "maintenance"))
	// Moving a cluster between two sets it administers.
	ok(setAdminA, procUpdateCluster, labelsBody("a2", inSet("c")))
	testkit.Eventually(t, 10*time.Second, func() error {
		if m := members("c"); !slices.Equal(m, []string{"a2"}) {
			return fmt.Errorf("set c's members: %v", m)
		}
		return nil
	})
	// It binds its set to the project whose placements it manages, and grants and revokes the
	// set's roles.
	ok(setAdminA, procBindSet, `{"project":"team-a","clusterSet":"a"}`)
	ok(setAdminA, procBindSetRole, setRoleBody("a", "SUBJECT_KIND_USER", "zed", "clusterset-view"))
	names := func(caller, proc, body, field string) []string {
		var res map[string][]map[string]any
		_ = json.Unmarshal(ok(caller, proc, body), &res)
		var out []string
		for _, b := range res[field] {
			s := fmt.Sprint(b["clusterSet"])
			if sub, ok := b["subject"].(map[string]any); ok {
				s += "/" + fmt.Sprint(sub["name"])
			}
			if p, ok := b["project"]; ok {
				s = fmt.Sprint(p) + "/" + s
			}
			out = append(out, s)
		}
		return out
	}
	if got, want := names(setAdminA, procListSetRoles, `{}`, "bindings"), []string{"a/set-a-viewers", "a/alice", "a/zed", "c/alice"}; !slices.Equal(got, want) {
		t.Errorf("alice's list of set roles: %v, want %v (none of set b)", got, want)
	}
	if got := names(setViewerA, procListSetRoles, `{"clusterSet":"a"}`, "bindings"); len(got) != 3 {
		t.Errorf("carol's list of set a's roles: %v", got)
	}
	if got := names(setViewerA, procListSetBindings, `{}`, "bindings"); !slices.Equal(got, []string{"team-a/a"}) {
		t.Errorf("carol's list of set bindings: %v, want set a's", got)
	}
	if got := names(roleNobody, procListSetRoles, `{}`, "bindings"); len(got) != 0 {
		t.Errorf("nobody sees set roles: %v", got)
	}
	ok(setAdminA, procUnbindSetRole, setRoleBody("a", "SUBJECT_KIND_USER", "zed", "clusterset-view"))
	ok(setAdminA, procUnbindSet, `{"project":"team-a","clusterSet":"a"}`)
	// Platform admins keep every right: moving b1 into a needs no set role.
	ok(roleAdmin, procUpdateCluster, labelsBody("b1", inSet("a")))
	// Revoked, alice loses set a's clusters (b1 included now) and keeps set c's.
	ok(roleAdmin, procUnbindSetRole, setRoleBody("a", "SUBJECT_KIND_USER", setAdminA, "clusterset-admin"))
	testkit.Eventually(t, 10*time.Second, func() error {
		if code := api.call(t, setAdminA, procUpdateCluster, taintBody("a1", "again")); code != "permission_denied" {
			return fmt.Errorf("revoked admin updates a1: %q", code)
		}
		return nil
	})
	if code := api.call(t, setAdminA, procUpdateCluster, taintBody("b1", "again")); code != "permission_denied" {
		t.Errorf("revoked admin updates b1, moved into a: %q", code)
	}
	ok(setAdminA, procUpdateCluster, taintBody("a2", "still-mine"))
}

// The set role API checks what it is given, with field paths.
func TestClusterSetRoleValidation(t *testing.T) {
	api := startSetRoles(t)
	for _, tc := range []struct {
		name, body, code, want string
	}{
		{"unknown role", setRoleBody("a", "SUBJECT_KIND_USER", "zed", "project-owner"), "invalid_argument", "role"},
		{"service account", `{"clusterSet":"a","subject":{"kind":"SUBJECT_KIND_SERVICE_ACCOUNT","name":"ci","namespace":"x"},"role":"clusterset-view"}`,
			"invalid_argument", "subject.kind"},
		{"no subject name", setRoleBody("a", "SUBJECT_KIND_GROUP", "", "clusterset-view"), "invalid_argument", "subject.name"},
		{"bad set name", setRoleBody("Not_A_Set", "SUBJECT_KIND_USER", "zed", "clusterset-view"), "invalid_argument", "cluster_set"},
		{"missing set", setRoleBody("nope", "SUBJECT_KIND_USER", "zed", "clusterset-view"), "not_found", "nope"},
		{"bound twice", setRoleBody("a", "SUBJECT_KIND_USER", setAdminA, "clusterset-admin"), "already_exists", "alice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := api.callFull(t, roleAdmin, procBindSetRole, tc.body)
			if code != tc.code || !strings.Contains(string(body), tc.want) {
				t.Fatalf("got %q %s, want %s naming %q", code, body, tc.code, tc.want)
			}
		})
	}
	if code := api.call(t, roleAdmin, procUnbindSetRole, setRoleBody("a", "SUBJECT_KIND_USER", "zed", "clusterset-view")); code != "not_found" {
		t.Errorf("unbinding what is not bound: %q", code)
	}
}
