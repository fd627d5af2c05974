package rbacsync

import (
	"slices"
	"strings"

	rbacv1k "k8s.io/api/rbac/v1"
	rbachelpers "k8s.io/component-helpers/auth/rbac/validation"

	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/roles"
)

// templateLookup finds a template by name; the API passes its view cache, the fan-out its model.
type templateLookup = roles.Lookup

// effectiveRules: see roles.EffectiveRules, shared with the API's authorizer.
func effectiveRules(lookup templateLookup, name string) []*rbacv1.PolicyRule {
	return roles.EffectiveRules(lookup, name)
}

// reaches returns the inheritance path from `from` to `target` (both included), or nil if target
// is not reachable. override replaces the inherits of the templates it names: the update being
// validated.
func reaches(lookup templateLookup, from, target string, override map[string][]string) []string {
	type frame struct {
		name string
		path []string
	}
	visited := map[string]bool{}
	stack := []frame{{from, []string{from}}}
	for len(stack) > 0 {
		f := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if f.name == target {
			return f.path
		}
		if visited[f.name] {
			continue
		}
		visited[f.name] = true
		parents, ok := override[f.name]
		if !ok {
			if t, found := lookup(f.name); found {
				parents = t.Inherits
			}
		}
		for i := len(parents) - 1; i >= 0; i-- {
			stack = append(stack, frame{parents[i], append(slices.Clone(f.path), parents[i])})
		}
	}
	return nil
}

func toK8sRules(rules []*rbacv1.PolicyRule) []rbacv1k.PolicyRule {
	out := make([]rbacv1k.PolicyRule, len(rules))
	for i, r := range rules {
		out[i] = rbacv1k.PolicyRule{Verbs: r.Verbs, APIGroups: r.ApiGroups, Resources: r.Resources,
			ResourceNames: r.ResourceNames, NonResourceURLs: r.NonResourceUrls}
	}
	return out
}

func fromK8sRules(rules []rbacv1k.PolicyRule) []*rbacv1.PolicyRule {
	out := make([]*rbacv1.PolicyRule, len(rules))
	for i, r := range rules {
		out[i] = &rbacv1.PolicyRule{Verbs: r.Verbs, ApiGroups: r.APIGroups, Resources: r.Resources,
			ResourceNames: r.ResourceNames, NonResourceUrls: r.NonResourceURLs}
	}
	return out
}

// covers reports whether owner grants everything servant does, with Kubernetes' own comparator
// (the one its RBAC escalation check uses), and what is missing.
func covers(owner, servant []*rbacv1.PolicyRule) (bool, []*rbacv1.PolicyRule) {
	ok, missing := rbachelpers.Covers(toK8sRules(owner), toK8sRules(servant))
	return ok, fromK8sRules(missing)
}

// allows reports whether rules grant verb on resource of apiGroup.
func allows(rules []*rbacv1.PolicyRule, verb, apiGroup, resource string) bool {
	ok, _ := covers(rules, []*rbacv1.PolicyRule{{Verbs: []string{verb}, ApiGroups: []string{apiGroup}, Resources: []string{resource}}})
	return ok
}

// formatRule renders a rule the way `kubectl describe` lists them, for error messages.
func formatRule(r *rbacv1.PolicyRule) string {
	var parts []string
	if len(r.NonResourceUrls) > 0 {
		parts = append(parts, "nonResourceURLs="+strings.Join(r.NonResourceUrls, ","))
	} else {
		groups := make([]string, len(r.ApiGroups))
		for i, g := range r.ApiGroups {
			if g == "" {
				g = `""`
			}
			groups[i] = g
		}
		parts = append(parts, "apiGroups="+strings.Join(groups, ","), "resources="+strings.Join(r.Resources, ","))
		if len(r.ResourceNames) > 0 {
			parts = append(parts, "resourceNames="+strings.Join(r.ResourceNames, ","))
		}
	}
	parts = append(parts, "verbs="+strings.Join(r.Verbs, ","))
	return "{" + strings.Join(parts, " ") + "}"
}
