package authz

import (
	"fmt"
	"slices"

	"go.uber.org/zap"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/placement"
	"github.com/fleetstream/fleetstream/pkg/roles"
)

// Cluster set roles (docs/placement.md, "Cluster set roles"): clusterset-admin and
// clusterset-view, bound per set (namespace-binding's view placement-clusterset-roles). Their
// rules (roles.ClusterSetRoleRules) hold on one set; what a cluster's update needs follows from
// the sets the cluster is in before and after it, computed with the scheduler's own membership
// rules from the sets and registry views, so the clusters a set admin may touch are exactly
// those the set's placements may pick.

// setRoleIndex indexes set role bindings by the user or group they grant to.
func setRoleIndex(_ string, b *placementv1.ClusterSetRoleBinding) []string {
	switch b.GetSubject().GetKind() {
	case rbacv1.SubjectKind_SUBJECT_KIND_USER:
		return []string{userTerm(b.Subject.Name)}
	case rbacv1.SubjectKind_SUBJECT_KIND_GROUP:
		return []string{groupTerm(b.Subject.Name)}
	}
	return nil
}

// setRulesOf returns, per set, the rules of the set roles bound to the user or its groups.
func (a *Authorizer) setRulesOf(user string, groups []string) map[string][]*rbacv1.PolicyRule {
	key := user
	for _, g := range groups {
		key += "\x00" + g
	}
	return a.setMemo.get(key, func() map[string][]*rbacv1.PolicyRule {
		out := map[string][]*rbacv1.PolicyRule{}
		add := func(bs []*placementv1.ClusterSetRoleBinding) {
			for _, b := range bs {
				rules, _ := roles.ClusterSetRoleRules(b.Role)
				out[b.ClusterSet] = append(out[b.ClusterSet], rules...)
			}
		}
		if user != "" {
			add(a.setRoles.lookup(userTerm(user)))
		}
		for _, g := range groups {
			add(a.setRoles.lookup(groupTerm(g)))
		}
		return out
	})
}

// CanInClusterSet reports whether the caller may do verb on resource of group in cluster set
// set, through a set role bound to it (or as a platform admin).
func (c *Caller) CanInClusterSet(verb, group, resource, set string) bool {
	if c == nil {
		return false
	}
	return c.admin || (set != "" && roles.Allows(c.a.setRulesOf(c.user, c.groups)[set], verb, group, resource))
}

// ClusterSetsWithRole returns the sets on which the caller holds a set role, sorted. A platform
// admin's are not listed: check Admin first.
func (c *Caller) ClusterSetsWithRole() []string {
	if c == nil {
		return nil
	}
	var out []string
	for s := range c.a.setRulesOf(c.user, c.groups) {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// setsOf returns the sets a cluster with these labels is a member of, sorted, as the scheduler
// decides membership (pkg/placement).
func (a *Authorizer) setsOf(name string, labels map[string]string) ([]string, error) {
	list := a.sets.list()
	sets := make([]placement.ClusterSet, len(list))
	for i, s := range list {
		sets[i] = placement.SetFromProto(s)
	}
	f, err := placement.NewFleet([]placement.Cluster{{Name: name, Labels: labels}}, sets, nil)
	if err != nil {
		return nil, fmt.Errorf("authz: cluster set membership: %w", err)
	}
	var out []string
	for _, s := range sets {
		if m, _ := f.Members(s.Name); len(m) > 0 {
			out = append(out, s.Name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// setAdminFields are the fields of a cluster a set admin may update; credentials (the
// connection) and claims (facts the cluster's owners and importers state) stay the platform's.
var setAdminFields = []string{"labels", "taints"}

// decideClusterUpdate decides an UpdateCluster of a caller who is not a platform admin: it needs
// `update clusters` in a set the cluster is in, and `create clustersets/join` in every set the
// update makes it join or leave (moving a cluster between two exclusive sets needs both, as in
// OCM). It returns the reason of a refusal for the scope's message, "" when allowed. An allowed
// request without an expected revision gets the revision decided on, so that the update
// applies to the cluster as it was decided on and to nothing a concurrent change made of it.
func (c *Caller) decideClusterUpdate(verb, group, resource string, m *clusterv1.UpdateClusterRequest) string {
	for _, f := range m.GetUpdateMask().GetPaths() {
		if !slices.Contains(setAdminFields, f) {
			return fmt.Sprintf("; a cluster set's admins may update labels and taints only, not %s", f)
		}
	}
	cur, ok := c.a.clusters.getKey(keys.Encode(m.Name))
	if !ok {
		return " (no such cluster in the registry this process reads)"
	}
	if m.ExpectedRevision > cur.Revision {
		return " (this process has not yet seen the expected revision)"
	}
	before, err := c.a.setsOf(cur.Name, cur.Labels)
	if err != nil {
		c.a.log.Warn("cluster update not authorized", zap.Error(err))
		return " (its cluster sets could not be computed)"
	}
	held := slices.IndexFunc(before, func(s string) bool { return c.CanInClusterSet(verb, group, resource, s) })
	if held < 0 {
		return fmt.Sprintf(" (it is in cluster sets %v: %s on one of them is needed)", before, roles.ClusterSetAdmin)
	}
	if slices.Contains(m.GetUpdateMask().GetPaths(), "labels") {
		after, err := c.a.setsOf(cur.Name, m.Labels)
		if err != nil {
			c.a.log.Warn("cluster update not authorized", zap.Error(err))
			return " (its cluster sets could not be computed)"
		}
		for _, s := range symmetricDifference(before, after) {
			if !c.CanInClusterSet("create", roles.Group, roles.ResClusterSetJoin, s) {
				return fmt.Sprintf(": the update moves it into or out of cluster set %q, which needs %s there", s, roles.ClusterSetAdmin)
			}
		}
	}
	if m.ExpectedRevision == 0 {
		m.ExpectedRevision = cur.Revision
	}
	return ""
}

func symmetricDifference(a, b []string) []string {
	var out []string
	for _, s := range a {
		if !slices.Contains(b, s) {
			out = append(out, s)
		}
	}
	for _, s := range b {
		if !slices.Contains(a, s) {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}
