package namespacebinding

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/events"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
)

// runRepair reconciles the claims bucket with the bindings view, which the stream defines:
// claims whose bind never completed, or whose binding was unbound, are released; bindings
// without a claim (a lost bucket) get theirs back.
func (s *Service) runRepair(ctx context.Context) error {
	t := time.NewTicker(s.cfg.RepairInterval)
	defer t.Stop()
	for {
		if err := s.repairClaims(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("claim repair", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (s *Service) repairClaims(ctx context.Context) error {
	// Decide from a bindings view that has caught up with the stream as it is now: a claim is
	// orphan only if its binding event is not in the stream.
	info, err := s.stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("stream info: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, viewWait)
	err = s.bindings.WaitCheckpoint(wctx, info.State.LastSeq)
	cancel()
	if err != nil {
		return err
	}
	released := 0
	for _, c := range s.claims.Entries(nil) {
		if !s.orphan(c.Key, c.Value) {
			continue
		}
		if err := s.claimsKV.Delete(ctx, c.Key, jetstream.LastRevision(c.KVRevision)); err != nil {
			s.log.Warn("release orphan claim", zap.String("key", c.Key), zap.Error(err))
			continue
		}
		released++
		s.log.Info("released orphan claim", zap.String("key", c.Key), zap.String("project", c.Value.Project), zap.String("binding", c.Value.BindingId))
	}
	restored := 0
	for _, b := range s.bindings.List(func(_ string, b *projectv1.NamespaceBinding) bool {
		return b.Phase != projectv1.BindingPhase_BINDING_PHASE_TERMINATING
	}) {
		key := bindingKey(b.Cluster, b.Namespace)
		if _, ok := s.claims.Get(key); ok {
			continue
		}
		data, err := proto.Marshal(&projectv1.Claim{Project: b.Project, BindingId: b.Id, CreateTime: timestamppb.New(s.now())})
		if err != nil {
			return fmt.Errorf("marshal claim: %w", err)
		}
		if _, err := s.claimsKV.Create(ctx, key, data); err != nil {
			if errors.Is(err, jetstream.ErrKeyExists) {
				continue // claimed meanwhile; the next round judges that claim
			}
			s.log.Warn("restore claim", zap.String("key", key), zap.Error(err))
			continue
		}
		restored++
	}
	if released+restored > 0 {
		s.log.Info("claims repaired", zap.Int("released", released), zap.Int("restored", restored))
	}
	return nil
}

// runRelease appends NamespaceReleased for each Terminating binding once the cluster's agent has
// applied all its tombstones; the binding then leaves the view. It looks on every change of
// the desired state or the agents' reports, and periodically.
func (s *Service) runRelease(ctx context.Context) error {
	t := time.NewTicker(s.cfg.ReleaseInterval)
	defer t.Stop()
	// Releases appended and not yet visible, so they are not appended again meanwhile.
	pending := map[string]time.Time{}
	for {
		now := s.now()
		for id, at := range pending {
			if now.Sub(at) > time.Minute {
				delete(pending, id)
			}
		}
		for _, b := range s.bindings.Lookup(terminatingTerm) {
			if _, ok := pending[b.Id]; ok || !s.released(b) {
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
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-s.applied.Changed():
		case <-s.desired.Changed():
		}
		// Coalesce bursts of reports into one pass.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
}
