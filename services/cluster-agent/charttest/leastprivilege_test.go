package charttest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	mcscrd "sigs.k8s.io/mcs-api/config/crd"

	"github.com/fleetstream/fleetstream/pkg/events"
	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	fleetrbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/protectedns"
	"github.com/fleetstream/fleetstream/pkg/roles"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/topology"
	"github.com/fleetstream/fleetstream/services/cluster-agent/agent"
	"github.com/fleetstream/fleetstream/services/cluster-agent/desired"
	"github.com/fleetstream/fleetstream/services/cluster-agent/endpointslices"
	agentmcs "github.com/fleetstream/fleetstream/services/cluster-agent/mcs"
)

const (
	lpCluster = "member-lp"
	// The chart's defaults: release "fleetstream" in namespace fleetstream-agent.
	agentNamespace = "fleetstream-agent"
	agentSA        = "fleetstream-cluster-agent"
	agentRole      = "fleetstream-cluster-agent"
	converge       = 30 * time.Second
)

// agentUser is the ServiceAccount's user name, as the apiserver authenticates its token.
var agentUser = "system:serviceaccount:" + agentNamespace + ":" + agentSA

// agentGroups are the groups every token of that ServiceAccount carries.
var agentGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + agentNamespace, "system:authenticated"}

// TestAgentWithChartClusterRole runs the agent as cmd/cluster-agent assembles it, as the
// chart's ServiceAccount bound to the chart's ClusterRole only (its rules read from the file the
// chart includes), and shows every function works: namespaces, quotas, the fleet's ClusterRoles
// and RoleBindings of them (no escalation error), removal, the namespace inventory, node
// resources and EndpointSlice reports; and that the identity cannot read Secrets.
func TestAgentWithChartClusterRole(t *testing.T) {
	j, k := testkit.StartJetStream(t), testkit.StartKube(t)
	ctx := testkit.Context(t, 3*time.Minute)
	admin := k.Client

	// The hub's side: what cluster-import, namespace-binding and rbac-sync create.
	must(t, "agent stream", topology.Ensure(ctx, j.JS, 1, topology.Topology{Streams: []jetstream.StreamConfig{subjects.AgentStream()}}))
	buckets := map[string]jetstream.KeyValue{}
	for _, b := range append(subjects.DesiredBuckets(), subjects.AppliedBucket) {
		kv, err := j.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: b, History: 1})
		must(t, "bucket "+b, err)
		buckets[b] = kv
	}

	// The chart's identity: its ClusterRole, bound to its ServiceAccount, and the admission
	// policy that narrows its escalate and bind to the fleet's roles.
	bindAgent(t, ctx, admin, agentRole, agentRules(t), rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: agentSA, Namespace: agentNamespace})
	adminDyn, err := dynamic.NewForConfig(k.Config)
	must(t, "admin dynamic client", err)
	for _, u := range agentPolicy(t, agentUser, protectedns.Defaults()) {
		resource := map[string]string{"ValidatingAdmissionPolicy": "validatingadmissionpolicies", "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings"}[u.GetKind()]
		gvr := schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: resource}
		_, err := adminDyn.Resource(gvr).Create(ctx, u, metav1.CreateOptions{})
		must(t, "admission policy "+u.GetKind(), err)
	}
	cfg := k.ConfigAs(agentUser, agentGroups...)
	kube, err := kubernetes.NewForConfig(cfg)
	must(t, "agent clientset", err)
	dyn, err := dynamic.NewForConfig(cfg)
	must(t, "agent dynamic client", err)

	// What the cluster already runs: a node, a service with endpoints, a Secret.
	mustCreateNode(t, ctx, admin, "node-a", "4", "8Gi")
	for _, ns := range []string{agentNamespace, "shop"} {
		_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		must(t, "namespace "+ns, err)
	}
	_, err = admin.CoreV1().Secrets("shop").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db"}, StringData: map[string]string{"password": "s3cret"}}, metav1.CreateOptions{})
	must(t, "secret", err)
	ready := true
	_, err = admin.DiscoveryV1().EndpointSlices("shop").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "api-1", Labels: map[string]string{discoveryv1.LabelServiceName: "api"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.1.0.7"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
	}, metav1.CreateOptions{})
	must(t, "endpointslice", err)
	waitPolicyInForce(t, ctx, dyn)
	// Multi-cluster Services' CRDs, as a cluster that uses them has (upstream's files).
	k.InstallCRD(t, mcscrd.ServiceExportCRD)
	k.InstallCRD(t, mcscrd.ServiceImportCRD)

	startAgent(t, j, kube, dyn)

	// The desired state namespace-binding and rbac-sync would write: a namespace with a quota,
	// the built-in project roles as ClusterRoles, and one RoleBinding of each in the namespace.
	nsObj := desiredEntry(subjects.DesiredNamespacesBucket, "Namespace", "", "web", map[string]any{
		"apiVersion": "v1", "kind": "Namespace",
		"metadata": map[string]any{"name": "web", "labels": map[string]any{"fleetstream.io/project": "team-a"}},
	}, "namespace-binding")
	nsObj.obj.OwnerLabelKey, nsObj.obj.OwnerLabelValue = "fleetstream.io/project", "team-a"
	quota := desiredEntry(subjects.DesiredNamespacesBucket, "ResourceQuota", "web", "fleetstream-quota", map[string]any{
		"apiVersion": "v1", "kind": "ResourceQuota",
		"metadata": map[string]any{"name": "fleetstream-quota", "namespace": "web"},
		"spec":     map[string]any{"hard": map[string]any{"requests.cpu": "2", "requests.memory": "4Gi"}},
	}, "namespace-binding")
	quota.obj.ReportStatus = true
	entries := []entry{nsObj, quota}
	users := map[string]string{roles.ProjectOwner: "alice", roles.ProjectMember: "bob", roles.ProjectViewer: "carol"}
	for _, tpl := range roles.Builtin() {
		name := "fleetstream:" + tpl.Name
		entries = append(entries,
			desiredEntry(subjects.DesiredRBACBucket, "ClusterRole", "", name, map[string]any{
				"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
				"metadata": map[string]any{"name": name, "labels": map[string]any{"fleetstream.io/owner": "rbac-sync"}},
				"rules":    fleetRules(tpl.Name),
			}, "rbac-sync"),
			desiredEntry(subjects.DesiredRBACBucket, "RoleBinding", "web", name, map[string]any{
				"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
				"metadata": map[string]any{"name": name, "namespace": "web", "labels": map[string]any{"fleetstream.io/owner": "rbac-sync"}},
				"roleRef":  map[string]any{"apiGroup": rbacv1.GroupName, "kind": "ClusterRole", "name": name},
				"subjects": []any{map[string]any{"apiGroup": rbacv1.GroupName, "kind": "User", "name": users[tpl.Name]}},
			}, "rbac-sync"),
		)
	}
	for _, e := range entries {
		e.put(t, ctx, buckets)
	}

	t.Run("applies namespaces, quotas, the fleet's ClusterRoles and RoleBindings", func(t *testing.T) {
		for _, e := range entries {
			e.wait(t, ctx, buckets, desiredv1.Phase_PHASE_APPLIED, desired.ReasonApplied)
		}
		rq, err := admin.CoreV1().ResourceQuotas("web").Get(ctx, "fleetstream-quota", metav1.GetOptions{})
		must(t, "quota", err)
		if got := rq.Spec.Hard[corev1.ResourceRequestsCPU]; got.String() != "2" {
			t.Fatalf("quota requests.cpu %s, want 2", got.String())
		}
		// The bindings are in force: each user has the rights of the role it was bound to.
		for _, c := range []struct {
			user, verb, group, resource string
			want                        bool
		}{
			{"alice", "create", rbacv1.GroupName, "rolebindings", true}, // project-owner manages members
			{"bob", "create", "", "secrets", true},                      // project-member edits workloads
			{"bob", "create", rbacv1.GroupName, "rolebindings", false},
			{"carol", "list", "", "pods", true}, // project-viewer reads
			{"carol", "create", "", "pods", false},
		} {
			if got := allowed(t, ctx, admin, c.user, nil, c.verb, c.group, c.resource, "web"); got != c.want {
				t.Errorf("%s %s %s in web: %v, want %v", c.user, c.verb, c.resource, got, c.want)
			}
		}
	})

	t.Run("reports the inventory, node resources and EndpointSlices", func(t *testing.T) {
		testkit.Eventually(t, converge, func() error {
			inv, err := latest[*agentv1.NamespaceInventory](ctx, j.JS, subjects.AgentInventory(lpCluster))
			if err != nil {
				return err
			}
			seen := map[string]bool{}
			for _, ns := range inv.GetNamespaces() {
				seen[ns.GetName()] = true
			}
			if !seen["web"] || !seen["shop"] {
				return fmt.Errorf("inventory without web and shop: %v", inv.GetNamespaces())
			}
			return nil
		})
		testkit.Eventually(t, converge, func() error {
			hb, err := nextHeartbeat(ctx, j.JS.Conn(), lpCluster)
			if err != nil {
				return err
			}
			if hb.GetResources() == nil {
				return errors.New("heartbeat without node resources")
			}
			return nil
		})
		testkit.Eventually(t, converge, func() error {
			r, err := latest[*endpointv1.EndpointSliceReport](ctx, j.JS, subjects.AgentEndpointSlice(lpCluster, "shop", "api-1"))
			if err != nil {
				return err
			}
			if len(r.GetEndpoints()) != 1 {
				return fmt.Errorf("endpointslice report %v, want one endpoint", r)
			}
			return nil
		})
	})

	t.Run("reports ServiceExports, applies imports and writes the Conflict condition", func(t *testing.T) {
		_, err := admin.CoreV1().Services("web").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "api"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}, metav1.CreateOptions{})
		must(t, "service", err)
		_, err = adminDyn.Resource(agentmcs.ExportsGVR).Namespace("web").Create(ctx, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceExport", "metadata": map[string]any{"name": "api"}}}, metav1.CreateOptions{})
		must(t, "service export", err)
		testkit.Eventually(t, converge, func() error {
			r, err := latest[*endpointv1.ServiceExportsReport](ctx, j.JS, subjects.AgentServiceExports(lpCluster, "web"))
			if err != nil {
				return err
			}
			if len(r.GetExports()) != 1 || r.Exports[0].GetName() != "api" || len(r.Exports[0].GetPorts()) != 1 {
				return fmt.Errorf("export report %v", r)
			}
			return nil
		})
		imp := desiredEntry(subjects.DesiredMCSBucket, "ServiceImport.multicluster.x-k8s.io", "web", "api", map[string]any{
			"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceImport",
			"metadata": map[string]any{"name": "api", "namespace": "web", "annotations": map[string]any{"mcs.fleetstream.io/conflict": "PortConflict: a test's verdict"}},
			"spec":     map[string]any{"type": "ClusterSetIP", "ports": []any{map[string]any{"name": "http", "port": 80, "protocol": "TCP"}}},
		}, "endpoint-collector")
		slice := desiredEntry(subjects.DesiredMCSBucket, "EndpointSlice.discovery.k8s.io", "web", "api.c9", map[string]any{
			"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
			"metadata": map[string]any{"name": "api.c9", "namespace": "web", "labels": map[string]any{"multicluster.kubernetes.io/service-name": "api", "multicluster.kubernetes.io/source-cluster": "c9",
				"endpointslice.kubernetes.io/managed-by": "mcs.fleetstream.io"}},
			"endpoints": []any{map[string]any{"addresses": []any{"10.9.0.1"}}},
		}, "endpoint-collector")
		for _, e := range []entry{imp, slice} {
			e.obj.OwnerLabelKey, e.obj.OwnerLabelValue = "fleetstream.io/project", "team-a"
			e.put(t, ctx, buckets)
			e.wait(t, ctx, buckets, desiredv1.Phase_PHASE_APPLIED, desired.ReasonApplied)
		}
		testkit.Eventually(t, converge, func() error {
			u, err := adminDyn.Resource(agentmcs.ExportsGVR).Namespace("web").Get(ctx, "api", metav1.GetOptions{})
			if err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, c := range conds {
				if m := c.(map[string]any); m["type"] == "Conflict" && m["status"] == "True" && m["reason"] == "PortConflict" {
					return nil
				}
			}
			return fmt.Errorf("export conditions %v", conds)
		})
		for _, e := range []entry{imp, slice} {
			e.tombstone(t, ctx, buckets)
			e.wait(t, ctx, buckets, desiredv1.Phase_PHASE_APPLIED, desired.ReasonDeleted)
		}
	})

	t.Run("removes what is no longer desired", func(t *testing.T) {
		// Reverse order: bindings before roles, the namespace last.
		for i := len(entries) - 1; i >= 0; i-- {
			e := entries[i]
			if e.kind == "Namespace" {
				continue
			}
			e.tombstone(t, ctx, buckets)
			e.wait(t, ctx, buckets, desiredv1.Phase_PHASE_APPLIED, desired.ReasonDeleted)
		}
		if _, err := admin.RbacV1().ClusterRoles().Get(ctx, "fleetstream:"+roles.ProjectOwner, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("ClusterRole after its removal: %v", err)
		}
		nsObj.tombstone(t, ctx, buckets)
		// Without a namespace controller the namespace stays Terminating: the delete went through.
		testkit.Eventually(t, converge, func() error {
			ns, err := admin.CoreV1().Namespaces().Get(ctx, "web", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if ns.DeletionTimestamp == nil {
				return errors.New("namespace web not being deleted")
			}
			return nil
		})
	})

	t.Run("cannot read Secrets or grant itself cluster-wide rights", func(t *testing.T) {
		_, err := kube.CoreV1().Secrets("shop").Get(ctx, "db", metav1.GetOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("get secret as the agent: %v, want Forbidden", err)
		}
		_, err = kube.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("list secrets as the agent: %v, want Forbidden", err)
		}
		_, err = kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "agent-admin"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: agentSA, Namespace: agentNamespace}},
		}, metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("create a ClusterRoleBinding as the agent: %v, want Forbidden", err)
		}
		for _, c := range []struct{ verb, group, resource string }{
			{"get", "", "secrets"}, {"list", "", "secrets"}, {"watch", "", "secrets"},
			{"get", "", "pods"}, {"create", "", "pods"}, {"list", "", "configmaps"},
			{"create", rbacv1.GroupName, "clusterrolebindings"}, {"update", "", "nodes"},
		} {
			if allowed(t, ctx, admin, agentUser, agentGroups, c.verb, c.group, c.resource, "") {
				t.Errorf("the agent may %s %s.%s", c.verb, c.resource, c.group)
			}
		}
	})

	t.Run("without escalate and bind the fleet's roles are refused", func(t *testing.T) {
		// The same rules less escalate and bind: what the README's note on them is about.
		var trimmed []rbacv1.PolicyRule
		for _, r := range agentRules(t) {
			r.Verbs = strings.Fields(strings.NewReplacer("escalate", "", "bind", "").Replace(strings.Join(r.Verbs, " ")))
			trimmed = append(trimmed, r)
		}
		const user = "agent-without-escalate"
		bindAgent(t, ctx, admin, user, trimmed, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user})
		weak, err := dynamic.NewForConfig(k.ConfigAs(user, "system:authenticated"))
		must(t, "dynamic client", err)
		// The project-owner role as rbac-sync writes it, under a name of its own.
		const probe = "fleetstream:probe-owner"
		role := map[string]any{
			"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
			"metadata": map[string]any{"name": probe}, "rules": fleetRules(roles.ProjectOwner),
		}
		clusterRoles := schema.GroupVersionResource{Group: rbacv1.GroupName, Version: "v1", Resource: "clusterroles"}
		err = applyAs(ctx, weak, clusterRoles, "", role)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "escalat") {
			t.Errorf("apply the project-owner ClusterRole without escalate: %v, want Forbidden (escalation)", err)
		}
		// With the role in place (the admin writes it), binding it is still refused.
		admin, err := dynamic.NewForConfig(k.Config)
		must(t, "admin dynamic client", err)
		must(t, "admin applies the role", applyAs(ctx, admin, clusterRoles, "", role))
		_, err = k.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "web2"}}, metav1.CreateOptions{})
		must(t, "namespace web2", err)
		binding := map[string]any{
			"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
			"metadata": map[string]any{"name": probe, "namespace": "web2"},
			"roleRef":  map[string]any{"apiGroup": rbacv1.GroupName, "kind": "ClusterRole", "name": probe},
			"subjects": []any{map[string]any{"apiGroup": rbacv1.GroupName, "kind": "User", "name": "alice"}},
		}
		err = applyAs(ctx, weak, schema.GroupVersionResource{Group: rbacv1.GroupName, Version: "v1", Resource: "rolebindings"}, "web2", binding)
		if !apierrors.IsForbidden(err) {
			t.Errorf("bind the project-owner ClusterRole without bind: %v, want Forbidden", err)
		}
		// The chart's identity may do both.
		must(t, "bind as the agent", applyAs(ctx, dyn, schema.GroupVersionResource{Group: rbacv1.GroupName, Version: "v1", Resource: "rolebindings"}, "web2", binding))
	})

	// escalate and bind on every ClusterRole would let the agent's identity (a stolen token)
	// edit a ClusterRole bound cluster-wide, or bind cluster-admin anywhere: cluster-admin.
	// The chart's admission policy keeps it to the fleet's ClusterRoles, outside the protected
	// namespaces; RBAC's resourceNames cannot, the names being made at runtime.
	t.Run("a stolen agent token cannot reach beyond the fleet's roles", func(t *testing.T) {
		star := []any{map[string]any{"apiGroups": []any{"*"}, "resources": []any{"*"}, "verbs": []any{"*"}}}
		clusterRole := func(name string, labels map[string]any, extra map[string]any) map[string]any {
			m := map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
				"metadata": map[string]any{"name": name, "labels": labels}, "rules": star}
			for k, v := range extra {
				m[k] = v
			}
			return m
		}
		roleBinding := func(namespace, name, role string) map[string]any {
			return map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
				"metadata": map[string]any{"name": name, "namespace": namespace},
				"roleRef":  map[string]any{"apiGroup": rbacv1.GroupName, "kind": "ClusterRole", "name": role},
				"subjects": []any{map[string]any{"apiGroup": rbacv1.GroupName, "kind": "User", "name": "mallory"}}}
		}
		clusterRoles := schema.GroupVersionResource{Group: rbacv1.GroupName, Version: "v1", Resource: "clusterroles"}
		roleBindings := schema.GroupVersionResource{Group: rbacv1.GroupName, Version: "v1", Resource: "rolebindings"}
		slices := schema.GroupVersionResource{Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"}
		imports := schema.GroupVersionResource{Group: "multicluster.x-k8s.io", Version: "v1alpha1", Resource: "serviceimports"}
		slice := func(namespace, name string, labels map[string]any) map[string]any {
			return map[string]any{"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
				"metadata":  map[string]any{"name": name, "namespace": namespace, "labels": labels},
				"endpoints": []any{map[string]any{"addresses": []any{"10.66.0.1"}}}}
		}
		imported := map[string]any{"endpointslice.kubernetes.io/managed-by": "mcs.fleetstream.io", "multicluster.kubernetes.io/service-name": "api"}
		for _, c := range []struct {
			name      string
			gvr       schema.GroupVersionResource
			namespace string
			manifest  map[string]any
		}{
			{"widen its own ClusterRole", clusterRoles, "", clusterRole(agentRole, nil, nil)},
			{"widen a bootstrap ClusterRole bound to everyone", clusterRoles, "", clusterRole("system:basic-user", nil, nil)},
			{"aggregate a fleet ClusterRole into admin", clusterRoles, "", clusterRole("fleetstream:evil", map[string]any{"rbac.authorization.k8s.io/aggregate-to-admin": "true"}, nil)},
			{"aggregate others into a fleet ClusterRole", clusterRoles, "", clusterRole("fleetstream:agg", nil, map[string]any{"aggregationRule": map[string]any{
				"clusterRoleSelectors": []any{map[string]any{"matchLabels": map[string]any{"kubernetes.io/bootstrapping": "rbac-defaults"}}}}})},
			{"bind cluster-admin in a project namespace", roleBindings, "shop", roleBinding("shop", "mallory", "cluster-admin")},
			{"bind a fleet role in kube-system", roleBindings, "kube-system", roleBinding("kube-system", "fleetstream:project-owner", "fleetstream:project-owner")},
			{"bind a fleet role in its own namespace", roleBindings, agentNamespace, roleBinding(agentNamespace, "fleetstream:project-owner", "fleetstream:project-owner")},
			{"route kube-dns to its own endpoints", slices, "kube-system", slice("kube-system", "kube-dns-evil", map[string]any{
				"kubernetes.io/service-name": "kube-dns", "endpointslice.kubernetes.io/managed-by": "mcs.fleetstream.io"})},
			{"route a project's Service to its own endpoints", slices, "shop", slice("shop", "api-evil", map[string]any{
				"kubernetes.io/service-name": "api", "endpointslice.kubernetes.io/managed-by": "mcs.fleetstream.io"})},
			{"write a slice as Kubernetes' controller", slices, "shop", slice("shop", "api-evil2", map[string]any{
				"endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"})},
			{"import endpoints into kube-system", slices, "kube-system", slice("kube-system", "api.c9", imported)},
			{"import a service into kube-system", imports, "kube-system", map[string]any{"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceImport",
				"metadata": map[string]any{"name": "api", "namespace": "kube-system"},
				"spec":     map[string]any{"type": "ClusterSetIP", "ports": []any{map[string]any{"name": "http", "port": 80, "protocol": "TCP"}}}}},
		} {
			err := applyAs(ctx, dyn, c.gvr, c.namespace, c.manifest)
			if err == nil || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy") {
				t.Errorf("%s as the agent: %v, want the admission policy's denial", c.name, err)
			}
		}
		err := dyn.Resource(clusterRoles).Delete(ctx, "admin", metav1.DeleteOptions{})
		if err == nil || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy") {
			t.Errorf("delete ClusterRole admin as the agent: %v, want the admission policy's denial", err)
		}
	})
}

// waitPolicyInForce waits until the apiserver enforces the agent's admission policy (it loads
// policies asynchronously): binding cluster-admin as the agent is then denied.
func waitPolicyInForce(t *testing.T, ctx context.Context, agent dynamic.Interface) {
	t.Helper()
	rb := agent.Resource(schema.GroupVersionResource{Group: rbacv1.GroupName, Version: "v1", Resource: "rolebindings"}).Namespace("shop")
	binding := map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
		"metadata": map[string]any{"name": "policy-probe", "namespace": "shop"},
		"roleRef":  map[string]any{"apiGroup": rbacv1.GroupName, "kind": "ClusterRole", "name": "cluster-admin"},
		"subjects": []any{map[string]any{"apiGroup": rbacv1.GroupName, "kind": "User", "name": "nobody"}}}
	testkit.Eventually(t, converge, func() error {
		err := applyAs(ctx, agent, schema.GroupVersionResource{Group: rbacv1.GroupName, Version: "v1", Resource: "rolebindings"}, "shop", binding)
		if err == nil {
			_ = rb.Delete(ctx, "policy-probe", metav1.DeleteOptions{})
			return errors.New("the admission policy is not in force yet")
		}
		if !strings.Contains(err.Error(), "ValidatingAdmissionPolicy") {
			return err
		}
		return nil
	})
}

// bindAgent creates ClusterRole name with rules, bound to subject.
func bindAgent(t *testing.T, ctx context.Context, admin kubernetes.Interface, name string, rules []rbacv1.PolicyRule, subject rbacv1.Subject) {
	t.Helper()
	_, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{})
	must(t, "clusterrole "+name, err)
	_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{subject},
	}, metav1.CreateOptions{})
	must(t, "clusterrolebinding "+name, err)
}

// startAgent runs the agent with every part cmd/cluster-agent adds, until the test ends.
func startAgent(t *testing.T, j *testkit.JetStream, kube kubernetes.Interface, dyn dynamic.Interface) {
	t.Helper()
	log := testkit.Logger(t)
	_, js := j.Connect(t)
	a, err := agent.New(agent.Config{ClusterName: lpCluster, HeartbeatInterval: 200 * time.Millisecond,
		InventoryDebounce: 100 * time.Millisecond, ResourcesDebounce: 50 * time.Millisecond}, js, kube, log)
	must(t, "new agent", err)
	ap, err := desired.New(desired.Config{ClusterName: lpCluster, ResyncPeriod: 10 * time.Second}, js, dyn, kube.Discovery(), log)
	must(t, "new applier", err)
	a.Add(ap)
	a.Add(agent.NewImportWatcher(a, dyn, kube.Discovery(), agent.ImportWatchConfig{}))
	filter, err := endpointslices.ParseFilter("all")
	must(t, "filter", err)
	rep, err := endpointslices.New(endpointslices.Config{ClusterName: lpCluster, Filter: filter, SessionID: a.SessionID()}, a.Informers(), a.Store(), log)
	must(t, "new endpointslice reporter", err)
	a.Add(rep)
	exports, err := agentmcs.New(agentmcs.Config{ClusterName: lpCluster, SessionID: a.SessionID()}, kube, dyn, a.Store(), log)
	must(t, "new export reporter", err)
	a.Add(exports)
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("agent run: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("agent did not stop")
		}
	})
}

// entry is one desired object as the hub's services write it.
type entry struct {
	bucket, kind, namespace, name string
	manifest                      map[string]any
	obj                           *desiredv1.DesiredObject
}

func desiredEntry(bucket, kind, namespace, name string, manifest map[string]any, owner string) entry {
	data, err := json.Marshal(manifest)
	if err != nil {
		panic(err)
	}
	obj := &desiredv1.DesiredObject{Manifest: data, Owner: owner}
	if owner == "rbac-sync" {
		obj.OwnerLabelKey, obj.OwnerLabelValue = "fleetstream.io/owner", "rbac-sync"
	}
	return entry{bucket: bucket, kind: kind, namespace: namespace, name: name, manifest: manifest, obj: obj}
}

func (e entry) key() string { return subjects.DesiredKey(lpCluster, e.kind, e.namespace, e.name) }

func (e entry) put(t *testing.T, ctx context.Context, buckets map[string]jetstream.KeyValue) {
	t.Helper()
	data, err := proto.Marshal(e.obj)
	must(t, "marshal", err)
	_, err = buckets[e.bucket].Put(ctx, e.key(), data)
	must(t, "put "+e.key(), err)
}

func (e entry) tombstone(t *testing.T, ctx context.Context, buckets map[string]jetstream.KeyValue) {
	t.Helper()
	e.obj = &desiredv1.DesiredObject{Tombstone: true, DeletionPolicy: desiredv1.DeletionPolicy_DELETION_POLICY_DELETE,
		Owner: e.obj.Owner, OwnerLabelKey: e.obj.OwnerLabelKey, OwnerLabelValue: e.obj.OwnerLabelValue}
	e.put(t, ctx, buckets)
}

// wait waits until the agent reports e's status as phase and reason.
func (e entry) wait(t *testing.T, ctx context.Context, buckets map[string]jetstream.KeyValue, phase desiredv1.Phase, reason string) {
	t.Helper()
	testkit.Eventually(t, converge, func() error {
		ent, err := buckets[subjects.AppliedBucket].Get(ctx, subjects.AppliedKey(e.bucket, e.key()))
		if err != nil {
			return fmt.Errorf("status of %s: %w", e.key(), err)
		}
		st := &desiredv1.AppliedStatus{}
		if err := proto.Unmarshal(ent.Value(), st); err != nil {
			return err
		}
		if st.GetPhase() != phase || st.GetReason() != reason {
			return fmt.Errorf("%s: %v %s (%s), want %v %s", e.key(), st.GetPhase(), st.GetReason(), st.GetMessage(), phase, reason)
		}
		return nil
	})
}

// fleetRules is the flattened rules of a built-in template, as rbac-sync writes them.
func fleetRules(template string) []any {
	builtin := roles.Builtin()
	lookup := func(n string) (*fleetrbacv1.RoleTemplate, bool) {
		for _, tpl := range builtin {
			if tpl.Name == n {
				return tpl, true
			}
		}
		return nil, false
	}
	var out []any
	for _, r := range roles.EffectiveRules(lookup, template) {
		rule := map[string]any{"verbs": r.GetVerbs()}
		if len(r.GetApiGroups()) > 0 {
			rule["apiGroups"] = r.GetApiGroups()
		}
		if len(r.GetResources()) > 0 {
			rule["resources"] = r.GetResources()
		}
		out = append(out, rule)
	}
	return out
}

// allowed asks the apiserver (SubjectAccessReview) whether user may verb group/resource.
func allowed(t *testing.T, ctx context.Context, admin kubernetes.Interface, user string, groups []string, verb, group, resource, namespace string) bool {
	t.Helper()
	r, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user, Groups: groups,
		ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Group: group, Resource: resource, Namespace: namespace},
	}}, metav1.CreateOptions{})
	must(t, "subjectaccessreview", err)
	return r.Status.Allowed
}

// applyAs server-side applies manifest with dyn's identity.
func applyAs(ctx context.Context, dyn dynamic.Interface, gvr schema.GroupVersionResource, namespace string, manifest map[string]any) error {
	data, err := json.Marshal(manifest)
	if err != nil {
		return err
	}
	name := manifest["metadata"].(map[string]any)["name"].(string)
	var ri dynamic.ResourceInterface = dyn.Resource(gvr)
	if namespace != "" {
		ri = dyn.Resource(gvr).Namespace(namespace)
	}
	force := true
	_, err = ri.Patch(ctx, name, types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: "escalation-probe", Force: &force})
	return err
}

// mustCreateNode creates a Ready node with cpu and memory, its status written as a kubelet would.
func mustCreateNode(t *testing.T, ctx context.Context, admin kubernetes.Interface, name, cpu, memory string) {
	t.Helper()
	n, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	must(t, "node", err)
	list := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory), corev1.ResourcePods: resource.MustParse("110")}
	now := metav1.Now()
	n.Status = corev1.NodeStatus{Capacity: list, Allocatable: list, Conditions: []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now,
	}}}
	_, err = admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
	must(t, "node status", err)
}

// nextHeartbeat waits (up to 15 s) for the next heartbeat of cluster's agent: heartbeats go on
// core NATS and are not stored, so there is no last one to read.
func nextHeartbeat(ctx context.Context, nc *nats.Conn, cluster string) (*agentv1.Heartbeat, error) {
	sub, err := nc.SubscribeSync(subjects.AgentLiveHeartbeat(cluster))
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	m, err := sub.NextMsgWithContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("heartbeat of %s: %w", cluster, err)
	}
	hb := &agentv1.Heartbeat{}
	if err := proto.Unmarshal(m.Data, hb); err != nil {
		return nil, fmt.Errorf("heartbeat of %s: %w", cluster, err)
	}
	return hb, nil
}

// latest returns the payload of the last report on subject.
func latest[T proto.Message](ctx context.Context, js jetstream.JetStream, subject string) (T, error) {
	var zero T
	s, err := js.Stream(ctx, subjects.AgentStreamName)
	if err != nil {
		return zero, err
	}
	m, err := s.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		return zero, fmt.Errorf("last on %s: %w", subject, err)
	}
	ev, err := events.Decode(m.Data)
	if err != nil {
		return zero, err
	}
	p, ok := ev.Payload.(T)
	if !ok {
		return zero, fmt.Errorf("payload of %s is %T", subject, ev.Payload)
	}
	return p, nil
}
