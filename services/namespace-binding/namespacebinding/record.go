package namespacebinding

import (
	"context"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/fleetstream/fleetstream/pkg/events"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// recordInterval is how often queued bindings are looked at: agent reports come in bursts.
const recordInterval = 100 * time.Millisecond

// runStatus records the phase transitions agents cause in the bindings view, as
// NamespaceBindingStatusChanged events: the API derives the live phase on every read, but other
// services (rbac-sync withholds RoleBindings from a namespace that is another project's) read
// the view. Only changes of phase, or of a failure's reason, are recorded; usage never is.
func (s *Service) runStatus(ctx context.Context) error {
	t := time.NewTicker(s.cfg.StatusResync)
	defer t.Stop()
	tick := time.NewTicker(recordInterval)
	defer tick.Stop()
	queue := map[string]bool{}
	// Appended and not yet in the view: binding id → phase/reason recorded.
	pending := map[string]string{}
	for {
		// Subscribe first, then look at everything: nothing falls in between.
		sctx, cancel := context.WithCancel(ctx)
		applied := s.applied.Updates(sctx, 8192)
		desired := s.desired.Updates(sctx, 8192)
		bindings := s.bindings.Updates(sctx, 8192)
		for _, e := range s.bindings.Entries(nil) {
			queue[e.Key] = true
		}
		resubscribe := false
		for !resubscribe {
			select {
			case <-ctx.Done():
				cancel()
				return nil
			case c, ok := <-applied:
				if !ok {
					resubscribe = true
					break
				}
				if bk := bindingKeyOfDesired(strings.TrimPrefix(c.Key, keys.Encode(subjects.DesiredNamespacesBucket)+".")); bk != "" {
					queue[bk] = true
				}
			case c, ok := <-desired:
				if !ok {
					resubscribe = true
					break
				}
				if bk := bindingKeyOfDesired(c.Key); bk != "" {
					queue[bk] = true
				}
			case c, ok := <-bindings:
				if !ok {
					resubscribe = true
					break
				}
				queue[c.Key] = true
			case <-t.C:
				resubscribe = true // a full pass now and then, whatever was missed
			case <-tick.C:
				for key := range queue {
					delete(queue, key)
					s.recordStatus(ctx, key, pending)
				}
			}
		}
		cancel()
	}
}

// recordStatus appends the binding's live phase if the view records another one.
func (s *Service) recordStatus(ctx context.Context, key string, pending map[string]string) {
	b, ok := s.bindings.Get(key)
	if !ok {
		return
	}
	if b.Phase == projectv1.BindingPhase_BINDING_PHASE_TERMINATING {
		delete(pending, b.Id)
		return
	}
	live := s.present(b)
	state := live.Phase.String()
	if live.Phase == projectv1.BindingPhase_BINDING_PHASE_FAILED {
		state += "/" + live.Reason
	}
	stored := b.Phase.String()
	if b.Phase == projectv1.BindingPhase_BINDING_PHASE_FAILED {
		stored += "/" + b.Reason
	}
	if state == stored {
		delete(pending, b.Id)
		return
	}
	if pending[b.Id] == state {
		return
	}
	ev := &projectv1.NamespaceBindingStatusChanged{BindingId: b.Id, Project: b.Project, Cluster: b.Cluster, Namespace: b.Namespace,
		Phase: live.Phase, Reason: live.Reason, Message: live.Message}
	// Any expectation: the event states an observation and is ignored unless it names the
	// current binding; replicas recording the same transition twice change nothing.
	if _, err := s.store.Append(ctx, bindingSubject(b.Cluster, b.Namespace), b.Id, events.Any, ev); err != nil {
		if ctx.Err() == nil {
			s.log.Warn("record binding status", zap.String("cluster", b.Cluster), zap.String("namespace", b.Namespace), zap.Error(err))
		}
		return
	}
	pending[b.Id] = state
}

// bindingKeyOfDesired returns the bindings view key a desired key belongs to, or "".
func bindingKeyOfDesired(key string) string {
	parts, err := keys.Split(key)
	if err != nil || len(parts) != 4 {
		return ""
	}
	switch parts[1] {
	case kindNamespace:
		return bindingKey(parts[0], parts[3])
	case kindResourceQuota:
		return bindingKey(parts[0], parts[2])
	}
	return ""
}
