package placement

import (
	"context"
	"fmt"
	"strings"

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
	"github.com/fleetstream/fleetstream/pkg/view"
	"github.com/fleetstream/fleetstream/pkg/viewapi"
)

// PlacementAPI: placements, their decisions and add-on scores (docs/placement.md, Placements).

func (s *Service) awaitPlacement(ctx context.Context, project, name string, seq uint64) (*placementv1.Placement, error) {
	p, ok, err := viewapi.Await(ctx, s.placements, placementKey(project, name), seq)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, apierr.Concurrent("placement %s/%s", project, name)
	}
	return s.presentPlacement(p), nil
}

// presentPlacement adds the decision's status to a placement's spec.
func (s *Service) presentPlacement(p *placementv1.Placement) *placementv1.Placement {
	out := proto.CloneOf(p)
	if d, ok := s.decisions.Get(placementKey(p.Project, p.Name)); ok {
		out.Status = d.Status
	}
	return out
}

func (s *PlacementAPI) CreatePlacement(ctx context.Context, req *connect.Request[placementv1.CreatePlacementRequest]) (*connect.Response[placementv1.CreatePlacementResponse], error) {
	var v apierr.Violations
	validatePlacementSpec(&v, "placement", req.Msg.Placement)
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	spec := placementSpec(req.Msg.Placement)
	what := spec.Project + "/" + spec.Name
	if !s.projects.ProjectExists(spec.Project) {
		return nil, apierr.NotFound("project", spec.Project)
	}
	if _, ok := s.placements.Get(placementKey(spec.Project, spec.Name)); ok {
		return nil, apierr.AlreadyExists("placement", what)
	}
	if req.Msg.DryRun {
		decided, err := s.decideNow(ctx, spec)
		if err != nil {
			return nil, err
		}
		return connect.NewResponse(&placementv1.CreatePlacementResponse{Placement: spec, DecidedClusters: decided}), nil
	}
	seq, err := viewapi.Create(ctx, s.store, s.stream, subjects.Placement(spec.Project, spec.Name), placementKey(spec.Project, spec.Name),
		func(last proto.Message) bool { _, gone := last.(*placementv1.PlacementDeleted); return gone },
		&placementv1.PlacementCreated{Placement: spec}, apierr.AlreadyExists("placement", what))
	if err != nil {
		return nil, err
	}
	out, err := s.awaitPlacement(ctx, spec.Project, spec.Name, seq)
	if err != nil {
		return nil, err
	}
	s.log.Info("placement created", zap.String("project", spec.Project), zap.String("placement", spec.Name), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&placementv1.CreatePlacementResponse{Placement: out}), nil
}

func (s *PlacementAPI) UpdatePlacement(ctx context.Context, req *connect.Request[placementv1.UpdatePlacementRequest]) (*connect.Response[placementv1.UpdatePlacementResponse], error) {
	var v apierr.Violations
	validatePlacementSpec(&v, "placement", req.Msg.Placement)
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	spec := placementSpec(req.Msg.Placement)
	key := placementKey(spec.Project, spec.Name)
	// A lost race is the caller's to resolve (Aborted), with or without an expected revision.
	res, err := events.Command[*placementv1.Placement]{
		Store: s.store, Subject: subjects.Placement(spec.Project, spec.Name), AggregateID: key, MaxConflicts: -1,
		DryRun: req.Msg.DryRun,
		Load: func(context.Context, uint64) (*placementv1.Placement, uint64, error) {
			cur, ok := s.placements.Get(key)
			if !ok {
				return nil, 0, apierr.NotFound("placement", spec.Project+"/"+spec.Name)
			}
			if rev := req.Msg.ExpectedRevision; rev != 0 && rev != cur.Revision {
				return nil, 0, apierr.RevisionMismatch("placement", spec.Project+"/"+spec.Name, cur.Revision, rev)
			}
			return cur, cur.Revision, nil
		},
		Decide: func(cur *placementv1.Placement) ([]proto.Message, error) {
			if proto.Equal(placementSpec(cur), spec) {
				return nil, nil
			}
			return []proto.Message{&placementv1.PlacementUpdated{Placement: spec}}, nil
		},
	}.Run(ctx)
	switch {
	case events.IsConflict(err):
		return nil, apierr.Concurrent("placement %s/%s", spec.Project, spec.Name)
	case err != nil:
		return nil, apierr.Internal(err)
	case req.Msg.DryRun:
		decided, err := s.decideNow(ctx, spec)
		if err != nil {
			return nil, err
		}
		next := proto.CloneOf(spec)
		next.Revision, next.CreateTime = res.State.Revision, res.State.CreateTime
		return connect.NewResponse(&placementv1.UpdatePlacementResponse{Placement: next, DecidedClusters: decided}), nil
	case len(res.Events) == 0:
		return connect.NewResponse(&placementv1.UpdatePlacementResponse{Placement: s.presentPlacement(res.State)}), nil
	}
	seq := res.Sequence
	out, err := s.awaitPlacement(ctx, spec.Project, spec.Name, seq)
	if err != nil {
		return nil, err
	}
	s.log.Info("placement updated", zap.String("project", spec.Project), zap.String("placement", spec.Name), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&placementv1.UpdatePlacementResponse{Placement: out}), nil
}

func (s *PlacementAPI) DeletePlacement(ctx context.Context, req *connect.Request[placementv1.DeletePlacementRequest]) (*connect.Response[placementv1.DeletePlacementResponse], error) {
	m := req.Msg
	var v apierr.Violations
	v.DNSLabel("project", m.Project)
	v.DNSLabel("name", m.Name)
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	key := placementKey(m.Project, m.Name)
	load := func() (*placementv1.Placement, error) {
		cur, ok := s.placements.Get(key)
		if !ok {
			return nil, apierr.NotFound("placement", m.Project+"/"+m.Name)
		}
		if m.ExpectedRevision != 0 && m.ExpectedRevision != cur.Revision {
			return nil, apierr.RevisionMismatch("placement", m.Project+"/"+m.Name, cur.Revision, m.ExpectedRevision)
		}
		// Deleting a placement that namespaces follow would strand their bindings (or
		// release them all at once); as with a project that owns namespaces, unbinding
		// comes first.
		if followers := s.followers.FollowersOf(m.Project, m.Name); len(followers) > 0 {
			return nil, apierr.FailedPrecondition("placement %s/%s is followed by namespace(s) %s: unbind them first (fleetctl namespace unbind NAME --project %s --placement %s)",
				m.Project, m.Name, strings.Join(followers, ", "), m.Project, m.Name)
		}
		return cur, nil
	}
	if m.DryRun {
		if _, err := load(); err != nil {
			return nil, err
		}
		return connect.NewResponse(&placementv1.DeletePlacementResponse{}), nil
	}
	cur, err := viewapi.Remove(ctx, s.store, subjects.Placement(m.Project, m.Name), key, load,
		func(*placementv1.Placement) proto.Message {
			return &placementv1.PlacementDeleted{Project: m.Project, Name: m.Name}
		},
		apierr.Concurrent("placement %s/%s", m.Project, m.Name))
	if err != nil {
		return nil, err
	}
	if err := viewapi.AwaitPast(ctx, s.placements, key, cur.Revision); err != nil {
		return nil, err
	}
	s.log.Info("placement deleted", zap.String("project", m.Project), zap.String("placement", m.Name), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&placementv1.DeletePlacementResponse{}), nil
}

func (s *PlacementAPI) GetPlacement(ctx context.Context, req *connect.Request[placementv1.GetPlacementRequest]) (*connect.Response[placementv1.GetPlacementResponse], error) {
	p, err := s.getPlacement(ctx, req.Msg.Project, req.Msg.Name)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&placementv1.GetPlacementResponse{Placement: s.presentPlacement(p)}), nil
}

func (s *Service) getPlacement(ctx context.Context, project, name string) (*placementv1.Placement, error) {
	var v apierr.Violations
	v.DNSLabel("project", project)
	v.DNSLabel("name", name)
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	p, ok := s.placements.Get(placementKey(project, name))
	if !ok {
		return nil, apierr.NotFound("placement", project+"/"+name)
	}
	return p, nil
}

func (s *PlacementAPI) ListPlacements(ctx context.Context, req *connect.Request[placementv1.ListPlacementsRequest]) (*connect.Response[placementv1.ListPlacementsResponse], error) {
	list, err := listInProjects(ctx, s.Service, s.placements, req.Msg.Project, roles.ResPlacements, func(p *placementv1.Placement) string { return p.Project })
	if err != nil {
		return nil, err
	}
	res := &placementv1.ListPlacementsResponse{}
	for _, p := range list {
		res.Placements = append(res.Placements, s.presentPlacement(p))
	}
	return connect.NewResponse(res), nil
}

// listInProjects lists a view indexed by project (byProject): one project's entries, or
// every project's, keeping those of projects where the caller may list resource. A named
// project the caller may not read is a denial, not an empty list.
func listInProjects[T proto.Message](ctx context.Context, s *Service, c *view.Cache[T], project, resource string, projectOf func(T) string) ([]T, error) {
	var v apierr.Violations
	if project != "" {
		v.DNSLabel("project", project)
	}
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	caller := authz.CallerFrom(ctx)
	if project != "" && !caller.Can("list", roles.Group, resource, project) {
		return nil, authz.Denied(caller, "list", resource+"."+roles.Group, authz.Scope{Kind: authz.Project, Project: project})
	}
	var list []T
	if project != "" {
		list = c.Lookup(byProject(project))
	} else {
		list = c.List(nil)
	}
	out := list[:0:0]
	for _, e := range list {
		if caller.Can("list", roles.Group, resource, projectOf(e)) {
			out = append(out, e)
		}
	}
	return out, nil
}

// emptyDecisions is what a placement shows before the scheduler first decided it.
func emptyDecisions(project, name string) *placementv1.PlacementDecisions {
	return &placementv1.PlacementDecisions{Project: project, Name: name, Status: &placementv1.PlacementStatus{}}
}

func (s *PlacementAPI) GetPlacementDecisions(ctx context.Context, req *connect.Request[placementv1.GetPlacementDecisionsRequest]) (*connect.Response[placementv1.GetPlacementDecisionsResponse], error) {
	m := req.Msg
	if _, err := s.getPlacement(ctx, m.Project, m.Name); err != nil {
		return nil, err
	}
	d, ok := s.decisions.Get(placementKey(m.Project, m.Name))
	if !ok {
		d = emptyDecisions(m.Project, m.Name)
	}
	return connect.NewResponse(&placementv1.GetPlacementDecisionsResponse{Decisions: d}), nil
}

func (s *PlacementAPI) WatchPlacementDecisions(ctx context.Context, req *connect.Request[placementv1.WatchPlacementDecisionsRequest], stream *connect.ServerStream[placementv1.WatchPlacementDecisionsResponse]) error {
	m := req.Msg
	if _, err := s.getPlacement(ctx, m.Project, m.Name); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	key := placementKey(m.Project, m.Name)
	// Subscribe before reading, so no change falls between the first message and the stream.
	updates := s.decisions.Updates(ctx, 4096) // every placement's changes: room for a fleet-wide re-decision
	var shown []string
	send := func(d *placementv1.PlacementDecisions) error {
		now := decidedClusters(d)
		added, removed := core.Diff(shown, now)
		shown = now
		return stream.Send(&placementv1.WatchPlacementDecisionsResponse{Decisions: d, Added: added, Removed: removed})
	}
	cur, ok := s.decisions.Get(key)
	if !ok {
		cur = emptyDecisions(m.Project, m.Name)
	}
	if err := send(cur); err != nil {
		return err
	}
	return viewapi.Watch(ctx, updates, fmt.Sprintf("placement %s/%s", m.Project, m.Name), func(u view.Update[*placementv1.PlacementDecisions]) error {
		switch {
		case u.Key != key:
			return nil
		case u.Op == view.Delete:
			_ = send(nil)
			return viewapi.ErrStop // the placement is gone
		}
		return send(u.Value)
	})
}

func (s *PlacementAPI) SetAddOnScore(ctx context.Context, req *connect.Request[placementv1.SetAddOnScoreRequest]) (*connect.Response[placementv1.SetAddOnScoreResponse], error) {
	m := req.Msg
	var v apierr.Violations
	v.DNSLabel("cluster", m.Cluster)
	for _, f := range []struct{ field, val string }{{"resource_name", m.ResourceName}, {"score_name", m.ScoreName}} {
		if f.val == "" {
			v.Add(f.field, "required")
		} else if len(f.val) > 253 {
			v.Add(f.field, "at most 253 characters")
		}
	}
	if m.Score < int32(core.MinClusterScore) || m.Score > int32(core.MaxClusterScore) {
		v.Add("score", "must be in [%d, %d], got %d", core.MinClusterScore, core.MaxClusterScore, m.Score)
	}
	if m.ValidUntil != nil {
		if err := m.ValidUntil.CheckValid(); err != nil {
			v.Add("valid_until", "%v", err)
		}
	}
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	if err := s.clusterRegistered(ctx, m.Cluster); err != nil {
		return nil, err
	}
	sc := &placementv1.AddOnScore{Cluster: m.Cluster, ResourceName: m.ResourceName, ScoreName: m.ScoreName, Score: m.Score, ValidUntil: m.ValidUntil}
	// The last score per subject counts: concurrent writers of one score need no order, so no
	// events.Command.
	seq, err := s.store.Append(ctx, subjects.AddOnScore(m.Cluster, m.ResourceName, m.ScoreName), scoreKey(m.Cluster, m.ResourceName, m.ScoreName), events.Any,
		&placementv1.AddOnScoreSet{Score: sc})
	if err != nil {
		return nil, apierr.Internal(err)
	}
	key := scoreKey(m.Cluster, m.ResourceName, m.ScoreName)
	if err := s.waitView(ctx, func(ctx context.Context) error { return s.addOnScores.WaitRevision(ctx, key, seq, false) }); err != nil {
		return nil, err
	}
	out, _ := s.addOnScores.Get(key)
	if out == nil {
		out = sc
	}
	return connect.NewResponse(&placementv1.SetAddOnScoreResponse{Score: out}), nil
}
