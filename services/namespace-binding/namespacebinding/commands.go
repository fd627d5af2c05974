package namespacebinding

// The commands of a project: each appends one event to the project's subject at the revision
// it decided from (appendProject), serialized per project in this replica (projectLocks).

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/events"
	eventv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/event/v1"
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
// The commands of one project are serialized in this replica (projectLock), so they queue
// instead of racing each other for one expectation, and each appends at the sequence the
// previous one got, without waiting for the projects view to show it: the lock keeps the
// project as this replica's own appends left it. A race lost to another replica is retried at
// the subject's last sequence read from the stream: what the other replica appended is known
// once the projects view shows that sequence. Either way the stream checks the expectation: a
// wrong guess is a conflict, never a write on a state nobody looked at.
func (s *Service) appendProject(ctx context.Context, project string, decides func(p *projectv1.Project) bool, build func(p *projectv1.Project) (proto.Message, error)) (uint64, error) {
	l, err := s.locks.lock(ctx, project)
	if err != nil {
		// Nothing was appended: Aborted lets a bind release its claim at once.
		return 0, apierr.Aborted("project %s is busy with other commands: %w", project, err)
	}
	defer s.locks.unlock(project, l)
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

// projectSettled reports whether the projects view shows project at last or later, or no
// longer holds it: a project lock that remembers no more than that may be forgotten.
func (s *Service) projectSettled(project string, last uint64) bool {
	p, ok := s.projects.Get(projectKey(project))
	return !ok || p.Revision >= last
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

// ownedBinding returns the binding of (cluster, namespace) if project owns it (Terminating
// included), else NotFound naming what was asked.
func (s *Service) ownedBinding(project, cluster, namespace string) (*projectv1.NamespaceBinding, error) {
	b, ok := s.bindings.Get(bindingKey(cluster, namespace))
	if !ok || b.Project != project {
		return nil, apierr.NotFoundf("namespace: %q on cluster %q is not bound to project %q", namespace, cluster, project)
	}
	return b, nil
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
