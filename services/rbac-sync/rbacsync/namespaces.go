package rbacsync

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// nsUpdate is a namespace binding as the fan-out needs it: which project, if any, its place
// belongs to. grant is nil when the binding does not (or no longer) give its place to a project.
type nsUpdate struct {
	key   string
	grant *grantBinding
	// rev is the KV revision of the change in namespace-binding's view (view.Update.Revision).
	// An update with no key only marks that the subscription has reached rev.
	rev uint64
	// at is view.Update.Time: when the change was stored (zero in a snapshot).
	at time.Time
}

// namespaceSource is what the fan-out needs of namespace-binding's view.
type namespaceSource interface {
	Ready() <-chan struct{}
	// Subscribe is view.Cache.SubscribeAt: the snapshot, its position and the later changes.
	Subscribe(ctx context.Context, buf int) ([]nsUpdate, uint64, <-chan nsUpdate)
	// Current is view.Cache.Current.
	Current(ctx context.Context) (uint64, error)
}

// reasonOwnedByOther is the failure that means the namespace on the cluster belongs to
// another project (labelled for it): the project must get no RoleBindings there.
const reasonOwnedByOther = "OwnedByOther"

// grantsPlace decides whether a namespace binding gives its (cluster, namespace) to its project
// for RBAC purposes. A Pending binding grants, so a project's members have access as soon as
// the namespace exists and a binding being repaired does not flap their access; a Terminating
// one does not (unbinding removes the project's RoleBindings); a Failed one grants unless it
// failed because the namespace is another project's. Other failures (a quota that did not
// apply) leave the namespace the project's.
func grantsPlace(b *projectv1.NamespaceBinding) bool {
	switch b.GetPhase() {
	case projectv1.BindingPhase_BINDING_PHASE_TERMINATING:
		return false
	case projectv1.BindingPhase_BINDING_PHASE_FAILED:
		return b.GetReason() != reasonOwnedByOther
	}
	return true
}

// bindingSource adapts namespace-binding's view (read-only) to namespaceSource. The view's
// bucket is created by namespace-binding when it starts, before any binding can exist, so while
// the bucket is missing there are no bindings: the source is ready and empty, and attaches to
// the bucket when it appears (a hub may start rbac-sync first).
type bindingSource struct {
	js     jetstream.JetStream
	bucket string
	log    *zap.Logger

	ready    chan struct{}
	attached chan struct{}
	cache    *view.Cache[*projectv1.NamespaceBinding] // set before attached closes
}

func newBindingSource(js jetstream.JetStream, bucket string, log *zap.Logger) *bindingSource {
	return &bindingSource{js: js, bucket: bucket, log: log, ready: make(chan struct{}), attached: make(chan struct{})}
}

// Run waits for the bucket and mirrors it until ctx ends.
func (b *bindingSource) Run(ctx context.Context) error {
	logged := false
	for {
		kv, err := b.js.KeyValue(ctx, b.bucket)
		if err == nil {
			b.cache = view.NewCache(b.js, kv, func() *projectv1.NamespaceBinding { return &projectv1.NamespaceBinding{} }, b.log)
			close(b.attached)
			go func() {
				select {
				case <-b.cache.Ready():
					b.markReady()
				case <-ctx.Done():
				}
			}()
			return b.cache.Run(ctx)
		}
		if !errors.Is(err, jetstream.ErrBucketNotFound) {
			return fmt.Errorf("bucket %s: %w", b.bucket, err)
		}
		// No bucket, no bindings yet.
		b.markReady()
		if !logged {
			b.log.Info("namespace-binding's view does not exist yet; no namespace bindings", zap.String("bucket", b.bucket))
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (b *bindingSource) markReady() {
	select {
	case <-b.ready:
	default:
		close(b.ready)
	}
}

func (b *bindingSource) Ready() <-chan struct{} { return b.ready }

func (b *bindingSource) Subscribe(ctx context.Context, buf int) ([]nsUpdate, uint64, <-chan nsUpdate) {
	select {
	case <-b.attached:
		snap, at, in := b.cache.SubscribeAt(ctx, buf)
		out := make([]nsUpdate, len(snap))
		for i, u := range snap {
			out[i] = toNSUpdate(u)
		}
		return out, at, forward(ctx, in, buf)
	default:
	}
	// Not there yet: an empty snapshot, and everything in the bucket as changes once it is.
	ch := make(chan nsUpdate, buf)
	go func() {
		select {
		case <-b.attached:
		case <-ctx.Done():
			close(ch)
			return
		}
		snap, at, in := b.cache.SubscribeAt(ctx, buf)
		updates := make([]nsUpdate, 0, len(snap)+1)
		for _, u := range snap {
			updates = append(updates, toNSUpdate(u))
		}
		// The snapshot's position, which a delete before it leaves no update to carry.
		updates = append(updates, nsUpdate{rev: at})
		forwardInto(ctx, ch, updates, in)
	}()
	return nil, 0, ch
}

// Current is view.Cache.Current of namespace-binding's view; without the bucket there is
// nothing to take.
func (b *bindingSource) Current(ctx context.Context) (uint64, error) {
	if _, err := b.js.KeyValue(ctx, b.bucket); errors.Is(err, jetstream.ErrBucketNotFound) {
		return 0, nil
	} else if err != nil {
		return 0, fmt.Errorf("bucket %s: %w", b.bucket, err)
	}
	select {
	case <-b.attached:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return b.cache.Current(ctx)
}

// forward converts a cache subscription into namespace updates on a new channel.
func forward(ctx context.Context, in <-chan view.Update[*projectv1.NamespaceBinding], buf int) <-chan nsUpdate {
	ch := make(chan nsUpdate, buf)
	go forwardInto(ctx, ch, nil, in)
	return ch
}

// forwardInto sends first, then everything from in, converted, and closes ch when in closes:
// that passes on both the end of ctx and a cut-off subscription.
func forwardInto(ctx context.Context, ch chan<- nsUpdate, first []nsUpdate, in <-chan view.Update[*projectv1.NamespaceBinding]) {
	defer close(ch)
	for _, u := range first {
		select {
		case ch <- u:
		case <-ctx.Done():
			return
		}
	}
	for u := range in {
		select {
		case ch <- toNSUpdate(u):
		case <-ctx.Done():
			return
		}
	}
}

func toNSUpdate(u view.Update[*projectv1.NamespaceBinding]) nsUpdate {
	if u.Op == view.Delete || !grantsPlace(u.Value) {
		return nsUpdate{key: u.Key, rev: u.Revision, at: u.Time}
	}
	b := u.Value
	return nsUpdate{key: u.Key, rev: u.Revision, at: u.Time, grant: &grantBinding{project: b.Project, place: place{b.Cluster, b.Namespace}}}
}
