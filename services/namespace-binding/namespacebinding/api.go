package namespacebinding

import (
	"context"
	"fmt"
	"strings"

	"connectrpc.com/connect"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/apiwait"
	"github.com/fleetstream/fleetstream/pkg/authz"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/identity"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/nsinventory"
	"github.com/fleetstream/fleetstream/pkg/paging"
	"github.com/fleetstream/fleetstream/pkg/roles"
	"github.com/fleetstream/fleetstream/pkg/viewapi"
)

func (s *ProjectAPI) CreateProject(ctx context.Context, req *connect.Request[projectv1.CreateProjectRequest]) (*connect.Response[projectv1.CreateProjectResponse], error) {
	m := req.Msg
	var v apierr.Violations
	v.DNSLabel("name", m.Name)
	validateProjectMeta(&v, m.DisplayName, m.Labels)
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	if _, ok := s.projects.Get(projectKey(m.Name)); ok {
		return nil, apierr.AlreadyExists("project", m.Name)
	}
	if m.DryRun {
		return connect.NewResponse(&projectv1.CreateProjectResponse{Project: s.presentProject(&projectv1.Project{
			Name: m.Name, DisplayName: m.DisplayName, Labels: m.Labels})}), nil
	}
	// A name is free when its subject is empty or ends with the project's deletion. Reading the
	// stream rather than the view keeps a lagging view from letting a second creation through;
	// the expectation makes concurrent creations race for one append.
	seq, err := viewapi.Create(ctx, s.store, s.stream, ProjectSubject(m.Name), m.Name,
		func(last proto.Message) bool { _, deleted := last.(*projectv1.ProjectDeleted); return deleted },
		&projectv1.ProjectCreated{Name: m.Name, DisplayName: m.DisplayName, Labels: m.Labels}, apierr.AlreadyExists("project", m.Name))
	if err != nil {
		return nil, err
	}
	if err := s.waitView(ctx, func(ctx context.Context) error { return s.projects.WaitCheckpoint(ctx, seq) }); err != nil {
		return nil, err
	}
	p, ok := s.projects.Get(projectKey(m.Name))
	if !ok {
		return nil, apierr.Internal(fmt.Errorf("project %s vanished after creation", m.Name))
	}
	s.log.Info("project created", zap.String("project", m.Name), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&projectv1.CreateProjectResponse{Project: s.presentProject(p)}), nil
}

func (s *ProjectAPI) DeleteProject(ctx context.Context, req *connect.Request[projectv1.DeleteProjectRequest]) (*connect.Response[projectv1.DeleteProjectResponse], error) {
	m := req.Msg
	var v apierr.Violations
	v.DNSLabel("name", m.Name)
	validatePolicy(&v, "unbind_policy", m.UnbindPolicy)
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	// Placements and the namespaces following them are the project's too; deleting the project
	// under them would leave a scheduler deciding, and a follower binding, for a project that is
	// gone (and back, should the name be reused).
	if n := s.placements.PlacementCount(m.Name); n > 0 {
		return nil, apierr.FailedPrecondition("project %q has %d placement(s) (and may have namespaces following them): unbind those namespaces (fleetctl namespace unbind NAME --project %s --placement P) and delete the placements first",
			m.Name, n, m.Name)
	}
	if m.DryRun {
		return s.deleteProjectDryRun(ctx, m)
	}
	res := &projectv1.DeleteProjectResponse{}
	// A bind may race in between the unbinds and the deletion; the deletion's expectation then
	// fails and the next round unbinds it too.
	for round := 0; ; round++ {
		if m.Force {
			for _, b := range s.activeBindings(m.Name) {
				ub, err := s.unbind(ctx, m.Name, b.Cluster, b.Namespace, m.UnbindPolicy)
				if err != nil && connect.CodeOf(err) != connect.CodeNotFound {
					return nil, err
				}
				if ub != nil {
					res.Unbound = append(res.Unbound, ub)
				}
			}
		}
		seq, err := s.appendProject(ctx, m.Name, always, func(*projectv1.Project) (proto.Message, error) {
			if owned := s.activeBindings(m.Name); len(owned) > 0 {
				return nil, errOwnsNamespaces(m.Name, owned)
			}
			return &projectv1.ProjectDeleted{Name: m.Name}, nil
		})
		if err != nil {
			if m.Force && round < 3 && connect.CodeOf(err) == connect.CodeFailedPrecondition {
				continue
			}
			return nil, err
		}
		if err := s.waitView(ctx, func(ctx context.Context) error { return s.projects.WaitCheckpoint(ctx, seq) }); err != nil {
			return nil, err
		}
		s.log.Info("project deleted", zap.String("project", m.Name), zap.Int("unbound", len(res.Unbound)), zap.String("actor", identity.ActorFrom(ctx)))
		return connect.NewResponse(res), nil
	}
}

// deleteProjectDryRun decides DeleteProject as its last round would, writing nothing: with force
// it answers the bindings it would unbind (Terminating, with the policy), without force it
// refuses a project that owns namespaces.
func (s *ProjectAPI) deleteProjectDryRun(ctx context.Context, m *projectv1.DeleteProjectRequest) (*connect.Response[projectv1.DeleteProjectResponse], error) {
	res := &projectv1.DeleteProjectResponse{}
	if m.Force {
		for _, b := range s.activeBindings(m.Name) {
			ub, err := s.unbindCommand(ctx, m.Name, b.Cluster, b.Namespace, m.UnbindPolicy, true)
			if err != nil && connect.CodeOf(err) != connect.CodeNotFound {
				return nil, err
			}
			if ub != nil {
				res.Unbound = append(res.Unbound, ub)
			}
		}
	}
	if _, err := s.projectCommand(ctx, m.Name, true, always, func(*projectv1.Project) (proto.Message, error) {
		if owned := s.activeBindings(m.Name); len(owned) > 0 && !m.Force {
			return nil, errOwnsNamespaces(m.Name, owned)
		}
		return &projectv1.ProjectDeleted{Name: m.Name}, nil
	}); err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

func errOwnsNamespaces(project string, owned []*projectv1.NamespaceBinding) error {
	const show = 5
	names := make([]string, 0, show)
	for i, b := range owned {
		if i == show {
			names = append(names, "…")
			break
		}
		names = append(names, b.Cluster+"/"+b.Namespace)
	}
	return apierr.FailedPrecondition("project %q still owns %d namespace(s) (%s): unbind them first, or delete with force",
		project, len(owned), strings.Join(names, ", "))
}

// activeBindings returns the bindings project owns (not Terminating).
func (s *Service) activeBindings(project string) []*projectv1.NamespaceBinding {
	var out []*projectv1.NamespaceBinding
	for _, b := range s.bindings.Lookup(byProject(project)) {
		if b.Phase != projectv1.BindingPhase_BINDING_PHASE_TERMINATING {
			out = append(out, b)
		}
	}
	return out
}

func (s *ProjectAPI) GetProject(ctx context.Context, req *connect.Request[projectv1.GetProjectRequest]) (*connect.Response[projectv1.GetProjectResponse], error) {
	p, err := viewapi.Kind[*projectv1.Project]{Name: "project", Cache: s.projects, Key: projectKey, Gate: s.gate}.Get(ctx, req.Msg.Name)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&projectv1.GetProjectResponse{Project: s.presentProject(p)}), nil
}

func (s *ProjectAPI) ListProjects(ctx context.Context, req *connect.Request[projectv1.ListProjectsRequest]) (*connect.Response[projectv1.ListProjectsResponse], error) {
	sel, err := viewapi.Selected(ctx, s.gate, req.Msg.LabelSelector)
	if err != nil {
		return nil, err
	}
	res := &projectv1.ListProjectsResponse{}
	caller := authz.CallerFrom(ctx)
	for _, p := range s.projects.List(func(_ string, p *projectv1.Project) bool {
		return sel.Matches(labels.Set(p.Labels)) && caller.Can("list", roles.Group, roles.ResProjects, p.Name)
	}) {
		res.Projects = append(res.Projects, s.presentProject(p))
	}
	return connect.NewResponse(res), nil
}

func (s *ProjectAPI) BindNamespace(ctx context.Context, req *connect.Request[projectv1.BindNamespaceRequest]) (*connect.Response[projectv1.BindNamespaceResponse], error) {
	m := req.Msg
	if m.Placement != "" || m.Cluster == "" && m.UnbindPolicy != projectv1.UnbindPolicy_UNBIND_POLICY_UNSPECIFIED {
		return s.bindToPlacement(ctx, m)
	}
	var v apierr.Violations
	validateTarget(&v, m.Project, m.Cluster, m.Namespace)
	validateUnprotected(&v, s.cfg.Protected, "namespace", m.Namespace)
	validateHard(&v, "hard", m.Hard)
	if m.UnbindPolicy != projectv1.UnbindPolicy_UNBIND_POLICY_UNSPECIFIED {
		v.Add("unbind_policy", "only with placement: a binding to one cluster takes its policy when unbound")
	}
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	if m.DryRun {
		b, budget, err := s.bindDryRun(ctx, m.Project, m.Cluster, m.Namespace, m.Hard)
		if err != nil {
			return nil, err
		}
		return connect.NewResponse(&projectv1.BindNamespaceResponse{Binding: b, Budget: budget}), nil
	}
	b, err := s.bind(ctx, m.Project, m.Cluster, m.Namespace, m.Hard, "")
	if err != nil {
		return nil, err
	}
	s.log.Info("namespace bound", zap.String("project", m.Project), zap.String("cluster", m.Cluster), zap.String("namespace", m.Namespace), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&projectv1.BindNamespaceResponse{Binding: b}), nil
}

// clusterRegistered is NotFound unless cluster is in cluster-import's registry. A cluster
// registered a moment ago counts even before this replica's cache of the registry has caught up:
// a client that registers and then binds must not be told the cluster does not exist.
func (s *Service) clusterRegistered(ctx context.Context, cluster string) error {
	_, ok, err := s.clusters.GetFresh(ctx, keys.Encode(cluster))
	switch {
	case err != nil:
		return apierr.Internal(fmt.Errorf("look up cluster %q: %w", cluster, err))
	case !ok:
		return apierr.NotFound("cluster", cluster)
	}
	return nil
}

func (s *ProjectAPI) UpdateQuota(ctx context.Context, req *connect.Request[projectv1.UpdateQuotaRequest]) (*connect.Response[projectv1.UpdateQuotaResponse], error) {
	m := req.Msg
	var v apierr.Violations
	validateTarget(&v, m.Project, m.Cluster, m.Namespace)
	validateHard(&v, "hard", m.Hard)
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	if b, ok := s.bindings.Get(bindingKey(m.Cluster, m.Namespace)); ok && b.Project == m.Project && b.Placement != "" {
		return nil, errPlaced(b)
	}
	b, budget, err := s.quotaCommand(ctx, m.Project, m.Cluster, m.Namespace, m.Hard, m.DryRun)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&projectv1.UpdateQuotaResponse{Binding: b, Budget: budget}), nil
}

// errPlaced refuses changing by hand a binding the follower keeps in line with a placement: it
// would undo the change at once.
func errPlaced(b *projectv1.NamespaceBinding) error {
	return apierr.FailedPrecondition("namespace %q on cluster %q follows placement %q: change it through the placement (bind the namespace to the placement again with new limits, or unbind it from the placement)",
		b.Namespace, b.Cluster, b.Placement)
}

func (s *ProjectAPI) UnbindNamespace(ctx context.Context, req *connect.Request[projectv1.UnbindNamespaceRequest]) (*connect.Response[projectv1.UnbindNamespaceResponse], error) {
	m := req.Msg
	if m.Placement != "" {
		return s.unbindFromPlacement(ctx, m)
	}
	var v apierr.Violations
	validateTarget(&v, m.Project, m.Cluster, m.Namespace)
	validatePolicy(&v, "policy", m.Policy)
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	if b, ok := s.bindings.Get(bindingKey(m.Cluster, m.Namespace)); ok && b.Project == m.Project && b.Placement != "" &&
		b.Phase != projectv1.BindingPhase_BINDING_PHASE_TERMINATING {
		return nil, errPlaced(b)
	}
	b, err := s.unbindCommand(ctx, m.Project, m.Cluster, m.Namespace, m.Policy, m.DryRun)
	if err != nil {
		return nil, err
	}
	if m.DryRun {
		return connect.NewResponse(&projectv1.UnbindNamespaceResponse{Binding: b}), nil
	}
	s.log.Info("namespace unbound", zap.String("project", m.Project), zap.String("cluster", m.Cluster), zap.String("namespace", m.Namespace),
		zap.Stringer("policy", b.UnbindPolicy), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&projectv1.UnbindNamespaceResponse{Binding: b}), nil
}

// namespaceBindingKey is the key a page of ListNamespaceBindings is ordered by and its token
// names: the bindings view's key.
func namespaceBindingKey(b *projectv1.NamespaceBinding) string {
	return bindingKey(b.Cluster, b.Namespace)
}

func (s *ProjectAPI) ListNamespaceBindings(ctx context.Context, req *connect.Request[projectv1.ListNamespaceBindingsRequest]) (*connect.Response[projectv1.ListNamespaceBindingsResponse], error) {
	m := req.Msg
	var v apierr.Violations
	if m.Project != "" {
		v.DNSLabel("project", m.Project)
	}
	if m.Cluster != "" {
		v.DNSLabel("cluster", m.Cluster)
	}
	page := paging.Parse(&v, paging.Request{PageSize: m.PageSize, PageToken: m.PageToken, List: "ListNamespaceBindings",
		Filters: []string{m.Project, m.Cluster}})
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	caller := authz.CallerFrom(ctx)
	if m.Project != "" && !caller.Can("list", roles.Group, roles.ResNamespaceBindings, m.Project) {
		return nil, authz.Denied(caller, "list", roles.ResNamespaceBindings+"."+roles.Group, authz.Scope{Kind: authz.Project, Project: m.Project})
	}
	var list []*projectv1.NamespaceBinding
	switch {
	case m.Project != "":
		if _, ok := s.projects.Get(projectKey(m.Project)); !ok && s.bindings.Count(byProject(m.Project)) == 0 {
			return nil, apierr.NotFound("project", m.Project)
		}
		list = s.bindings.Lookup(byProject(m.Project))
	case m.Cluster != "":
		list = s.bindings.Lookup(byCluster(m.Cluster))
	default:
		list = s.bindings.List(nil)
	}
	if m.Cluster != "" && len(list) == 0 {
		if err := s.clusterRegistered(ctx, m.Cluster); err != nil {
			return nil, err
		}
	}
	// What the caller may read is filtered before paging, so a page holds page_size bindings
	// it may read (not fewer for the ones it may not) and its token names one of them. The
	// bindings are presented (which reads their claims) only once on a page.
	var readable []*projectv1.NamespaceBinding
	for _, b := range list {
		if m.Cluster != "" && b.Cluster != m.Cluster || !caller.Can("list", roles.Group, roles.ResNamespaceBindings, b.Project) {
			continue
		}
		readable = append(readable, b)
	}
	// blocked are a following namespace's Failed entries, made here and not in the view, so
	// not presented from it.
	blocked := map[*projectv1.NamespaceBinding]bool{}
	if m.Project != "" && m.Cluster == "" {
		// A project's list holds one entry per cluster and namespace, bound or blocked, so
		// the binding key orders and names them all.
		for _, b := range s.withBlocked(m.Project, nil) {
			blocked[b] = true
			readable = append(readable, b)
		}
	}
	// The view's keys are (cluster, namespace) and the list above is sorted by them only
	// when it came from one index: sort by the key the token names.
	paging.SortByKey(readable, namespaceBindingKey)
	bindings, next := paging.Slice(page, readable, namespaceBindingKey)
	res := &projectv1.ListNamespaceBindingsResponse{NextPageToken: next}
	for _, b := range bindings {
		if blocked[b] {
			res.Bindings = append(res.Bindings, b)
			continue
		}
		res.Bindings = append(res.Bindings, s.present(b))
	}
	return connect.NewResponse(res), nil
}

func (s *ProjectAPI) ListIdleNamespaces(ctx context.Context, req *connect.Request[projectv1.ListIdleNamespacesRequest]) (*connect.Response[projectv1.ListIdleNamespacesResponse], error) {
	var v apierr.Violations
	v.DNSLabel("cluster", req.Msg.Cluster)
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	cluster := req.Msg.Cluster
	if err := s.clusterRegistered(ctx, cluster); err != nil {
		return nil, err
	}
	// Not idle: claimed, or held by a binding (one whose claim the repair loop has yet to
	// restore, or one still being released from its project), or protected: no project may
	// ever claim it.
	owned := map[string]bool{}
	for _, key := range s.claims.Keys(byCluster(cluster)) {
		owned[key] = true
	}
	for _, b := range s.bindings.Lookup(byCluster(cluster)) {
		owned[bindingKey(cluster, b.Namespace)] = true
	}
	res := &projectv1.ListIdleNamespacesResponse{}
	if inv := nsinventory.Assemble(s.inventory.Lookup(keys.Encode(cluster))); inv != nil {
		for _, ns := range inv.Namespaces {
			if _, protected := s.cfg.Protected.Match(ns.Name); protected || owned[bindingKey(cluster, ns.Name)] {
				continue
			}
			res.Namespaces = append(res.Namespaces, &projectv1.IdleNamespace{Cluster: cluster, Name: ns.Name, Labels: ns.Labels, Phase: ns.Phase})
		}
	}
	return connect.NewResponse(res), nil
}

func (s *Service) waitView(ctx context.Context, wait func(context.Context) error) error {
	return apiwait.Visible(ctx, "change", wait)
}
