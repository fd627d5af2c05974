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
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// runRelease appends NamespaceReleased for each Terminating binding once the cluster's agent has
// applied all its tombstones; the binding then leaves the view. It looks on every change of
// the desired state or the agents' reports, and periodically.
func (s *Service) runRelease(ctx context.Context) error {
	t := time.NewTicker(s.cfg.ReleaseInterval)
	defer t.Stop()
	// Releases appended and not yet visible, so they are not appended again meanwhile.
	pending := map[string]time.Time{}
	// Deregistrations are looked for when the registry changed (or on the ticker), not on every
	// agent report: it walks every binding.
	var gone map[string]bool
	recheck := true
	for {
		s.passes.start()
		clustersChanged := s.clusters.Changed()
		now := s.now()
		for id, at := range pending {
			if now.Sub(at) > time.Minute {
				delete(pending, id)
			}
		}
		if recheck {
			gone, recheck = s.deregisteredClusters(ctx), false
		}
		for c := range gone {
			for _, b := range s.bindings.Lookup(byCluster(c)) {
				if b.Phase == projectv1.BindingPhase_BINDING_PHASE_TERMINATING {
					continue // released below: nobody is left to confirm
				}
				// Deregistration releases every binding of the cluster (docs/namespaces.md): KEEP,
				// since no agent is left to carry out anything else.
				if _, err := s.unbind(ctx, b.Project, b.Cluster, b.Namespace, projectv1.UnbindPolicy_UNBIND_POLICY_KEEP); err != nil && ctx.Err() == nil {
					s.log.Warn("release binding of a deregistered cluster", zap.String("cluster", b.Cluster), zap.String("namespace", b.Namespace), zap.Error(err))
				}
			}
		}
		for _, b := range s.bindings.Lookup(terminatingTerm) {
			if _, ok := pending[b.Id]; ok || !(gone[b.Cluster] || s.released(b)) {
				continue
			}
			ev := &projectv1.NamespaceReleased{BindingId: b.Id, Project: b.Project, Cluster: b.Cluster, Namespace: b.Namespace}
			// Any expectation: the event is idempotent (ignored unless it names the current,
			// Terminating binding), so replicas racing to append it do no harm.
			if _, err := s.store.Append(ctx, bindingSubject(b.Cluster, b.Namespace), b.Id, events.Any, ev); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				s.log.Warn("append release", zap.String("cluster", b.Cluster), zap.String("namespace", b.Namespace), zap.Error(err))
				continue
			}
			pending[b.Id] = now
			s.log.Info("namespace released", zap.String("project", b.Project), zap.String("cluster", b.Cluster), zap.String("namespace", b.Namespace))
		}
		s.passes.finish()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			recheck = true
		case <-s.applied.Changed():
		case <-s.desired.Changed():
		case <-clustersChanged: // perhaps a deregistration
			recheck = true
		}
		// Coalesce bursts of reports into one pass.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// deregisteredClusters returns the clusters that bindings name and the registry no longer
// holds, each confirmed deregistered by the last event on its subject: a registry view being
// rebuilt (or lagging) must never release a live cluster's namespaces.
func (s *Service) deregisteredClusters(ctx context.Context) map[string]bool {
	gone := map[string]bool{}
	checked := map[string]bool{}
	for _, b := range s.bindings.List(nil) {
		if checked[b.Cluster] {
			continue
		}
		checked[b.Cluster] = true
		if _, ok := s.clusters.Get(keys.Encode(b.Cluster)); ok {
			continue
		}
		stream, err := s.clusterEvents(ctx)
		if err != nil {
			s.log.Warn("confirm deregistration", zap.Error(err))
			return gone
		}
		_, last, err := events.Last(ctx, stream, subjects.Cluster(b.Cluster))
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("confirm deregistration", zap.String("cluster", b.Cluster), zap.Error(err))
			}
			continue
		}
		if _, ok := payloadOf(last).(*clusterv1.ClusterDeregistered); ok {
			gone[b.Cluster] = true
		}
	}
	return gone
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

// passes counts the passes of a loop (the release loop, the placement scheduler), so a caller
// can wait for a whole pass that began after it asked (WaitReleasePass, WaitSchedulingRound).
type passes struct {
	mu            sync.Mutex
	started, done uint64
	changed       chan struct{}
}

func newPasses() *passes { return &passes{changed: make(chan struct{})} }

func (p *passes) start() {
	p.mu.Lock()
	p.started++
	p.mu.Unlock()
}

func (p *passes) finish() {
	p.mu.Lock()
	p.done = p.started
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

// next is the pass a caller asking now waits for: the first to begin after the call.
func (p *passes) next() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.started + 1
}

// wait blocks until pass want has finished.
func (p *passes) wait(ctx context.Context, want uint64) error {
	for {
		p.mu.Lock()
		done, ch := p.done, p.changed
		p.mu.Unlock()
		if done >= want {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// WaitReleasePass blocks until the release loop has made a whole pass that began after the
// call, with the desired state as it is in its bucket now and the agents' reports up to
// revision appliedRev of bucket applied: whatever that state releases has then been appended.
// Tests use it before asserting that a binding was not released.
func (s *Service) WaitReleasePass(ctx context.Context, appliedRev uint64) error {
	if _, err := s.desired.Current(ctx); err != nil {
		return err
	}
	if err := s.applied.WaitSeen(ctx, appliedRev); err != nil {
		return err
	}
	if err := s.passes.wait(ctx, s.passes.next()); err != nil {
		return fmt.Errorf("wait for a release pass: %w", err)
	}
	return nil
}
