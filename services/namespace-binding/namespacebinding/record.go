package namespacebinding

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/events"
	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/reconcile"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// statusRecorder records the phase transitions agents cause in the bindings view, as
// NamespaceBindingStatusChanged events: the API derives the live phase on every read, but other
// services (rbac-sync withholds RoleBindings from a namespace that is another project's) read
// the view. Only changes of phase, or of a failure's reason, are recorded; usage never is. It is
// keyed by binding (bindings view key): a change of the binding, of its desired objects or of
// their agent's reports queues it, and every binding is looked at each StatusResync.
func (s *Service) statusRecorder() *reconcile.Controller {
	return reconcile.New(reconcile.Config{Name: "namespace-binding-status", Keys: func() []string { return keysOf(s.bindings) },
		Resync: s.cfg.StatusResync, Log: s.log}, &statusRecorder{s: s, pending: map[string]string{}})
}

// statusSources queue a binding for the status recorder.
func (s *Service) statusSources() []reconcile.Source {
	return []reconcile.Source{reconcile.Watch(s.bindings, nil), reconcile.Watch(s.desired, bindingOfDesired), reconcile.Watch(s.applied, bindingOfApplied)}
}

// keysOf lists every key of a cache.
func keysOf[T proto.Message](c *view.Cache[T]) []string {
	entries := c.Entries(nil)
	out := make([]string, len(entries))
	for i, e := range entries {
		out[i] = e.Key
	}
	return out
}

type statusRecorder struct {
	s  *Service
	mu sync.Mutex
	// pending are the statuses appended and not yet in the view: binding id → phase/reason
	// recorded, so a reconcile before the view shows one does not append it again.
	pending map[string]string
}

// Reconcile appends the binding's live phase if the view records another one.
func (r *statusRecorder) Reconcile(ctx context.Context, key string) error {
	s := r.s
	b, ok := s.bindings.Get(key)
	if !ok {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if b.Phase == projectv1.BindingPhase_BINDING_PHASE_TERMINATING {
		delete(r.pending, b.Id)
		return nil
	}
	phase, reason, message := s.livePhase(b)
	state := phase.String()
	if phase == projectv1.BindingPhase_BINDING_PHASE_FAILED {
		state += "/" + reason
	}
	stored := b.Phase.String()
	if b.Phase == projectv1.BindingPhase_BINDING_PHASE_FAILED {
		stored += "/" + b.Reason
	}
	if state == stored {
		delete(r.pending, b.Id)
		return nil
	}
	if r.pending[b.Id] == state {
		return nil
	}
	ev := &projectv1.NamespaceBindingStatusChanged{BindingId: b.Id, Project: b.Project, Cluster: b.Cluster, Namespace: b.Namespace,
		Phase: phase, Reason: reason, Message: message}
	// Any expectation: the event states an observation and is ignored unless it names the
	// current binding; replicas recording the same transition twice change nothing.
	if _, err := s.store.Append(ctx, bindingSubject(b.Cluster, b.Namespace), b.Id, events.Any, ev); err != nil {
		return fmt.Errorf("record status of namespace %s on cluster %s: %w", b.Namespace, b.Cluster, err)
	}
	r.pending[b.Id] = state
	return nil
}

// bindingOfDesired and bindingOfApplied queue the binding a desired object (or its agent's
// report) belongs to.
func bindingOfDesired(u view.Update[*desiredv1.DesiredObject]) []string {
	if bk := bindingKeyOfDesired(u.Key); bk != "" {
		return []string{bk}
	}
	return nil
}

func bindingOfApplied(u view.Update[*desiredv1.AppliedStatus]) []string {
	if bk := bindingKeyOfDesired(strings.TrimPrefix(u.Key, keys.Encode(subjects.DesiredNamespacesBucket)+".")); bk != "" {
		return []string{bk}
	}
	return nil
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
