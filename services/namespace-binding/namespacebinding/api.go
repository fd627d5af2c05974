package namespacebinding

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/apiwait"
	"github.com/fleetstream/fleetstream/pkg/authz"
	"github.com/fleetstream/fleetstream/pkg/events"
	eventv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/event/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/identity"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/nsinventory"
	"github.com/fleetstream/fleetstream/pkg/roles"
)

const (
	// bindTimeout bounds a bind from its claim to its event; Config.ClaimGrace must exceed it,
	// so the repair loop never releases the claim of a bind still in flight.
	bindTimeout = 30 * time.Second
	// maxAttempts bounds the retries of a command that lost an optimistic-concurrency race.
	maxAttempts = 10
	// maxConflicts bounds the rounds a project command loses to other replicas. Commands that
	// decide from the bindings view (quota updates, binds on a budgeted cluster) wait for it on
	// every round, and two replicas doing that on one project win about every other round.
	maxConflicts = 32
)

// errUnchanged makes a command a no-op: the state already is what was asked.
var errUnchanged = errors.New("unchanged")

func (s *Service) waitReady(ctx context.Context) error {
	return apiwait.Ready(ctx, s.ready, "namespace-binding")
}

func (s *Service) CreateProject(ctx context.Context, req *connect.Request[projectv1.CreateProjectRequest]) (*connect.Response[projectv1.CreateProjectResponse], error) {
	m := req.Msg
	var v apierr.Violations
	v.DNSLabel("name", m.Name)
	validateProjectMeta(&v, m.DisplayName, m.Labels)
	if err := v.Err(); err != nil {
		return nil, err
	}
	if err := s.waitReady(ctx); err != nil {
		return nil, err
	}
	if _, ok := s.projects.Get(projectKey(m.Name)); ok {
		return nil, apierr.AlreadyExists("project", m.Name)
	}
	// A name is free when its subject is empty or ends with the project's deletion. Reading the
	// stream rather than the view keeps a lagging view from letting a second creation through;
	// the expectation makes concurrent creations race for one append.
	subject := ProjectSubject(m.Name)
	var last uint64
	msg, err := s.stream.GetLastMsgForSubject(ctx, subject)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
	case err != nil:
		return nil, apierr.Internal(fmt.Errorf("read project %s: %w", m.Name, err))
	default:
		ev, err := events.Decode(msg.Data)
		if err != nil {
			return nil, apierr.Internal(fmt.Errorf("read project %s: %w", m.Name, err))
		}
		if _, deleted := ev.Payload.(*projectv1.ProjectDeleted); !deleted {
			return nil, apierr.AlreadyExists("project", m.Name)
		}
		last = msg.Sequence
	}
	seq, err := s.store.Append(ctx, subject, m.Name, events.At(last), &projectv1.ProjectCreated{Name: m.Name, DisplayName: m.DisplayName, Labels: m.Labels})
	if events.IsConflict(err) {
		return nil, apierr.AlreadyExists("project", m.Name)
	}
	if err != nil {
		return nil, apierr.Internal(err)
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

func (s *Service) DeleteProject(ctx context.Context, req *connect.Request[projectv1.DeleteProjectRequest]) (*connect.Response[projectv1.DeleteProjectResponse], error) {
	m := req.Msg
	var v apierr.Violations
	v.DNSLabel("name", m.Name)
	validatePolicy(&v, "unbind_policy", m.UnbindPolicy)
	if err := v.Err(); err != nil {
		return nil, err
	}
	if err := s.waitReady(ctx); err != nil {
		return nil, err
	}
	// Placements and the namespaces following them are the project's too; deleting the project
	// under them would leave a scheduler deciding, and a follower binding, for a project that is
	// gone (and back, should the name be reused).
	if n := s.placements.Count(byProject(m.Name)); n > 0 {
		return nil, apierr.FailedPrecondition("project %q has %d placement(s) (and may have namespaces following them): unbind those namespaces (fleetctl namespace unbind NAME --project %s --placement P) and delete the placements first",
			m.Name, n, m.Name)
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

func (s *Service) GetProject(ctx context.Context, req *connect.Request[projectv1.GetProjectRequest]) (*connect.Response[projectv1.GetProjectResponse], error) {
	var v apierr.Violations
	v.DNSLabel("name", req.Msg.Name)
	if err := v.Err(); err != nil {
		return nil, err
	}
	if err := s.waitReady(ctx); err != nil {
		return nil, err
	}
	p, ok := s.projects.Get(projectKey(req.Msg.Name))
	if !ok {
		return nil, apierr.NotFound("project", req.Msg.Name)
	}
	return connect.NewResponse(&projectv1.GetProjectResponse{Project: s.presentProject(p)}), nil
}

func (s *Service) ListProjects(ctx context.Context, req *connect.Request[projectv1.ListProjectsRequest]) (*connect.Response[projectv1.ListProjectsResponse], error) {
	sel, err := parseSelector(req.Msg.LabelSelector)
	if err != nil {
		return nil, err
	}
	if err := s.waitReady(ctx); err != nil {
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

func (s *Service) BindNamespace(ctx context.Context, req *connect.Request[projectv1.BindNamespaceRequest]) (*connect.Response[projectv1.BindNamespaceResponse], error) {
	m := req.Msg
	if m.Placement != "" || m.Cluster == "" && m.UnbindPolicy != projectv1.UnbindPolicy_UNBIND_POLICY_UNSPECIFIED {
		return s.bindToPlacement(ctx, m)
	}
	var v apierr.Violations
	validateTarget(&v, m.Project, m.Cluster, m.Namespace)
	validateHard(&v, "hard", m.Hard)
	if m.UnbindPolicy != projectv1.UnbindPolicy_UNBIND_POLICY_UNSPECIFIED {
		v.Add("unbind_policy", "only with placement: a binding to one cluster takes its policy when unbound")
	}
	if err := v.Err(); err != nil {
		return nil, err
	}
	if err := s.waitReady(ctx); err != nil {
		return nil, err
	}
	b, err := s.bind(ctx, m.Project, m.Cluster, m.Namespace, m.Hard, "")
	if err != nil {
		return nil, err
	}
	s.log.Info("namespace bound", zap.String("project", m.Project), zap.String("cluster", m.Cluster), zap.String("namespace", m.Namespace), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&projectv1.BindNamespaceResponse{Binding: b}), nil
}

// bind binds (cluster, namespace) to project; placement names the placement the binding
// follows, if any.
func (s *Service) bind(ctx context.Context, project, cluster, namespace string, hardIn map[string]string, placement string) (*projectv1.NamespaceBinding, error) {
	if _, ok := s.projects.Get(projectKey(project)); !ok {
		return nil, apierr.NotFound("project", project)
	}
	if err := s.clusterRegistered(ctx, cluster); err != nil {
		return nil, err
	}
	key := bindingKey(cluster, namespace)
	if err := s.bindable(key, project); err != nil {
		return nil, err
	}
	hard := canonicalHard(hardIn)
	id := uuid.NewString()
	// Claim first, then append: the claim is what makes the (cluster, namespace) belong to one
	// project across replicas, and the event carries the claim's binding id. A crash between
	// the two leaves a claim without a binding, which the repair loop releases after
	// ClaimGrace; bindTimeout keeps this call well inside that.
	bctx, cancel := context.WithTimeout(ctx, bindTimeout)
	defer cancel()
	claimRev, err := s.claim(bctx, key, project, id)
	if err != nil {
		return nil, err
	}
	// Judge again now that the claim is ours: a binding whose claim was lost (and not yet
	// restored by the repair loop) must not be replaced.
	if err := s.bindable(key, project); err != nil {
		s.dropClaim(key, id, claimRev)
		return nil, err
	}
	seq, err := s.appendProject(bctx, project, budgeted(cluster), func(p *projectv1.Project) (proto.Message, error) {
		if err := s.fitsBudget(p, cluster, namespace, hard); err != nil {
			return nil, err
		}
		return &projectv1.NamespaceBound{BindingId: id, Project: project, Cluster: cluster, Namespace: namespace, Hard: hard, Placement: placement}, nil
	})
	if err != nil {
		// Release only when the event was certainly not appended: a refusal or a lost race.
		// After a timeout it may have landed; the repair loop decides from the view.
		if c := connect.CodeOf(err); c == connect.CodeNotFound || c == connect.CodeAborted || c == connect.CodeFailedPrecondition {
			s.dropClaim(key, id, claimRev)
		}
		return nil, err
	}
	return s.awaitBinding(ctx, key, id, seq)
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

// bindable refuses a (cluster, namespace) that a binding still holds: an active one of any
// project, or one of another project still being unbound. The agent must carry out the old
// project's tombstone first (release its label, or delete the namespace) or it would find the
// namespace labelled for the old project and refuse the new one (OwnedByOther); while the
// cluster is unreachable that waits. The project that unbound it may bind it again at once.
func (s *Service) bindable(key, project string) error {
	b, ok := s.bindings.Get(key)
	switch {
	case !ok:
		return nil
	case b.Phase != projectv1.BindingPhase_BINDING_PHASE_TERMINATING:
		return errBound(b)
	case b.Project != project:
		return apierr.FailedPrecondition("namespace %q on cluster %q is still being released from project %q: its agent has not confirmed yet",
			b.Namespace, b.Cluster, b.Project)
	}
	return nil
}

func errBound(b *projectv1.NamespaceBinding) error {
	return apierr.AlreadyExistsf("namespace %q on cluster %q is already bound to project %q", b.Namespace, b.Cluster, b.Project)
}

func (s *Service) UpdateQuota(ctx context.Context, req *connect.Request[projectv1.UpdateQuotaRequest]) (*connect.Response[projectv1.UpdateQuotaResponse], error) {
	m := req.Msg
	var v apierr.Violations
	validateTarget(&v, m.Project, m.Cluster, m.Namespace)
	validateHard(&v, "hard", m.Hard)
	if err := v.Err(); err != nil {
		return nil, err
	}
	if err := s.waitReady(ctx); err != nil {
		return nil, err
	}
	if b, ok := s.bindings.Get(bindingKey(m.Cluster, m.Namespace)); ok && b.Project == m.Project && b.Placement != "" {
		return nil, errPlaced(b)
	}
	b, err := s.updateQuota(ctx, m.Project, m.Cluster, m.Namespace, m.Hard)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&projectv1.UpdateQuotaResponse{Binding: b}), nil
}

// errPlaced refuses changing by hand a binding the follower keeps in line with a placement: it
// would undo the change at once.
func errPlaced(b *projectv1.NamespaceBinding) error {
	return apierr.FailedPrecondition("namespace %q on cluster %q follows placement %q: change it through the placement (bind the namespace to the placement again with new limits, or unbind it from the placement)",
		b.Namespace, b.Cluster, b.Placement)
}

func (s *Service) updateQuota(ctx context.Context, project, cluster, namespace string, hardIn map[string]string) (*projectv1.NamespaceBinding, error) {
	key := bindingKey(cluster, namespace)
	hard := canonicalHard(hardIn)
	var id string
	seq, err := s.appendProject(ctx, project, always, func(p *projectv1.Project) (proto.Message, error) {
		b, err := s.ownedBinding(project, cluster, namespace)
		if err != nil {
			return nil, err
		}
		if b.Phase == projectv1.BindingPhase_BINDING_PHASE_TERMINATING {
			return nil, apierr.FailedPrecondition("namespace %q on cluster %q is being unbound", namespace, cluster)
		}
		id = b.Id
		if proto.Equal(&projectv1.NamespaceBinding{Hard: canonicalHard(b.Hard)}, &projectv1.NamespaceBinding{Hard: hard}) {
			return nil, errUnchanged
		}
		if err := s.fitsBudget(p, cluster, namespace, hard); err != nil {
			return nil, err
		}
		return &projectv1.NamespaceQuotaUpdated{BindingId: b.Id, Project: project, Cluster: cluster, Namespace: namespace, Hard: hard}, nil
	})
	if err != nil && !errors.Is(err, errUnchanged) {
		return nil, err
	}
	return s.awaitBinding(ctx, key, id, seq)
}

func (s *Service) UnbindNamespace(ctx context.Context, req *connect.Request[projectv1.UnbindNamespaceRequest]) (*connect.Response[projectv1.UnbindNamespaceResponse], error) {
	m := req.Msg
	if m.Placement != "" {
		return s.unbindFromPlacement(ctx, m)
	}
	var v apierr.Violations
	validateTarget(&v, m.Project, m.Cluster, m.Namespace)
	validatePolicy(&v, "policy", m.Policy)
	if err := v.Err(); err != nil {
		return nil, err
	}
	if err := s.waitReady(ctx); err != nil {
		return nil, err
	}
	if b, ok := s.bindings.Get(bindingKey(m.Cluster, m.Namespace)); ok && b.Project == m.Project && b.Placement != "" &&
		b.Phase != projectv1.BindingPhase_BINDING_PHASE_TERMINATING {
		return nil, errPlaced(b)
	}
	b, err := s.unbind(ctx, m.Project, m.Cluster, m.Namespace, m.Policy)
	if err != nil {
		return nil, err
	}
	s.log.Info("namespace unbound", zap.String("project", m.Project), zap.String("cluster", m.Cluster), zap.String("namespace", m.Namespace),
		zap.Stringer("policy", b.UnbindPolicy), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&projectv1.UnbindNamespaceResponse{Binding: b}), nil
}

// unbind appends the unbinding of project's namespace and then releases its claim. Unbinding a
// Terminating binding again only changes its policy.
func (s *Service) unbind(ctx context.Context, project, cluster, namespace string, policy projectv1.UnbindPolicy) (*projectv1.NamespaceBinding, error) {
	if policy == projectv1.UnbindPolicy_UNBIND_POLICY_UNSPECIFIED {
		policy = projectv1.UnbindPolicy_UNBIND_POLICY_KEEP
	}
	key := bindingKey(cluster, namespace)
	var id string
	seq, err := s.appendProject(ctx, project, always, func(*projectv1.Project) (proto.Message, error) {
		b, err := s.ownedBinding(project, cluster, namespace)
		if err != nil {
			return nil, err
		}
		id = b.Id
		if b.Phase == projectv1.BindingPhase_BINDING_PHASE_TERMINATING && b.UnbindPolicy == policy {
			return nil, errUnchanged
		}
		return &projectv1.NamespaceUnbinding{BindingId: b.Id, Project: project, Cluster: cluster, Namespace: namespace,
			Policy: policy, DeleteQuota: len(b.Hard) > 0}, nil
	})
	if err != nil && !errors.Is(err, errUnchanged) {
		return nil, err
	}
	b, err := s.awaitBinding(ctx, key, id, seq)
	if err != nil {
		return nil, err
	}
	// The event is the truth; the claim goes after it. If this fails (or the process dies
	// here) the repair loop releases the claim of a Terminating binding.
	if c, ok := s.claims.GetEntry(key); ok && c.Value.BindingId == id {
		s.dropClaim(key, id, c.KVRevision)
	}
	return b, nil
}

// ownedBinding returns the binding of (cluster, namespace) if project owns it (Terminating
// included), else NotFound naming what was asked.
func (s *Service) ownedBinding(project, cluster, namespace string) (*projectv1.NamespaceBinding, error) {
	b, ok := s.bindings.Get(bindingKey(cluster, namespace))
	if !ok || b.Project != project {
		return nil, apierr.NotFoundf("namespace: %q on cluster %q is not bound to project %q", namespace, cluster, project)
	}
	return b, nil
}

func (s *Service) ListNamespaceBindings(ctx context.Context, req *connect.Request[projectv1.ListNamespaceBindingsRequest]) (*connect.Response[projectv1.ListNamespaceBindingsResponse], error) {
	m := req.Msg
	var v apierr.Violations
	if m.Project != "" {
		v.DNSLabel("project", m.Project)
	}
	if m.Cluster != "" {
		v.DNSLabel("cluster", m.Cluster)
	}
	if err := v.Err(); err != nil {
		return nil, err
	}
	if err := s.waitReady(ctx); err != nil {
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
	res := &projectv1.ListNamespaceBindingsResponse{}
	for _, b := range list {
		if m.Cluster != "" && b.Cluster != m.Cluster || !caller.Can("list", roles.Group, roles.ResNamespaceBindings, b.Project) {
			continue
		}
		res.Bindings = append(res.Bindings, s.present(b))
	}
	if m.Project != "" && m.Cluster == "" {
		res.Bindings = s.withBlocked(m.Project, res.Bindings)
	}
	return connect.NewResponse(res), nil
}

func (s *Service) ListIdleNamespaces(ctx context.Context, req *connect.Request[projectv1.ListIdleNamespacesRequest]) (*connect.Response[projectv1.ListIdleNamespacesResponse], error) {
	var v apierr.Violations
	v.DNSLabel("cluster", req.Msg.Cluster)
	if err := v.Err(); err != nil {
		return nil, err
	}
	if err := s.waitReady(ctx); err != nil {
		return nil, err
	}
	cluster := req.Msg.Cluster
	if err := s.clusterRegistered(ctx, cluster); err != nil {
		return nil, err
	}
	// Not idle: claimed, or held by a binding (one whose claim the repair loop has yet to
	// restore, or one still being released from its project).
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
			if owned[bindingKey(cluster, ns.Name)] {
				continue
			}
			res.Namespaces = append(res.Namespaces, &projectv1.IdleNamespace{Cluster: cluster, Name: ns.Name, Labels: ns.Labels, Phase: ns.Phase})
		}
	}
	return connect.NewResponse(res), nil
}

// appendProject appends the event build returns to project's subject, expecting the project's
// revision: the project exists and nothing happened to it since build decided. build gets the
// project exactly as of that revision (its budgets, say). When decides returns true for it,
// build also reads the bindings, and sees them as of that revision (the view has applied it);
// a build that decides nothing from the view (a bind on a cluster where the project has no
// budget: its other checks ran before its claim, and the claim is what keeps a second binding
// out) appends without that wait.
//
// The commands of one project are serialized in this replica (projectLock), so they queue
// instead of racing each other for one expectation, and each appends at the sequence the
// previous one got, without waiting for the projects view to show it: the lock keeps the
// project as this replica's own appends left it. A race lost to another replica is retried at
// the subject's last sequence read from the stream: what the other replica appended is known
// once the projects view shows that sequence. Either way the stream checks the expectation: a
// wrong guess is a conflict, never a write on a state nobody looked at.
func (s *Service) appendProject(ctx context.Context, project string, decides func(p *projectv1.Project) bool, build func(p *projectv1.Project) (proto.Message, error)) (uint64, error) {
	l, err := s.lockProject(ctx, project)
	if err != nil {
		// Nothing was appended: Aborted lets a bind release its claim at once.
		return 0, apierr.Aborted("project %s is busy with other commands: %w", project, err)
	}
	defer s.unlockProject(project, l)
	for attempt := 0; ; attempt++ {
		p, rev, err := s.projectAt(ctx, project, l)
		if err != nil {
			return 0, err
		}
		if decides(p) {
			if err := s.waitView(ctx, func(ctx context.Context) error { return s.bindings.WaitCheckpoint(ctx, rev) }); err != nil {
				return 0, err
			}
		}
		msg, err := build(p)
		if err != nil {
			return 0, err
		}
		seq, err := s.store.Append(ctx, ProjectSubject(project), project, events.At(rev), msg)
		if err == nil {
			l.last, l.proj = seq, foldProject(project, p, msg, seq)
			return seq, nil
		}
		l.last, l.proj = 0, nil
		if !events.IsConflict(err) || attempt == maxConflicts {
			return 0, apierr.Internal(err)
		}
		// Another replica's command on the project won: fold what it appended, read from the
		// stream, and decide again at the subject's current last sequence.
		next, last, folded, err := s.catchUp(ctx, project, p)
		if err != nil {
			return 0, apierr.Internal(err)
		}
		if !folded {
			// Too far behind to fold: the view will tell, once it shows the last sequence.
			var exists bool
			if last, exists, err = s.projectHead(ctx, project); err != nil {
				return 0, apierr.Internal(err)
			} else if !exists {
				return 0, apierr.NotFound("project", project)
			}
		} else if next == nil {
			return 0, apierr.NotFound("project", project)
		}
		l.last, l.proj = last, next
	}
}

// maxCatchUp bounds how many events of another replica catchUp folds before leaving it to the
// projects view.
const maxCatchUp = 32

// catchUp reads the events appended to project's subject after p (the project as of its
// revision) from the stream and folds them: the project as of the subject's last sequence (nil
// if deleted by then) and that sequence, without waiting for the projects view. folded is
// false when there were more than maxCatchUp or one did not fold.
func (s *Service) catchUp(ctx context.Context, project string, p *projectv1.Project) (*projectv1.Project, uint64, bool, error) {
	seq := p.Revision
	for range maxCatchUp {
		msg, err := s.stream.GetMsg(ctx, seq+1, jetstream.WithGetMsgSubject(ProjectSubject(project)))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return p, seq, true, nil
		}
		if err != nil {
			return nil, 0, false, fmt.Errorf("read project %s after %d: %w", project, seq, err)
		}
		ev, err := events.Decode(msg.Data)
		if err != nil {
			return nil, 0, false, fmt.Errorf("read project %s at %d: %w", project, msg.Sequence, err)
		}
		ev.Sequence, ev.Subject = msg.Sequence, msg.Subject
		next, ok := foldEvent(project, p, ev)
		if !ok {
			return nil, 0, false, nil
		}
		p, seq = next, msg.Sequence
	}
	return nil, 0, false, nil
}

// projectAt returns the project as of the revision the next append to its subject expects,
// and that revision: the view's entry when it shows everything this replica appended (l.last),
// else the project as this replica's own appends left it (l.proj), else (a race lost to
// another replica, whose events only the view folds) the view's entry once it has applied
// l.last.
func (s *Service) projectAt(ctx context.Context, project string, l *projectLock) (*projectv1.Project, uint64, error) {
	p, ok := s.projects.Get(projectKey(project))
	switch {
	case ok && p.Revision >= l.last:
		return p, p.Revision, nil
	case l.proj != nil && l.proj.Revision == l.last:
		return l.proj, l.last, nil
	case l.last == 0:
		return nil, 0, apierr.NotFound("project", project)
	}
	if err := s.waitView(ctx, func(ctx context.Context) error { return s.projects.WaitCheckpoint(ctx, l.last) }); err != nil {
		return nil, 0, err
	}
	if p, ok = s.projects.Get(projectKey(project)); !ok {
		return nil, 0, apierr.NotFound("project", project)
	}
	return p, p.Revision, nil
}

// foldProject returns p after msg, which this replica appended at seq, as the projects view
// will show it (nil: unknown, or the project is gone).
func foldProject(project string, p *projectv1.Project, msg proto.Message, seq uint64) *projectv1.Project {
	next, _ := foldEvent(project, p, &events.Event{Envelope: &eventv1.Envelope{Time: timestamppb.New(time.Now())}, Payload: msg,
		Subject: ProjectSubject(project), Sequence: seq})
	return next
}

// foldEvent applies ev to p (nil: absent) with the projection's own code and returns the next
// project (nil: gone); ok is false when ev does not fold into it.
func foldEvent(project string, p *projectv1.Project, ev *events.Event) (next *projectv1.Project, ok bool) {
	changes, err := applyProject(ev)
	if err != nil || len(changes) != 1 || changes[0].Key != projectKey(project) {
		return nil, false
	}
	var cur proto.Message
	if p != nil {
		cur = proto.Clone(p)
	}
	next, _ = changes[0].Update(cur).(*projectv1.Project)
	if next != nil {
		next.Revision = ev.Sequence
	}
	return next, true
}

// projectHead reads the last event of project's subject from the stream: its sequence, and
// whether the project exists after it (the subject is not empty and does not end with the
// project's deletion).
func (s *Service) projectHead(ctx context.Context, project string) (uint64, bool, error) {
	msg, err := s.stream.GetLastMsgForSubject(ctx, ProjectSubject(project))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read project %s: %w", project, err)
	}
	ev, err := events.Decode(msg.Data)
	if err != nil {
		return 0, false, fmt.Errorf("read project %s: %w", project, err)
	}
	_, deleted := ev.Payload.(*projectv1.ProjectDeleted)
	return msg.Sequence, !deleted, nil
}

// projectLock serializes one project's commands in this replica. last is the sequence this
// replica's last append to the project's subject got (0: unknown), proj the project as of
// last (nil: unknown, only the view can tell); only the lock's holder uses them.
type projectLock struct {
	ch   chan struct{} // holds a token while locked
	refs int           // holders and waiters; guarded by Service.projectLocksMu
	last uint64
	proj *projectv1.Project
}

// lockProject takes project's lock, or gives up when ctx ends.
func (s *Service) lockProject(ctx context.Context, project string) (*projectLock, error) {
	s.projectLocksMu.Lock()
	l := s.projectLocks[project]
	if l == nil {
		l = &projectLock{ch: make(chan struct{}, 1)}
		s.projectLocks[project] = l
	}
	l.refs++
	s.projectLocksMu.Unlock()
	select {
	case l.ch <- struct{}{}:
		return l, nil
	case <-ctx.Done():
		s.releaseProjectLock(project, l)
		return nil, ctx.Err()
	}
}

func (s *Service) unlockProject(project string, l *projectLock) {
	<-l.ch
	s.releaseProjectLock(project, l)
}

// releaseProjectLock drops a reference to l. Once nobody holds or awaits it and the projects
// view shows its last sequence, it is forgotten; until then it is kept, so a caller's next
// command on the project (one that did not wait for the projects view) does not start with a
// conflict.
func (s *Service) releaseProjectLock(project string, l *projectLock) {
	s.projectLocksMu.Lock()
	defer s.projectLocksMu.Unlock()
	if l.refs--; l.refs > 0 {
		return
	}
	if p, ok := s.projects.Get(projectKey(project)); !ok || p.Revision >= l.last {
		delete(s.projectLocks, project)
	}
}

// awaitBinding waits until the bindings view has applied seq (0: already there) and returns
// binding id at key as presented.
func (s *Service) awaitBinding(ctx context.Context, key, id string, seq uint64) (*projectv1.NamespaceBinding, error) {
	if err := s.waitView(ctx, func(ctx context.Context) error { return s.bindings.WaitCheckpoint(ctx, seq) }); err != nil {
		return nil, err
	}
	b, ok := s.bindings.Get(key)
	if !ok || b.Id != id {
		return nil, apierr.Concurrent("the binding")
	}
	return s.present(b), nil
}

func (s *Service) waitView(ctx context.Context, wait func(context.Context) error) error {
	return apiwait.Visible(ctx, "change", wait)
}

// claim takes (cluster, namespace) at key for project's binding id and returns the claim's KV
// revision. A claim left by a bind that never completed is taken over.
func (s *Service) claim(ctx context.Context, key, project, id string) (uint64, error) {
	data, err := proto.Marshal(&projectv1.Claim{Project: project, BindingId: id, CreateTime: timestamppb.New(s.now())})
	if err != nil {
		return 0, apierr.Internal(fmt.Errorf("marshal claim: %w", err))
	}
	for attempt := 0; ; attempt++ {
		rev, err := s.claimsKV.Create(ctx, key, data)
		if err == nil {
			return rev, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) || attempt == maxAttempts {
			return 0, apierr.Internal(fmt.Errorf("claim %s: %w", key, err))
		}
		e, err := s.claimsKV.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // released meanwhile
		}
		if err != nil {
			return 0, apierr.Internal(fmt.Errorf("read claim %s: %w", key, err))
		}
		cur := &projectv1.Claim{}
		if err := proto.Unmarshal(e.Value(), cur); err != nil {
			return 0, apierr.Internal(fmt.Errorf("decode claim %s: %w", key, err))
		}
		if !s.orphan(key, cur) {
			cluster, namespace := splitBindingKey(key)
			return 0, apierr.AlreadyExistsf("namespace %q on cluster %q is already bound to project %q", namespace, cluster, cur.Project)
		}
		rev, err = s.claimsKV.Update(ctx, key, data, e.Revision())
		if err == nil {
			s.log.Info("took over an orphan claim", zap.String("key", key), zap.String("from_project", cur.Project), zap.String("binding", cur.BindingId))
			return rev, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return 0, apierr.Internal(fmt.Errorf("take over claim %s: %w", key, err))
		}
	}
}

// orphan reports whether claim c at key no longer protects a binding: its binding was
// unbound, or never appeared although the claim is older than ClaimGrace (its bind crashed
// between claim and event).
func (s *Service) orphan(key string, c *projectv1.Claim) bool {
	if b, ok := s.bindings.Get(key); ok && b.Id == c.BindingId {
		return b.Phase == projectv1.BindingPhase_BINDING_PHASE_TERMINATING
	}
	return s.now().Sub(c.CreateTime.AsTime()) > s.cfg.ClaimGrace
}

// dropClaim deletes the claim at key if it is still binding id's (compare-and-delete on its
// revision), detached from the caller's context: a cancelled call must not leave it behind.
func (s *Service) dropClaim(key, id string, rev uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.claimsKV.Delete(ctx, key, jetstream.LastRevision(rev)); err != nil {
		s.log.Warn("release claim; the repair loop will", zap.String("key", key), zap.String("binding", id), zap.Error(err))
	}
}

func splitBindingKey(key string) (cluster, namespace string) {
	parts, err := keys.Split(key)
	if err != nil || len(parts) != 2 {
		return "", ""
	}
	return parts[0], parts[1]
}

func parseSelector(s string) (labels.Selector, error) {
	sel, err := labels.Parse(s)
	if err != nil {
		var v apierr.Violations
		v.Add("label_selector", "%v", err)
		return nil, v.Err()
	}
	return sel, nil
}
