package namespacebinding

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/reconcile"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// releaser appends NamespaceReleased for each Terminating binding once the cluster's agent has
// applied all its tombstones; the binding then leaves the view. It also releases every binding
// of a deregistered cluster. It is keyed by binding (bindings view key): a change of the
// binding, of its desired objects, of their agent's reports or of its cluster's registration
// queues it, and every binding that may be due (Terminating, or of a cluster the registry view
// does not hold) is looked at each ReleaseInterval.
func (s *Service) releaser() *reconcile.Controller {
	return reconcile.New(reconcile.Config{Name: "namespace-binding-release", Keys: s.releaseCandidates, Resync: s.cfg.ReleaseInterval, Log: s.log},
		&releaser{s: s, pending: map[string]time.Time{}})
}

// releaseSources queue a binding for the releaser.
func (s *Service) releaseSources() []reconcile.Source {
	return []reconcile.Source{reconcile.Watch(s.bindings, nil), reconcile.Watch(s.desired, bindingOfDesired),
		reconcile.Watch(s.applied, bindingOfApplied), reconcile.Watch(s.clusters, s.bindingsOfCluster)}
}

// releaseCandidates are the bindings the releaser may have to act on: the Terminating ones and
// those of clusters missing from the registry view (perhaps deregistered).
func (s *Service) releaseCandidates() []string {
	out := s.bindings.Keys(terminatingTerm)
	checked := map[string]bool{}
	for _, b := range s.bindings.List(nil) {
		if checked[b.Cluster] {
			continue
		}
		checked[b.Cluster] = true
		if _, ok := s.clusters.Get(keys.Encode(b.Cluster)); !ok {
			out = append(out, s.bindings.Keys(byCluster(b.Cluster))...)
		}
	}
	return out
}

// bindingsOfCluster queues every binding of a cluster whose registration changed (perhaps a
// deregistration).
func (s *Service) bindingsOfCluster(u view.Update[*clusterv1.Cluster]) []string {
	name, err := keys.Decode(u.Key)
	if err != nil {
		return nil
	}
	return s.bindings.Keys(byCluster(name))
}

type releaser struct {
	s  *Service
	mu sync.Mutex
	// pending are the releases appended and not yet visible (binding id → when), so they are
	// not appended again meanwhile.
	pending map[string]time.Time
}

func (r *releaser) Reconcile(ctx context.Context, key string) error {
	s := r.s
	b, ok := s.bindings.Get(key)
	if !ok {
		return nil
	}
	gone, err := s.deregistered(ctx, b.Cluster)
	if err != nil {
		return err
	}
	if gone && b.Phase != projectv1.BindingPhase_BINDING_PHASE_TERMINATING {
		// Deregistration releases every binding of the cluster (docs/namespaces.md): KEEP,
		// since no agent is left to carry out anything else. The unbinding queues the key
		// again, and it is released then: nobody is left to confirm.
		if _, err := s.unbind(ctx, b.Project, b.Cluster, b.Namespace, projectv1.UnbindPolicy_UNBIND_POLICY_KEEP); err != nil {
			return fmt.Errorf("release binding of namespace %s on deregistered cluster %s: %w", b.Namespace, b.Cluster, err)
		}
		return nil
	}
	if b.Phase != projectv1.BindingPhase_BINDING_PHASE_TERMINATING || !(gone || s.released(b)) {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := s.now()
	for id, at := range r.pending {
		if now.Sub(at) > time.Minute {
			delete(r.pending, id)
		}
	}
	if _, ok := r.pending[b.Id]; ok {
		return nil
	}
	ev := &projectv1.NamespaceReleased{BindingId: b.Id, Project: b.Project, Cluster: b.Cluster, Namespace: b.Namespace}
	// Any expectation: the event is idempotent (ignored unless it names the current,
	// Terminating binding), so replicas racing to append it do no harm.
	if _, err := s.store.Append(ctx, bindingSubject(b.Cluster, b.Namespace), b.Id, events.Any, ev); err != nil {
		return fmt.Errorf("append release of namespace %s on cluster %s: %w", b.Namespace, b.Cluster, err)
	}
	r.pending[b.Id] = now
	// An unbinding whose caller died (or gave up) before dropping the claim leaves it naming
	// this binding; once the binding is gone such a claim would hold the (cluster, namespace)
	// against every bind until ClaimGrace.
	if c, ok := s.claims.GetEntry(key); ok && c.Value.BindingId == b.Id {
		s.dropClaim(key, b.Id, c.KVRevision)
	}
	s.log.Info("namespace released", zap.String("project", b.Project), zap.String("cluster", b.Cluster), zap.String("namespace", b.Namespace))
	return nil
}

// deregistered reports whether cluster is missing from the registry view and confirmed
// deregistered by the last event on its subject: a registry view being rebuilt (or lagging)
// must never release a live cluster's namespaces.
func (s *Service) deregistered(ctx context.Context, cluster string) (bool, error) {
	if _, ok := s.clusters.Get(keys.Encode(cluster)); ok {
		return false, nil
	}
	stream, err := s.clusterEvents(ctx)
	if err != nil {
		return false, fmt.Errorf("confirm deregistration: %w", err)
	}
	_, last, err := events.Last(ctx, stream, subjects.Cluster(cluster))
	if err != nil {
		return false, fmt.Errorf("confirm deregistration of cluster %s: %w", cluster, err)
	}
	_, ok := events.PayloadOf(last).(*clusterv1.ClusterDeregistered)
	return ok, nil
}

// clusterEvents opens cluster-import's stream on first use: a standalone namespace-binding may
// start before cluster-import has created it.
func (s *Service) clusterEvents(ctx context.Context) (jetstream.Stream, error) {
	if s.clusterStream != nil {
		return s.clusterStream, nil
	}
	st, err := s.js.Stream(ctx, subjects.ClusterStream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", subjects.ClusterStream, err)
	}
	s.clusterStream = st
	return st, nil
}
