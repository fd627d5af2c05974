package namespacebinding

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/apiwait"
	"github.com/fleetstream/fleetstream/pkg/events"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/identity"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/reconcile"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/view"
	"github.com/fleetstream/fleetstream/pkg/viewapi"
)

// Namespaces that follow a placement (docs/placement.md). BindNamespace {placement} records
// that the namespace follows the placement (fleet.placement.namespace.<project>.<namespace>);
// the follower then keeps one ordinary binding per decided cluster, made and released through
// the same path as a binding to one cluster (claims, budgets, quotas, the agents), each
// marked with the placement. A decided cluster where another project holds the namespace is
// skipped and shown as a Failed binding naming the owner; the others proceed.

// ReasonOwnedByOtherProject is the reason of a placement's binding that cannot be made because
// another project holds the namespace on that cluster.
const ReasonOwnedByOtherProject = "OwnedByOtherProject"

// ReasonOverBudget is the reason of a placement's binding that the project's budget on that
// cluster cannot hold.
const ReasonOverBudget = "OverBudget"

// ReasonProtectedNamespace is the reason of a placement's binding that is never made because
// the namespace is protected (Config.Protected): a namespace recorded as following a placement
// before it became protected.
const ReasonProtectedNamespace = "ProtectedNamespace"

// placements is what the follower and the project API read of placement (package placement,
// which the Service wires): whether a placement exists, and the clusters it decided.
type placements interface {
	// PlacementExists reports whether project's placement name is in the view.
	PlacementExists(project, name string) bool
	// PlacementCount is how many placements project has.
	PlacementCount(project string) int
	// PlacementGone confirms from the stream that the placement was deleted (or never
	// created), for a reader whose view may lag.
	PlacementGone(ctx context.Context, project, name string) bool
	// DecidedClusters lists the clusters of the placement's decision; false before its first.
	DecidedClusters(project, name string) ([]string, bool)
	// WatchDecisions queues the keys that keys returns for a placement whose decision changes.
	WatchDecisions(keys func(project, name string) []string) reconcile.Source
}

// connectMessage is an error's message without Connect's code prefix.
func connectMessage(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}

func placementNamespacesProjection() view.Projection {
	return view.Projection{
		Name:     "placement-namespaces",
		Version:  1,
		Stream:   PlacementStream,
		Subjects: []string{PlacementPrefix + ".namespace.>"},
		Bucket:   bucketConfig(subjects.PlacementNamespacesBucket, "Namespaces that follow a placement (projection of FLEET_PLACEMENT)."),
		New:      func() proto.Message { return &placementv1.PlacementNamespace{} },
		Apply:    applyPlacementNamespace,
	}
}

func applyPlacementNamespace(ev *events.Event) ([]view.Change, error) {
	project, namespace, err := twoTokens(ev.Subject, PlacementPrefix+".namespace.")
	if err != nil {
		return nil, err
	}
	key := keys.Join(project, namespace)
	at := ev.GetTime()
	switch p := ev.Payload.(type) {
	case *placementv1.PlacementNamespaceBound:
		n := p.GetNamespace()
		if n.GetProject() != project || n.GetNamespace() != namespace {
			return nil, fmt.Errorf("PlacementNamespaceBound for %s/%s on subject of %s/%s", n.GetProject(), n.GetNamespace(), project, namespace)
		}
		return []view.Change{{Key: key, Update: func(cur proto.Message) proto.Message {
			out := proto.CloneOf(n)
			out.CreateTime, out.UpdateTime = at, at
			if c, ok := cur.(*placementv1.PlacementNamespace); ok && c != nil {
				out.CreateTime = c.CreateTime
			}
			return out
		}}}, nil
	case *placementv1.PlacementNamespaceUnbound:
		return []view.Change{{Key: key, Update: func(proto.Message) proto.Message { return nil }}}, nil
	}
	return nil, fmt.Errorf("unexpected event %s on %s", ev.Type, ev.Subject)
}

// twoTokens splits the <a>.<b> tail of subject after prefix.
func twoTokens(subject, prefix string) (string, string, error) {
	tok, ok := strings.CutPrefix(subject, prefix)
	if !ok {
		return "", "", fmt.Errorf("subject %s is not under %s", subject, prefix)
	}
	parts, err := keys.Split(tok)
	if err != nil || len(parts) != 2 {
		return "", "", fmt.Errorf("subject %s: want two tokens after %s: %v", subject, prefix, err)
	}
	return parts[0], parts[1], nil
}

func placementNamespaceIndex(_ string, n *placementv1.PlacementNamespace) []string {
	return []string{byProject(n.Project), byPlacement(n.Project, n.Placement), byFollowingNamespace(n.Namespace)}
}

// byFollowingNamespace finds the following namespaces of one name in every project: a binding
// of that name that goes frees the cluster for them.
func byFollowingNamespace(ns string) string { return "ns\x00" + ns }

func byPlacement(project, placement string) string { return "pl\x00" + project + "\x00" + placement }

// followersOf lists the namespaces that follow a placement.
func (s *Service) followersOf(project, placement string) []string {
	var out []string
	for _, n := range s.placementNamespaces.Lookup(byPlacement(project, placement)) {
		out = append(out, n.Namespace)
	}
	return out
}

func (s *Service) bindToPlacement(ctx context.Context, m *projectv1.BindNamespaceRequest) (*connect.Response[projectv1.BindNamespaceResponse], error) {
	var v apierr.Violations
	v.DNSLabel("project", m.Project)
	v.DNSLabel("namespace", m.Namespace)
	validateUnprotected(&v, s.cfg.Protected, "namespace", m.Namespace)
	v.DNSLabel("placement", m.Placement)
	if m.Cluster != "" {
		v.Add("cluster", "give cluster or placement, not both")
	}
	validateHard(&v, "hard", m.Hard)
	validatePolicy(&v, "unbind_policy", m.UnbindPolicy)
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	if _, ok := s.projects.Get(projectKey(m.Project)); !ok {
		return nil, apierr.NotFound("project", m.Project)
	}
	if !s.placements.PlacementExists(m.Project, m.Placement) {
		return nil, apierr.NotFound("placement", m.Project+"/"+m.Placement)
	}
	policy := m.UnbindPolicy
	if policy == projectv1.UnbindPolicy_UNBIND_POLICY_UNSPECIFIED {
		policy = projectv1.UnbindPolicy_UNBIND_POLICY_KEEP
	}
	want := &placementv1.PlacementNamespace{Project: m.Project, Namespace: m.Namespace, Placement: m.Placement,
		Hard: canonicalHard(m.Hard), UnbindPolicy: policy}
	key := keys.Join(m.Project, m.Namespace)
	subject := subjects.PlacementNamespace(m.Project, m.Namespace)
	res, err := events.Command[viewapi.Entry[*placementv1.PlacementNamespace]]{
		Store: s.store, Subject: subject, AggregateID: key, DryRun: m.DryRun,
		Load: s.loadFollowing(key, subject),
		Decide: func(e viewapi.Entry[*placementv1.PlacementNamespace]) ([]proto.Message, error) {
			cur := e.Cur
			switch {
			case e.OK && cur.Placement != m.Placement:
				return nil, apierr.AlreadyExistsf("namespace %q of project %q already follows placement %q: unbind it from that placement first",
					m.Namespace, m.Project, cur.Placement)
			case e.OK && proto.Equal(&placementv1.PlacementNamespace{Hard: cur.Hard, UnbindPolicy: cur.UnbindPolicy},
				&placementv1.PlacementNamespace{Hard: want.Hard, UnbindPolicy: want.UnbindPolicy}):
				return nil, nil // nothing to change
			}
			return []proto.Message{&placementv1.PlacementNamespaceBound{Namespace: want}}, nil
		},
	}.Run(ctx)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	if m.DryRun {
		return connect.NewResponse(&projectv1.BindNamespaceResponse{PlacementBindings: s.placementBindingsAfter(want)}), nil
	}
	seq := res.Revision
	if len(res.Events) > 0 {
		seq = res.Sequence
	}
	if err := s.waitView(ctx, func(ctx context.Context) error { return s.placementNamespaces.WaitRevision(ctx, key, seq, false) }); err != nil {
		return nil, err
	}
	// DeletePlacement checks for followers in the view, this call for the placement in its view:
	// both can pass. Ask the stream now that the following is recorded, and take it back if the
	// placement went meanwhile.
	if s.placements.PlacementGone(ctx, m.Project, m.Placement) {
		// Only the following this call recorded (Expected): a lost race means another call
		// moved it on, and that call's answer stands.
		_, _ = events.Command[viewapi.Entry[*placementv1.PlacementNamespace]]{
			Store: s.store, Subject: subject, AggregateID: key, Expected: seq,
			Load: s.loadFollowing(key, subject),
			Decide: func(e viewapi.Entry[*placementv1.PlacementNamespace]) ([]proto.Message, error) {
				if !e.OK || e.Cur.Revision != seq {
					return nil, nil
				}
				return []proto.Message{&placementv1.PlacementNamespaceUnbound{Project: m.Project, Namespace: m.Namespace, Policy: projectv1.UnbindPolicy_UNBIND_POLICY_KEEP}}, nil
			},
		}.Run(ctx)
		return nil, apierr.NotFound("placement", m.Project+"/"+m.Placement)
	}
	// Bind on the clusters decided now before answering, so the caller sees them; later
	// decisions are the follower's.
	n, ok := s.placementNamespaces.Get(key)
	if !ok {
		return nil, apierr.Concurrent("namespace %q of project %q", m.Namespace, m.Project)
	}
	s.followBackoff.reset(n)
	if err := s.follow(ctx, n); err != nil {
		s.log.Warn("bind namespace to placement: some clusters wait for the follower", zap.String("project", m.Project),
			zap.String("namespace", m.Namespace), zap.Error(err))
	}
	s.log.Info("namespace follows placement", zap.String("project", m.Project), zap.String("namespace", m.Namespace),
		zap.String("placement", m.Placement), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&projectv1.BindNamespaceResponse{PlacementBindings: s.placementBindings(n)}), nil
}

// loadFollowing is the events.Command Load of a write to the following namespace at key (on
// subject), which may create it.
func (s *Service) loadFollowing(key, subject string) func(context.Context, uint64) (viewapi.Entry[*placementv1.PlacementNamespace], uint64, error) {
	return viewapi.LoadEntry(s.placementNamespaces, key, s.placementStream, subject, func(last proto.Message) bool {
		_, gone := last.(*placementv1.PlacementNamespaceUnbound)
		return gone
	})
}

// placementBindings presents a following namespace's bindings, with a Failed one for each
// decided cluster where another project holds the namespace.
func (s *Service) placementBindings(n *placementv1.PlacementNamespace) []*projectv1.NamespaceBinding {
	var out []*projectv1.NamespaceBinding
	for _, b := range s.bindings.Lookup(byProjectNamespace(n.Project, n.Namespace)) {
		if b.Placement == n.Placement {
			out = append(out, s.present(b))
		}
	}
	return append(out, s.blockedBindings(n)...)
}

// placementBindingsAfter is a dry run's answer for a namespace that would follow a placement as
// n says: per cluster decided now, its binding as it would be (the namespace's own, with n's
// quota, or a new one Pending), or Failed with what keeps the follower from binding it there.
func (s *Service) placementBindingsAfter(n *placementv1.PlacementNamespace) []*projectv1.NamespaceBinding {
	blocked := map[string]bool{}
	out := s.blockedBindings(n)
	for _, b := range out {
		blocked[b.Cluster] = true
	}
	decided, _ := s.placements.DecidedClusters(n.Project, n.Placement)
	for _, c := range sorted(decided) {
		if blocked[c] {
			continue
		}
		b := &projectv1.NamespaceBinding{Project: n.Project, Cluster: c, Namespace: n.Namespace, Phase: projectv1.BindingPhase_BINDING_PHASE_PENDING}
		if cur, ok := s.bindings.Get(bindingKey(c, n.Namespace)); ok && cur.Project == n.Project {
			b = s.present(cur)
		}
		b.Hard, b.Placement, b.UnbindPolicy = n.Hard, n.Placement, n.UnbindPolicy
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b *projectv1.NamespaceBinding) int { return strings.Compare(a.Cluster, b.Cluster) })
	return out
}

// blockedBindings are the decided clusters of a following namespace where another project
// holds it, as Failed bindings naming the owner (or the protection, or the budget, that keeps it
// from being bound). They are computed, never stored: the moment
// the owner lets go, the follower binds and the entry becomes a real binding.
func (s *Service) blockedBindings(n *placementv1.PlacementNamespace) []*projectv1.NamespaceBinding {
	decided, ok := s.placements.DecidedClusters(n.Project, n.Placement)
	if !ok {
		return nil
	}
	p, _ := s.projects.Get(projectKey(n.Project))
	var out []*projectv1.NamespaceBinding
	failed := func(c, reason, msg string) {
		out = append(out, &projectv1.NamespaceBinding{Project: n.Project, Cluster: c, Namespace: n.Namespace, Hard: n.Hard,
			Placement: n.Placement, UnbindPolicy: n.UnbindPolicy, Phase: projectv1.BindingPhase_BINDING_PHASE_FAILED,
			Reason: reason, Message: msg})
	}
	protected := s.cfg.Protected.Reason(n.Namespace)
	for _, c := range sorted(decided) {
		b, ok := s.bindings.Get(bindingKey(c, n.Namespace))
		switch {
		case ok && b.Project != n.Project:
			failed(c, ReasonOwnedByOtherProject,
				fmt.Sprintf("placement %s decided cluster %s, where namespace %s belongs to project %s", n.Placement, c, n.Namespace, b.Project))
		case !ok && protected != "":
			failed(c, ReasonProtectedNamespace, fmt.Sprintf("placement %s decided cluster %s: namespace %s: it is never a project's", n.Placement, c, protected))
		case !ok && p != nil:
			// Not bound and nobody else's: the project's budget there is the one thing that
			// keeps the follower from binding it.
			if err := s.fitsBudget(p, c, n.Namespace, n.Hard); err != nil {
				failed(c, ReasonOverBudget, fmt.Sprintf("placement %s decided cluster %s: %s", n.Placement, c, connectMessage(err)))
			}
		}
	}
	return out
}

func (s *Service) unbindFromPlacement(ctx context.Context, m *projectv1.UnbindNamespaceRequest) (*connect.Response[projectv1.UnbindNamespaceResponse], error) {
	var v apierr.Violations
	v.DNSLabel("project", m.Project)
	v.DNSLabel("namespace", m.Namespace)
	v.DNSLabel("placement", m.Placement)
	if m.Cluster != "" {
		v.Add("cluster", "give cluster or placement, not both")
	}
	validatePolicy(&v, "policy", m.Policy)
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	key := keys.Join(m.Project, m.Namespace)
	subject := subjects.PlacementNamespace(m.Project, m.Namespace)
	policy := m.Policy
	res, err := events.Command[viewapi.Entry[*placementv1.PlacementNamespace]]{
		Store: s.store, Subject: subject, AggregateID: key, DryRun: m.DryRun,
		Load: s.loadFollowing(key, subject),
		Decide: func(e viewapi.Entry[*placementv1.PlacementNamespace]) ([]proto.Message, error) {
			if !e.OK || e.Cur.Placement != m.Placement {
				return nil, apierr.NotFoundf("namespace: %q of project %q does not follow placement %q", m.Namespace, m.Project, m.Placement)
			}
			policy = m.Policy
			if policy == projectv1.UnbindPolicy_UNBIND_POLICY_UNSPECIFIED {
				policy = e.Cur.UnbindPolicy
			}
			return []proto.Message{&placementv1.PlacementNamespaceUnbound{Project: m.Project, Namespace: m.Namespace, Policy: policy}}, nil
		},
	}.Run(ctx)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	if m.DryRun {
		return connect.NewResponse(&projectv1.UnbindNamespaceResponse{}), nil
	}
	if err := s.waitView(ctx, func(ctx context.Context) error {
		return s.placementNamespaces.WaitFor(ctx, key, func(n *placementv1.PlacementNamespace, ok bool) bool { return !ok || n.Revision > res.Revision })
	}); err != nil {
		return nil, err
	}
	// Release every cluster now, with the caller's policy. Should this stop half-way, the
	// follower releases the rest with KEEP: it never deletes a namespace nobody asked it to.
	var firstErr error
	for _, b := range s.bindings.Lookup(byProjectNamespace(m.Project, m.Namespace)) {
		if b.Placement != m.Placement || b.Phase == projectv1.BindingPhase_BINDING_PHASE_TERMINATING {
			continue
		}
		if _, err := s.unbind(ctx, m.Project, b.Cluster, m.Namespace, policy); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	s.log.Info("namespace no longer follows placement", zap.String("project", m.Project), zap.String("namespace", m.Namespace),
		zap.String("placement", m.Placement), zap.Stringer("policy", policy), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&projectv1.UnbindNamespaceResponse{}), nil
}

// followRetry is how long a following namespace whose bind or quota change failed waits before
// it is tried again while nothing changes (a budget that does not fit, an unreachable view).
const followRetry = 5 * time.Second

// followResync is how often every following namespace is looked at with nothing changing.
const followResync = time.Minute

// follower keeps the bindings of every following namespace in line with its placement's
// decision, and releases the bindings of namespaces that stopped following. It is keyed by
// following namespace (keys.Join(project, namespace), the placement-namespaces key): a change
// of the following, of its placement's decision or of a binding of that namespace name queues
// it. It runs only in the replica holding PlacementLease.
func (s *Service) newFollower() *reconcile.Controller {
	return reconcile.New(reconcile.Config{Name: "namespace-binding-follow", Keys: s.followCandidates, Resync: followResync,
		BaseDelay: followRetry, MaxDelay: followRetry, Log: s.log}, reconcile.Func(s.followKey))
}

// followSources queue a following namespace for the follower.
func (s *Service) followSources() []reconcile.Source {
	return []reconcile.Source{reconcile.Watch(s.placementNamespaces, nil), s.placements.WatchDecisions(s.followersOfDecision),
		reconcile.Watch(s.bindings, s.followersOfBinding)}
}

// followCandidates are every following namespace and every namespace with a binding a
// placement made (perhaps a stray).
func (s *Service) followCandidates() []string {
	s.followBackoff.pending(s.now()) // forgets waits nobody re-armed
	out := keysOf(s.placementNamespaces)
	for _, b := range s.bindings.Lookup(placedTerm) {
		out = append(out, keys.Join(b.Project, b.Namespace))
	}
	return out
}

func (s *Service) followersOfDecision(project, placement string) []string {
	return s.placementNamespaces.Keys(byPlacement(project, placement))
}

func (s *Service) followersOfBinding(u view.Update[*projectv1.NamespaceBinding]) []string {
	b := u.Value
	return append(s.placementNamespaces.Keys(byFollowingNamespace(b.GetNamespace())), keys.Join(b.GetProject(), b.GetNamespace()))
}

// followKey follows the placement of the namespace at key, if it follows one, and releases the
// bindings of that namespace that placements made and it no longer follows.
func (s *Service) followKey(ctx context.Context, key string) error {
	parts, err := keys.Split(key)
	if err != nil || len(parts) != 2 {
		return nil // never queued: not a following namespace's key
	}
	var errs []error
	if n, ok := s.placementNamespaces.Get(key); ok {
		if err := s.follow(ctx, n); err != nil {
			errs = append(errs, err)
		}
	}
	if err := s.releaseStrays(ctx, parts[0], parts[1]); err != nil {
		errs = append(errs, fmt.Errorf("release bindings of namespace %s/%s that stopped following: %w", parts[0], parts[1], err))
	}
	return errors.Join(errs...)
}

// follow binds n on every decided cluster and releases it from clusters the decision left.
// A binding made by hand (no placement) is never touched.
func (s *Service) follow(ctx context.Context, n *placementv1.PlacementNamespace) error {
	// Act only on the following as it is now: a round that started before an
	// UnbindNamespace {placement} must not bind again what that call is releasing.
	cur, ok := s.placementNamespaces.Get(keys.Join(n.Project, n.Namespace))
	if !ok || cur.Revision != n.Revision {
		return nil
	}
	if _, ok := s.projects.Get(projectKey(n.Project)); !ok {
		return nil
	}
	decided, _ := s.placements.DecidedClusters(n.Project, n.Placement)
	want := map[string]bool{}
	for _, c := range decided {
		want[c] = true
	}
	// A namespace that became protected after it started following stays recorded, but no
	// binding is made for it any more (shown as Failed; bind would refuse it anyway).
	protected := s.cfg.Protected.Reason(n.Namespace) != ""
	var errs []error
	for _, c := range sorted(decided) {
		b, ok := s.bindings.Get(bindingKey(c, n.Namespace))
		switch {
		case ok && b.Project != n.Project:
			continue // another project's: shown as Failed, bound once it lets go
		case ok && b.Phase != projectv1.BindingPhase_BINDING_PHASE_TERMINATING:
			quotaDiffers := b.Placement == n.Placement && !proto.Equal(&projectv1.NamespaceBinding{Hard: canonicalHard(b.Hard)}, &projectv1.NamespaceBinding{Hard: n.Hard})
			if quotaDiffers && !s.followBackoff.ready(n, c, s.now()) {
				s.follower.AddAfter(keys.Join(n.Project, n.Namespace), followRetry) // as for a bind, below
			}
			if quotaDiffers && s.followBackoff.ready(n, c, s.now()) {
				if _, err := s.updateQuota(ctx, n.Project, c, n.Namespace, n.Hard); err != nil {
					s.followBackoff.failed(n, c, s.now())
					errs = append(errs, fmt.Errorf("quota of namespace %s on cluster %s: %w", n.Namespace, c, err))
				} else {
					s.followBackoff.succeeded(n, c)
				}
			}
			continue
		}
		if protected {
			continue
		}
		if ok && !s.stillFollows(ctx, n) {
			return nil // replacing a Terminating binding: only if the following still stands
		}
		if !s.followBackoff.ready(n, c, s.now()) {
			// Failed a moment ago (perhaps in BindNamespace's own pass): tried again after
			// followRetry. Nothing the follower watches need change meanwhile (a budget raised
			// is a project change), so the key is queued for then.
			s.follower.AddAfter(keys.Join(n.Project, n.Namespace), followRetry)
			continue
		}
		_, err := s.bind(ctx, n.Project, c, n.Namespace, n.Hard, n.Placement)
		switch {
		case err != nil && connect.CodeOf(err) != connect.CodeAlreadyExists:
			s.followBackoff.failed(n, c, s.now())
			errs = append(errs, fmt.Errorf("bind namespace %s/%s on cluster %s: %w", n.Project, n.Namespace, c, err))
			continue
		case err != nil:
			// Bound meanwhile by someone else (the follower and BindNamespace's own pass race
			// for the same clusters): wait until the view shows it, so a caller presenting the
			// bindings next sees it too.
			wctx, cancel := context.WithTimeout(ctx, apiwait.Patience)
			_ = s.bindings.WaitFor(wctx, bindingKey(c, n.Namespace), func(_ *projectv1.NamespaceBinding, ok bool) bool { return ok })
			cancel()
		}
		s.followBackoff.succeeded(n, c)
	}
	for _, b := range s.bindings.LookupUnordered(byProjectNamespace(n.Project, n.Namespace)) {
		if b.Placement != n.Placement || want[b.Cluster] || b.Phase == projectv1.BindingPhase_BINDING_PHASE_TERMINATING {
			continue
		}
		if _, err := s.unbind(ctx, n.Project, b.Cluster, n.Namespace, n.UnbindPolicy); err != nil && connect.CodeOf(err) != connect.CodeNotFound {
			errs = append(errs, fmt.Errorf("release namespace %s/%s from cluster %s: %w", n.Project, n.Namespace, b.Cluster, err))
		}
	}
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// releaseStrays unbinds, with KEEP, the placement-made bindings of a project's namespace that
// no longer follows their placement: what an UnbindNamespace that stopped half-way left.
func (s *Service) releaseStrays(ctx context.Context, project, namespace string) error {
	var errs []error
	for _, b := range s.bindings.LookupUnordered(byProjectNamespace(project, namespace)) {
		if b.Placement == "" || b.Phase == projectv1.BindingPhase_BINDING_PHASE_TERMINATING {
			continue
		}
		if n, ok := s.placementNamespaces.Get(keys.Join(b.Project, b.Namespace)); ok && n.Placement == b.Placement {
			continue
		}
		// This replica's view of the following namespaces may lag the bindings another
		// replica's follower just made: ask the stream before releasing anything.
		_, last, err := events.Last(ctx, s.placementStream, subjects.PlacementNamespace(b.Project, b.Namespace))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if p, ok := events.PayloadOf(last).(*placementv1.PlacementNamespaceBound); ok && p.GetNamespace().GetPlacement() == b.Placement {
			continue
		}
		if _, err := s.unbind(ctx, b.Project, b.Cluster, b.Namespace, projectv1.UnbindPolicy_UNBIND_POLICY_KEEP); err != nil && connect.CodeOf(err) != connect.CodeNotFound {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

// withBlocked adds the Failed entries of following namespaces to a project's binding list.
func (s *Service) withBlocked(project string, list []*projectv1.NamespaceBinding) []*projectv1.NamespaceBinding {
	for _, n := range s.placementNamespaces.Lookup(byProject(project)) {
		list = append(list, s.blockedBindings(n)...)
	}
	slices.SortStableFunc(list, func(a, b *projectv1.NamespaceBinding) int {
		return cmp.Or(strings.Compare(a.Cluster, b.Cluster), strings.Compare(a.Namespace, b.Namespace))
	})
	return list
}

// stillFollows confirms from the stream that n is the namespace's last following event.
func (s *Service) stillFollows(ctx context.Context, n *placementv1.PlacementNamespace) bool {
	last, ev, err := events.Last(ctx, s.placementStream, subjects.PlacementNamespace(n.Project, n.Namespace))
	if err != nil {
		s.log.Warn("confirm namespace following", zap.String("project", n.Project), zap.String("namespace", n.Namespace), zap.Error(err))
		return false
	}
	_, bound := events.PayloadOf(ev).(*placementv1.PlacementNamespaceBound)
	return bound && last == n.Revision
}

// backoff spaces out a following namespace's failing bind or quota change on one cluster (a
// budget that does not fit): without it every binding change anywhere in the fleet would try
// it again, claim and all. The API's own follow (BindNamespace) is not held back: a caller
// retrying by hand has changed something.
type backoff struct {
	mu    sync.Mutex
	until map[string]time.Time
}

func backoffKey(n *placementv1.PlacementNamespace, cluster string) string {
	return keys.Join(n.Project, n.Namespace, cluster)
}

func (b *backoff) ready(n *placementv1.PlacementNamespace, cluster string, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.until[backoffKey(n, cluster)]
	return !ok || !now.Before(t)
}

func (b *backoff) failed(n *placementv1.PlacementNamespace, cluster string, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.until == nil {
		b.until = map[string]time.Time{}
	}
	b.until[backoffKey(n, cluster)] = now.Add(followRetry)
}

func (b *backoff) succeeded(n *placementv1.PlacementNamespace, cluster string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.until, backoffKey(n, cluster))
}

// pending reports whether some retry waits, so the follower wakes for it. An entry nobody
// re-armed for a whole period after it ran out (its cluster left the decision, the namespace
// stopped following) is forgotten.
func (b *backoff) pending(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for k, t := range b.until {
		if !now.Before(t.Add(followRetry)) {
			delete(b.until, k)
		}
	}
	return len(b.until) > 0
}

// reset forgets every wait: the API's follow acts at once.
func (b *backoff) reset(n *placementv1.PlacementNamespace) {
	b.mu.Lock()
	defer b.mu.Unlock()
	prefix := keys.Join(n.Project, n.Namespace) + "."
	for k := range b.until {
		if strings.HasPrefix(k, prefix) {
			delete(b.until, k)
		}
	}
}
