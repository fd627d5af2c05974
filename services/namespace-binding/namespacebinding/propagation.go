package namespacebinding

import (
	"context"
	"strings"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/view"
)

const propagationBuffer = 4096

// propagationKind is the kind of change a write of desired key carries out: a Namespace put is
// a bind, its tombstone an unbind; a ResourceQuota either way a quota change.
func propagationKind(key string, obj *desiredv1.DesiredObject) string {
	parts := strings.SplitN(key, ".", 3)
	if len(parts) > 1 && parts[1] == keys.Encode(kindResourceQuota) {
		return "quota"
	}
	if obj.GetTombstone() {
		return "unbind"
	}
	return "bind"
}

// report hands the agent's applied status of desired key to the measure. The bindings view
// and the desired view are projections of the same events by different engines, so when the
// Namespace was written the binding that follows a placement may not have been in the cache
// yet: by the agent's status it is (a binding is released only after its agent's status), and
// the change is classified again.
func (s *Service) report(key string, st *desiredv1.AppliedStatus) {
	if propagationKind(key, nil) != "quota" && s.followsPlacement(key) {
		s.prop.Reclassify(key, "placement")
	}
	s.prop.Reported(key, st)
}

// followsPlacement reports whether the binding desired key belongs to follows a placement: its
// Namespace is put and removed as the placement's decision moves, a change of kind "placement"
// rather than a bind or an unbind by hand.
func (s *Service) followsPlacement(key string) bool {
	if s.bindings == nil {
		return false
	}
	b, ok := s.bindings.Get(bindingKeyOfDesired(key))
	return ok && b.GetPlacement() != ""
}

// measurePropagation starts the propagation clock at each desired write (desired-namespaces is
// a projection of FLEET_NS, so the write's time is its event's plus the projection's lag) and
// stops it at the agent's applied status for that revision. Every replica measures the same
// changes, so a quantile over replicas is the same as one replica's. A subscription cut off for
// falling behind is made again (what it missed stays pending, bounded, until written again).
func (s *Service) measurePropagation(ctx context.Context, desired <-chan view.Update[*desiredv1.DesiredObject], applied <-chan view.Update[*desiredv1.AppliedStatus]) {
	prefix := keys.Encode(subjects.DesiredNamespacesBucket) + "."
	for {
		select {
		case <-ctx.Done():
			return
		case u, ok := <-desired:
			if !ok {
				desired = s.desired.Updates(ctx, propagationBuffer)
				continue
			}
			if u.Op != view.Put {
				s.prop.Forget(u.Key)
				continue
			}
			kind := propagationKind(u.Key, u.Value)
			if kind != "quota" && s.followsPlacement(u.Key) {
				kind = "placement"
			}
			s.prop.Written(u.Key, u.Revision, kind, u.Time)
			if st, ok := s.applied.Get(appliedKey(u.Key)); ok {
				s.report(u.Key, st)
			}
		case u, ok := <-applied:
			if !ok {
				applied = s.applied.Updates(ctx, propagationBuffer)
				continue
			}
			if u.Op == view.Put {
				s.report(strings.TrimPrefix(u.Key, prefix), u.Value)
			}
		}
	}
}
