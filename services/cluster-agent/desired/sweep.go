package desired

import (
	"context"

	"go.uber.org/zap"
)

// sweep is the prune pass of one bucket, run after each complete replay and every resync: it
// queues every key that a managed object carries but desired state no longer holds. The key's
// reconcile then prunes (see prune). A tombstone is present, so its object goes the tombstone
// way.
func (a *Applier) sweep(ctx context.Context, bucket string) error {
	if !a.store.isSynced(bucket) {
		return nil
	}
	// Managed objects are found through the informers: those of the known kinds and of every
	// kind in this bucket's desired state must run, or their objects would escape the prune.
	if err := a.ensureKnownInformers(ctx); err != nil {
		return err
	}
	for _, e := range a.store.list(bucket) {
		target, err := a.tombstoneTarget(e)
		if e.obj == nil || err != nil {
			continue
		}
		m, err := a.resolver.mapping(target.kind, "")
		if err == nil {
			err = a.informers.ensure(ctx, m.Resource)
		}
		if err != nil {
			// Reported by the key's own reconcile; objects of this kind escape this pass.
			a.log.Debug("sweep cannot watch a desired kind", zap.String("bucket", bucket), zap.Stringer("kind", target.kind), zap.Error(err))
		}
	}
	n := 0
	for _, qk := range a.informers.keys() {
		b, _, _ := splitQueueKey(qk)
		if b == bucket && a.ours(qk) && !a.store.has(qk) {
			a.queue.Add(qk)
			n++
		}
	}
	if n > 0 {
		a.log.Info("pruning objects no longer desired", zap.String("bucket", bucket), zap.Int("keys", n))
	}
	return nil
}
