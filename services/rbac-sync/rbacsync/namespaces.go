package rbacsync

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
//
// namespace-binding drops and rebuilds the bucket when its view cannot be trusted (another
// projection version, or a restored bucket without its checkpoint): the cache's reader then
// ends with "stream not found", and the source attaches again with a new cache, ending the
// subscriptions of the old one so the fan-out subscribes again (errResubscribe). Returning the
// reader's error instead stopped rbac-sync, and with it every service of a fleetd, which then
// never became ready (TestBackupOfARunningFleetdRestoresIntoANewOne under load).
type bindingSource struct {
	js     jetstream.JetStream
	bucket string
	log    *zap.Logger

	ready chan struct{}

	mu sync.Mutex
	// cur is the attached cache; nil until the bucket is first found.
	cur *attachment
	// installed is closed, and replaced, whenever another attachment is installed.
	installed chan struct{}
}

// attachment is one cache of the bucket; done is closed when its reader has ended.
type attachment struct {
	cache *view.Cache[*projectv1.NamespaceBinding]
	done  chan struct{}
}

func newBindingSource(js jetstream.JetStream, bucket string, log *zap.Logger) *bindingSource {
	return &bindingSource{js: js, bucket: bucket, log: log, ready: make(chan struct{}), installed: make(chan struct{})}
}

// Run waits for the bucket and mirrors it, attaching again whenever the bucket is dropped or
// replaced, until ctx ends.
func (b *bindingSource) Run(ctx context.Context) error {
	logged := false
	for ctx.Err() == nil {
		lctx, cancel := context.WithTimeout(ctx, bucketLookupTimeout)
		kv, err := b.js.KeyValue(lctx, b.bucket)
		cancel()
		switch {
		case err == nil:
			b.follow(ctx, kv)
			continue
		case errors.Is(err, jetstream.ErrBucketNotFound):
			// No bucket, no bindings yet (or it is being rebuilt: the old cache keeps answering
			// until the new one is attached).
			b.markReady()
			if !logged {
				b.log.Info("namespace-binding's view does not exist yet; no namespace bindings", zap.String("bucket", b.bucket))
				logged = true
			}
		case ctx.Err() == nil:
			b.log.Warn("namespace-binding's view unavailable; retrying", zap.String("bucket", b.bucket), zap.Error(err))
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
	return nil
}

// follow mirrors kv with a new cache, installed for the fan-out's subscriptions (which end with
// it), until view.Follow ends it: the bucket was dropped, or dropped and created again for a
// rebuild.
func (b *bindingSource) follow(ctx context.Context, kv jetstream.KeyValue) {
	a := &attachment{
		cache: view.NewCache(b.js, kv, func() *projectv1.NamespaceBinding { return &projectv1.NamespaceBinding{} }, b.log),
		done:  make(chan struct{}),
	}
	defer close(a.done)
	install := func() {
		b.mu.Lock()
		b.cur = a
		close(b.installed)
		b.installed = make(chan struct{})
		b.mu.Unlock()
	}
	err := view.Follow(ctx, kv, a.cache, install, b.markReady)
	switch {
	case ctx.Err() != nil:
	case errors.Is(err, view.ErrBucketReplaced):
		b.log.Info("namespace-binding's view was rebuilt or is gone; attaching again", zap.String("bucket", b.bucket))
	default:
		b.log.Info("namespace-binding's view ended (dropped for a rebuild?); attaching again", zap.String("bucket", b.bucket), zap.Error(err))
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// bucketLookupTimeout bounds each request that attaches the source.
const bucketLookupTimeout = 10 * time.Second

func (b *bindingSource) markReady() {
	select {
	case <-b.ready:
	default:
		close(b.ready)
	}
}

func (b *bindingSource) Ready() <-chan struct{} { return b.ready }

// live returns the attachment whose reader is running, or nil and a channel closed when another
// is installed.
func (b *bindingSource) live() (*attachment, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if a := b.cur; a != nil {
		select {
		case <-a.done:
		default:
			return a, nil
		}
	}
	return nil, b.installed
}

// subscribeTo subscribes to a's cache until ctx ends or a's reader does: the channel closes
// then, and the fan-out subscribes again, to the next attachment.
func subscribeTo(ctx context.Context, a *attachment, buf int) ([]view.Update[*projectv1.NamespaceBinding], uint64, <-chan view.Update[*projectv1.NamespaceBinding]) {
	sctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(ctx, cancel)
	go func() {
		select {
		case <-a.done:
		case <-sctx.Done():
		}
		stop()
		cancel()
	}()
	return a.cache.SubscribeAt(sctx, buf)
}

func (b *bindingSource) Subscribe(ctx context.Context, buf int) ([]nsUpdate, uint64, <-chan nsUpdate) {
	if a, _ := b.live(); a != nil {
		snap, at, in := subscribeTo(ctx, a, buf)
		out := make([]nsUpdate, len(snap))
		for i, u := range snap {
			out[i] = toNSUpdate(u)
		}
		return out, at, forward(ctx, in, buf)
	}
	// Not there (or being attached again): an empty snapshot, and everything in the bucket as
	// changes once it is.
	ch := make(chan nsUpdate, buf)
	go func() {
		var a *attachment
		for a == nil {
			var next <-chan struct{}
			if a, next = b.live(); a == nil {
				select {
				case <-next:
				case <-ctx.Done():
					close(ch)
					return
				}
			}
		}
		snap, at, in := subscribeTo(ctx, a, buf)
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
	for {
		a, next := b.live()
		if a != nil {
			return a.cache.Current(ctx)
		}
		select {
		case <-next:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
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
