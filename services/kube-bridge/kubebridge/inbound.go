package kubebridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/zap"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1/endpointv1connect"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1/placementv1connect"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1/rbacv1connect"
	"github.com/fleetstream/fleetstream/pkg/paging"
	"github.com/fleetstream/fleetstream/pkg/weights"
)

// The fleetstream.io custom resources the bridge reconciles into Fleetstream (the write side):
// their CRDs are generated from fleetctl apply's manifest schemas (services/kube-bridge/crds).
var (
	ProjectGVR            = schema.GroupVersionResource{Group: "fleetstream.io", Version: "v1alpha1", Resource: "projects"}
	NamespaceBindingGVR   = schema.GroupVersionResource{Group: "fleetstream.io", Version: "v1alpha1", Resource: "namespacebindings"}
	ProjectRoleBindingGVR = schema.GroupVersionResource{Group: "fleetstream.io", Version: "v1alpha1", Resource: "projectrolebindings"}
	PlacementGVR          = schema.GroupVersionResource{Group: "fleetstream.io", Version: "v1alpha1", Resource: "placements"}
	RoleTemplateGVR       = schema.GroupVersionResource{Group: "fleetstream.io", Version: "v1alpha1", Resource: "roletemplates"}
	ClusterSetGVR         = schema.GroupVersionResource{Group: "fleetstream.io", Version: "v1alpha1", Resource: "clustersets"}
	ClusterSetBindingGVR  = schema.GroupVersionResource{Group: "fleetstream.io", Version: "v1alpha1", Resource: "clustersetbindings"}
	ServiceWeightsGVR     = schema.GroupVersionResource{Group: "fleetstream.io", Version: "v1alpha1", Resource: "serviceweights"}
)

// inboundKinds are the fleetstream.io kinds the bridge reconciles. A namespaced kind lives in a
// project (fleetctl apply's manifests give it metadata.project) and acts, as the bridge's own
// limited identity, only in the project its hub namespace is mapped to. A cluster-scoped kind is
// fleet-wide, a platform admin's to change in Fleetstream: the bridge acts with the platform
// token given for them (--kube-bridge-projects-token-file), and who may create one on the hub is
// the hub's RBAC on a cluster-scoped resource, which hub admins alone hold by default.
var inboundKinds = []struct {
	name       string
	gvr        schema.GroupVersionResource
	namespaced bool
}{
	{"Project", ProjectGVR, false},
	{"RoleTemplate", RoleTemplateGVR, false},
	{"ClusterSet", ClusterSetGVR, false},
	{"NamespaceBinding", NamespaceBindingGVR, true},
	{"ProjectRoleBinding", ProjectRoleBindingGVR, true},
	{"Placement", PlacementGVR, true},
	{"ClusterSetBinding", ClusterSetBindingGVR, true},
	{"ServiceWeights", ServiceWeightsGVR, true},
}

// Finalizer holds a fleetstream.io object on the hub until the bridge has removed what it made
// of it in Fleetstream.
const Finalizer = "fleetstream.io/kube-bridge"

// Ready condition reasons.
const (
	ReasonApplied        = "Applied"        // Fleetstream holds what the object declares
	ReasonForbidden      = "Forbidden"      // the namespace is not mapped to the object's project, or the API refused the bridge's identity
	ReasonRefused        = "Refused"        // the API refused the object (its message says why); retried when the object or the fleet changes
	ReasonAPIUnavailable = "APIUnavailable" // the API could not be reached; retried with backoff
	ReasonNotConfigured  = "NotConfigured"  // a cluster-scoped kind without --kube-bridge-projects-token-file
	ReasonDeleting       = "Deleting"       // removing it from Fleetstream failed (unreachable, or refused for now); retried
)

// inboundKind is one fleetstream.io kind the bridge reconciles.
type inboundKind struct {
	name string
	gvr  schema.GroupVersionResource
	inf  cache.SharedIndexInformer
	// namespaced: the kind lives in a project and in a hub namespace mapped to it; otherwise it
	// is cluster-scoped and acts with the platform identity.
	namespaced bool
}

// inbound are the bridge's write side: the informers of its custom resources and the API
// clients it acts with.
type inbound struct {
	kinds []*inboundKind
	// The namespaced kinds' clients: the bridge's limited identity.
	projects    projectv1connect.ProjectServiceClient
	rbac        rbacv1connect.RBACServiceClient
	placements  placementv1connect.PlacementServiceClient
	clusterSets placementv1connect.ClusterSetServiceClient
	endpoints   endpointv1connect.EndpointServiceClient
	// admin and its siblings are the cluster-scoped kinds' clients (a platform admin's token),
	// nil without one.
	admin            projectv1connect.ProjectServiceClient
	adminRBAC        rbacv1connect.RBACServiceClient
	adminClusterSets placementv1connect.ClusterSetServiceClient
}

func (in *inbound) kind(name string) *inboundKind {
	for _, k := range in.kinds {
		if k.name == name {
			return k
		}
	}
	return nil
}

// bearer adds the token to every call.
func bearer(token string) connect.ClientOption {
	return connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("Authorization", "Bearer "+token)
			return next(ctx, req)
		}
	}))
}

func newInbound(url, token, adminToken string) *inbound {
	hc := &http.Client{Timeout: 30 * time.Second}
	in := &inbound{
		projects:    projectv1connect.NewProjectServiceClient(hc, url, bearer(token)),
		rbac:        rbacv1connect.NewRBACServiceClient(hc, url, bearer(token)),
		placements:  placementv1connect.NewPlacementServiceClient(hc, url, bearer(token)),
		clusterSets: placementv1connect.NewClusterSetServiceClient(hc, url, bearer(token)),
		endpoints:   endpointv1connect.NewEndpointServiceClient(hc, url, bearer(token)),
	}
	if adminToken != "" {
		in.admin = projectv1connect.NewProjectServiceClient(hc, url, bearer(adminToken))
		in.adminRBAC = rbacv1connect.NewRBACServiceClient(hc, url, bearer(adminToken))
		in.adminClusterSets = placementv1connect.NewClusterSetServiceClient(hc, url, bearer(adminToken))
	}
	return in
}

// inboundKey is a custom resource's queue key: kind/namespace/name (namespace empty for a
// cluster-scoped kind).
func inboundKey(kind string, obj any) string {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	m, ok := obj.(metav1.Object)
	if !ok {
		return ""
	}
	return kind + "/" + m.GetNamespace() + "/" + m.GetName()
}

// inboundKeys are every custom resource of the three kinds.
func (b *Bridge) inboundKeys() []string {
	var out []string
	for _, k := range b.in.kinds {
		for _, obj := range k.inf.GetStore().List() {
			out = append(out, inboundKey(k.name, obj))
		}
	}
	return out
}

// queueNamespace queues every custom resource of hub namespace ns (its mapping changed).
func (b *Bridge) queueNamespace(ns string) {
	if b.in == nil {
		return
	}
	for _, k := range b.in.kinds {
		objs, _ := k.inf.GetIndexer().ByIndex(cache.NamespaceIndex, ns)
		for _, o := range objs {
			b.inbound.Add(inboundKey(k.name, o))
		}
	}
}

// refusal is why the bridge does not act on an object: the Ready condition's reason and
// message.
type refusal struct{ reason, message string }

func (r *refusal) Error() string { return r.message }

// reconcileInbound brings Fleetstream in line with one custom resource: what it declares is
// made through the API (only in the project its hub namespace is mapped to), its Ready
// condition says how that went, and a deleted one has its Fleetstream object removed before its
// finalizer goes.
func (b *Bridge) reconcileInbound(ctx context.Context, key string) error {
	parts := strings.SplitN(key, "/", 3)
	if len(parts) != 3 {
		return nil
	}
	k := b.in.kind(parts[0])
	if k == nil {
		return nil
	}
	u := stored(k.inf, parts[1], parts[2])
	if u == nil {
		return nil // gone: the finalizer saw to Fleetstream before it went
	}
	u = u.DeepCopy()
	project, denied := b.projectOf(k, u)
	applied, wasApplied := u.GetAnnotations()[AnnotationAppliedProject]
	if u.GetDeletionTimestamp() != nil {
		if !slices.Contains(u.GetFinalizers(), Finalizer) {
			return nil
		}
		switch {
		case !wasApplied:
			// Never applied (refused, or deleted before its first apply): whatever Fleetstream
			// holds under the same name is someone else's, and not the object's to remove.
		case k.namespaced && b.namespaceLabel(u.GetNamespace()) != applied:
			// The namespace is no longer mapped to the project the object acted in (remapped,
			// or its label removed): its writers have no say there any more, so what was
			// made stays in Fleetstream. A namespace being deleted keeps its label, and with
			// it the removal of what its objects made.
			b.log.Warn("fleetstream.io object deleted while its namespace is no longer mapped to the project it was applied in: Fleetstream is left as it is",
				zap.String("key", key), zap.String("applied_in", applied))
		default:
			if err := b.deleteInbound(ctx, k, u, applied); err != nil {
				r := classify(err)
				if r.reason != ReasonForbidden {
					// Unreachable, or refused for now (a project that still has placements):
					// the object stays, saying why, as a namespace with content does.
					if serr := b.setReady(ctx, k, u, metav1.ConditionFalse, ReasonDeleting, r.message); serr != nil {
						return errors.Join(err, serr)
					}
					return err // retried with backoff
				}
				// The bridge has no right there (lost it): holding the object forever would
				// help nobody.
				b.log.Warn("fleetstream.io object deleted; the API refused to remove it from Fleetstream, which is left as it is",
					zap.String("key", key), zap.String("why", r.message))
			}
		}
		return b.setFinalizer(ctx, k, u, false)
	}
	if denied != nil {
		return b.setReady(ctx, k, u, metav1.ConditionFalse, denied.reason, denied.message)
	}
	if wasApplied && applied != project {
		// Remapped since it was applied: acting in the new project would adopt (and on
		// deletion remove) what that project holds under the same name.
		return b.setReady(ctx, k, u, metav1.ConditionFalse, ReasonForbidden, fmt.Sprintf(
			"applied in project %s, and hub namespace %s is now mapped to %s: delete the object and create it again to act in %s", applied, u.GetNamespace(), project, project))
	}
	if !slices.Contains(u.GetFinalizers(), Finalizer) {
		// Before anything is made in Fleetstream: a deletion then always passes through here.
		return b.setFinalizer(ctx, k, u, true) // its update queues the object again
	}
	err := b.applyInbound(ctx, k, u, project)
	if err == nil {
		if !wasApplied {
			// Recorded once it holds: only then is removing it on deletion the object's business.
			if err := b.setAppliedProject(ctx, k, u, project); err != nil {
				return err
			}
		}
		return b.setReady(ctx, k, u, metav1.ConditionTrue, ReasonApplied, "Fleetstream holds what the object declares")
	}
	r := classify(err)
	if serr := b.setReady(ctx, k, u, metav1.ConditionFalse, r.reason, r.message); serr != nil {
		return errors.Join(err, serr)
	}
	if r.reason == ReasonAPIUnavailable || r.reason == ReasonForbidden {
		// Forbidden by the API: the bridge's identity lacks a role a platform admin may grant
		// at any moment (docs/kubernetes.md), and nothing the bridge watches changes then. So
		// it is retried with backoff (at most a minute apart), not left to the resync.
		return err
	}
	return nil // refused: again when the object, the mapping or a resync says so
}

// AnnotationAppliedProject records on a fleetstream.io object the project its first successful
// apply acted in. Deleting the object removes what it made only when it has one, and only while
// its namespace is still mapped to that project; an object remapped since is refused.
const AnnotationAppliedProject = "kube-bridge.fleetstream.io/applied-in-project"

// namespaceLabel is the project label of hub namespace ns as the hub holds it, a namespace
// being deleted included.
func (b *Bridge) namespaceLabel(ns string) string {
	if obj, ok, _ := b.namespaceInformer.GetStore().GetByKey(ns); ok {
		return labelOf(obj, LabelProject)
	}
	return ""
}

func (b *Bridge) setAppliedProject(ctx context.Context, k *inboundKind, u *unstructured.Unstructured, project string) error {
	a := maps.Clone(u.GetAnnotations())
	if a == nil {
		a = map[string]string{}
	}
	a[AnnotationAppliedProject] = project
	u.SetAnnotations(a)
	res, err := b.dyn.Resource(k.gvr).Namespace(u.GetNamespace()).Update(ctx, u, metav1.UpdateOptions{FieldManager: FieldManager})
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s %s/%s: annotation %s: %w", k.name, u.GetNamespace(), u.GetName(), AnnotationAppliedProject, err)
	}
	*u = *res // the status write that follows applies to what the hub now holds
	return nil
}

// projectOf is the Fleetstream project the object acts on, or why it may not: a Project is its
// own name, another cluster-scoped kind none (who may create them is the hub's RBAC on a
// cluster-scoped kind); a namespaced object acts only in the project its hub namespace is mapped
// to, and spec.project, if given, must be that one.
func (b *Bridge) projectOf(k *inboundKind, u *unstructured.Unstructured) (string, *refusal) {
	if !k.namespaced {
		if b.in.admin == nil {
			return "", &refusal{ReasonNotConfigured, "the kube bridge has no platform identity for cluster-scoped " + k.name + " objects (--kube-bridge-projects-token-file)"}
		}
		if k.name == "Project" {
			return u.GetName(), nil
		}
		return "", nil
	}
	ns := u.GetNamespace()
	named, _, _ := unstructured.NestedString(u.Object, "spec", "project")
	var mapped string
	if obj, ok, _ := b.namespaceInformer.GetStore().GetByKey(ns); ok {
		mapped = labelOf(obj, LabelProject)
	}
	if mapped == "" {
		return "", &refusal{ReasonForbidden, fmt.Sprintf("hub namespace %s is not mapped to a project (label %s)", ns, LabelProject)}
	}
	if named != "" && named != mapped {
		return "", &refusal{ReasonForbidden, fmt.Sprintf("hub namespace %s is mapped to project %s, not %s: an object here acts in %s only", ns, mapped, named, mapped)}
	}
	if only, err := b.projectNamespace(mapped); err != nil || only != ns {
		msg := fmt.Sprintf("project %s is not mapped to hub namespace %s alone", mapped, ns)
		if err != nil {
			msg = err.Error()
		}
		return "", &refusal{ReasonForbidden, msg}
	}
	return mapped, nil
}

// decodeSpec hands the object's spec, without spec.project, to into as the API's JSON (the
// CRD's schema is the manifest's, whose fields are the message's).
func decodeSpec(u *unstructured.Unstructured, into func([]byte) error) error {
	spec, _, _ := unstructured.NestedMap(u.Object, "spec")
	spec = maps.Clone(spec)
	delete(spec, "project")
	raw, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	if err := into(raw); err != nil {
		return &refusal{ReasonRefused, "spec: " + strings.TrimPrefix(err.Error(), "proto: ")}
	}
	return nil
}

func (b *Bridge) applyInbound(ctx context.Context, k *inboundKind, u *unstructured.Unstructured, project string) error {
	switch k.name {
	case "Project":
		var p projectv1.Project
		if err := decodeSpec(u, func(raw []byte) error { return protojson.Unmarshal(raw, &p) }); err != nil {
			return err
		}
		return b.applyProject(ctx, u.GetName(), &p)
	case "NamespaceBinding":
		var nb projectv1.NamespaceBinding
		if err := decodeSpec(u, func(raw []byte) error { return protojson.Unmarshal(raw, &nb) }); err != nil {
			return err
		}
		return b.applyNamespaceBinding(ctx, project, u.GetName(), &nb)
	case "ProjectRoleBinding":
		var rb rbacv1.ProjectRoleBinding
		if err := decodeSpec(u, func(raw []byte) error { return protojson.Unmarshal(raw, &rb) }); err != nil {
			return err
		}
		return b.applyProjectRoleBinding(ctx, project, &rb)
	case "Placement":
		var p placementv1.Placement
		if err := decodeSpec(u, func(raw []byte) error { return protojson.Unmarshal(raw, &p) }); err != nil {
			return err
		}
		return b.applyPlacement(ctx, project, u.GetName(), &p)
	case "ClusterSetBinding":
		var sb placementv1.ClusterSetBinding
		if err := decodeSpec(u, func(raw []byte) error { return protojson.Unmarshal(raw, &sb) }); err != nil {
			return err
		}
		return b.applyClusterSetBinding(ctx, project, sb.ClusterSet)
	case "RoleTemplate":
		var t rbacv1.RoleTemplate
		if err := decodeSpec(u, func(raw []byte) error { return protojson.Unmarshal(raw, &t) }); err != nil {
			return err
		}
		return b.applyRoleTemplate(ctx, u.GetName(), &t)
	case "ClusterSet":
		var cs placementv1.ClusterSet
		if err := decodeSpec(u, func(raw []byte) error { return protojson.Unmarshal(raw, &cs) }); err != nil {
			return err
		}
		return b.applyClusterSet(ctx, u.GetName(), &cs)
	case "ServiceWeights":
		var w endpointv1.ServiceWeights
		if err := decodeSpec(u, func(raw []byte) error { return protojson.Unmarshal(raw, &w) }); err != nil {
			return err
		}
		return b.applyServiceWeights(ctx, project, u.GetName(), &w)
	}
	return fmt.Errorf("kind %s has no reconciler", k.name)
}

func (b *Bridge) deleteInbound(ctx context.Context, k *inboundKind, u *unstructured.Unstructured, project string) error {
	var err error
	switch k.name {
	case "Project":
		_, err = b.in.admin.DeleteProject(ctx, connect.NewRequest(&projectv1.DeleteProjectRequest{Name: u.GetName()}))
	case "NamespaceBinding":
		var nb projectv1.NamespaceBinding
		if derr := decodeSpec(u, func(raw []byte) error { return protojson.Unmarshal(raw, &nb) }); derr != nil {
			return nil // never applied: nothing to remove
		}
		_, err = b.in.projects.UnbindNamespace(ctx, connect.NewRequest(&projectv1.UnbindNamespaceRequest{
			Project: project, Cluster: nb.Cluster, Placement: nb.Placement, Namespace: u.GetName()}))
	case "ProjectRoleBinding":
		var rb rbacv1.ProjectRoleBinding
		if derr := decodeSpec(u, func(raw []byte) error { return protojson.Unmarshal(raw, &rb) }); derr != nil {
			return nil
		}
		_, err = b.in.rbac.UnbindProjectRole(ctx, connect.NewRequest(&rbacv1.UnbindProjectRoleRequest{
			Project: project, Subject: rb.Subject, RoleTemplate: rb.RoleTemplate}))
	case "Placement":
		_, err = b.in.placements.DeletePlacement(ctx, connect.NewRequest(&placementv1.DeletePlacementRequest{Project: project, Name: u.GetName()}))
	case "ClusterSetBinding":
		var sb placementv1.ClusterSetBinding
		if derr := decodeSpec(u, func(raw []byte) error { return protojson.Unmarshal(raw, &sb) }); derr != nil {
			return nil
		}
		_, err = b.in.clusterSets.UnbindClusterSet(ctx, connect.NewRequest(&placementv1.UnbindClusterSetRequest{Project: project, ClusterSet: sb.ClusterSet}))
	case "RoleTemplate":
		_, err = b.in.adminRBAC.DeleteRoleTemplate(ctx, connect.NewRequest(&rbacv1.DeleteRoleTemplateRequest{Name: u.GetName()}))
	case "ClusterSet":
		_, err = b.in.adminClusterSets.DeleteClusterSet(ctx, connect.NewRequest(&placementv1.DeleteClusterSetRequest{Name: u.GetName()}))
	case "ServiceWeights":
		// Every weight of the service back to its default (what fleetctl apply's prune does).
		var w endpointv1.ServiceWeights
		if derr := decodeSpec(u, func(raw []byte) error { return protojson.Unmarshal(raw, &w) }); derr != nil {
			return nil
		}
		err = b.applyServiceWeights(ctx, project, u.GetName(), &endpointv1.ServiceWeights{Namespace: w.Namespace})
	}
	if connect.CodeOf(err) == connect.CodeNotFound {
		return nil // already gone
	}
	return err
}

// applyProject creates the project if it is missing and sets the budgets that differ. A project
// that exists (made through the API) is taken as the object's: its budgets follow the object.
func (b *Bridge) applyProject(ctx context.Context, name string, want *projectv1.Project) error {
	res, err := b.in.admin.GetProject(ctx, connect.NewRequest(&projectv1.GetProjectRequest{Name: name}))
	have := map[string]map[string]string{}
	switch {
	case connect.CodeOf(err) == connect.CodeNotFound:
		if _, err := b.in.admin.CreateProject(ctx, connect.NewRequest(&projectv1.CreateProjectRequest{Name: name, DisplayName: want.DisplayName})); err != nil {
			return err
		}
	case err != nil:
		return err
	default:
		if res.Msg.Project.GetDisplayName() != want.DisplayName {
			return &refusal{ReasonRefused, fmt.Sprintf("spec.displayName: project %s exists with another display name, which the API cannot change", name)}
		}
		for _, bd := range res.Msg.Project.GetBudgets() {
			have[bd.Cluster] = bd.Hard
		}
	}
	wantBudgets := map[string]map[string]string{}
	for _, bd := range want.Budgets {
		wantBudgets[bd.Cluster] = bd.Hard
	}
	var errs []error
	for _, c := range slices.Sorted(maps.Keys(wantBudgets)) {
		if !maps.Equal(wantBudgets[c], have[c]) {
			_, err := b.in.admin.SetProjectBudget(ctx, connect.NewRequest(&projectv1.SetProjectBudgetRequest{Project: name, Cluster: c, Hard: wantBudgets[c]}))
			errs = append(errs, err)
		}
	}
	for _, c := range slices.Sorted(maps.Keys(have)) {
		if _, ok := wantBudgets[c]; !ok && len(have[c]) > 0 {
			_, err := b.in.admin.SetProjectBudget(ctx, connect.NewRequest(&projectv1.SetProjectBudgetRequest{Project: name, Cluster: c}))
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// applyNamespaceBinding binds the namespace if the project has no such binding, and sets its
// quota if it differs.
func (b *Bridge) applyNamespaceBinding(ctx context.Context, project, namespace string, want *projectv1.NamespaceBinding) error {
	bindings, err := b.namespaceBindings(ctx, &projectv1.ListNamespaceBindingsRequest{Project: project, Cluster: want.Cluster})
	if err != nil {
		return err
	}
	found, same := false, true
	for _, nb := range bindings {
		if nb.Namespace != namespace || nb.Placement != want.Placement || (want.Cluster != "" && nb.Cluster != want.Cluster) {
			continue
		}
		found = true
		same = same && maps.Equal(nb.Hard, want.Hard)
	}
	switch {
	case !found || (want.Placement != "" && !same):
		// Binding a placement's namespace again sets its quota on every cluster it decides.
		_, err = b.in.projects.BindNamespace(ctx, connect.NewRequest(&projectv1.BindNamespaceRequest{
			Project: project, Cluster: want.Cluster, Placement: want.Placement, Namespace: namespace, Hard: want.Hard}))
	case !same:
		_, err = b.in.projects.UpdateQuota(ctx, connect.NewRequest(&projectv1.UpdateQuotaRequest{
			Project: project, Cluster: want.Cluster, Namespace: namespace, Hard: want.Hard}))
	}
	return err
}

// namespaceBindings reads every page of req: the server pages the list, and a binding past the
// first page is still the project's (binding it again would be refused as existing; a weight
// of a namespace on it would be refused as another project's).
func (b *Bridge) namespaceBindings(ctx context.Context, req *projectv1.ListNamespaceBindingsRequest) ([]*projectv1.NamespaceBinding, error) {
	var out []*projectv1.NamespaceBinding
	err := paging.All(func(token string) (string, error) {
		req.PageToken = token
		res, err := b.in.projects.ListNamespaceBindings(ctx, connect.NewRequest(req))
		if err != nil {
			return "", err
		}
		out = append(out, res.Msg.Bindings...)
		return res.Msg.NextPageToken, nil
	})
	return out, err
}

// applyProjectRoleBinding grants the role if the project has no such grant.
func (b *Bridge) applyProjectRoleBinding(ctx context.Context, project string, want *rbacv1.ProjectRoleBinding) error {
	res, err := b.in.rbac.ListProjectRoleBindings(ctx, connect.NewRequest(&rbacv1.ListProjectRoleBindingsRequest{
		Project: project, RoleTemplate: want.RoleTemplate, Subject: want.Subject}))
	if err != nil {
		return err
	}
	if len(res.Msg.Bindings) > 0 {
		return nil
	}
	_, err = b.in.rbac.BindProjectRole(ctx, connect.NewRequest(&rbacv1.BindProjectRoleRequest{
		Project: project, Subject: want.Subject, RoleTemplate: want.RoleTemplate}))
	return err
}

// declared is a copy of live holding only the top-level fields an object of the kind declares
// (its CRD's spec, fleetctl apply's manifest fields): what the bridge compares with the object,
// leaving out what the API computes (name, revision, times, status).
func declared(live proto.Message, fields ...string) proto.Message {
	c := proto.Clone(live)
	m := c.ProtoReflect()
	m.Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		if !slices.Contains(fields, string(fd.Name())) {
			m.Clear(fd)
		}
		return true
	})
	return c
}

// placementFields are the fields of a Placement object (manifest.Kind Placement's Fields).
var placementFields = []string{"cluster_sets", "number_of_clusters", "predicates", "tolerations", "prioritizer_policy", "decision_strategy"}

// applyPlacement creates the placement if the project has none of the name, and updates it
// (on the revision read) if what it declares differs. One that exists (made through the API) is
// taken as the object's.
func (b *Bridge) applyPlacement(ctx context.Context, project, name string, want *placementv1.Placement) error {
	res, err := b.in.placements.GetPlacement(ctx, connect.NewRequest(&placementv1.GetPlacementRequest{Project: project, Name: name}))
	p := proto.Clone(want).(*placementv1.Placement)
	p.Project, p.Name = project, name
	switch {
	case connect.CodeOf(err) == connect.CodeNotFound:
		_, err = b.in.placements.CreatePlacement(ctx, connect.NewRequest(&placementv1.CreatePlacementRequest{Placement: p}))
		return err
	case err != nil:
		return err
	}
	if proto.Equal(declared(res.Msg.Placement, placementFields...), declared(want, placementFields...)) {
		return nil
	}
	_, err = b.in.placements.UpdatePlacement(ctx, connect.NewRequest(&placementv1.UpdatePlacementRequest{Placement: p, ExpectedRevision: res.Msg.Placement.GetRevision()}))
	return err
}

// applyClusterSetBinding binds the cluster set to the project if it is not bound.
func (b *Bridge) applyClusterSetBinding(ctx context.Context, project, set string) error {
	res, err := b.in.clusterSets.ListClusterSetBindings(ctx, connect.NewRequest(&placementv1.ListClusterSetBindingsRequest{Project: project}))
	if err != nil {
		return err
	}
	for _, sb := range res.Msg.Bindings {
		if sb.Project == project && sb.ClusterSet == set {
			return nil
		}
	}
	_, err = b.in.clusterSets.BindClusterSet(ctx, connect.NewRequest(&placementv1.BindClusterSetRequest{Project: project, ClusterSet: set}))
	return err
}

var roleTemplateFields = []string{"display_name", "rules", "inherits", "locked"}

// applyRoleTemplate creates the role template, or updates the declared fields that differ.
func (b *Bridge) applyRoleTemplate(ctx context.Context, name string, want *rbacv1.RoleTemplate) error {
	res, err := b.in.adminRBAC.GetRoleTemplate(ctx, connect.NewRequest(&rbacv1.GetRoleTemplateRequest{Name: name}))
	t := proto.Clone(want).(*rbacv1.RoleTemplate)
	t.Name = name
	switch {
	case connect.CodeOf(err) == connect.CodeNotFound:
		_, err = b.in.adminRBAC.CreateRoleTemplate(ctx, connect.NewRequest(&rbacv1.CreateRoleTemplateRequest{Template: t}))
		return err
	case err != nil:
		return err
	}
	if proto.Equal(declared(res.Msg.Template, roleTemplateFields...), declared(want, roleTemplateFields...)) {
		return nil
	}
	_, err = b.in.adminRBAC.UpdateRoleTemplate(ctx, connect.NewRequest(&rbacv1.UpdateRoleTemplateRequest{Template: t,
		UpdateMask: &fieldmaskpb.FieldMask{Paths: roleTemplateFields}, ExpectedRevision: res.Msg.Template.GetRevision()}))
	return err
}

// applyClusterSet creates the cluster set, or updates its selector if it differs.
func (b *Bridge) applyClusterSet(ctx context.Context, name string, want *placementv1.ClusterSet) error {
	res, err := b.in.adminClusterSets.GetClusterSet(ctx, connect.NewRequest(&placementv1.GetClusterSetRequest{Name: name}))
	switch {
	case connect.CodeOf(err) == connect.CodeNotFound:
		_, err = b.in.adminClusterSets.CreateClusterSet(ctx, connect.NewRequest(&placementv1.CreateClusterSetRequest{Name: name, Selector: want.Selector}))
		return err
	case err != nil:
		return err
	}
	if proto.Equal(res.Msg.ClusterSet.GetSelector(), want.GetSelector()) {
		return nil
	}
	_, err = b.in.adminClusterSets.UpdateClusterSet(ctx, connect.NewRequest(&placementv1.UpdateClusterSetRequest{Name: name, Selector: want.Selector,
		ExpectedRevision: res.Msg.ClusterSet.GetRevision()}))
	return err
}

// applyServiceWeights makes the weights of service name in the member-cluster namespace
// want.Namespace those want declares, one call per weight that differs (fleetctl apply's
// order: raises before cuts, so capacity is added before it is taken away). Only in clusters
// where the namespace is the project's: the project comes from the hub namespace, and a weight
// of another project's namespace is refused here even where the bridge's identity may set it.
func (b *Bridge) applyServiceWeights(ctx context.Context, project, name string, want *endpointv1.ServiceWeights) error {
	ns := want.Namespace
	bindings, err := b.namespaceBindings(ctx, &projectv1.ListNamespaceBindingsRequest{Project: project})
	if err != nil {
		return err
	}
	owned := map[string]bool{} // clusters where the project has namespace ns
	for _, nb := range bindings {
		if nb.Namespace == ns && nb.Cluster != "" {
			owned[nb.Cluster] = true
		}
	}
	have := &endpointv1.ServiceWeights{}
	list, err := b.in.endpoints.ListServiceWeights(ctx, connect.NewRequest(&endpointv1.ListServiceWeightsRequest{Namespace: ns}))
	if err != nil {
		return err
	}
	for _, w := range list.Msg.Weights {
		if w.Name != name {
			continue
		}
		// Only the weights of clusters where the namespace is the project's are the object's
		// to compare (and reset): another project's cluster of the same namespace name is none
		// of its business, whatever the bridge's identity may read.
		have = &endpointv1.ServiceWeights{ClusterWeights: map[string]uint32{}}
		for c, wt := range w.ClusterWeights {
			if owned[c] {
				have.ClusterWeights[c] = wt
			}
		}
		for _, e := range w.EndpointWeights {
			if owned[e.ClusterName] {
				have.EndpointWeights = append(have.EndpointWeights, e)
			}
		}
	}
	changes := weights.Changes(want, have)
	for _, c := range changes {
		if !owned[c.Cluster] {
			return &refusal{ReasonForbidden, fmt.Sprintf("spec.namespace: namespace %s on cluster %s is not bound to project %s, the project hub namespace's objects act in", ns, c.Cluster, project)}
		}
	}
	for _, c := range changes {
		var err error
		switch {
		case c.IP == "":
			_, err = b.in.endpoints.SetClusterWeight(ctx, connect.NewRequest(&endpointv1.SetClusterWeightRequest{Namespace: ns, Name: name, Cluster: c.Cluster, Weight: c.To}))
		case c.Reset:
			_, err = b.in.endpoints.SetEndpointWeight(ctx, connect.NewRequest(&endpointv1.SetEndpointWeightRequest{Namespace: ns, Name: name, Ip: c.IP, Cluster: c.Cluster, Clear: true}))
		default:
			_, err = b.in.endpoints.SetEndpointWeight(ctx, connect.NewRequest(&endpointv1.SetEndpointWeightRequest{Namespace: ns, Name: name, Ip: c.IP, Cluster: c.Cluster, Weight: c.To}))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// classify turns an API error into the Ready condition's reason and message: the API's own
// message, so the hub user reads why.
func classify(err error) *refusal {
	var r *refusal
	if errors.As(err, &r) {
		return r
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return &refusal{ReasonAPIUnavailable, err.Error()}
	}
	switch ce.Code() {
	case connect.CodePermissionDenied, connect.CodeUnauthenticated:
		return &refusal{ReasonForbidden, ce.Error()}
	case connect.CodeInvalidArgument, connect.CodeFailedPrecondition, connect.CodeAlreadyExists, connect.CodeNotFound,
		connect.CodeOutOfRange, connect.CodeResourceExhausted, connect.CodeAborted:
		return &refusal{ReasonRefused, ce.Error()}
	}
	return &refusal{ReasonAPIUnavailable, ce.Error()}
}

// setFinalizer adds or removes the bridge's finalizer (an update on the object's
// resourceVersion: a conflict is retried with the object as it is then).
func (b *Bridge) setFinalizer(ctx context.Context, k *inboundKind, u *unstructured.Unstructured, add bool) error {
	fs := slices.DeleteFunc(slices.Clone(u.GetFinalizers()), func(f string) bool { return f == Finalizer })
	if add {
		fs = append(fs, Finalizer)
	}
	u.SetFinalizers(fs)
	_, err := b.dyn.Resource(k.gvr).Namespace(u.GetNamespace()).Update(ctx, u, metav1.UpdateOptions{FieldManager: FieldManager})
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s %s/%s: finalizer: %w", k.name, u.GetNamespace(), u.GetName(), err)
	}
	return nil
}

// setReady writes the Ready condition (observing the object's generation) by server-side apply
// of the status, unless it already says so.
func (b *Bridge) setReady(ctx context.Context, k *inboundKind, u *unstructured.Unstructured, status metav1.ConditionStatus, reason, message string) error {
	if len(message) > 32768 {
		message = message[:32768]
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	transition := metav1.NewTime(b.now().UTC().Truncate(time.Second))
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] != "Ready" {
			continue
		}
		gen, _, _ := unstructured.NestedInt64(m, "observedGeneration")
		if m["status"] == string(status) {
			if m["reason"] == reason && m["message"] == message && gen == u.GetGeneration() {
				return nil
			}
			if t, err := time.Parse(time.RFC3339, fmt.Sprint(m["lastTransitionTime"])); err == nil {
				transition = metav1.NewTime(t)
			}
		}
	}
	gvk := k.gvr.GroupVersion().WithKind(k.name)
	obj := map[string]any{
		"apiVersion": gvk.GroupVersion().String(), "kind": gvk.Kind,
		"metadata": map[string]any{"name": u.GetName(), "namespace": u.GetNamespace()},
		"status": map[string]any{"conditions": []any{map[string]any{
			"type": "Ready", "status": string(status), "reason": reason, "message": message,
			"observedGeneration": u.GetGeneration(), "lastTransitionTime": transition.UTC().Format(time.RFC3339),
		}}},
	}
	b.applies.Add(1)
	_, err := b.dyn.Resource(k.gvr).Namespace(u.GetNamespace()).ApplyStatus(ctx, u.GetName(), &unstructured.Unstructured{Object: obj},
		metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s %s/%s: status: %w", k.name, u.GetNamespace(), u.GetName(), err)
	}
	return nil
}
