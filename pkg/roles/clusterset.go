package roles

import rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"

// The cluster set roles (OCM's cluster set admin and view), bound per set through
// ClusterSetService rather than in a project: their rules hold on one set's clusters.
const (
	ClusterSetAdmin = "clusterset-admin"
	ClusterSetView  = "clusterset-view"
)

// Resources of a set, as set roles' rules name them (API group fleetstream.io). The
// subresources are OCM's: `join` moves clusters into and out of the set, `bind` makes it
// available to a project.
const (
	ResClusterSetJoin = "clustersets/join"
	ResClusterSetBind = "clustersets/bind"
	// ResClusterSetRoles is the set's role bindings.
	ResClusterSetRoles = "clustersetroles"
)

// ClusterSetRoleRules returns the rules a set role grants on its set, and whether role is one.
// A set admin manages the set's clusters (their labels and taints, never their connection or
// registration, which stay the platform's), its members, its bindings and its roles; it does
// not change the set itself (a label-selector set's selector could reach any cluster).
func ClusterSetRoleRules(role string) ([]*rbacv1.PolicyRule, bool) {
	view := []*rbacv1.PolicyRule{rule(read, Group, ResClusterSets, ResClusters, ResClusterSetRoles)}
	switch role {
	case ClusterSetView:
		return view, true
	case ClusterSetAdmin:
		return append(view,
			rule([]string{"update", "patch"}, Group, ResClusters),
			rule([]string{"create", "delete"}, Group, ResClusterSetJoin, ResClusterSetBind, ResClusterSetRoles)), true
	}
	return nil, false
}
