package roles

import (
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
)

// The built-in project roles, created by rbac-sync at start-up, never deletable or editable
// through the API. Each inherits the one below it.
const (
	ProjectOwner  = "project-owner"
	ProjectMember = "project-member"
	ProjectViewer = "project-viewer"
)

// Fleetstream's own resources, as rules name them (API group fleetstream.io).
const (
	ResClusters          = "clusters"
	ResIdleNamespaces    = "idlenamespaces"
	ResProjects          = "projects"
	ResNamespaceBindings = "namespacebindings"
	ResBudgets           = "budgets"
	ResRoleTemplates     = "roletemplates"
	// ResMembers is the project's role bindings as a list to read. Creating and deleting them
	// is `create`/`delete` on rolebindings.rbac.authorization.k8s.io, as in Kubernetes.
	ResMembers        = "members"
	ResAccess         = "access"
	ResServices       = "services"
	ResServiceWeights = "serviceweights"
	ResSubscribers    = "subscribers"
	ResImportPolicies = "importpolicies"
	// ResClusterSets is the cluster sets, and, in a project, the sets bound to it.
	ResClusterSets = "clustersets"
	// ResPlacements is a project's placements and their decisions.
	ResPlacements = "placements"
	// ResAddOnScores is the scores other systems set on clusters for placements.
	ResAddOnScores = "addonscores"
	// ResActivity is a project's audit trail (AuditService): what was done to its objects, by
	// whom, and the calls on them that were denied.
	ResActivity = "activity"
	// ResXDS is the fleet-wide xDS feed of every service's endpoints (proxies read it).
	ResXDS = "xds"
)

// RBACGroup is Kubernetes' RBAC API group: managing a project's members is managing RoleBindings.
const RBACGroup = "rbac.authorization.k8s.io"

var (
	read  = []string{"get", "list", "watch"}
	write = []string{"create", "update", "patch", "delete", "deletecollection"}
	all   = append(append([]string{}, read...), write...)
)

func rule(verbs []string, group string, resources ...string) *rbacv1.PolicyRule {
	return &rbacv1.PolicyRule{Verbs: verbs, ApiGroups: []string{group}, Resources: resources}
}

// Builtin returns the built-in project role templates. Their Kubernetes rules follow the
// aggregated admin/edit/view ClusterRoles of Kubernetes, trimmed to the namespaced resources a
// project team uses; their fleetstream.io rules give the matching rights on the hub (on member
// clusters those rules are inert: no such resources exist there).
func Builtin() []*rbacv1.RoleTemplate {
	viewer := &rbacv1.RoleTemplate{
		Name:        ProjectViewer,
		DisplayName: "Project viewer: reads the project's namespaces, on the hub and on every cluster",
		Rules: []*rbacv1.PolicyRule{
			rule(read, "", "pods", "pods/log", "pods/status", "services", "services/status", "endpoints", "configmaps",
				"persistentvolumeclaims", "persistentvolumeclaims/status", "replicationcontrollers", "events",
				"resourcequotas", "resourcequotas/status", "limitranges", "serviceaccounts", "namespaces", "namespaces/status"),
			rule(read, "apps", "deployments", "deployments/status", "deployments/scale", "replicasets", "replicasets/status",
				"replicasets/scale", "statefulsets", "statefulsets/status", "statefulsets/scale", "daemonsets", "daemonsets/status",
				"controllerrevisions"),
			rule(read, "batch", "jobs", "jobs/status", "cronjobs", "cronjobs/status"),
			rule(read, "autoscaling", "horizontalpodautoscalers", "horizontalpodautoscalers/status"),
			rule(read, "policy", "poddisruptionbudgets", "poddisruptionbudgets/status"),
			rule(read, "networking.k8s.io", "ingresses", "ingresses/status", "networkpolicies"),
			rule(read, "discovery.k8s.io", "endpointslices"),
			rule(read, Group, ResProjects, ResNamespaceBindings, ResMembers, ResAccess, ResServices, ResClusterSets, ResPlacements),
		},
	}
	member := &rbacv1.RoleTemplate{
		Name:        ProjectMember,
		DisplayName: "Project member: reads and edits workloads in the project's namespaces and sets service weights",
		Inherits:    []string{ProjectViewer},
		Rules: []*rbacv1.PolicyRule{
			rule(all, "", "pods", "services", "configmaps", "secrets", "persistentvolumeclaims", "replicationcontrollers",
				"replicationcontrollers/scale", "serviceaccounts", "endpoints"),
			rule([]string{"create"}, "", "pods/exec", "pods/attach", "pods/portforward", "pods/eviction", "serviceaccounts/token"),
			rule(all, "apps", "deployments", "deployments/scale", "deployments/rollback", "replicasets", "replicasets/scale",
				"statefulsets", "statefulsets/scale", "daemonsets"),
			rule(all, "batch", "jobs", "cronjobs"),
			rule(all, "autoscaling", "horizontalpodautoscalers"),
			rule(all, "policy", "poddisruptionbudgets"),
			rule(all, "networking.k8s.io", "ingresses", "networkpolicies"),
			rule([]string{"update"}, Group, ResServiceWeights),
		},
	}
	owner := &rbacv1.RoleTemplate{
		Name:        ProjectOwner,
		DisplayName: "Project owner: everything a member may, plus the project's namespaces, quotas and members",
		Inherits:    []string{ProjectMember},
		Rules: []*rbacv1.PolicyRule{
			rule(all, RBACGroup, "roles", "rolebindings"),
			rule([]string{"create", "update", "delete"}, Group, ResNamespaceBindings, ResPlacements),
			rule([]string{"list"}, Group, ResActivity),
		},
	}
	return []*rbacv1.RoleTemplate{viewer, member, owner}
}

// IsBuiltin reports whether name is a built-in template.
func IsBuiltin(name string) bool {
	return name == ProjectOwner || name == ProjectMember || name == ProjectViewer
}
