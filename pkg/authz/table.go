package authz

import (
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/audit/v1/auditv1connect"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1/endpointv1connect"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1/placementv1connect"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1/rbacv1connect"
	"github.com/fleetstream/fleetstream/pkg/roles"
)

// table is the one authorization table: every procedure of every API, the right it needs and
// where. A procedure missing here is refused to everyone but platform admins, and
// TestEveryProcedureHasARule fails, so a new RPC cannot ship unauthorized by accident.
// docs/security.md renders this table for people; keep the two in step.
var table = map[string]Rule{
	// The cluster registry: everyone signed in may read it (project teams need cluster names
	// and labels to bind namespaces); platform admins change it, and a cluster set's admins
	// update the labels and taints of the set's clusters, moving them only between sets they
	// administer (Caller.decideClusterUpdate). A cluster's namespace inventory lists every
	// tenant's namespaces, so asking for it is admin-only.
	clusterv1connect.ClusterServiceRegisterClusterProcedure:   admin("create", roles.ResClusters),
	clusterv1connect.ClusterServiceUpdateClusterProcedure:     clusterMember("update", roles.ResClusters),
	clusterv1connect.ClusterServiceDeregisterClusterProcedure: admin("delete", roles.ResClusters),
	clusterv1connect.ClusterServiceGetClusterProcedure: custom("get", roles.ResClusters, func(m *clusterv1.GetClusterRequest) Scope {
		if m.IncludeInventory {
			return Scope{Kind: Platform}
		}
		return Scope{Kind: Authenticated}
	}),
	clusterv1connect.ClusterServiceListClustersProcedure:  anyone("list", roles.ResClusters),
	clusterv1connect.ClusterServiceWatchClustersProcedure: anyone("watch", roles.ResClusters),

	// Subscribers are NATS credentials of downstream systems: platform-admin only, reading them
	// included (a list names every downstream consumer of the fleet's events).
	clusterv1connect.SubscriberServiceCreateSubscriberProcedure: admin("create", roles.ResSubscribers),
	clusterv1connect.SubscriberServiceDeleteSubscriberProcedure: admin("delete", roles.ResSubscribers),
	clusterv1connect.SubscriberServiceListSubscribersProcedure:  admin("list", roles.ResSubscribers),

	// Import policies turn other inventories' objects into registered clusters: the platform's,
	// like registration itself. A preview creates nothing (a dry-run create).
	clusterv1connect.ImportPolicyServicePreviewImportPolicyProcedure: admin("create", roles.ResImportPolicies),
	clusterv1connect.ImportPolicyServiceCreateImportPolicyProcedure:  admin("create", roles.ResImportPolicies),
	clusterv1connect.ImportPolicyServiceUpdateImportPolicyProcedure:  admin("update", roles.ResImportPolicies),
	clusterv1connect.ImportPolicyServiceDeleteImportPolicyProcedure:  admin("delete", roles.ResImportPolicies),
	// Policies name where credentials come from (and templates may read secrets): reading
	// them is the platform's too.
	clusterv1connect.ImportPolicyServiceGetImportPolicyProcedure:    admin("get", roles.ResImportPolicies),
	clusterv1connect.ImportPolicyServiceListImportPoliciesProcedure: admin("list", roles.ResImportPolicies),
	// Lifecycles name source objects and the clusters made of them: what policies show.
	clusterv1connect.ImportPolicyServiceListImportLifecyclesProcedure: admin("list", roles.ResImportPolicies),

	// Projects and their namespaces. Creating and deleting projects is the platform's; a
	// project's owners manage its namespaces and quotas.
	projectv1connect.ProjectServiceCreateProjectProcedure: admin("create", roles.ResProjects),
	projectv1connect.ProjectServiceDeleteProjectProcedure: admin("delete", roles.ResProjects),
	// A budget caps what the project's owners may hand out to its namespaces: the platform's.
	projectv1connect.ProjectServiceSetProjectBudgetProcedure: admin("update", roles.ResBudgets),
	projectv1connect.ProjectServiceGetProjectProcedure: inProject("get", roles.ResProjects,
		func(m *projectv1.GetProjectRequest) string { return m.Name }),
	projectv1connect.ProjectServiceListProjectsProcedure:  filtered("list", roles.ResProjects),
	projectv1connect.ProjectServiceWatchProjectsProcedure: filtered("watch", roles.ResProjects),
	projectv1connect.ProjectServiceBindNamespaceProcedure: inProject("create", roles.ResNamespaceBindings,
		func(m *projectv1.BindNamespaceRequest) string { return m.Project }),
	projectv1connect.ProjectServiceUpdateQuotaProcedure: inProject("update", roles.ResNamespaceBindings,
		func(m *projectv1.UpdateQuotaRequest) string { return m.Project }),
	projectv1connect.ProjectServiceUnbindNamespaceProcedure: inProject("delete", roles.ResNamespaceBindings,
		func(m *projectv1.UnbindNamespaceRequest) string { return m.Project }),
	projectv1connect.ProjectServiceListNamespaceBindingsProcedure: filtered("list", roles.ResNamespaceBindings),
	projectv1connect.ProjectServiceListIdleNamespacesProcedure:    admin("list", roles.ResIdleNamespaces),

	// Role templates are the platform's; everyone may read them (they are what can be granted).
	// Granting and revoking is managing RoleBindings in the project, as in Kubernetes, and the
	// handler adds Kubernetes' escalation rule: no one grants rules they do not hold.
	rbacv1connect.RBACServiceCreateRoleTemplateProcedure: admin("create", roles.ResRoleTemplates),
	rbacv1connect.RBACServiceUpdateRoleTemplateProcedure: admin("update", roles.ResRoleTemplates),
	rbacv1connect.RBACServiceDeleteRoleTemplateProcedure: admin("delete", roles.ResRoleTemplates),
	rbacv1connect.RBACServiceGetRoleTemplateProcedure:    anyone("get", roles.ResRoleTemplates),
	rbacv1connect.RBACServiceListRoleTemplatesProcedure:  anyone("list", roles.ResRoleTemplates),
	rbacv1connect.RBACServiceBindProjectRoleProcedure: inProjectGroup("create", roles.RBACGroup, "rolebindings",
		func(m *rbacv1.BindProjectRoleRequest) string { return m.Project }),
	rbacv1connect.RBACServiceUnbindProjectRoleProcedure: inProjectGroup("delete", roles.RBACGroup, "rolebindings",
		func(m *rbacv1.UnbindProjectRoleRequest) string { return m.Project }),
	rbacv1connect.RBACServiceListProjectRoleBindingsProcedure: filtered("list", roles.ResMembers),
	// A binding's propagation belongs to its project; a template's ClusterRole on every
	// cluster is the platform's.
	rbacv1connect.RBACServiceGetPropagationStatusProcedure: custom("get", roles.ResMembers, func(m *rbacv1.GetPropagationStatusRequest) Scope {
		if b := m.GetBinding(); b != nil {
			return Scope{Kind: Project, Project: b.Project}
		}
		return Scope{Kind: Platform}
	}),
	rbacv1connect.RBACServiceWhoCanProcedure: inNamespace("get", roles.ResAccess,
		func(m *rbacv1.WhoCanRequest) (string, string) { return m.Cluster, m.Namespace }),
	rbacv1connect.RBACServiceAccessAtProcedure: filtered("get", roles.ResAccess),

	// Cluster sets are the platform's to change. Everyone signed in may read the sets (a project
	// team needs their names and members to write placements). A set's admins (set roles,
	// roles.ClusterSetRoleRules) bind it to a project where they may also manage placements,
	// and bind the set's roles; a project's bindings are shown to those who may list
	// clustersets in it, and a set's bindings and roles to those holding a role on it.
	placementv1connect.ClusterSetServiceCreateClusterSetProcedure: admin("create", roles.ResClusterSets),
	placementv1connect.ClusterSetServiceUpdateClusterSetProcedure: admin("update", roles.ResClusterSets),
	placementv1connect.ClusterSetServiceDeleteClusterSetProcedure: admin("delete", roles.ResClusterSets),
	placementv1connect.ClusterSetServiceGetClusterSetProcedure:    anyone("get", roles.ResClusterSets),
	placementv1connect.ClusterSetServiceListClusterSetsProcedure:  anyone("list", roles.ResClusterSets),
	placementv1connect.ClusterSetServiceBindClusterSetProcedure: inClusterSetAndProject("create", roles.ResClusterSetBind,
		Right{Verb: "create", Group: roles.Group, Resource: roles.ResPlacements},
		func(m *placementv1.BindClusterSetRequest) (string, string) { return m.ClusterSet, m.Project }),
	placementv1connect.ClusterSetServiceUnbindClusterSetProcedure: inClusterSetAndProject("delete", roles.ResClusterSetBind,
		Right{Verb: "delete", Group: roles.Group, Resource: roles.ResPlacements},
		func(m *placementv1.UnbindClusterSetRequest) (string, string) { return m.ClusterSet, m.Project }),
	placementv1connect.ClusterSetServiceListClusterSetBindingsProcedure: filtered("list", roles.ResClusterSets),
	placementv1connect.ClusterSetServiceBindClusterSetRoleProcedure: inClusterSet("create", roles.ResClusterSetRoles,
		func(m *placementv1.BindClusterSetRoleRequest) string { return m.ClusterSet }),
	placementv1connect.ClusterSetServiceUnbindClusterSetRoleProcedure: inClusterSet("delete", roles.ResClusterSetRoles,
		func(m *placementv1.UnbindClusterSetRoleRequest) string { return m.ClusterSet }),
	placementv1connect.ClusterSetServiceListClusterSetRoleBindingsProcedure: filtered("list", roles.ResClusterSetRoles),

	// Placements are a project's: its owners write them, its viewers read them and their
	// decisions. Add-on scores feed every project's placements, so setting one is the
	// platform's (the system computing them runs with platform rights).
	placementv1connect.PlacementServiceCreatePlacementProcedure: inProject("create", roles.ResPlacements,
		func(m *placementv1.CreatePlacementRequest) string { return m.GetPlacement().GetProject() }),
	placementv1connect.PlacementServiceUpdatePlacementProcedure: inProject("update", roles.ResPlacements,
		func(m *placementv1.UpdatePlacementRequest) string { return m.GetPlacement().GetProject() }),
	placementv1connect.PlacementServiceDeletePlacementProcedure: inProject("delete", roles.ResPlacements,
		func(m *placementv1.DeletePlacementRequest) string { return m.Project }),
	placementv1connect.PlacementServiceGetPlacementProcedure: inProject("get", roles.ResPlacements,
		func(m *placementv1.GetPlacementRequest) string { return m.Project }),
	placementv1connect.PlacementServiceListPlacementsProcedure: filtered("list", roles.ResPlacements),
	placementv1connect.PlacementServiceGetPlacementDecisionsProcedure: inProject("get", roles.ResPlacements,
		func(m *placementv1.GetPlacementDecisionsRequest) string { return m.Project }),
	placementv1connect.PlacementServiceWatchPlacementDecisionsProcedure: inProject("watch", roles.ResPlacements,
		func(m *placementv1.WatchPlacementDecisionsRequest) string { return m.Project }),
	placementv1connect.PlacementServiceSetAddOnScoreProcedure: admin("update", roles.ResAddOnScores),
	// Explaining a placement reads what its decision reads: the fleet (everyone signed in may
	// list it) and the placement, so it is GetPlacement's right in the placement's project.
	placementv1connect.PlacementServiceExplainPlacementProcedure: inProject("get", roles.ResPlacements,
		func(m *placementv1.ExplainPlacementRequest) string { return m.Project }),

	// Endpoints belong to the project owning the service's namespace on the cluster reporting
	// them, and are merged per owning project (docs/endpoints.md, "Who owns a service's
	// endpoints"): a read, or an endpoint weight not naming a cluster, needs the right in one
	// project owning the namespace and answers with that project's service; a cluster's weight
	// needs it in the project owning the namespace there. Services in a namespace no project
	// owns (and a cluster's endpoints in a namespace another cluster's project owns) are the
	// platform's.
	endpointv1connect.EndpointServiceGetServiceEndpointsProcedure: inNamespaceView("get", roles.ResServices,
		func(m *endpointv1.GetServiceEndpointsRequest) (string, string) { return "", m.Namespace }),
	endpointv1connect.EndpointServiceWatchServiceEndpointsProcedure: inNamespaceView("watch", roles.ResServices,
		func(m *endpointv1.WatchServiceEndpointsRequest) (string, string) { return "", m.Namespace }),
	endpointv1connect.EndpointServiceSetEndpointWeightProcedure: inNamespaceView("update", roles.ResServiceWeights,
		func(m *endpointv1.SetEndpointWeightRequest) (string, string) { return m.Cluster, m.Namespace }),
	endpointv1connect.EndpointServiceSetClusterWeightProcedure: inNamespace("update", roles.ResServiceWeights,
		func(m *endpointv1.SetClusterWeightRequest) (string, string) { return m.Cluster, m.Namespace }),
	endpointv1connect.EndpointServiceListServicesProcedure: filtered("list", roles.ResServices),
	// The weights are read as the service is: per cluster, by the project owning the namespace
	// there (the handler filters to those clusters).
	endpointv1connect.EndpointServiceListServiceWeightsProcedure: filtered("list", roles.ResServices),

	// The audit trail: platform admins read every row; others the rows of the projects where
	// they may list activity (project owners), which the handler filters to
	// (Caller.ProjectsAllowing), refusing a request for any other project.
	auditv1connect.AuditServiceListActivityProcedure: filtered("list", roles.ResActivity),

	// The xDS feed (endpoint-collector's and fleetd's --xds-listen, gRPC) carries every
	// service's endpoints fleet-wide, for proxies: platform admins and the xds-reader role.
	// The names are Envoy's (go-control-plane's generated code is not linked into pkg).
	"/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources": xdsReader("watch"),
	"/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources":  xdsReader("watch"),
	"/envoy.service.endpoint.v3.EndpointDiscoveryService/StreamEndpoints":              xdsReader("watch"),
	"/envoy.service.endpoint.v3.EndpointDiscoveryService/DeltaEndpoints":               xdsReader("watch"),
	"/envoy.service.endpoint.v3.EndpointDiscoveryService/FetchEndpoints":               xdsReader("get"),
	"/envoy.service.cluster.v3.ClusterDiscoveryService/StreamClusters":                 xdsReader("watch"),
	"/envoy.service.cluster.v3.ClusterDiscoveryService/DeltaClusters":                  xdsReader("watch"),
	"/envoy.service.cluster.v3.ClusterDiscoveryService/FetchClusters":                  xdsReader("get"),
	"/envoy.service.listener.v3.ListenerDiscoveryService/StreamListeners":              xdsReader("watch"),
	"/envoy.service.listener.v3.ListenerDiscoveryService/DeltaListeners":               xdsReader("watch"),
	"/envoy.service.listener.v3.ListenerDiscoveryService/FetchListeners":               xdsReader("get"),
	"/envoy.service.route.v3.RouteDiscoveryService/StreamRoutes":                       xdsReader("watch"),
	"/envoy.service.route.v3.RouteDiscoveryService/DeltaRoutes":                        xdsReader("watch"),
	"/envoy.service.route.v3.RouteDiscoveryService/FetchRoutes":                        xdsReader("get"),
}
