package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

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
	"github.com/fleetstream/fleetstream/pkg/weights"
	"github.com/fleetstream/fleetstream/services/fleetctl/manifest"
)

// The fleet as manifests: fleetState reads what the API holds, every kind rendered as the
// manifest that declares it (what export prints and what apply and diff compare with), and
// applyObject makes one declared object so. Objects are compared in their manifest form, so an
// object is "unchanged" exactly when export would print what the manifest says.

// liveObject is an object as the API holds it.
type liveObject struct {
	obj *manifest.Object
	// revision is the API's revision of the object, passed back as expected_revision so that
	// an update made on a stale read fails instead of overwriting a change made since.
	revision uint64
}

// fleetState is the fleet's objects by manifest key, in export order.
type fleetState struct {
	byKey map[string]*liveObject
	keys  []string
}

func (s *fleetState) add(obj *manifest.Object, revision uint64) {
	k := obj.Key()
	if _, ok := s.byKey[k]; ok {
		return
	}
	s.byKey[k] = &liveObject{obj: obj, revision: revision}
	s.keys = append(s.keys, k)
}

// objects returns the live objects in apply order (kind rank, then the API's order).
func (s *fleetState) objects() []*manifest.Object {
	out := make([]*manifest.Object, 0, len(s.keys))
	for _, k := range s.keys {
		out = append(out, s.byKey[k].obj)
	}
	slices.SortStableFunc(out, func(a, b *manifest.Object) int { return a.Kind.Rank - b.Kind.Rank })
	return out
}

// readFleet lists the kinds wanted (nil: every kind) from the API, limited to one project when
// project is given (fleet-wide kinds are then left out).
func readFleet(ctx context.Context, f *factory, want map[string]bool, project string) (*fleetState, error) {
	s := &fleetState{byKey: map[string]*liveObject{}}
	wants := func(kind string) bool {
		if want != nil && !want[kind] {
			return false
		}
		return project == "" || manifest.KindNamed(kind).Project || kind == "Project"
	}
	kind := manifest.KindNamed
	if wants("Cluster") {
		clusters, err := allClusters(ctx, f, &clusterv1.ListClustersRequest{})
		if err != nil {
			return nil, err
		}
		for _, c := range clusters {
			s.add(clusterObject(c), c.Revision)
		}
	}
	if wants("Subscriber") {
		res, err := call(ctx, f, clusterv1connect.NewSubscriberServiceClient, clusterv1connect.SubscriberServiceClient.ListSubscribers,
			&clusterv1.ListSubscribersRequest{}, "list subscribers")
		if err != nil {
			return nil, err
		}
		for _, sub := range res.Subscribers {
			s.add(&manifest.Object{Kind: kind("Subscriber"), Name: sub.Name, Spec: kind("Subscriber").Clean(sub)}, 0)
		}
	}
	if wants("ImportPolicy") {
		res, err := call(ctx, f, clusterv1connect.NewImportPolicyServiceClient, clusterv1connect.ImportPolicyServiceClient.ListImportPolicies,
			&clusterv1.ListImportPoliciesRequest{}, "list import policies")
		if err != nil {
			return nil, err
		}
		for _, p := range res.Policies {
			s.add(&manifest.Object{Kind: kind("ImportPolicy"), Name: p.Name, Spec: kind("ImportPolicy").Clean(p)}, p.Revision)
		}
	}
	if wants("RoleTemplate") {
		res, err := call(ctx, f, rbacv1connect.NewRBACServiceClient, rbacv1connect.RBACServiceClient.ListRoleTemplates,
			&rbacv1.ListRoleTemplatesRequest{}, "list role templates")
		if err != nil {
			return nil, err
		}
		for _, t := range res.Templates {
			if roles.IsBuiltin(t.Name) {
				continue // part of every fleet, not declared
			}
			s.add(&manifest.Object{Kind: kind("RoleTemplate"), Name: t.Name, Spec: kind("RoleTemplate").Clean(t)}, t.Revision)
		}
	}
	if wants("ClusterSet") {
		res, err := call(ctx, f, placementv1connect.NewClusterSetServiceClient, placementv1connect.ClusterSetServiceClient.ListClusterSets,
			&placementv1.ListClusterSetsRequest{}, "list cluster sets")
		if err != nil {
			return nil, err
		}
		for _, cs := range res.ClusterSets {
			if cs.Name == "default" || cs.Name == "global" {
				continue // built in
			}
			s.add(&manifest.Object{Kind: kind("ClusterSet"), Name: cs.Name, Spec: kind("ClusterSet").Clean(cs)}, cs.Revision)
		}
	}
	if wants("Project") {
		res, err := call(ctx, f, projectv1connect.NewProjectServiceClient, projectv1connect.ProjectServiceClient.ListProjects,
			&projectv1.ListProjectsRequest{}, "list projects")
		if err != nil {
			return nil, err
		}
		for _, p := range res.Projects {
			if project != "" && p.Name != project {
				continue
			}
			s.add(&manifest.Object{Kind: kind("Project"), Name: p.Name, Labels: p.Labels, Spec: kind("Project").Clean(p)}, p.Revision)
		}
	}
	if wants("ClusterSetBinding") {
		res, err := call(ctx, f, placementv1connect.NewClusterSetServiceClient, placementv1connect.ClusterSetServiceClient.ListClusterSetBindings,
			&placementv1.ListClusterSetBindingsRequest{Project: project}, "list cluster set bindings")
		if err != nil {
			return nil, err
		}
		for _, b := range res.Bindings {
			s.add(&manifest.Object{Kind: kind("ClusterSetBinding"), Project: b.Project, Spec: &placementv1.ClusterSetBinding{ClusterSet: b.ClusterSet}}, b.Revision)
		}
	}
	if wants("Placement") {
		res, err := call(ctx, f, placementv1connect.NewPlacementServiceClient, placementv1connect.PlacementServiceClient.ListPlacements,
			&placementv1.ListPlacementsRequest{Project: project}, "list placements")
		if err != nil {
			return nil, err
		}
		for _, p := range res.Placements {
			s.add(&manifest.Object{Kind: kind("Placement"), Name: p.Name, Project: p.Project, Spec: kind("Placement").Clean(p)}, p.Revision)
		}
	}
	if wants("NamespaceBinding") {
		bindings, err := allNamespaceBindings(ctx, f, &projectv1.ListNamespaceBindingsRequest{Project: project})
		if err != nil {
			return nil, err
		}
		for _, b := range bindings {
			if b.Phase == projectv1.BindingPhase_BINDING_PHASE_TERMINATING {
				continue // unbound already
			}
			spec := &projectv1.NamespaceBinding{Cluster: b.Cluster, Hard: b.Hard}
			if b.Placement != "" {
				// One manifest declares the namespace on every cluster of the placement; the
				// first cluster's binding stands for them all.
				spec = &projectv1.NamespaceBinding{Placement: b.Placement, Hard: b.Hard}
			}
			s.add(&manifest.Object{Kind: kind("NamespaceBinding"), Name: b.Namespace, Project: b.Project, Spec: spec}, b.Revision)
		}
	}
	if wants("ProjectRoleBinding") {
		bindings, err := allProjectRoleBindings(ctx, f, &rbacv1.ListProjectRoleBindingsRequest{Project: project})
		if err != nil {
			return nil, err
		}
		for _, b := range bindings {
			s.add(&manifest.Object{Kind: kind("ProjectRoleBinding"), Project: b.Project,
				Spec: &rbacv1.ProjectRoleBinding{Subject: b.Subject, RoleTemplate: b.RoleTemplate}}, b.Revision)
		}
	}
	if wants("ServiceWeights") {
		res, err := call(ctx, f, endpointv1connect.NewEndpointServiceClient, endpointv1connect.EndpointServiceClient.ListServiceWeights,
			&endpointv1.ListServiceWeightsRequest{}, "list service weights")
		switch {
		case connect.CodeOf(err) == connect.CodeUnimplemented && want == nil:
			// A hub without the endpoint collector (a partial deployment): the fleet has no
			// weights. Asked for by name, the kind's absence is an error.
		case err != nil:
			return nil, err
		default:
			for _, w := range res.Weights {
				s.add(serviceWeightsObject(w), 0)
			}
		}
	}
	return s, nil
}

// serviceWeightsObject is a service's weights as a manifest declares them: without what the API
// records of the endpoint each weight is bound to.
func serviceWeightsObject(w *endpointv1.ServiceWeights) *manifest.Object {
	k := manifest.KindNamed("ServiceWeights")
	spec := k.Clean(w).(*endpointv1.ServiceWeights)
	manifest.SortEndpointWeights(spec.EndpointWeights)
	return &manifest.Object{Kind: k, Name: w.Name, Spec: spec}
}

// clusterObject is a cluster's manifest: what an admin declares, without the claims its agent
// reports and the taints the registry manages.
func clusterObject(c *clusterv1.Cluster) *manifest.Object {
	spec := &clusterv1.Cluster{}
	for k, v := range c.Claims {
		if !strings.HasSuffix(k, ".fleetstream.io") {
			if spec.Claims == nil {
				spec.Claims = map[string]string{}
			}
			spec.Claims[k] = v
		}
	}
	for _, t := range c.Taints {
		if !strings.HasPrefix(t.Key, "fleetstream.io/") {
			spec.Taints = append(spec.Taints, &clusterv1.Taint{Key: t.Key, Value: t.Value, Effect: t.Effect})
		}
	}
	return &manifest.Object{Kind: manifest.KindNamed("Cluster"), Name: c.Name, Labels: c.Labels, Spec: spec}
}

// sameObject reports whether declared and live say the same: their specs as a manifest holds
// them and, for kinds whose labels the API keeps, their labels.
func sameObject(declared, live *manifest.Object) bool {
	k := declared.Kind
	if k.Labels && !maps.Equal(declared.Labels, live.Labels) {
		return false
	}
	d, l := k.Clean(declared.Spec), k.Clean(live.Spec)
	if ds, ok := d.(*clusterv1.Subscriber); ok {
		// A set: the API keeps it in its own order.
		slices.Sort(ds.Streams)
		slices.Sort(l.(*clusterv1.Subscriber).Streams)
	}
	return proto.Equal(d, l)
}

// Apply outcomes, as kubectl words them.
const (
	outcomeCreated    = "created"
	outcomeConfigured = "configured"
	outcomeUnchanged  = "unchanged"
	outcomePruned     = "pruned"
)

// noTokenDirError: creating the object hands out a token, and apply was given nowhere to put
// it. A refusal of apply's flags, not of the manifest: diff, which creates nothing, has none.
type noTokenDirError string

func (e noTokenDirError) Error() string { return string(e) }

// planObject says what applying o to live would do, or why it cannot be done; it writes
// nothing. Every refusal is found here, before the first write, so that an apply that cannot
// finish does not start.
func planObject(o *manifest.Object, live *liveObject, tokenDir string) (string, error) {
	if live == nil {
		if o.Kind.Name == "Cluster" && tokenDir == "" {
			return "", noTokenDirError("registering a cluster hands out its agent token once: give --token-dir to receive it")
		}
		if o.Kind.Name == "Subscriber" && tokenDir == "" {
			return "", noTokenDirError("creating a subscriber hands out its NATS token once: give --token-dir to receive it")
		}
		return outcomeCreated, nil
	}
	if sameObject(o, live.obj) {
		return outcomeUnchanged, nil
	}
	// An object of another apply set stays that set's: taking it over would hide it from that
	// set's prune and make the two sets' applies undo each other (kubectl's ApplySet refuses
	// the same).
	if other := live.obj.Labels[partOfLabel]; other != "" && o.Labels[partOfLabel] != "" && other != o.Labels[partOfLabel] {
		return "", fmt.Errorf("metadata.labels[%s]: %s belongs to apply set %s, not %s; remove it from that set first", partOfLabel, o.Name, other, o.Labels[partOfLabel])
	}
	switch o.Kind.Name {
	case "Subscriber":
		// Not "prune it": prune never deletes a subscriber, which has no labels to carry the set.
		return "", errors.New("spec.streams: a subscriber's streams cannot be changed; delete it through the API (SubscriberService.DeleteSubscriber: prune never deletes subscribers, which carry no apply set label) and apply again, which creates it with a new token")
	case "Project":
		p, l := o.Spec.(*projectv1.Project), live.obj.Spec.(*projectv1.Project)
		if p.DisplayName != l.DisplayName {
			return "", fmt.Errorf("spec.displayName: a project's display name cannot be changed (the API has no project update); it is %q", l.DisplayName)
		}
		if !maps.Equal(o.Labels, live.obj.Labels) {
			if o.Labels[partOfLabel] != live.obj.Labels[partOfLabel] {
				return "", fmt.Errorf("the project exists outside apply set %s and cannot join it: the API cannot change a project's labels", o.Labels[partOfLabel])
			}
			return "", errors.New("metadata.labels: a project's labels cannot be changed (the API has no project update)")
		}
	}
	return outcomeConfigured, nil
}

// applyObject makes o as declared: created when live is nil, else updated from live.
func applyObject(ctx context.Context, f *factory, o *manifest.Object, live *liveObject, tokenDir string) error {
	if live == nil {
		return createObject(ctx, f, o, tokenDir)
	}
	return updateObject(ctx, f, o, live)
}

func createObject(ctx context.Context, f *factory, o *manifest.Object, tokenDir string) error {
	switch s := o.Spec.(type) {
	case *clusterv1.Cluster:
		if err := tokenFileFree(tokenDir, o.Name, "cluster "+o.Name); err != nil {
			return err
		}
		res, err := call(ctx, f, clusterv1connect.NewClusterServiceClient, clusterv1connect.ClusterServiceClient.RegisterCluster,
			&clusterv1.RegisterClusterRequest{Name: o.Name, Labels: o.Labels, Claims: s.Claims, Taints: s.Taints}, "register cluster %s", o.Name)
		if err != nil {
			return err
		}
		return writeToken(tokenDir, o.Name, res.AgentToken, "cluster "+o.Name)
	case *clusterv1.Subscriber:
		if err := tokenFileFree(tokenDir, "subscriber-"+o.Name, "subscriber "+o.Name); err != nil {
			return err
		}
		res, err := call(ctx, f, clusterv1connect.NewSubscriberServiceClient, clusterv1connect.SubscriberServiceClient.CreateSubscriber,
			&clusterv1.CreateSubscriberRequest{Name: o.Name, Streams: s.Streams}, "create subscriber %s", o.Name)
		if err != nil {
			return err
		}
		return writeToken(tokenDir, "subscriber-"+o.Name, res.Token, "subscriber "+o.Name)
	case *clusterv1.ImportPolicy:
		p := proto.Clone(s).(*clusterv1.ImportPolicy)
		p.Name = o.Name
		_, err := call(ctx, f, clusterv1connect.NewImportPolicyServiceClient, clusterv1connect.ImportPolicyServiceClient.CreateImportPolicy,
			&clusterv1.CreateImportPolicyRequest{Policy: p}, "create import policy %s", o.Name)
		return err
	case *rbacv1.RoleTemplate:
		t := proto.Clone(s).(*rbacv1.RoleTemplate)
		t.Name = o.Name
		_, err := call(ctx, f, rbacv1connect.NewRBACServiceClient, rbacv1connect.RBACServiceClient.CreateRoleTemplate,
			&rbacv1.CreateRoleTemplateRequest{Template: t}, "create role template %s", o.Name)
		return err
	case *placementv1.ClusterSet:
		_, err := call(ctx, f, placementv1connect.NewClusterSetServiceClient, placementv1connect.ClusterSetServiceClient.CreateClusterSet,
			&placementv1.CreateClusterSetRequest{Name: o.Name, Selector: s.Selector}, "create cluster set %s", o.Name)
		return err
	case *projectv1.Project:
		_, err := call(ctx, f, projectv1connect.NewProjectServiceClient, projectv1connect.ProjectServiceClient.CreateProject,
			&projectv1.CreateProjectRequest{Name: o.Name, DisplayName: s.DisplayName, Labels: o.Labels}, "create project %s", o.Name)
		if err != nil {
			return err
		}
		for _, b := range s.Budgets {
			if err := setBudget(ctx, f, o.Name, b.Cluster, b.Hard); err != nil {
				return err
			}
		}
		return nil
	case *placementv1.Placement:
		p := proto.Clone(s).(*placementv1.Placement)
		p.Project, p.Name = o.Project, o.Name
		_, err := call(ctx, f, placementv1connect.NewPlacementServiceClient, placementv1connect.PlacementServiceClient.CreatePlacement,
			&placementv1.CreatePlacementRequest{Placement: p}, "create placement %s in project %s", o.Name, o.Project)
		return err
	case *placementv1.ClusterSetBinding:
		_, err := call(ctx, f, placementv1connect.NewClusterSetServiceClient, placementv1connect.ClusterSetServiceClient.BindClusterSet,
			&placementv1.BindClusterSetRequest{Project: o.Project, ClusterSet: s.ClusterSet}, "bind cluster set %s to project %s", s.ClusterSet, o.Project)
		return err
	case *projectv1.NamespaceBinding:
		_, err := call(ctx, f, projectv1connect.NewProjectServiceClient, projectv1connect.ProjectServiceClient.BindNamespace,
			&projectv1.BindNamespaceRequest{Project: o.Project, Cluster: s.Cluster, Placement: s.Placement, Namespace: o.Name, Hard: s.Hard, UnbindPolicy: s.UnbindPolicy},
			"bind namespace %s", o.Name)
		return err
	case *rbacv1.ProjectRoleBinding:
		_, err := call(ctx, f, rbacv1connect.NewRBACServiceClient, rbacv1connect.RBACServiceClient.BindProjectRole,
			&rbacv1.BindProjectRoleRequest{Project: o.Project, Subject: s.Subject, RoleTemplate: s.RoleTemplate}, "bind role %s in project %s", s.RoleTemplate, o.Project)
		return err
	case *endpointv1.ServiceWeights:
		return setWeights(ctx, f, o.Name, s, &endpointv1.ServiceWeights{})
	}
	return fmt.Errorf("%s: kind %s cannot be created", o.Key(), o.Kind.Name)
}

func setBudget(ctx context.Context, f *factory, project, cluster string, hard map[string]string) error {
	_, err := call(ctx, f, projectv1connect.NewProjectServiceClient, projectv1connect.ProjectServiceClient.SetProjectBudget,
		&projectv1.SetProjectBudgetRequest{Project: project, Cluster: cluster, Hard: hard}, "set the budget of project %s on cluster %s", project, cluster)
	return err
}

// updateObject changes live into o. Updates carry live's revision where the API takes one, so
// a change someone made after apply read the fleet fails with aborted rather than being
// overwritten; a rerun reads it and decides again.
func updateObject(ctx context.Context, f *factory, o *manifest.Object, live *liveObject) error {
	switch s := o.Spec.(type) {
	case *clusterv1.Cluster:
		_, err := call(ctx, f, clusterv1connect.NewClusterServiceClient, clusterv1connect.ClusterServiceClient.UpdateCluster,
			&clusterv1.UpdateClusterRequest{Name: o.Name, Labels: o.Labels, Claims: s.Claims, Taints: s.Taints,
				UpdateMask:       &fieldmaskpb.FieldMask{Paths: []string{"labels", "claims", "taints"}},
				ExpectedRevision: live.revision}, "update cluster %s", o.Name)
		return err
	case *clusterv1.ImportPolicy:
		p := proto.Clone(s).(*clusterv1.ImportPolicy)
		p.Name = o.Name
		_, err := call(ctx, f, clusterv1connect.NewImportPolicyServiceClient, clusterv1connect.ImportPolicyServiceClient.UpdateImportPolicy,
			&clusterv1.UpdateImportPolicyRequest{Policy: p, ExpectedRevision: live.revision}, "update import policy %s", o.Name)
		return err
	case *rbacv1.RoleTemplate:
		t := proto.Clone(s).(*rbacv1.RoleTemplate)
		t.Name = o.Name
		_, err := call(ctx, f, rbacv1connect.NewRBACServiceClient, rbacv1connect.RBACServiceClient.UpdateRoleTemplate,
			&rbacv1.UpdateRoleTemplateRequest{Template: t,
				UpdateMask:       &fieldmaskpb.FieldMask{Paths: []string{"display_name", "rules", "inherits", "locked"}},
				ExpectedRevision: live.revision}, "update role template %s", o.Name)
		return err
	case *placementv1.ClusterSet:
		_, err := call(ctx, f, placementv1connect.NewClusterSetServiceClient, placementv1connect.ClusterSetServiceClient.UpdateClusterSet,
			&placementv1.UpdateClusterSetRequest{Name: o.Name, Selector: s.Selector, ExpectedRevision: live.revision}, "update cluster set %s", o.Name)
		return err
	case *projectv1.Project:
		// Budgets are set per cluster: the declared ones that differ, and an empty budget for
		// each cluster the manifest no longer budgets.
		want := map[string]map[string]string{}
		for _, b := range s.Budgets {
			want[b.Cluster] = b.Hard
		}
		have := map[string]map[string]string{}
		for _, b := range live.obj.Spec.(*projectv1.Project).Budgets {
			have[b.Cluster] = b.Hard
		}
		for _, c := range slices.Sorted(maps.Keys(want)) {
			if !maps.Equal(want[c], have[c]) {
				if err := setBudget(ctx, f, o.Name, c, want[c]); err != nil {
					return err
				}
			}
		}
		for _, c := range slices.Sorted(maps.Keys(have)) {
			if _, ok := want[c]; !ok {
				if err := setBudget(ctx, f, o.Name, c, nil); err != nil {
					return err
				}
			}
		}
		return nil
	case *placementv1.Placement:
		p := proto.Clone(s).(*placementv1.Placement)
		p.Project, p.Name = o.Project, o.Name
		_, err := call(ctx, f, placementv1connect.NewPlacementServiceClient, placementv1connect.PlacementServiceClient.UpdatePlacement,
			&placementv1.UpdatePlacementRequest{Placement: p, ExpectedRevision: live.revision}, "update placement %s in project %s", o.Name, o.Project)
		return err
	case *projectv1.NamespaceBinding:
		if s.Placement != "" {
			// Binding a namespace to its placement again changes its quota and unbind policy
			// on every cluster of the decision.
			return createObject(ctx, f, o, "")
		}
		_, err := call(ctx, f, projectv1connect.NewProjectServiceClient, projectv1connect.ProjectServiceClient.UpdateQuota,
			&projectv1.UpdateQuotaRequest{Project: o.Project, Cluster: s.Cluster, Namespace: o.Name, Hard: s.Hard}, "update the quota of namespace %s", o.Name)
		return err
	case *endpointv1.ServiceWeights:
		return setWeights(ctx, f, o.Name, s, live.obj.Spec.(*endpointv1.ServiceWeights))
	}
	// Bindings are what they bind: a different one is a different key, never an update.
	return fmt.Errorf("%s: kind %s cannot be updated", o.Key(), o.Kind.Name)
}

// deleteObject removes a live object (prune).
func deleteObject(ctx context.Context, f *factory, o *manifest.Object, live *liveObject, cascade bool) error {
	switch s := o.Spec.(type) {
	case *clusterv1.Cluster:
		_, err := call(ctx, f, clusterv1connect.NewClusterServiceClient, clusterv1connect.ClusterServiceClient.DeregisterCluster,
			&clusterv1.DeregisterClusterRequest{Name: o.Name, ExpectedRevision: live.revision}, "deregister cluster %s", o.Name)
		return err
	case *clusterv1.Subscriber:
		_, err := call(ctx, f, clusterv1connect.NewSubscriberServiceClient, clusterv1connect.SubscriberServiceClient.DeleteSubscriber,
			&clusterv1.DeleteSubscriberRequest{Name: o.Name}, "delete subscriber %s", o.Name)
		return err
	case *clusterv1.ImportPolicy:
		_, err := call(ctx, f, clusterv1connect.NewImportPolicyServiceClient, clusterv1connect.ImportPolicyServiceClient.DeleteImportPolicy,
			&clusterv1.DeleteImportPolicyRequest{Name: o.Name, ExpectedRevision: live.revision}, "delete import policy %s", o.Name)
		return err
	case *rbacv1.RoleTemplate:
		_, err := call(ctx, f, rbacv1connect.NewRBACServiceClient, rbacv1connect.RBACServiceClient.DeleteRoleTemplate,
			&rbacv1.DeleteRoleTemplateRequest{Name: o.Name, ExpectedRevision: live.revision}, "delete role template %s", o.Name)
		return err
	case *placementv1.ClusterSet:
		_, err := call(ctx, f, placementv1connect.NewClusterSetServiceClient, placementv1connect.ClusterSetServiceClient.DeleteClusterSet,
			&placementv1.DeleteClusterSetRequest{Name: o.Name, ExpectedRevision: live.revision}, "delete cluster set %s", o.Name)
		return err
	case *projectv1.Project:
		_, err := call(ctx, f, projectv1connect.NewProjectServiceClient, projectv1connect.ProjectServiceClient.DeleteProject,
			&projectv1.DeleteProjectRequest{Name: o.Name, Force: cascade}, "delete project %s", o.Name)
		return err
	case *placementv1.Placement:
		_, err := call(ctx, f, placementv1connect.NewPlacementServiceClient, placementv1connect.PlacementServiceClient.DeletePlacement,
			&placementv1.DeletePlacementRequest{Project: o.Project, Name: o.Name, ExpectedRevision: live.revision}, "delete placement %s in project %s", o.Name, o.Project)
		return err
	case *placementv1.ClusterSetBinding:
		_, err := call(ctx, f, placementv1connect.NewClusterSetServiceClient, placementv1connect.ClusterSetServiceClient.UnbindClusterSet,
			&placementv1.UnbindClusterSetRequest{Project: o.Project, ClusterSet: s.ClusterSet}, "unbind cluster set %s from project %s", s.ClusterSet, o.Project)
		return err
	case *projectv1.NamespaceBinding:
		_, err := call(ctx, f, projectv1connect.NewProjectServiceClient, projectv1connect.ProjectServiceClient.UnbindNamespace,
			&projectv1.UnbindNamespaceRequest{Project: o.Project, Cluster: s.Cluster, Placement: s.Placement, Namespace: o.Name}, "unbind namespace %s", o.Name)
		return err
	case *rbacv1.ProjectRoleBinding:
		_, err := call(ctx, f, rbacv1connect.NewRBACServiceClient, rbacv1connect.RBACServiceClient.UnbindProjectRole,
			&rbacv1.UnbindProjectRoleRequest{Project: o.Project, Subject: s.Subject, RoleTemplate: s.RoleTemplate}, "unbind role %s in project %s", s.RoleTemplate, o.Project)
		return err
	}
	return fmt.Errorf("%s: kind %s cannot be deleted", o.Key(), o.Kind.Name)
}

// writeToken stores a token the API hands out once (a new cluster's agent token, a new
// subscriber's NATS token) as <dir>/<file>.token, readable by its owner only. The token is shown
// nowhere else: apply's output goes into CI logs, which are no place for a credential.
func writeToken(dir, file, token, what string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("--token-dir: %w", err)
	}
	path := filepath.Join(dir, file+".token")
	// O_EXCL: never another token's file (cluster "subscriber-x" and subscriber "x" share a
	// name), and always a file made now, with this mode.
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		_, err = fh.WriteString(token + "\n")
		if cerr := fh.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return fmt.Errorf("%s is created but its token could not be written (delete it and apply again to get a new one): %w", what, err)
	}
	return nil
}

// tokenFileFree refuses, before anything is created, an object whose token would go to a file
// that already exists: the API hands a token out once, and the file may hold another one.
func tokenFileFree(dir, file, what string) error {
	path := filepath.Join(dir, file+".token")
	if _, err := os.Lstat(path); err == nil {
		return fmt.Errorf("%s: its token would be written to %s, which already exists (another object's token, or one left from before): move it away and apply again", what, path)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// setWeights makes service name's weights those of want, from have: a call per cluster or
// endpoint weight that differs, and a reset to the default of each one want leaves out (the API
// has one call per weight, and no expected revision: each weight is set whole). Raises go
// before cuts, so that a failure halfway never leaves the service more drained than either
// side says (from {b: 0} to {a: 0}, b comes back before a goes).
func setWeights(ctx context.Context, f *factory, name string, want, have *endpointv1.ServiceWeights) error {
	ns := want.Namespace
	for _, c := range weights.Changes(want, have) {
		var err error
		switch {
		case c.IP == "":
			err = setClusterWeight(ctx, f, ns, name, c.Cluster, c.To)
		case c.Reset:
			_, err = call(ctx, f, endpointv1connect.NewEndpointServiceClient, endpointv1connect.EndpointServiceClient.SetEndpointWeight,
				&endpointv1.SetEndpointWeightRequest{Namespace: ns, Name: name, Ip: c.IP, Cluster: c.Cluster, Clear: true},
				"reset the weight of %s in cluster %s of service %s/%s", c.IP, c.Cluster, ns, name)
		default:
			_, err = call(ctx, f, endpointv1connect.NewEndpointServiceClient, endpointv1connect.EndpointServiceClient.SetEndpointWeight,
				&endpointv1.SetEndpointWeightRequest{Namespace: ns, Name: name, Ip: c.IP, Cluster: c.Cluster, Weight: c.To},
				"set the weight of %s in cluster %s of service %s/%s", c.IP, c.Cluster, ns, name)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func setClusterWeight(ctx context.Context, f *factory, ns, name, cluster string, weight uint32) error {
	_, err := call(ctx, f, endpointv1connect.NewEndpointServiceClient, endpointv1connect.EndpointServiceClient.SetClusterWeight,
		&endpointv1.SetClusterWeightRequest{Namespace: ns, Name: name, Cluster: cluster, Weight: weight},
		"set the weight of cluster %s for service %s/%s", cluster, ns, name)
	return err
}
