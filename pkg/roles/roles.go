// Package roles is the meaning of a role template's rules: the rules a binding to a template
// grants (its own and every inherited template's), whether a set of rules allows a request, and
// the built-in project roles that every Fleetstream starts with.
//
// The same rules serve two authorities. On member clusters they become ClusterRoles (Kubernetes
// enforces them); on the hub, rules in API group `fleetstream.io` decide what a caller may do
// through Fleetstream's own APIs (pkg/authz). One grant therefore gives both.
package roles

import (
	"slices"
	"strings"

	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
)

// Group is the API group of Fleetstream's own resources in rules.
const Group = "fleetstream.io"

// Lookup finds a template by name.
type Lookup func(name string) (*rbacv1.RoleTemplate, bool)

// EffectiveRules returns the rules a binding to template name grants: its own rules, then those
// of every template it inherits, depth first in inherits order, each rule once. Templates are
// flattened rather than aggregated (aggregationRule) because aggregation needs the
// clusterrole-aggregation controller of kube-controller-manager, which not every member cluster
// runs, and because a flattened ClusterRole is complete in itself: "the agent applied revision
// N" then means the cluster grants exactly those rules. A missing inherited template (possible
// only transiently) contributes nothing; inheritance is acyclic by validation, and the visited
// set makes even a corrupted cycle terminate.
func EffectiveRules(lookup Lookup, name string) []*rbacv1.PolicyRule {
	var out []*rbacv1.PolicyRule
	seenRule := map[string]bool{}
	visited := map[string]bool{}
	var walk func(string)
	walk = func(n string) {
		if visited[n] {
			return
		}
		visited[n] = true
		t, ok := lookup(n)
		if !ok {
			return
		}
		for _, r := range t.Rules {
			k := ruleKey(r)
			if !seenRule[k] {
				seenRule[k] = true
				out = append(out, r)
			}
		}
		for _, p := range t.Inherits {
			walk(p)
		}
	}
	walk(name)
	return out
}

// ruleKey identifies a rule by content, order of values included (rules are copied verbatim).
func ruleKey(r *rbacv1.PolicyRule) string {
	var b strings.Builder
	for _, l := range [][]string{r.Verbs, r.ApiGroups, r.Resources, r.ResourceNames, r.NonResourceUrls} {
		b.WriteString(strings.Join(l, "\x00"))
		b.WriteByte('\x01')
	}
	return b.String()
}

// Allows reports whether one of rules allows verb on every object of resource in group, with
// Kubernetes RBAC's matching: `*` matches any verb, group or resource, and a rule restricted to
// resourceNames does not allow the whole resource.
func Allows(rules []*rbacv1.PolicyRule, verb, group, resource string) bool {
	for _, r := range rules {
		if len(r.ResourceNames) == 0 && has(r.Verbs, verb) && has(r.ApiGroups, group) && has(r.Resources, resource) {
			return true
		}
	}
	return false
}

func has(list []string, v string) bool {
	return slices.Contains(list, v) || slices.Contains(list, "*")
}
