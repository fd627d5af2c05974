package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	auditv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/audit/v1"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
)

var update = flag.Bool("update", false, "rewrite testdata/commands/*.golden with what the commands print now")

// A commandCase is one fleetctl invocation against fakeAPI. Its golden file holds the command
// line, every request the server received (what the flags turned into), the exit code, stdout
// and stderr.
type commandCase struct {
	name  string
	args  []string
	stdin string
	// answers are the fake server's responses (see fakeAPI.answers).
	answers []proto.Message
	// formats runs the case three times: as a table, with -o json and with -o yaml.
	formats bool
	// holdStreams keeps a watch open after its answers, until the client ends it.
	holdStreams bool
	// config is the configuration file the case starts with (every case gets its own,
	// empty unless given); showConfig appends the file as the command left it to the golden.
	config     string
	showConfig bool
}

// Fixed times, so that the golden files hold the same columns every day. Columns that show an
// age (AGE, LAST SEEN) are left without a time: TestAge and TestPrintCluster cover them.
var goldenTime = timestamppb.New(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))

func goldenCluster(name string) *clusterv1.Cluster {
	return &clusterv1.Cluster{
		Id: "id-" + name, Name: name, Revision: 3,
		Labels: map[string]string{"env": "prod", "tier": "gold"},
		Claims: map[string]string{"region": "eu-west-1"},
		Taints: []*clusterv1.Taint{{Key: "maintenance", Value: "true", Effect: clusterv1.TaintEffect_TAINT_EFFECT_NO_SELECT_IF_NEW}},
		Status: &clusterv1.ClusterStatus{
			KubernetesVersion: "v1.34.1",
			CredentialsSet:    true,
			Conditions:        []*clusterv1.Condition{{Type: "AgentConnected", Status: clusterv1.ConditionStatus_CONDITION_STATUS_TRUE}},
		},
	}
}

func goldenActivity() *auditv1.Activity {
	return &auditv1.Activity{Id: 41, Time: goldenTime, Actor: "alice", Type: "fleetstream.rbac.v1.ProjectRoleBound", Kind: "rolebinding",
		Name: "User//bob/project-viewer", Project: "team-a", Stream: "FLEET_RBAC", Sequence: 7, EventId: "ev-7"}
}

func goldenDenial() *auditv1.Activity {
	return &auditv1.Activity{Id: 42, Time: goldenTime, Actor: "alice", Type: "Denied", Kind: "namespacebindings", Project: "team-a",
		Procedure: "/fleetstream.project.v1.ProjectService/BindNamespace",
		Reason:    `user "alice" may not create namespacebindings.fleetstream.io in project "team-a"`}
}

func goldenProject() *projectv1.Project {
	return &projectv1.Project{
		Name: "team-a", DisplayName: "Team A", Labels: map[string]string{"org": "web"}, Revision: 2,
		Status: &projectv1.ProjectStatus{NamespaceCount: 2, AvailableCount: 1, PendingCount: 1, Clusters: []*projectv1.ClusterQuotaStatus{
			{Cluster: "c1", NamespaceCount: 2, Hard: map[string]string{"cpu": "4"}, Used: map[string]string{"cpu": "1"}},
		}},
		Budgets: []*projectv1.ProjectBudget{{Cluster: "c1", Hard: map[string]string{"cpu": "10"}, Allocated: map[string]string{"cpu": "4"}}},
	}
}

func goldenBinding(cluster, placement string) *projectv1.NamespaceBinding {
	return &projectv1.NamespaceBinding{
		Id: "b-" + cluster, Project: "team-a", Cluster: cluster, Namespace: "web", Placement: placement,
		Phase: projectv1.BindingPhase_BINDING_PHASE_AVAILABLE, Hard: map[string]string{"cpu": "2", "memory": "4Gi"},
		Used: map[string]string{"cpu": "500m"}, Revision: 1,
	}
}

func goldenClusterSet() *placementv1.ClusterSet {
	return &placementv1.ClusterSet{
		Name: "prod", Revision: 1,
		Selector: &placementv1.ClusterSetSelector{Type: placementv1.SelectorType_SELECTOR_TYPE_LABEL_SELECTOR,
			LabelSelector: &placementv1.LabelSelector{MatchLabels: map[string]string{"env": "prod"},
				MatchExpressions: []*placementv1.LabelSelectorRequirement{{Key: "region", Operator: "In", Values: []string{"eu", "us"}}}}},
		Status: &placementv1.ClusterSetStatus{MemberCount: 2, Members: []string{"c1", "c2"}},
	}
}

func goldenSetBinding(exists bool) *placementv1.ClusterSetBinding {
	return &placementv1.ClusterSetBinding{Project: "team-a", ClusterSet: "eu", Status: &placementv1.ClusterSetBindingStatus{ClusterSetExists: exists}}
}

func goldenSetRoleBinding() *placementv1.ClusterSetRoleBinding {
	return &placementv1.ClusterSetRoleBinding{ClusterSet: "eu", Role: "clusterset-admin", Creator: "admin", CreateTime: goldenTime,
		Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: "alice"}}
}

func goldenPlacement() *placementv1.Placement {
	three := int32(3)
	return &placementv1.Placement{
		Project: "team-a", Name: "eu-3", ClusterSets: []string{"eu"}, NumberOfClusters: &three, Revision: 4,
		Status: &placementv1.PlacementStatus{NumberOfSelectedClusters: 2, Conditions: []*placementv1.PlacementCondition{
			{Type: "PlacementSatisfied", Status: "False", Reason: "NotAllDecisionsScheduled", Message: "1 cluster(s) missing"},
		}},
	}
}

func goldenRole() *rbacv1.RoleTemplate {
	rule := &rbacv1.PolicyRule{Verbs: []string{"get", "list"}, ApiGroups: []string{""}, Resources: []string{"pods"}}
	return &rbacv1.RoleTemplate{Name: "pod-reader", DisplayName: "Pod reader", Rules: []*rbacv1.PolicyRule{rule},
		EffectiveRules: []*rbacv1.PolicyRule{rule, {Verbs: []string{"get"}, NonResourceUrls: []string{"/healthz"}}}, Revision: 2}
}

func goldenPlan() []*rbacv1.PlannedChange {
	return []*rbacv1.PlannedChange{{Cluster: "c1", Namespace: "web", Name: "fleetstream:pod-reader", Action: rbacv1.ChangeAction_CHANGE_ACTION_CREATE,
		SubjectsAfter: []*rbacv1.Subject{{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: "alice"}}}}
}

func goldenPropagation() *rbacv1.GetPropagationStatusResponse {
	return &rbacv1.GetPropagationStatusResponse{UpToDate: 1, Failed: 1, Clusters: []*rbacv1.ClusterPropagation{
		{Cluster: "c1", Kind: "ClusterRole", Name: "fleetstream:pod-reader", DesiredRevision: 2, AppliedRevision: 2, UpToDate: true},
		{Cluster: "c2", Kind: "ClusterRole", Name: "fleetstream:pod-reader", DesiredRevision: 2, Phase: desiredv1.Phase_PHASE_FAILED, Reason: "Forbidden", Message: "escalation"},
	}}
}

func goldenGrant() *rbacv1.Grant {
	return &rbacv1.Grant{Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: "alice"}, Project: "team-a", Cluster: "c1",
		Namespace: "web", RoleTemplate: "pod-reader", RoleBinding: "fleetstream:pod-reader",
		Rules: []*rbacv1.PolicyRule{{Verbs: []string{"get"}, ApiGroups: []string{"apps"}, Resources: []string{"deployments"}}}}
}

func goldenPolicy() *clusterv1.ImportPolicy {
	return &clusterv1.ImportPolicy{Name: "capi", Revision: 1,
		Source: &clusterv1.ImportSource{Cluster: "mgmt", Group: "cluster.x-k8s.io", Version: "v1beta1", Resource: "clusters"},
		Status: &clusterv1.ImportPolicyStatus{SourceObjects: 2, Lifecycles: 2, ClustersCreated: 1, Conditions: []*clusterv1.Condition{
			{Type: "Validated", Status: clusterv1.ConditionStatus_CONDITION_STATUS_TRUE, Reason: "Valid"},
		}}}
}

func goldenEndpoints() []*endpointv1.ClusterEndpoints {
	return []*endpointv1.ClusterEndpoints{{ClusterId: "id-c1", ClusterName: "c1", Weight: 100, Addresses: []*endpointv1.Address{
		{Ip: "10.0.0.7", Port: 8080, PortName: "http", Protocol: "TCP", Weight: 100, Ready: true, Zone: "eu-1a", Node: "n1", Target: "cart-0"},
		{Ip: "10.0.0.8", Port: 8080, PortName: "http", Protocol: "TCP", Weight: 0, Terminating: true, Serving: true},
	}}}
}

func commandCases() []commandCase {
	cluster := goldenCluster("prod-eu-1")
	return []commandCase{
		// cluster
		{name: "cluster-register", formats: true, stdin: "apiVersion: v1\nkind: Config\n",
			args:    []string{"cluster", "register", "prod-eu-1", "--label", "env=prod", "--label", "tier=gold", "--claim", "region=eu-west-1", "--taint", "maintenance=true:NoSelectIfNew", "--kubeconfig", "-"},
			answers: []proto.Message{&clusterv1.RegisterClusterResponse{Cluster: cluster, AgentToken: "agent-s3cret"}}},
		{name: "cluster-list", formats: true, args: []string{"cluster", "list", "-l", "env=prod"},
			answers: []proto.Message{&clusterv1.ListClustersResponse{Clusters: []*clusterv1.Cluster{goldenCluster("zz-last"), cluster}}}},
		{name: "cluster-list-empty", formats: true, args: []string{"cluster", "ls"}},
		{name: "cluster-get", formats: true, args: []string{"cluster", "get", "prod-eu-1"},
			answers: []proto.Message{&clusterv1.GetClusterResponse{Cluster: cluster}}},
		{name: "cluster-get-inventory", formats: true, args: []string{"cluster", "get", "prod-eu-1", "--inventory"},
			answers: []proto.Message{&clusterv1.GetClusterResponse{Cluster: cluster, Inventory: &clusterv1.NamespaceInventory{Namespaces: []*clusterv1.InventoryNamespace{
				{Name: "web", Phase: "Active", Labels: map[string]string{"fleetstream.io/project": "team-a"}}}}}}},
		{name: "cluster-get-inventory-none", args: []string{"cluster", "get", "prod-eu-1", "--inventory"},
			answers: []proto.Message{&clusterv1.GetClusterResponse{Cluster: cluster}}},
		{name: "cluster-update", formats: true, args: []string{"cluster", "update", "prod-eu-1", "--label", "env=staging", "--taint=", "--expected-revision", "3"},
			answers: []proto.Message{&clusterv1.UpdateClusterResponse{Cluster: cluster}}},
		{name: "cluster-update-nothing", args: []string{"cluster", "update", "prod-eu-1"}},
		{name: "cluster-deregister", formats: true, args: []string{"cluster", "deregister", "prod-eu-1", "--expected-revision", "3"}},
		{name: "cluster-watch", formats: true, args: []string{"cluster", "watch", "-l", "env=prod"},
			answers: []proto.Message{
				&clusterv1.WatchClustersResponse{Type: clusterv1.WatchClustersResponse_EVENT_TYPE_ADDED, Cluster: cluster},
				&clusterv1.WatchClustersResponse{Type: clusterv1.WatchClustersResponse_EVENT_TYPE_DELETED, Cluster: goldenCluster("c2")},
			}},

		{name: "cluster-watch-timeout", holdStreams: true, args: []string{"--timeout", "500ms", "cluster", "watch"},
			answers: []proto.Message{&clusterv1.WatchClustersResponse{Type: clusterv1.WatchClustersResponse_EVENT_TYPE_ADDED, Cluster: cluster}}},
		// A server with nothing to send has not even answered the request when the time runs out.
		{name: "cluster-watch-timeout-quiet", holdStreams: true, args: []string{"--timeout", "200ms", "cluster", "watch", "-l", "env=none"}},

		// import
		{name: "import-preview", formats: true,
			args: []string{"import", "preview", "-f", "testdata/commands/policy.yaml", "--source", "testdata/commands/source.yaml", "--ref", "kubeconfig=testdata/commands/source.yaml"},
			answers: []proto.Message{&clusterv1.PreviewImportPolicyResponse{Name: "prod-eu-1", Create: true,
				Cluster: &clusterv1.PreviewCluster{Labels: map[string]string{"env": "prod"}, Server: "https://10.0.0.1:6443", CredentialsRendered: true}}}},
		{name: "import-preview-problems", args: []string{"import", "preview", "-f", "testdata/commands/policy.yaml", "--source", "testdata/commands/source.yaml"},
			answers: []proto.Message{&clusterv1.PreviewImportPolicyResponse{Name: "prod-eu-1",
				Errors: []*clusterv1.ImportFieldError{{Field: "template", Message: "unknown function"}}}}},
		{name: "import-policy-create", formats: true, args: []string{"import", "policy", "create", "-f", "testdata/commands/policy.yaml"},
			answers: []proto.Message{&clusterv1.CreateImportPolicyResponse{Policy: goldenPolicy()}}},
		{name: "import-policy-get", formats: true, args: []string{"import", "policy", "get", "capi"},
			answers: []proto.Message{&clusterv1.GetImportPolicyResponse{Policy: goldenPolicy()}}},
		{name: "import-policy-list", formats: true, args: []string{"import", "policy", "list"},
			answers: []proto.Message{&clusterv1.ListImportPoliciesResponse{Policies: []*clusterv1.ImportPolicy{goldenPolicy()}}}},
		{name: "import-policy-delete", formats: true, args: []string{"import", "policy", "delete", "capi"}},
		{name: "import-lifecycles", formats: true, args: []string{"import", "lifecycles", "capi"},
			answers: []proto.Message{&clusterv1.ListImportLifecyclesResponse{Lifecycles: []*clusterv1.ImportLifecycle{
				{Policy: "capi", Name: "prod-eu-1", Cluster: "prod-eu-1", Mode: clusterv1.ImportMode_IMPORT_MODE_CREATED, LastRenderTime: goldenTime,
					Source: &clusterv1.ImportSourceRef{Namespace: "default", Name: "prod-eu-1"}},
				{Policy: "capi", Name: "edge-1", Source: &clusterv1.ImportSourceRef{Name: "edge-1"}, Conditions: []*clusterv1.Condition{
					{Type: "Created", Status: clusterv1.ConditionStatus_CONDITION_STATUS_FALSE, Reason: "NotReady", Message: "control plane not ready"}}},
			}}}},

		// project
		{name: "project-create", formats: true, args: []string{"project", "create", "team-a", "--display-name", "Team A", "--label", "org=web"},
			answers: []proto.Message{&projectv1.CreateProjectResponse{Project: goldenProject()}}},
		{name: "project-list", formats: true, args: []string{"project", "list", "-l", "org=web"},
			answers: []proto.Message{&projectv1.ListProjectsResponse{Projects: []*projectv1.Project{goldenProject()}}}},
		{name: "project-get", formats: true, args: []string{"project", "get", "team-a"},
			answers: []proto.Message{&projectv1.GetProjectResponse{Project: goldenProject()}}},
		{name: "project-delete", formats: true, args: []string{"project", "delete", "team-a", "--force", "--unbind-policy", "delete"},
			answers: []proto.Message{&projectv1.DeleteProjectResponse{Unbound: []*projectv1.NamespaceBinding{goldenBinding("c1", "")}}}},
		{name: "project-delete-bad-policy", args: []string{"project", "delete", "team-a", "--unbind-policy", "drop"}},
		{name: "project-budget", formats: true, args: []string{"project", "budget", "team-a", "--cluster", "c1", "--hard", "cpu=10"},
			answers: []proto.Message{&projectv1.SetProjectBudgetResponse{Project: goldenProject()}}},
		{name: "project-budget-remove", args: []string{"project", "budget", "team-a", "-c", "c1", "--hard="},
			answers: []proto.Message{&projectv1.SetProjectBudgetResponse{Project: &projectv1.Project{Name: "team-a"}}}},

		// namespace
		{name: "namespace-bind", formats: true, args: []string{"namespace", "bind", "web", "-p", "team-a", "-c", "c1", "--hard", "cpu=2", "--hard", "memory=4Gi"},
			answers: []proto.Message{&projectv1.BindNamespaceResponse{Binding: goldenBinding("c1", "")}}},
		{name: "namespace-bind-placement", formats: true, args: []string{"namespace", "bind", "web", "-p", "team-a", "--placement", "eu-3", "--unbind-policy", "delete"},
			answers: []proto.Message{&projectv1.BindNamespaceResponse{PlacementBindings: []*projectv1.NamespaceBinding{goldenBinding("c1", "eu-3"), goldenBinding("c2", "eu-3")}}}},
		{name: "namespace-quota", formats: true, args: []string{"namespace", "quota", "web", "-p", "team-a", "-c", "c1", "--hard", "cpu=4"},
			answers: []proto.Message{&projectv1.UpdateQuotaResponse{Binding: goldenBinding("c1", "")}}},
		{name: "namespace-quota-needs-hard", args: []string{"namespace", "quota", "web", "-p", "team-a", "-c", "c1"}},
		{name: "namespace-unbind", formats: true, args: []string{"namespace", "unbind", "web", "-p", "team-a", "-c", "c1", "--policy", "delete"},
			answers: []proto.Message{&projectv1.UnbindNamespaceResponse{Binding: goldenBinding("c1", "")}}},
		{name: "namespace-unbind-placement", formats: true, args: []string{"namespace", "unbind", "web", "-p", "team-a", "--placement", "eu-3"}},
		{name: "namespace-list", formats: true, args: []string{"namespace", "list", "-p", "team-a"},
			answers: []proto.Message{&projectv1.ListNamespaceBindingsResponse{Bindings: []*projectv1.NamespaceBinding{goldenBinding("c1", ""), goldenBinding("c2", "eu-3")}}}},
		{name: "namespace-idle", formats: true, args: []string{"namespace", "idle", "c1"},
			answers: []proto.Message{&projectv1.ListIdleNamespacesResponse{Namespaces: []*projectv1.IdleNamespace{{Cluster: "c1", Name: "legacy", Phase: "Active"}}}}},
		{name: "namespace-missing-project", args: []string{"namespace", "bind", "web", "-c", "c1"}},

		// clusterset
		{name: "clusterset-create", formats: true, args: []string{"clusterset", "create", "prod", "--selector", "env=prod,region in (eu,us)"},
			answers: []proto.Message{&placementv1.CreateClusterSetResponse{ClusterSet: goldenClusterSet()}}},
		{name: "clusterset-create-exclusive", args: []string{"clusterset", "create", "eu"},
			answers: []proto.Message{&placementv1.CreateClusterSetResponse{ClusterSet: &placementv1.ClusterSet{Name: "eu"}}}},
		{name: "clusterset-create-bad-selector", args: []string{"clusterset", "create", "x", "--selector", "env in prod"}},
		{name: "clusterset-list", formats: true, args: []string{"clusterset", "list"},
			answers: []proto.Message{&placementv1.ListClusterSetsResponse{ClusterSets: []*placementv1.ClusterSet{goldenClusterSet(), {Name: "default"}}}}},
		{name: "clusterset-get", formats: true, args: []string{"clusterset", "get", "prod"},
			answers: []proto.Message{&placementv1.GetClusterSetResponse{ClusterSet: goldenClusterSet()}}},
		{name: "clusterset-delete", formats: true, args: []string{"clusterset", "delete", "prod"}},
		{name: "clusterset-bind", formats: true, args: []string{"clusterset", "bind", "eu", "--project", "team-a"},
			answers: []proto.Message{&placementv1.BindClusterSetResponse{Binding: goldenSetBinding(false)}}},
		{name: "clusterset-unbind", formats: true, args: []string{"clusterset", "unbind", "eu", "-p", "team-a"}},
		{name: "clusterset-bindings", formats: true, args: []string{"clusterset", "bindings", "-p", "team-a"},
			answers: []proto.Message{&placementv1.ListClusterSetBindingsResponse{Bindings: []*placementv1.ClusterSetBinding{goldenSetBinding(true)}}}},
		{name: "clusterset-role-bind", formats: true, args: []string{"clusterset", "role", "bind", "eu", "--user", "alice", "--role", "clusterset-admin"},
			answers: []proto.Message{&placementv1.BindClusterSetRoleResponse{Binding: goldenSetRoleBinding()}}},
		{name: "clusterset-role-unbind", formats: true, args: []string{"clusterset", "role", "unbind", "eu", "--group", "sre", "--role", "clusterset-view"}},
		{name: "clusterset-role-list", formats: true, args: []string{"clusterset", "role", "list", "eu"},
			answers: []proto.Message{&placementv1.ListClusterSetRoleBindingsResponse{Bindings: []*placementv1.ClusterSetRoleBinding{goldenSetRoleBinding()}}}},
		{name: "clusterset-role-two-subjects", args: []string{"clusterset", "role", "bind", "eu", "--user", "a", "--group", "g", "--role", "clusterset-view"}},

		// placement
		{name: "placement-create", formats: true, args: []string{"placement", "create", "-f", "testdata/commands/placement.yaml"},
			answers: []proto.Message{&placementv1.CreatePlacementResponse{Placement: goldenPlacement()}}},
		{name: "placement-update", formats: true, args: []string{"placement", "update", "-f", "testdata/commands/placement.yaml", "--expected-revision", "4"},
			answers: []proto.Message{&placementv1.UpdatePlacementResponse{Placement: goldenPlacement()}}},
		{name: "placement-get", formats: true, args: []string{"placement", "get", "team-a/eu-3"},
			answers: []proto.Message{&placementv1.GetPlacementResponse{Placement: goldenPlacement()}}},
		{name: "placement-list", formats: true, args: []string{"placement", "list", "-p", "team-a"},
			answers: []proto.Message{&placementv1.ListPlacementsResponse{Placements: []*placementv1.Placement{goldenPlacement()}}}},
		{name: "placement-delete", formats: true, args: []string{"placement", "delete", "eu-3", "-p", "team-a", "--expected-revision", "4"}},
		{name: "placement-decisions", formats: true, args: []string{"placement", "decisions", "eu-3", "--project", "team-a"},
			answers: []proto.Message{&placementv1.GetPlacementDecisionsResponse{Decisions: testDecisions()}}},
		{name: "placement-explain", formats: true, args: []string{"placement", "explain", "eu-3", "-p", "team-a"},
			answers: []proto.Message{testExplanation()}},
		{name: "placement-watch", formats: true, args: []string{"placement", "watch", "team-a/eu-3"},
			answers: []proto.Message{&placementv1.WatchPlacementDecisionsResponse{Decisions: testDecisions(), Added: []string{"eu-1", "eu-2"}},
				&placementv1.WatchPlacementDecisionsResponse{Removed: []string{"eu-2"}}}},

		// addonscore
		{name: "addonscore-set", formats: true, args: []string{"addonscore", "set", "--", "c1", "resource-usage", "cpuAvailable", "-20"},
			answers: []proto.Message{&placementv1.SetAddOnScoreResponse{Score: &placementv1.AddOnScore{Cluster: "c1", ResourceName: "resource-usage", ScoreName: "cpuAvailable", Score: -20}}}},

		// role
		{name: "role-create", formats: true, args: []string{"role", "create", "pod-reader", "--rule", "get,list:pods,deployments.apps", "--inherits", "base", "--display-name", "Pod reader"},
			answers: []proto.Message{&rbacv1.CreateRoleTemplateResponse{Template: goldenRole()}}},
		{name: "role-create-file", stdin: "name: auditor\nrules: [{verbs: [get], apiGroups: [''], resources: [events]}]\n", args: []string{"role", "create", "-f", "-"},
			answers: []proto.Message{&rbacv1.CreateRoleTemplateResponse{Template: goldenRole()}}},
		{name: "role-update", formats: true, args: []string{"role", "update", "pod-reader", "--rule", "get:pods", "--locked", "--expected-revision", "2"},
			answers: []proto.Message{&rbacv1.UpdateRoleTemplateResponse{Template: goldenRole()}}},
		{name: "role-delete", formats: true, args: []string{"role", "delete", "pod-reader"}},
		{name: "role-get", formats: true, args: []string{"role", "get", "pod-reader"},
			answers: []proto.Message{&rbacv1.GetRoleTemplateResponse{Template: goldenRole()}}},
		{name: "role-list", formats: true, args: []string{"role", "list"},
			answers: []proto.Message{&rbacv1.ListRoleTemplatesResponse{Templates: []*rbacv1.RoleTemplate{{Name: "z"}, goldenRole()}}}},
		{name: "role-status", formats: true, args: []string{"role", "status", "pod-reader"}, answers: []proto.Message{goldenPropagation()}},
		{name: "role-bad-rule", args: []string{"role", "create", "x", "--rule", "get"}},

		// member
		{name: "member-add", formats: true, args: []string{"member", "add", "team-a", "--user", "alice", "--role", "pod-reader", "--dry-run"},
			answers: []proto.Message{&rbacv1.BindProjectRoleResponse{Plan: goldenPlan()}}},
		{name: "member-remove", formats: true, args: []string{"member", "remove", "team-a", "--service-account", "ci:deployer", "--role", "deployer"},
			answers: []proto.Message{&rbacv1.UnbindProjectRoleResponse{}}},
		{name: "member-list", formats: true, args: []string{"member", "list", "team-a", "--group", "ops"},
			answers: []proto.Message{&rbacv1.ListProjectRoleBindingsResponse{Bindings: []*rbacv1.ProjectRoleBinding{{Project: "team-a", RoleTemplate: "pod-reader",
				Creator: "admin", CreateTime: goldenTime, Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_GROUP, Name: "ops"}}}}}},
		{name: "member-status", formats: true, args: []string{"member", "status", "team-a", "--user", "alice", "--role", "pod-reader"}, answers: []proto.Message{goldenPropagation()}},
		{name: "member-no-subject", args: []string{"member", "add", "team-a", "--role", "pod-reader"}},

		// access
		{name: "access-who-can", formats: true, args: []string{"access", "who-can", "c1", "web", "update", "deployments", "--api-group", "apps"},
			answers: []proto.Message{&rbacv1.WhoCanResponse{Project: "team-a", Grants: []*rbacv1.Grant{goldenGrant()}}}},
		{name: "access-who-can-no-project", args: []string{"access", "who-can", "c1", "kube-system"}},
		{name: "access-who-can-three-args", args: []string{"access", "who-can", "c1", "web", "get"}},
		{name: "access-at", formats: true, args: []string{"access", "at", "--user", "alice", "--time", "2026-11-21T10:00:00Z"},
			answers: []proto.Message{&rbacv1.AccessAtResponse{Grants: []*rbacv1.Grant{goldenGrant()}, RbacSequence: 12}}},

		// audit: two pages read in turn; --limit stops early and says how to go on
		{name: "audit", formats: true, args: []string{"audit", "--actor", "alice", "-p", "team-a", "--since", "2026-11-20T00:00:00Z", "--until", "2026-11-22T00:00:00Z"},
			answers: []proto.Message{
				&auditv1.ListActivityResponse{Activities: []*auditv1.Activity{goldenActivity()}, NextPageToken: "page-2"},
				&auditv1.ListActivityResponse{Activities: []*auditv1.Activity{goldenDenial()}},
			}},
		{name: "audit-limit", args: []string{"audit", "--denied", "--limit", "1"},
			answers: []proto.Message{&auditv1.ListActivityResponse{Activities: []*auditv1.Activity{goldenDenial()}, NextPageToken: "page-2"}}},
		{name: "audit-bad-since", args: []string{"audit", "--since", "last week"}},

		// endpoints
		{name: "endpoints-get", formats: true, args: []string{"endpoints", "get", "shop/cart", "--filter", "all", "--port", "http"},
			answers: []proto.Message{&endpointv1.GetServiceEndpointsResponse{Namespace: "shop", Name: "cart", Version: 7, Clusters: goldenEndpoints()}}},
		{name: "endpoints-get-bad-filter", args: []string{"endpoints", "get", "shop/cart", "--filter", "some"}},
		{name: "endpoints-list", formats: true, args: []string{"endpoints", "list", "-n", "shop"},
			answers: []proto.Message{&endpointv1.ListServicesResponse{Services: []*endpointv1.ServiceSummary{
				{Namespace: "shop", Name: "cart", Clusters: []string{"c1", "c2"}, ReadyEndpoints: 3, TotalEndpoints: 4}}}}},
		{name: "endpoints-watch", formats: true, args: []string{"endpoints", "watch", "shop/cart"},
			answers: []proto.Message{&endpointv1.WatchServiceEndpointsResponse{Namespace: "shop", Name: "cart", Exists: true, Version: 7, Clusters: goldenEndpoints()},
				&endpointv1.WatchServiceEndpointsResponse{Namespace: "shop", Name: "cart", Version: 8}}},
		{name: "endpoints-weight-ip", formats: true, args: []string{"endpoints", "weight", "shop/cart", "--ip", "10.0.0.7", "--weight", "20"},
			answers: []proto.Message{&endpointv1.SetEndpointWeightResponse{Weights: &endpointv1.ServiceWeights{Namespace: "shop", Name: "cart",
				ClusterWeights:  map[string]uint32{"c2": 0},
				EndpointWeights: []*endpointv1.EndpointWeight{{Ip: "10.0.0.7", ClusterName: "c1", TargetUid: "uid-1", Weight: 20}}}}}},
		{name: "endpoints-weight-cluster", args: []string{"endpoints", "weight", "shop/cart", "--cluster", "c2", "--weight", "0"},
			answers: []proto.Message{&endpointv1.SetClusterWeightResponse{Weights: &endpointv1.ServiceWeights{ClusterWeights: map[string]uint32{"c2": 0}}}}},
		{name: "endpoints-weight-both", args: []string{"endpoints", "weight", "shop/cart", "--ip", "10.0.0.7", "--weight", "1", "--clear"}},
		{name: "endpoints-xds-config", args: []string{"endpoints", "xds-config", "shop/cart@team-a"},
			answers: []proto.Message{&endpointv1.GetServiceEndpointsResponse{Clusters: goldenEndpoints()}}},
		{name: "endpoints-xds-config-port", args: []string{"endpoints", "xds-config", "shop/cart", "--port", "http,grpc", "--xds-server", "xds.example:18000", "--listen-port", "9000", "--node-id", "edge"}},

		// events: no API call; what it refuses.
		{name: "events-tail-needs-subscriber", args: []string{"events", "tail", "--stream", "FLEET_RBAC"}},

		// apply, diff, export: the fleet is read with List calls, then written object by object
		// (--concurrency 1 keeps the requests in a fixed order).
		{name: "apply", args: []string{"apply", "-f", "-", "--token-dir", "testdata/no-such-dir-is-written", "--concurrency", "1"}, stdin: applyStdin,
			answers: applyAnswers()},
		{name: "apply-dry-run", args: []string{"apply", "-f", "-", "--dry-run"}, stdin: applyStdin, answers: applyAnswers()},
		{name: "apply-needs-token-dir", args: []string{"apply", "-f", "-"}, stdin: applyStdin + "---\napiVersion: fleetstream.io/v1alpha1\nkind: Cluster\nmetadata: {name: us-1}\n", answers: applyAnswers()},
		{name: "apply-needs-file", args: []string{"apply"}},
		{name: "apply-prune-nothing", args: []string{"apply", "-f", "-", "--applyset", "prod", "--prune"}, stdin: "# nothing\n"},
		{name: "apply-bad-dry-run", args: []string{"apply", "-f", "-", "--dry-run=maybe"}, stdin: applyStdin},
		{name: "apply-bad-manifest", args: []string{"apply", "-f", "-"}, stdin: "apiVersion: fleetstream.io/v1alpha1\nkind: Cluster\nmetadata: {name: eu-1}\nspec:\n  taints: [{key: a, efect: TAINT_EFFECT_NO_SELECT}]\n"},
		{name: "diff", args: []string{"diff", "-f", "-"}, stdin: applyStdin, answers: applyAnswers()},
		{name: "diff-bad-manifest", args: []string{"diff", "-f", "-"}, stdin: "kind: Cluster\n"},
		{name: "export", args: []string{"export"}, answers: []proto.Message{
			&clusterv1.ListClustersResponse{Clusters: []*clusterv1.Cluster{goldenCluster("eu-1")}},
			&rbacv1.ListRoleTemplatesResponse{Templates: []*rbacv1.RoleTemplate{{Name: "project-owner"}, {Name: "reader", Rules: []*rbacv1.PolicyRule{{Verbs: []string{"get"}, Resources: []string{"pods"}}}, Revision: 4}}},
			&rbacv1.ListProjectRoleBindingsResponse{Bindings: []*rbacv1.ProjectRoleBinding{{Project: "team-a", RoleTemplate: "reader", Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_GROUP, Name: "devs"}}}},
			&placementv1.ListClusterSetsResponse{ClusterSets: []*placementv1.ClusterSet{{Name: "default"}, {Name: "europe", Selector: &placementv1.ClusterSetSelector{Type: placementv1.SelectorType_SELECTOR_TYPE_EXCLUSIVE_LABEL}}}},
			&placementv1.ListClusterSetBindingsResponse{Bindings: []*placementv1.ClusterSetBinding{{Project: "team-a", ClusterSet: "europe"}}},
			&projectv1.ListProjectsResponse{Projects: []*projectv1.Project{goldenProject()}},
			&projectv1.ListNamespaceBindingsResponse{Bindings: []*projectv1.NamespaceBinding{goldenBinding("c1", "")}},
			&clusterv1.ListSubscribersResponse{Subscribers: []*clusterv1.Subscriber{{Name: "audit", Streams: []string{"FLEET_RBAC"}}}},
			&clusterv1.ListImportPoliciesResponse{Policies: []*clusterv1.ImportPolicy{{Name: "capi", NameTemplate: "{{ .source.metadata.name }}", Revision: 3,
				Source: &clusterv1.ImportSource{Cluster: "eu-1", Group: "cluster.x-k8s.io", Version: "v1beta1", Resource: "clusters"}}}},
			&placementv1.ListPlacementsResponse{Placements: []*placementv1.Placement{{Project: "team-a", Name: "web", ClusterSets: []string{"europe"}, NumberOfClusters: proto.Int32(2), Revision: 5}}},
			&endpointv1.ListServiceWeightsResponse{Weights: []*endpointv1.ServiceWeights{{Namespace: "shop", Name: "cart", ClusterWeights: map[string]uint32{"eu-1": 0},
				EndpointWeights: []*endpointv1.EndpointWeight{{Ip: "10.0.0.7", ClusterName: "eu-1", Weight: 5, TargetUid: "uid-1"}}}}}}},
		{name: "export-project-kind", args: []string{"export", "--project", "team-a", "--kind", "NamespaceBinding"},
			answers: []proto.Message{&projectv1.ListNamespaceBindingsResponse{Bindings: []*projectv1.NamespaceBinding{goldenBinding("c1", ""), goldenBinding("c2", "eu-3"), goldenBinding("c3", "eu-3")}}}},
		{name: "export-bad-kind", args: []string{"export", "--kind", "Widget"}},

		{name: "schema", args: []string{"schema", "NamespaceBinding"}},
		{name: "schema-unknown-kind", args: []string{"schema", "Widget"}},
		// admin talks to NATS, not to the API: its goldens are the refusals before any stream is
		// touched; pkg/backup and fleetd's tests run them against JetStream.
		{name: "admin-backup-no-nats", args: []string{"admin", "backup", "testdata/commands/new-backup", "--nats-url", "nats://127.0.0.1:1"}},
		{name: "admin-restore-no-nats", args: []string{"admin", "restore", "testdata/commands", "--nats-url", "nats://127.0.0.1:1"}},
		{name: "admin-restore-bad-replicas", args: []string{"admin", "restore", "testdata/commands", "--replicas", "7"}},
		{name: "admin-restore-user-without-password", args: []string{"admin", "restore", "testdata/commands", "--nats-user", "admin"}},

		// config: the file is the case's own.
		{name: "config-set-context", args: []string{"config", "set-context", "staging", "--context-server", "https://fleet.staging.example:8080", "--context-token-file", "/run/secrets/staging", "--use"},
			config: goldenConfig, showConfig: true},
		{name: "config-set-context-token-clears-file", args: []string{"config", "set-context", "prod", "--context-token", "s3cret"}, config: goldenConfig, showConfig: true},
		{name: "config-use-context", args: []string{"config", "use-context", "dev"}, config: goldenConfig, showConfig: true},
		{name: "config-use-context-unknown", args: []string{"config", "use-context", "nope"}, config: goldenConfig},
		{name: "config-get-contexts", args: []string{"config", "get-contexts"}, config: goldenConfig},
		{name: "config-get-contexts-flag", args: []string{"config", "get-contexts", "--context", "dev"}, config: goldenConfig},
		{name: "config-bad-file", args: []string{"config", "get-contexts"}, config: "contexts:\n- name: a\n  sever: https://x\n"},

		// global flags
		{name: "global-bad-output", args: []string{"-o", "xml", "cluster", "list"}},
		{name: "global-unknown-command", args: []string{"cluster", "frobnicate"}},
	}
}

const goldenConfig = `currentContext: prod
contexts:
- name: dev
  server: http://127.0.0.1:8080
- name: prod
  server: https://fleet.example:8080
  tokenFile: /run/secrets/prod
  certificateAuthority: /etc/fleet/ca.pem
`

// applyStdin declares a cluster the fake fleet holds with other labels, a new project and a
// namespace binding in it.
const applyStdin = `apiVersion: fleetstream.io/v1alpha1
kind: Cluster
metadata:
  name: eu-1
  labels: {env: prod}
spec:
  claims: {region: eu-west-1}
  taints:
  - {key: maintenance, value: "true", effect: TAINT_EFFECT_NO_SELECT_IF_NEW}
---
apiVersion: fleetstream.io/v1alpha1
kind: Project
metadata: {name: team-b}
spec:
  displayName: Team B
  budgets:
  - {cluster: eu-1, hard: {cpu: "8"}}
---
apiVersion: fleetstream.io/v1alpha1
kind: NamespaceBinding
metadata: {name: web, project: team-b}
spec: {cluster: eu-1, hard: {cpu: "2"}}
`

func applyAnswers() []proto.Message {
	return []proto.Message{
		&clusterv1.ListClustersResponse{Clusters: []*clusterv1.Cluster{goldenCluster("eu-1")}},
		&projectv1.ListProjectsResponse{},
		&projectv1.ListNamespaceBindingsResponse{},
	}
}

// TestCommands runs every case against fakeAPI and compares with testdata/commands; run
// `go test ./cli -run TestCommands -update` to rewrite the files after a deliberate change, and
// read the diff.
func TestCommands(t *testing.T) {
	api := startFakeAPI(t)
	for _, tc := range commandCases() {
		formats := []string{""}
		if tc.formats {
			formats = []string{formatTable, formatJSON, formatYAML}
		}
		for _, format := range formats {
			name := tc.name
			args := tc.args
			if format != "" {
				name += "." + format
				args = append([]string{"-o", format}, args...)
			}
			t.Run(name, func(t *testing.T) {
				api.reset(tc.answers, nil)
				api.holdStreams(tc.holdStreams)
				cfg := filepath.Join(t.TempDir(), "config.yaml")
				t.Setenv(envConfig, cfg)
				if tc.config != "" {
					if err := os.WriteFile(cfg, []byte(tc.config), 0o600); err != nil {
						t.Fatal(err)
					}
				}
				got := runGolden(t, api, tc.stdin, args)
				if tc.showConfig {
					data, _ := os.ReadFile(cfg)
					got += "--- config\n" + string(data)
				}
				got = strings.ReplaceAll(got, cfg, "$"+envConfig)
				checkGolden(t, filepath.Join("testdata", "commands", name+".golden"), got)
			})
		}
	}
}

// watchTime masks the TIME column of watch tables, the only wall clock fleetctl prints.
var watchTime = regexp.MustCompile(`(?m)^\d\d:\d\d:\d\d `)

func runGolden(t *testing.T, api *fakeAPI, stdin string, args []string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	code := Run(context.Background(), IOStreams{In: strings.NewReader(stdin), Out: &out, ErrOut: &errOut},
		append([]string{"--server", api.url, "--token", fakeToken}, args...))
	var b strings.Builder
	fmt.Fprintf(&b, "$ fleetctl %s\n", strings.Join(args, " "))
	for _, r := range api.sent() {
		fmt.Fprintf(&b, "--- request %s\n%s\n", r.procedure, canonicalJSON(t, r.msg))
	}
	fmt.Fprintf(&b, "--- exit %d\n--- stdout\n%s--- stderr\n%s", code, watchTime.ReplaceAllString(out.String(), "HH:MM:SS "), errOut.String())
	return b.String()
}

func checkGolden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs (run with -update to rewrite it, then read the diff)\n--- got:\n%s\n--- want:\n%s", path, got, want)
	}
}

// leafCommands returns the command path of every command that does something, "cluster get"
// rather than "cluster".
func leafCommands(c *cobra.Command) []string {
	var out []string
	for _, sub := range c.Commands() {
		if sub.Name() == "help" || sub.Name() == "completion" {
			continue
		}
		if sub.HasSubCommands() {
			out = append(out, leafCommands(sub)...)
			continue
		}
		out = append(out, strings.TrimPrefix(sub.CommandPath(), "fleetctl "))
	}
	return out
}

// commandOf returns the command path args run.
func commandOf(t *testing.T, args []string) string {
	t.Helper()
	root := NewRootCommand(IOStreams{In: strings.NewReader(""), Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}})
	var words []string
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			break
		}
		words = append(words, a)
	}
	c, _, err := root.Find(words)
	if err != nil {
		t.Fatalf("find %v: %v", words, err)
	}
	return strings.TrimPrefix(c.CommandPath(), "fleetctl ")
}

// TestEveryCommandHasGoldenCases keeps TestCommands complete: a new command needs a case.
func TestEveryCommandHasGoldenCases(t *testing.T) {
	covered := map[string]bool{}
	for _, tc := range commandCases() {
		covered[commandOf(t, tc.args)] = true
	}
	root := NewRootCommand(IOStreams{In: strings.NewReader(""), Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}})
	for _, path := range leafCommands(root) {
		if !covered[path] {
			t.Errorf("fleetctl %s has no case in commandCases", path)
		}
	}
}

// A commandSpec is the shortest valid use of a command: its positional arguments and the
// flags it cannot run without.
type commandSpec struct {
	pos, flags []string
	// missing is the error when pos is left out; empty for commands that take no argument.
	missing string
	// serverError is what a NotFound answer prints, when the command does not print the API's
	// error as is; "-" for commands that send no request.
	serverError string
}

func commandSpecs() map[string]commandSpec {
	one := "error: accepts 1 arg(s), received 0\n"
	return map[string]commandSpec{
		"cluster register":       {pos: []string{"c1"}, missing: one},
		"cluster list":           {},
		"cluster get":            {pos: []string{"c1"}, missing: one},
		"cluster update":         {pos: []string{"c1"}, flags: []string{"--label", "a=b"}, missing: one},
		"cluster deregister":     {pos: []string{"c1"}, missing: one},
		"cluster watch":          {},
		"import preview":         {flags: []string{"-f", "testdata/commands/policy.yaml", "--source", "testdata/commands/source.yaml"}},
		"import policy create":   {flags: []string{"-f", "testdata/commands/policy.yaml"}},
		"import policy get":      {pos: []string{"capi"}, missing: one},
		"import policy list":     {},
		"import policy delete":   {pos: []string{"capi"}, missing: one},
		"import lifecycles":      {pos: []string{"capi"}, missing: one},
		"project create":         {pos: []string{"team-a"}, missing: one},
		"project list":           {},
		"project get":            {pos: []string{"team-a"}, missing: one},
		"project delete":         {pos: []string{"team-a"}, missing: one},
		"project budget":         {pos: []string{"team-a"}, flags: []string{"-c", "c1", "--hard", "cpu=1"}, missing: one},
		"clusterset create":      {pos: []string{"eu"}, missing: one},
		"clusterset list":        {},
		"clusterset get":         {pos: []string{"eu"}, missing: one},
		"clusterset delete":      {pos: []string{"eu"}, missing: one},
		"clusterset bind":        {pos: []string{"eu"}, flags: []string{"-p", "team-a"}, missing: one},
		"clusterset unbind":      {pos: []string{"eu"}, flags: []string{"-p", "team-a"}, missing: one},
		"clusterset bindings":    {},
		"clusterset role bind":   {pos: []string{"eu"}, flags: []string{"--user", "alice", "--role", "clusterset-view"}, missing: one},
		"clusterset role unbind": {pos: []string{"eu"}, flags: []string{"--user", "alice", "--role", "clusterset-view"}, missing: one},
		"clusterset role list":   {},
		"placement create":       {flags: []string{"-f", "testdata/commands/placement.yaml"}},
		"placement update":       {flags: []string{"-f", "testdata/commands/placement.yaml"}},
		"placement get":          {pos: []string{"team-a/eu-3"}, missing: one},
		"placement list":         {},
		"placement delete":       {pos: []string{"team-a/eu-3"}, missing: one},
		"placement decisions":    {pos: []string{"team-a/eu-3"}, missing: one},
		"placement explain":      {pos: []string{"team-a/eu-3"}, missing: one},
		"placement watch":        {pos: []string{"team-a/eu-3"}, missing: one},
		"addonscore set":         {pos: []string{"c1", "res", "score", "5"}, missing: "error: accepts 4 arg(s), received 0\n"},
		"namespace bind":         {pos: []string{"web"}, flags: []string{"-p", "team-a", "-c", "c1"}, missing: one},
		"namespace quota":        {pos: []string{"web"}, flags: []string{"-p", "team-a", "-c", "c1", "--hard", "cpu=1"}, missing: one},
		"namespace unbind":       {pos: []string{"web"}, flags: []string{"-p", "team-a", "-c", "c1"}, missing: one},
		"namespace list":         {},
		"namespace idle":         {pos: []string{"c1"}, missing: one},
		"role create":            {pos: []string{"r"}},
		"role update":            {pos: []string{"r"}, flags: []string{"--locked"}, missing: one},
		"role delete":            {pos: []string{"r"}, missing: one},
		"role get":               {pos: []string{"r"}, missing: one},
		"role list":              {},
		"role status":            {pos: []string{"r"}, missing: one},
		"member add":             {pos: []string{"team-a"}, flags: []string{"--user", "alice", "--role", "r"}, missing: one},
		"member remove":          {pos: []string{"team-a"}, flags: []string{"--user", "alice", "--role", "r"}, missing: one},
		"member list":            {},
		"member status":          {pos: []string{"team-a"}, flags: []string{"--user", "alice", "--role", "r"}, missing: one},
		"access who-can":         {pos: []string{"c1", "web"}, missing: "error: want CLUSTER NAMESPACE [VERB RESOURCE], got 0 arguments\n"},
		"access at":              {flags: []string{"--user", "alice", "--time", "1h"}},
		"audit":                  {},
		"endpoints get":          {pos: []string{"shop/cart"}, missing: one},
		"endpoints list":         {},
		"endpoints watch":        {pos: []string{"shop/cart"}, missing: one},
		"endpoints weight":       {pos: []string{"shop/cart"}, flags: []string{"--ip", "10.0.0.1", "--weight", "5"}, missing: one},
		"endpoints xds-config":   {pos: []string{"shop/cart"}, missing: one, serverError: "error: shop/cart has no endpoints in any cluster: give --port to print a bootstrap anyway\n"},
		"events tail":            {serverError: "-"},
		"apply":                  {flags: []string{"-f", "testdata/commands/fleet.yaml"}},
		// diff exits 2 on an error (1 means "there are differences"); its goldens cover it.
		"diff":                {flags: []string{"-f", "testdata/commands/fleet.yaml"}, serverError: "-"},
		"export":              {},
		"config set-context":  {pos: []string{"c"}, missing: one, serverError: "-"},
		"config use-context":  {pos: []string{"c"}, missing: one, serverError: "-"},
		"config get-contexts": {serverError: "-"},
		"admin backup":        {pos: []string{"DIR"}, missing: one, serverError: "-"},
		"admin restore":       {pos: []string{"DIR"}, missing: one, serverError: "-"},
		"schema":              {pos: []string{"Cluster"}, missing: one, serverError: "-"},
	}
}

// TestCommandErrors checks, for every command, the three ways a user's command fails: an
// unknown flag, a missing argument, and an error from the server, which must reach the user as
// the API's code and message on one line of stderr, exit code 1 and nothing on stdout.
func TestCommandErrors(t *testing.T) {
	api := startFakeAPI(t)
	specs := commandSpecs()
	root := NewRootCommand(IOStreams{In: strings.NewReader(""), Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}})
	leaves := leafCommands(root)
	if len(specs) != len(leaves) {
		t.Errorf("commandSpecs has %d commands, fleetctl %d", len(specs), len(leaves))
	}
	serverErr := connect.NewError(connect.CodeNotFound, errors.New(`thing "x" not found`))
	for _, path := range leaves {
		spec, ok := specs[path]
		if !ok {
			t.Errorf("fleetctl %s has no commandSpec", path)
			continue
		}
		words := strings.Fields(path)
		run := func(t *testing.T, args ...string) (int, string, string) {
			t.Helper()
			var out, errOut bytes.Buffer
			code := Run(context.Background(), IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut},
				append(append([]string{"--server", api.url, "--token", fakeToken}, words...), args...))
			return code, out.String(), errOut.String()
		}
		t.Run(path, func(t *testing.T) {
			t.Run("unknown flag", func(t *testing.T) {
				api.reset(nil, nil)
				code, out, errOut := run(t, append(append(spec.pos, spec.flags...), "--no-such-flag")...)
				if code != 1 || out != "" || errOut != "error: unknown flag: --no-such-flag\n" || len(api.sent()) != 0 {
					t.Errorf("exit %d, stdout %q, stderr %q, %d requests", code, out, errOut, len(api.sent()))
				}
			})
			if spec.missing != "" {
				t.Run("missing argument", func(t *testing.T) {
					api.reset(nil, nil)
					code, out, errOut := run(t, spec.flags...)
					if code != 1 || out != "" || errOut != spec.missing || len(api.sent()) != 0 {
						t.Errorf("exit %d, stdout %q, stderr %q, %d requests; want stderr %q", code, out, errOut, len(api.sent()), spec.missing)
					}
				})
			}
			if spec.serverError == "-" {
				return
			}
			t.Run("server error", func(t *testing.T) {
				api.reset(nil, serverErr)
				code, out, errOut := run(t, append(spec.pos, spec.flags...)...)
				want := spec.serverError
				if want == "" {
					want = "error: not_found: thing \"x\" not found\n"
				}
				if code != 1 || out != "" || errOut != want || len(api.sent()) == 0 {
					t.Errorf("exit %d, stdout %q, stderr %q, %d requests; want stderr %q", code, out, errOut, len(api.sent()), want)
				}
			})
		})
	}
}

// TestHelp pins every command's usage and flags with their defaults, the interface scripts
// are written against: a renamed flag or a changed default must be a deliberate -update.
func TestHelp(t *testing.T) {
	root := NewRootCommand(IOStreams{In: strings.NewReader(""), Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}})
	for _, path := range append([]string{""}, leafCommands(root)...) {
		name := "fleetctl"
		if path != "" {
			name = strings.ReplaceAll(path, " ", "-")
		}
		t.Run(name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := Run(context.Background(), IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut},
				append(strings.Fields(path), "--help"))
			if code != 0 || errOut.Len() != 0 {
				t.Fatalf("exit %d, stderr %q", code, errOut.String())
			}
			checkGolden(t, filepath.Join("testdata", "help", name+".golden"), out.String())
		})
	}
}
