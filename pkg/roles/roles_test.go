package roles

import (
	"testing"

	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
)

func TestAllows(t *testing.T) {
	rules := []*rbacv1.PolicyRule{
		{Verbs: []string{"get", "list"}, ApiGroups: []string{Group}, Resources: []string{ResProjects}},
		{Verbs: []string{"*"}, ApiGroups: []string{""}, Resources: []string{"pods"}},
		{Verbs: []string{"update"}, ApiGroups: []string{"*"}, Resources: []string{"*"}, ResourceNames: []string{"one"}},
		{Verbs: []string{"delete"}, ApiGroups: []string{"apps"}, Resources: []string{"*"}},
	}
	for _, tc := range []struct {
		verb, group, resource string
		want                  bool
	}{
		{"get", Group, ResProjects, true},
		{"watch", Group, ResProjects, false},
		{"get", "", ResProjects, false},
		{"create", "", "pods", true},
		{"create", Group, "pods", false},
		{"update", "", "pods", true},
		{"update", "apps", "deployments", false}, // only resourceNames: not the whole resource
		{"delete", "apps", "deployments", true},
		{"delete", "batch", "jobs", false},
	} {
		if got := Allows(rules, tc.verb, tc.group, tc.resource); got != tc.want {
			t.Errorf("Allows(%s %s/%s) = %v, want %v", tc.verb, tc.group, tc.resource, got, tc.want)
		}
	}
}

func TestBuiltinsNest(t *testing.T) {
	byName := map[string]*rbacv1.RoleTemplate{}
	for _, b := range Builtin() {
		byName[b.Name] = b
		if !IsBuiltin(b.Name) {
			t.Errorf("%s is not reported built in", b.Name)
		}
	}
	lookup := func(n string) (*rbacv1.RoleTemplate, bool) { t, ok := byName[n]; return t, ok }
	for _, tc := range []struct {
		role, verb, group, resource string
		want                        bool
	}{
		{ProjectViewer, "get", Group, ResProjects, true},
		{ProjectViewer, "update", Group, ResServiceWeights, false},
		{ProjectViewer, "get", "", "secrets", false},
		{ProjectMember, "update", Group, ResServiceWeights, true},
		{ProjectMember, "get", Group, ResProjects, true}, // inherited
		{ProjectMember, "create", RBACGroup, "rolebindings", false},
		{ProjectMember, "create", Group, ResNamespaceBindings, false},
		{ProjectOwner, "create", RBACGroup, "rolebindings", true},
		{ProjectOwner, "create", Group, ResNamespaceBindings, true},
		{ProjectOwner, "get", "", "secrets", true},
		{ProjectOwner, "create", Group, ResProjects, false},
		{ProjectOwner, "update", Group, ResBudgets, false},
	} {
		if got := Allows(EffectiveRules(lookup, tc.role), tc.verb, tc.group, tc.resource); got != tc.want {
			t.Errorf("%s: %s %s/%s = %v, want %v", tc.role, tc.verb, tc.group, tc.resource, got, tc.want)
		}
	}
}

func TestEffectiveRulesSurviveCycles(t *testing.T) {
	a := &rbacv1.RoleTemplate{Name: "a", Inherits: []string{"b"}, Rules: []*rbacv1.PolicyRule{{Verbs: []string{"get"}, Resources: []string{"x"}}}}
	b := &rbacv1.RoleTemplate{Name: "b", Inherits: []string{"a"}, Rules: []*rbacv1.PolicyRule{{Verbs: []string{"get"}, Resources: []string{"y"}}}}
	lookup := func(n string) (*rbacv1.RoleTemplate, bool) {
		switch n {
		case "a":
			return a, true
		case "b":
			return b, true
		}
		return nil, false
	}
	if got := EffectiveRules(lookup, "a"); len(got) != 2 {
		t.Fatalf("got %d rules, want 2", len(got))
	}
}
