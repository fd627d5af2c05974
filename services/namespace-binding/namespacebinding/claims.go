package namespacebinding

// The claim protocol: which project owns a (cluster, namespace), across replicas and crashes.
//
// The claims bucket (ClaimsBucket, key bindingKey(cluster, namespace)) holds one claim per
// namespace: {project, binding id, create time}. The stream is the truth about bindings; a claim
// is only what keeps two projects from binding one namespace at the same time, and is rebuilt
// from the stream when lost.
//
//   - Bind claims first, then appends (bind): KV Create of the claim with a fresh binding id (an
//     orphan claim is taken over with compare-and-set), the bindable check again now that the
//     claim is ours, then NamespaceBound carrying that id, all within bindTimeout.
//   - Unbind appends first, then releases (unbind): NamespaceUnbinding, and once the bindings
//     view shows it, a compare-and-delete of the claim if it is still the binding's.
//   - Who releases: the bind itself when the namespace turned out not bindable once claimed, or
//     its append was certainly refused (NotFound, Aborted, FailedPrecondition) — a
//     compare-and-delete on the claim's revision, detached from the caller's context
//     (dropClaim); the unbind after its event; the repair loop (repairer) for everything else,
//     including a bind whose append timed out (the event may have landed).
//   - Crash windows: a bind that dies (or times out) between claim and event leaves a claim
//     without a binding; the repair loop releases it once it is older than Config.ClaimGrace,
//     which exceeds bindTimeout, so a bind still in flight keeps its claim. An unbind that dies
//     between event and release leaves the claim of a Terminating binding, which the repair
//     loop releases on its next pass (orphan). A lost bucket leaves live bindings without
//     claims, which the repair loop restores. The repair loop decides only from a bindings view that has
//     applied the stream's last sequence, so an event in the stream always wins over a claim.
//
// docs/namespaces.md (Claims) tells the same with the API's errors.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/apiwait"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/reconcile"
)

const (
	// bindTimeout bounds a bind from its claim to its event; Config.ClaimGrace must exceed it,
	// so the repair loop never releases the claim of a bind still in flight.
	bindTimeout = 30 * time.Second
)

// bind binds (cluster, namespace) to project; placement names the placement the binding
// follows, if any.
func (s *Service) bind(ctx context.Context, project, cluster, namespace string, hardIn map[string]string, placement string) (*projectv1.NamespaceBinding, error) {
	// The handlers refuse a protected namespace already; this is the one place every binding
	// passes, a placement's follower included.
	var v apierr.Violations
	validateUnprotected(&v, s.cfg.Protected, "namespace", namespace)
	if err := v.Err(); err != nil {
		return nil, err
	}
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

// bindDryRun decides a bind of (cluster, namespace) to project as bind would, writing nothing:
// the same checks, a claim another bind holds (read, not taken) and the project's budget
// decided on the revision a bind's append would expect. It answers the binding as it would be
// and the project's budget on the cluster as it would be allocated (nil: no budget there).
func (s *Service) bindDryRun(ctx context.Context, project, cluster, namespace string, hardIn map[string]string) (*projectv1.NamespaceBinding, *projectv1.ProjectBudget, error) {
	if _, ok := s.projects.Get(projectKey(project)); !ok {
		return nil, nil, apierr.NotFound("project", project)
	}
	if err := s.clusterRegistered(ctx, cluster); err != nil {
		return nil, nil, err
	}
	key := bindingKey(cluster, namespace)
	if err := s.bindable(key, project); err != nil {
		return nil, nil, err
	}
	// The claim a real bind would fail to take: another bind's, in flight or not yet repaired.
	// Read from the bucket, as bind's Create meets it, not from the claims cache: a refused
	// bind drops its claim just before answering, and the cache may not show that yet (a
	// dry run right after an over-budget bind said the namespace was bound to the project).
	c, err := s.storedClaim(ctx, key)
	if err != nil {
		return nil, nil, err
	}
	if c != nil && !s.orphan(key, c) {
		return nil, nil, apierr.AlreadyExistsf("namespace %q on cluster %q is already bound to project %q", namespace, cluster, c.Project)
	}
	hard := canonicalHard(hardIn)
	var budget *projectv1.ProjectBudget
	if _, err := s.projectCommand(ctx, project, true, budgeted(cluster), func(p *projectv1.Project) (proto.Message, error) {
		if err := s.fitsBudget(p, cluster, namespace, hard); err != nil {
			return nil, err
		}
		budget = s.budgetAfter(p, cluster, namespace, hard)
		return &projectv1.NamespaceBound{Project: project, Cluster: cluster, Namespace: namespace, Hard: hard}, nil
	}); err != nil {
		return nil, nil, err
	}
	return &projectv1.NamespaceBinding{Project: project, Cluster: cluster, Namespace: namespace, Hard: hard,
		Phase: projectv1.BindingPhase_BINDING_PHASE_PENDING}, budget, nil
}

// storedClaim reads the claim at key from the claims bucket (nil: none).
func (s *Service) storedClaim(ctx context.Context, key string) (*projectv1.Claim, error) {
	e, err := s.claimsKV.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, apierr.Internal(fmt.Errorf("read claim %s: %w", key, err))
	}
	c := &projectv1.Claim{}
	if err := proto.Unmarshal(e.Value(), c); err != nil {
		return nil, apierr.Internal(fmt.Errorf("decode claim %s: %w", key, err))
	}
	return c, nil
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

// unbind appends the unbinding of project's namespace and then releases its claim. Unbinding a
// Terminating binding again only changes its policy.
func (s *Service) unbind(ctx context.Context, project, cluster, namespace string, policy projectv1.UnbindPolicy) (*projectv1.NamespaceBinding, error) {
	return s.unbindCommand(ctx, project, cluster, namespace, policy, false)
}

// unbindCommand is unbind; with dryRun it decides as unbind would and answers the binding as
// it would be (Terminating, with the policy), writing nothing.
func (s *Service) unbindCommand(ctx context.Context, project, cluster, namespace string, policy projectv1.UnbindPolicy, dryRun bool) (*projectv1.NamespaceBinding, error) {
	if policy == projectv1.UnbindPolicy_UNBIND_POLICY_UNSPECIFIED {
		policy = projectv1.UnbindPolicy_UNBIND_POLICY_KEEP
	}
	key := bindingKey(cluster, namespace)
	var unbound *projectv1.NamespaceBinding
	seq, err := s.projectCommand(ctx, project, dryRun, always, func(*projectv1.Project) (proto.Message, error) {
		b, err := s.ownedBinding(project, cluster, namespace)
		if err != nil {
			return nil, err
		}
		unbound = b
		if b.Phase == projectv1.BindingPhase_BINDING_PHASE_TERMINATING && b.UnbindPolicy == policy {
			return nil, errUnchanged
		}
		return &projectv1.NamespaceUnbinding{BindingId: b.Id, Project: project, Cluster: cluster, Namespace: namespace,
			Policy: policy, DeleteQuota: len(b.Hard) > 0}, nil
	})
	if err != nil && !errors.Is(err, errUnchanged) {
		return nil, err
	}
	if dryRun {
		out := s.present(unbound)
		out.Phase, out.UnbindPolicy = projectv1.BindingPhase_BINDING_PHASE_TERMINATING, policy
		return out, nil
	}
	id := unbound.Id
	b, err := s.awaitBinding(ctx, key, id, seq)
	// The event is the truth; the claim goes after it, whatever the view shows by now. If this
	// fails (or the process dies here) the repair loop releases the claim of a Terminating
	// binding, and the releaser that of the binding it releases.
	if c, ok := s.claims.GetEntry(key); ok && c.Value.BindingId == id {
		s.dropClaim(key, id, c.KVRevision)
	}
	if err != nil && connect.CodeOf(err) == connect.CodeAborted && s.releasedSince(key, id) &&
		(unbound.Phase != projectv1.BindingPhase_BINDING_PHASE_TERMINATING || unbound.UnbindPolicy == policy) {
		// The agent carried out the tombstones and the binding was released before the view
		// showed this call its unbinding. That is this call's unbinding carried out only if its
		// event is what made the binding Terminating (a release needs that first) or it asked
		// for nothing new; a policy change on an already Terminating binding may have lost to
		// the release of the old policy, and stays Aborted (a read then finds it gone).
		released := proto.CloneOf(unbound)
		released.Phase, released.UnbindPolicy = projectv1.BindingPhase_BINDING_PHASE_TERMINATING, policy
		if seq > 0 {
			released.Revision = seq
		}
		return s.present(released), nil
	}
	if err != nil {
		return nil, err
	}
	return b, nil
}

// releasedSince reports whether the binding id at key has left the bindings view (released),
// the view having caught up with at least its unbinding.
func (s *Service) releasedSince(key, id string) bool {
	b, ok := s.bindings.Get(key)
	return !ok || b.Id != id
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

// repairer reconciles the claims bucket with the bindings view, which the stream defines:
// claims whose bind never completed, or whose binding was unbound, are released; bindings
// without a claim (a lost bucket) get theirs back. It is keyed by (cluster, namespace) (the key
// of both) and driven by time alone: a claim becomes orphan when ClaimGrace passes, so every
// claim and every live binding is looked at each RepairInterval.
func (s *Service) repairer() *reconcile.Controller {
	return reconcile.New(reconcile.Config{Name: "namespace-binding-repair", Keys: s.repairCandidates, Resync: s.cfg.RepairInterval, Log: s.log},
		reconcile.Func(s.repairClaim))
}

func (s *Service) repairCandidates() []string {
	out := keysOf(s.claims)
	for _, e := range s.bindings.Entries(func(_ string, b *projectv1.NamespaceBinding) bool {
		return b.Phase != projectv1.BindingPhase_BINDING_PHASE_TERMINATING
	}) {
		out = append(out, e.Key)
	}
	return out
}

// repairClaim releases the claim at key if it is orphan, or restores the claim of a live binding
// that has none. What the caches show decides whether to look closer; the decision itself is
// made again on a bindings view that has caught up with the stream.
func (s *Service) repairClaim(ctx context.Context, key string) error {
	if !s.needsRepair(key) {
		return nil
	}
	// Decide from a bindings view that has caught up with the stream as it is now: a claim is
	// orphan only if its binding event is not in the stream.
	info, err := s.stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("stream info: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, apiwait.Patience)
	err = s.bindings.WaitCheckpoint(wctx, info.State.LastSeq)
	cancel()
	if err != nil {
		return err
	}
	if c, ok := s.claims.GetEntry(key); ok {
		if !s.orphan(c.Key, c.Value) {
			return nil
		}
		if err := s.claimsKV.Delete(ctx, c.Key, jetstream.LastRevision(c.KVRevision)); err != nil {
			return fmt.Errorf("release orphan claim %s: %w", c.Key, err)
		}
		s.log.Info("released orphan claim", zap.String("key", c.Key), zap.String("project", c.Value.Project), zap.String("binding", c.Value.BindingId))
		return nil
	}
	b, ok := s.bindings.Get(key)
	if !ok || b.Phase == projectv1.BindingPhase_BINDING_PHASE_TERMINATING {
		return nil
	}
	data, err := proto.Marshal(&projectv1.Claim{Project: b.Project, BindingId: b.Id, CreateTime: timestamppb.New(s.now())})
	if err != nil {
		return fmt.Errorf("marshal claim: %w", err)
	}
	if _, err := s.claimsKV.Create(ctx, key, data); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil // claimed meanwhile; the next resync judges that claim
		}
		return fmt.Errorf("restore claim %s: %w", key, err)
	}
	s.log.Info("restored claim", zap.String("key", key), zap.String("project", b.Project), zap.String("binding", b.Id))
	return nil
}

// needsRepair reports whether the caches show an orphan claim at key, or a live binding without
// a claim.
func (s *Service) needsRepair(key string) bool {
	if c, ok := s.claims.Get(key); ok {
		return s.orphan(key, c)
	}
	b, ok := s.bindings.Get(key)
	return ok && b.Phase != projectv1.BindingPhase_BINDING_PHASE_TERMINATING
}
