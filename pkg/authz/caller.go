package authz

import (
	"context"
	"sort"

	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/roles"
)

// Caller is the authorization view of one API call's caller. Handlers get it with CallerFrom.
// It is safe for concurrent use.
type Caller struct {
	a      *Authorizer
	user   string
	groups []string
	admin  bool
	// xdsReader: the caller holds the xds-reader role (authorizer Config.XDSReaders).
	xdsReader bool
}

type callerKey struct{}

func withCaller(ctx context.Context, c *Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFrom returns the caller of the API call ctx belongs to. Outside an authorized call it
// returns nil, which may do nothing: every method of a nil Caller denies.
func CallerFrom(ctx context.Context) *Caller {
	c, _ := ctx.Value(callerKey{}).(*Caller)
	return c
}

// User is the caller's name.
func (c *Caller) User() string {
	if c == nil {
		return ""
	}
	return c.user
}

// Groups are the caller's groups.
func (c *Caller) Groups() []string {
	if c == nil {
		return nil
	}
	return c.groups
}

// Admin reports whether the caller is a platform admin.
func (c *Caller) Admin() bool { return c != nil && c.admin }

// Rules returns the effective rules bound to the caller (as a user or through a group) in
// project, as the mirrors show them now (a long call, a watch, sees revocations). A platform
// admin's rules are not listed: check Admin first.
func (c *Caller) Rules(project string) []*rbacv1.PolicyRule {
	if c == nil {
		return nil
	}
	return c.a.rulesByProject(c.user, c.groups)[project]
}

// Can reports whether the caller may do verb on resource of group in project.
func (c *Caller) Can(verb, group, resource, project string) bool {
	if c == nil {
		return false
	}
	return c.admin || (project != "" && roles.Allows(c.Rules(project), verb, group, resource))
}

// CanInNamespace reports whether the caller may do verb on resource of group in namespace:
// in the project owning it on cluster, or, with cluster "", in every project owning a
// namespace of that name on some cluster. A namespace no project owns is the platform's.
func (c *Caller) CanInNamespace(verb, group, resource, cluster, namespace string) bool {
	if c == nil {
		return false
	}
	if c.admin {
		return true
	}
	owners := c.a.owners(cluster, namespace)
	if len(owners) == 0 {
		return false
	}
	for _, p := range owners {
		if !c.Can(verb, group, resource, p) {
			return false
		}
	}
	return true
}

// ProjectsAllowing lists the projects where the caller may do verb on resource of group (a
// platform admin's too are only those bound to it: check Admin first).
func (c *Caller) ProjectsAllowing(verb, group, resource string) []string {
	if c == nil {
		return nil
	}
	var out []string
	for p, rules := range c.a.rulesByProject(c.user, c.groups) {
		if roles.Allows(rules, verb, group, resource) {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

// RecordDenial records a refusal a handler decided (a request for a project the caller may not
// read, say) as the authorizer records its own: as audit activity, when it has a recorder.
func (c *Caller) RecordDenial(procedure, resource, project, reason string) {
	if c == nil || c.a.denials == nil {
		return
	}
	c.a.denials.RecordDenial(c.user, procedure, resource, project, "", reason)
}
