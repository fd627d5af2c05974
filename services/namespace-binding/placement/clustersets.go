package placement

import (
	"context"
	"fmt"

	"connectrpc.com/connect"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/authz"
	"github.com/fleetstream/fleetstream/pkg/events"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/identity"
	core "github.com/fleetstream/fleetstream/pkg/placement"
	"github.com/fleetstream/fleetstream/pkg/roles"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/viewapi"
)

// ClusterSetAPI: cluster sets, the built-in ones, and their bindings to projects
// (docs/placement.md, Cluster sets). Roles on sets are in setroles.go.

// builtinClusterSets are the sets that exist from the start (OCM's `default` and `global`):
// every cluster without the exclusive label, and every cluster.
func builtinClusterSets() []*placementv1.ClusterSet {
	return []*placementv1.ClusterSet{
		{Name: core.DefaultClusterSet, Selector: &placementv1.ClusterSetSelector{Type: placementv1.SelectorType_SELECTOR_TYPE_EXCLUSIVE_LABEL}},
		{Name: core.GlobalClusterSet, Selector: &placementv1.ClusterSetSelector{Type: placementv1.SelectorType_SELECTOR_TYPE_LABEL_SELECTOR,
			LabelSelector: &placementv1.LabelSelector{}}},
	}
}

func isBuiltinClusterSet(name string) bool {
	return name == core.DefaultClusterSet || name == core.GlobalClusterSet
}

// ensureClusterSets creates the built-in sets, or brings them back to their selectors, through
// the events an admin's command would append (viewapi.Ensure).
func (s *Service) ensureClusterSets(ctx context.Context) error {
	for _, want := range builtinClusterSets() {
		if err := viewapi.Ensure(ctx, s.log, viewapi.Builtin[*placementv1.ClusterSet]{
			What: "cluster set " + want.Name, Cache: s.clusterSets, Key: clusterSetKey(want.Name),
			Store: s.store, Stream: s.stream, Subject: subjects.ClusterSet(want.Name), AggregateID: want.Name,
			Ended: func(last proto.Message) bool {
				_, gone := last.(*placementv1.ClusterSetDeleted)
				return gone
			},
			Decide: func(cur *placementv1.ClusterSet, ok bool) []proto.Message { return decideClusterSet(want, cur, ok) },
		}); err != nil {
			return err
		}
	}
	return nil
}

// decideClusterSet returns what brings set cur (ok false when absent) to want, if anything.
func decideClusterSet(want, cur *placementv1.ClusterSet, ok bool) []proto.Message {
	switch {
	case !ok:
		return []proto.Message{&placementv1.ClusterSetCreated{ClusterSet: want}}
	case !proto.Equal(cur.Selector, want.Selector):
		return []proto.Message{&placementv1.ClusterSetUpdated{ClusterSet: &placementv1.ClusterSet{Name: want.Name, Selector: want.Selector}}}
	}
	return nil
}

// fleet indexes the registry's clusters against sets with the scheduler's own membership rules,
// so a set's members here are exactly those a placement picks from.
func (s *Service) fleet(sets []*placementv1.ClusterSet) (*core.Fleet, error) {
	list := s.clusters.List(nil)
	clusters := make([]core.Cluster, len(list))
	for i, c := range list {
		clusters[i] = core.Cluster{Name: c.Name, Labels: c.Labels}
	}
	ps := make([]core.ClusterSet, len(sets))
	for i, c := range sets {
		ps[i] = toPlacementSet(c)
	}
	f, err := core.NewFleet(clusters, ps, nil)
	if err != nil {
		return nil, apierr.Internal(fmt.Errorf("cluster set membership: %w", err))
	}
	return f, nil
}

// presentSets returns sets with their status: the member count, and the members too when
// withMembers is set.
func (s *Service) presentSets(sets []*placementv1.ClusterSet, withMembers bool) ([]*placementv1.ClusterSet, error) {
	f, err := s.fleet(sets)
	if err != nil {
		return nil, err
	}
	out := make([]*placementv1.ClusterSet, len(sets))
	for i, c := range sets {
		members, _ := f.Members(c.Name)
		o := proto.CloneOf(c)
		o.Status = &placementv1.ClusterSetStatus{MemberCount: int32(len(members))}
		if withMembers {
			o.Status.Members = members
		}
		out[i] = o
	}
	return out, nil
}

func (s *Service) presentSet(c *placementv1.ClusterSet) (*placementv1.ClusterSet, error) {
	out, err := s.presentSets([]*placementv1.ClusterSet{c}, true)
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

func (s *Service) presentSetBinding(b *placementv1.ClusterSetBinding) *placementv1.ClusterSetBinding {
	out := proto.CloneOf(b)
	_, exists := s.clusterSets.Get(clusterSetKey(b.ClusterSet))
	out.Status = &placementv1.ClusterSetBindingStatus{ClusterSetExists: exists}
	return out
}

func (s *Service) awaitClusterSet(ctx context.Context, name string, seq uint64) (*placementv1.ClusterSet, error) {
	c, ok, err := s.clusterSetKind().Await(ctx, name, seq)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, apierr.Concurrent("cluster set %q", name)
	}
	return s.presentSet(c)
}

// clusterSetKind is how the handlers read cluster sets.
func (s *Service) clusterSetKind() viewapi.Kind[*placementv1.ClusterSet] {
	return viewapi.Kind[*placementv1.ClusterSet]{Name: "cluster set", Cache: s.clusterSets, Key: clusterSetKey, Gate: s.gate}
}

func (s *ClusterSetAPI) CreateClusterSet(ctx context.Context, req *connect.Request[placementv1.CreateClusterSetRequest]) (*connect.Response[placementv1.CreateClusterSetResponse], error) {
	m := req.Msg
	var v apierr.Violations
	v.DNSLabel("name", m.Name)
	sel := validateSetSelector(&v, "selector", m.Selector)
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	if _, ok := s.clusterSets.Get(clusterSetKey(m.Name)); ok {
		return nil, apierr.AlreadyExists("cluster set", m.Name)
	}
	if m.DryRun {
		// The set as it would be, with the clusters it would hold now.
		out, err := s.presentSet(&placementv1.ClusterSet{Name: m.Name, Selector: sel})
		if err != nil {
			return nil, err
		}
		return connect.NewResponse(&placementv1.CreateClusterSetResponse{ClusterSet: out}), nil
	}
	seq, err := viewapi.Create(ctx, s.store, s.stream, subjects.ClusterSet(m.Name), m.Name,
		func(last proto.Message) bool { _, gone := last.(*placementv1.ClusterSetDeleted); return gone },
		&placementv1.ClusterSetCreated{ClusterSet: &placementv1.ClusterSet{Name: m.Name, Selector: sel}}, apierr.AlreadyExists("cluster set", m.Name))
	if err != nil {
		return nil, err
	}
	out, err := s.awaitClusterSet(ctx, m.Name, seq)
	if err != nil {
		return nil, err
	}
	s.log.Info("cluster set created", zap.String("cluster_set", m.Name), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&placementv1.CreateClusterSetResponse{ClusterSet: out}), nil
}

func (s *ClusterSetAPI) UpdateClusterSet(ctx context.Context, req *connect.Request[placementv1.UpdateClusterSetRequest]) (*connect.Response[placementv1.UpdateClusterSetResponse], error) {
	m := req.Msg
	var v apierr.Violations
	v.DNSLabel("name", m.Name)
	if m.Selector == nil {
		// Required here: taking nil as EXCLUSIVE_LABEL would silently turn a selector set into
		// an exclusive one.
		v.Add("selector", "required")
	}
	sel := validateSetSelector(&v, "selector", m.Selector)
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	if isBuiltinClusterSet(m.Name) {
		return nil, apierr.FailedPrecondition("cluster set %q is built in: its selector cannot be changed", m.Name)
	}
	// Without an expectation the caller wants this selector whatever happened: a lost race is
	// decided again on the state the other writer left.
	res, err := events.Command[*placementv1.ClusterSet]{
		Store: s.store, Subject: subjects.ClusterSet(m.Name), AggregateID: m.Name,
		Load: s.clusterSetKind().Load(m.Name, m.ExpectedRevision), Expected: m.ExpectedRevision, MaxConflicts: maxAttempts,
		DryRun: m.DryRun,
		Decide: func(cur *placementv1.ClusterSet) ([]proto.Message, error) {
			if proto.Equal(cur.Selector, sel) {
				return nil, nil
			}
			return []proto.Message{&placementv1.ClusterSetUpdated{ClusterSet: &placementv1.ClusterSet{Name: m.Name, Selector: sel}}}, nil
		},
	}.Run(ctx)
	switch {
	case events.IsConflict(err):
		return nil, apierr.Concurrent("cluster set %q", m.Name)
	case err != nil:
		return nil, apierr.Internal(err)
	case m.DryRun:
		// The set as it would be, with the clusters it would hold now.
		next := proto.CloneOf(res.State)
		next.Selector = sel
		out, err := s.presentSet(next)
		if err != nil {
			return nil, err
		}
		return connect.NewResponse(&placementv1.UpdateClusterSetResponse{ClusterSet: out}), nil
	case len(res.Events) == 0:
		out, err := s.presentSet(res.State)
		if err != nil {
			return nil, err
		}
		return connect.NewResponse(&placementv1.UpdateClusterSetResponse{ClusterSet: out}), nil
	}
	out, err := s.awaitClusterSet(ctx, m.Name, res.Sequence)
	if err != nil {
		return nil, err
	}
	s.log.Info("cluster set updated", zap.String("cluster_set", m.Name), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&placementv1.UpdateClusterSetResponse{ClusterSet: out}), nil
}

func (s *ClusterSetAPI) DeleteClusterSet(ctx context.Context, req *connect.Request[placementv1.DeleteClusterSetRequest]) (*connect.Response[placementv1.DeleteClusterSetResponse], error) {
	m := req.Msg
	var v apierr.Violations
	v.DNSLabel("name", m.Name)
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	if isBuiltinClusterSet(m.Name) {
		return nil, apierr.FailedPrecondition("cluster set %q is built in and cannot be deleted", m.Name)
	}
	sets := s.clusterSetKind()
	if m.DryRun {
		if _, err := sets.Current(m.Name, m.ExpectedRevision); err != nil {
			return nil, err
		}
		return connect.NewResponse(&placementv1.DeleteClusterSetResponse{}), nil
	}
	// Bindings of the set stay, as OCM's ManagedClusterSetBindings do: they report the set
	// missing, and come back to life if it is created again.
	cur, err := viewapi.Remove(ctx, s.store, subjects.ClusterSet(m.Name), m.Name,
		func() (*placementv1.ClusterSet, error) { return sets.Current(m.Name, m.ExpectedRevision) },
		func(*placementv1.ClusterSet) proto.Message { return &placementv1.ClusterSetDeleted{Name: m.Name} },
		apierr.Concurrent("cluster set %q", m.Name))
	if err != nil {
		return nil, err
	}
	if err := sets.AwaitPast(ctx, m.Name, cur.Revision); err != nil {
		return nil, err
	}
	s.log.Info("cluster set deleted", zap.String("cluster_set", m.Name), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&placementv1.DeleteClusterSetResponse{}), nil
}

func (s *ClusterSetAPI) GetClusterSet(ctx context.Context, req *connect.Request[placementv1.GetClusterSetRequest]) (*connect.Response[placementv1.GetClusterSetResponse], error) {
	c, err := s.clusterSetKind().Get(ctx, req.Msg.Name)
	if err != nil {
		return nil, err
	}
	out, err := s.presentSet(c)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&placementv1.GetClusterSetResponse{ClusterSet: out}), nil
}

func (s *ClusterSetAPI) ListClusterSets(ctx context.Context, _ *connect.Request[placementv1.ListClusterSetsRequest]) (*connect.Response[placementv1.ListClusterSetsResponse], error) {
	// Keys are encoded names, which sort as the names do for DNS labels.
	list, err := s.clusterSetKind().List(ctx, nil)
	if err != nil {
		return nil, err
	}
	out, err := s.presentSets(list, false)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&placementv1.ListClusterSetsResponse{ClusterSets: out}), nil
}

func (s *ClusterSetAPI) BindClusterSet(ctx context.Context, req *connect.Request[placementv1.BindClusterSetRequest]) (*connect.Response[placementv1.BindClusterSetResponse], error) {
	m := req.Msg
	var v apierr.Violations
	v.DNSLabel("project", m.Project)
	v.DNSLabel("cluster_set", m.ClusterSet)
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	// The set need not exist (OCM binds a set by name; the binding's status tells), the project
	// must: a binding is the project's.
	if !s.projects.ProjectExists(m.Project) {
		return nil, apierr.NotFound("project", m.Project)
	}
	key := setBindingKey(m.Project, m.ClusterSet)
	what := m.Project + "/" + m.ClusterSet
	if _, ok := s.setBindings.Get(key); ok {
		return nil, apierr.AlreadyExists("cluster set binding", what)
	}
	if m.DryRun {
		return connect.NewResponse(&placementv1.BindClusterSetResponse{Binding: s.presentSetBinding(
			&placementv1.ClusterSetBinding{Project: m.Project, ClusterSet: m.ClusterSet})}), nil
	}
	seq, err := viewapi.Create(ctx, s.store, s.stream, subjects.ClusterSetBinding(m.Project, m.ClusterSet), key,
		func(last proto.Message) bool { _, gone := last.(*placementv1.ClusterSetUnbound); return gone },
		&placementv1.ClusterSetBound{Project: m.Project, ClusterSet: m.ClusterSet}, apierr.AlreadyExists("cluster set binding", what))
	if err != nil {
		return nil, err
	}
	b, ok, err := viewapi.Await(ctx, s.setBindings, key, seq)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, apierr.Concurrent("cluster set binding %s", what)
	}
	s.log.Info("cluster set bound", zap.String("project", m.Project), zap.String("cluster_set", m.ClusterSet), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&placementv1.BindClusterSetResponse{Binding: s.presentSetBinding(b)}), nil
}

func (s *ClusterSetAPI) UnbindClusterSet(ctx context.Context, req *connect.Request[placementv1.UnbindClusterSetRequest]) (*connect.Response[placementv1.UnbindClusterSetResponse], error) {
	m := req.Msg
	var v apierr.Violations
	v.DNSLabel("project", m.Project)
	v.DNSLabel("cluster_set", m.ClusterSet)
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	key := setBindingKey(m.Project, m.ClusterSet)
	what := m.Project + "/" + m.ClusterSet
	if m.DryRun {
		if _, ok := s.setBindings.Get(key); !ok {
			return nil, apierr.NotFound("cluster set binding", what)
		}
		return connect.NewResponse(&placementv1.UnbindClusterSetResponse{}), nil
	}
	cur, err := viewapi.Remove(ctx, s.store, subjects.ClusterSetBinding(m.Project, m.ClusterSet), key,
		func() (*placementv1.ClusterSetBinding, error) {
			if cur, ok := s.setBindings.Get(key); ok {
				return cur, nil
			}
			return nil, apierr.NotFound("cluster set binding", what)
		},
		func(*placementv1.ClusterSetBinding) proto.Message {
			return &placementv1.ClusterSetUnbound{Project: m.Project, ClusterSet: m.ClusterSet}
		},
		apierr.Concurrent("cluster set binding %s", what))
	if err != nil {
		return nil, err
	}
	if err := viewapi.AwaitPast(ctx, s.setBindings, key, cur.Revision); err != nil {
		return nil, err
	}
	s.log.Info("cluster set unbound", zap.String("project", m.Project), zap.String("cluster_set", m.ClusterSet), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&placementv1.UnbindClusterSetResponse{}), nil
}

func (s *ClusterSetAPI) ListClusterSetBindings(ctx context.Context, req *connect.Request[placementv1.ListClusterSetBindingsRequest]) (*connect.Response[placementv1.ListClusterSetBindingsResponse], error) {
	var list []*placementv1.ClusterSetBinding
	if req.Msg.Project != "" {
		var err error
		if list, err = listInProjects(ctx, s.Service, s.setBindings, req.Msg.Project, roles.ResClusterSets, func(b *placementv1.ClusterSetBinding) string { return b.Project }); err != nil {
			return nil, err
		}
	} else {
		if err := s.gate.Ready(ctx); err != nil {
			return nil, err
		}
		// A set's admins and viewers also see where their set is bound, in any project.
		caller := authz.CallerFrom(ctx)
		list = s.setBindings.List(func(_ string, b *placementv1.ClusterSetBinding) bool {
			return caller.Can("list", roles.Group, roles.ResClusterSets, b.Project) ||
				caller.CanInClusterSet("list", roles.Group, roles.ResClusterSets, b.ClusterSet)
		})
	}
	res := &placementv1.ListClusterSetBindingsResponse{}
	for _, b := range list {
		res.Bindings = append(res.Bindings, s.presentSetBinding(b))
	}
	return connect.NewResponse(res), nil
}
