package namespacebinding

// The commands of a project: each appends one event to the project's subject at the revision
// it decided from (appendProject, an events.Command), serialized per project in this replica.

import (
	"context"
	"errors"

	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/events"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
)

const (
	// maxAttempts bounds the retries of a command that lost an optimistic-concurrency race.
	maxAttempts = 10
	// maxConflicts bounds the rounds a project command loses to other replicas. Commands that
	// decide from the bindings view (quota updates, binds on a budgeted cluster) wait for it on
	// every round, and two replicas doing that on one project win about every other round.
	maxConflicts = 32
)

// errUnchanged makes a command a no-op: the state already is what was asked.
var errUnchanged = errors.New("unchanged")

// appendProject appends the event build returns to project's subject, expecting the project's
// revision: the project exists and nothing happened to it since build decided. build gets the
// project exactly as of that revision (its budgets, say). When decides returns true for it,
// build also reads the bindings, and sees them as of that revision (the view has applied it);
// a build that decides nothing from the view (a bind on a cluster where the project has no
// budget: its other checks ran before its claim, and the claim is what keeps a second binding
// out) appends without that wait.
//
// The commands of one project are serialized in this replica (the command's Lock), so they
// queue instead of racing each other for one expectation, and each appends at the sequence the
// previous one got, without waiting for the projects view to show it: the lock keeps the
// project as this replica's own appends left it. A race lost to another replica is retried on
// the project caught up from the stream (CatchUp, with the projection's own code as Evolve), or
// once the projects view shows the subject's last sequence when there is too much to fold.
// Either way the stream checks the expectation: a wrong guess is a conflict, never a write on a
// state nobody looked at.
func (s *Service) appendProject(ctx context.Context, project string, decides func(p *projectv1.Project) bool, build func(p *projectv1.Project) (proto.Message, error)) (uint64, error) {
	return s.projectCommand(ctx, project, false, decides, build)
}

// projectCommand is appendProject; with dryRun it decides exactly as appendProject would (the
// same project state, the same wait for the bindings view, the same refusals) and appends
// nothing, returning 0.
func (s *Service) projectCommand(ctx context.Context, project string, dryRun bool, decides func(p *projectv1.Project) bool, build func(p *projectv1.Project) (proto.Message, error)) (uint64, error) {
	res, err := events.Command[*projectv1.Project]{
		Store: s.store, Subject: ProjectSubject(project), AggregateID: project,
		Lock: s.locks, LockKey: project, MaxConflicts: maxConflicts, DryRun: dryRun,
		CatchUp: s.stream, MaxCatchUp: maxCatchUp,
		Evolve: func(p *projectv1.Project, ev *events.Event) (*projectv1.Project, bool) {
			return foldEvent(project, p, ev)
		},
		Load: func(ctx context.Context, min uint64) (*projectv1.Project, uint64, error) {
			if min > 0 {
				if err := s.waitView(ctx, func(ctx context.Context) error { return s.projects.WaitCheckpoint(ctx, min) }); err != nil {
					return nil, 0, err
				}
			}
			p, ok := s.projects.Get(projectKey(project))
			if !ok {
				return nil, 0, apierr.NotFound("project", project)
			}
			return p, p.Revision, nil
		},
		Prepare: func(ctx context.Context, p *projectv1.Project, rev uint64) error {
			if p == nil || !decides(p) {
				return nil
			}
			return s.waitView(ctx, func(ctx context.Context) error { return s.bindings.WaitCheckpoint(ctx, rev) })
		},
		Decide: func(p *projectv1.Project) ([]proto.Message, error) {
			if p == nil {
				// Deleted by the events that beat this command.
				return nil, apierr.NotFound("project", project)
			}
			msg, err := build(p)
			if err != nil {
				return nil, err
			}
			return []proto.Message{msg}, nil
		},
	}.Run(ctx)
	switch {
	case errors.Is(err, events.ErrBusy):
		// Nothing was appended: Aborted lets a bind release its claim at once.
		return 0, apierr.Aborted("project %s is busy with other commands: %w", project, ctx.Err())
	case errors.Is(err, errUnchanged):
		return 0, err
	case err != nil:
		return 0, apierr.Internal(err)
	}
	return res.Sequence, nil
}

// maxCatchUp bounds how many events of another replica appendProject folds before leaving it
// to the projects view.
const maxCatchUp = 32

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

// projectSettled reports whether the projects view shows project at last or later, or no
// longer holds it: a project lock that remembers no more than that may be forgotten.
func (s *Service) projectSettled(project string, last uint64) bool {
	p, ok := s.projects.Get(projectKey(project))
	return !ok || p.Revision >= last
}

func (s *Service) updateQuota(ctx context.Context, project, cluster, namespace string, hardIn map[string]string) (*projectv1.NamespaceBinding, error) {
	b, _, err := s.quotaCommand(ctx, project, cluster, namespace, hardIn, false)
	return b, err
}

// quotaCommand updates the quota of project's namespace on cluster; with dryRun it decides as
// the update would and answers the binding as it would be, with the project's budget on the
// cluster as it would be allocated then (nil: no budget there).
func (s *Service) quotaCommand(ctx context.Context, project, cluster, namespace string, hardIn map[string]string, dryRun bool) (*projectv1.NamespaceBinding, *projectv1.ProjectBudget, error) {
	key := bindingKey(cluster, namespace)
	hard := canonicalHard(hardIn)
	var id string
	var cur *projectv1.NamespaceBinding
	var budget *projectv1.ProjectBudget
	seq, err := s.projectCommand(ctx, project, dryRun, always, func(p *projectv1.Project) (proto.Message, error) {
		b, err := s.ownedBinding(project, cluster, namespace)
		if err != nil {
			return nil, err
		}
		if b.Phase == projectv1.BindingPhase_BINDING_PHASE_TERMINATING {
			return nil, apierr.FailedPrecondition("namespace %q on cluster %q is being unbound", namespace, cluster)
		}
		id, cur = b.Id, b
		if dryRun {
			budget = s.budgetAfter(p, cluster, namespace, hard)
		}
		if proto.Equal(&projectv1.NamespaceBinding{Hard: canonicalHard(b.Hard)}, &projectv1.NamespaceBinding{Hard: hard}) {
			return nil, errUnchanged
		}
		if err := s.fitsBudget(p, cluster, namespace, hard); err != nil {
			return nil, err
		}
		return &projectv1.NamespaceQuotaUpdated{BindingId: b.Id, Project: project, Cluster: cluster, Namespace: namespace, Hard: hard}, nil
	})
	if err != nil && !errors.Is(err, errUnchanged) {
		return nil, nil, err
	}
	if dryRun {
		out := s.present(cur)
		out.Hard = hard
		return out, budget, nil
	}
	b, err := s.awaitBinding(ctx, key, id, seq)
	return b, nil, err
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

// awaitBinding waits until the bindings view and the projects view have applied seq (0:
// already there) and returns binding id at key as presented. The command's event moves its
// project's revision too: a caller that reads the project after the write must see it moved,
// or a read-modify-write keyed on that revision would take the write for someone else's.
func (s *Service) awaitBinding(ctx context.Context, key, id string, seq uint64) (*projectv1.NamespaceBinding, error) {
	if err := s.waitView(ctx, func(ctx context.Context) error {
		if err := s.bindings.WaitCheckpoint(ctx, seq); err != nil {
			return err
		}
		return s.projects.WaitCheckpoint(ctx, seq)
	}); err != nil {
		return nil, err
	}
	b, ok := s.bindings.Get(key)
	if !ok || b.Id != id {
		return nil, apierr.Concurrent("the binding")
	}
	return s.present(b), nil
}
