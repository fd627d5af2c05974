package desired

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
)

// Backoff between attempts to watch a bucket: it may not exist yet (its owning service has not
// started) or the hub may be unreachable.
const (
	watchRetryBase = 250 * time.Millisecond
	watchRetryMax  = 5 * time.Second
)

// watchBucket keeps a watch on this cluster's keys of bucket until ctx ends, re-establishing it
// (with a fresh replay) whenever it fails.
func (a *Applier) watchBucket(ctx context.Context, bucket string) {
	delay := watchRetryBase
	for ctx.Err() == nil {
		replayed, err := a.watchOnce(ctx, bucket)
		if ctx.Err() != nil {
			return
		}
		if replayed {
			delay = watchRetryBase
		}
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			a.log.Debug("desired bucket does not exist yet", zap.String("bucket", bucket))
		} else {
			a.log.Warn("desired watch failed; retrying", zap.String("bucket", bucket), zap.Duration("in", delay), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, watchRetryMax)
	}
}

// watchOnce replays this cluster's keys of bucket and then streams changes into the store,
// until the watch ends. It reports whether the replay completed.
func (a *Applier) watchOnce(ctx context.Context, bucket string) (replayed bool, err error) {
	kv, err := a.js.KeyValue(ctx, bucket)
	if err != nil {
		return false, fmt.Errorf("open bucket %s: %w", bucket, err)
	}
	// Only the latest value per key: history would replay superseded objects.
	w, err := kv.Watch(ctx, a.keyPrefix+".>")
	if err != nil {
		return false, fmt.Errorf("watch %s %s.>: %w", bucket, a.keyPrefix, err)
	}
	defer func() { _ = w.Stop() }()
	a.store.beginReplay(bucket)
	for {
		select {
		case <-ctx.Done():
			return replayed, nil
		case e, ok := <-w.Updates():
			if !ok {
				return replayed, fmt.Errorf("watch of %s closed", bucket)
			}
			if e == nil {
				// The replay is complete: this bucket's view is whole, so absence now means
				// "no longer desired" and a prune pass may run.
				replayed = true
				for _, qk := range a.store.endReplay(bucket) {
					a.queue.Add(qk)
				}
				a.queue.Add(queueKey(bucket, sweepKey))
				a.log.Info("desired state replayed", zap.String("bucket", bucket), zap.Int("keys", len(a.store.list(bucket))))
				continue
			}
			a.observe(bucket, e)
		}
	}
}

// observe records one watched entry and queues its key.
func (a *Applier) observe(bucket string, e jetstream.KeyValueEntry) {
	qk := queueKey(bucket, e.Key())
	switch e.Operation() {
	case jetstream.KeyValueDelete, jetstream.KeyValuePurge:
		a.store.remove(qk)
	default:
		ent := entry{bucket: bucket, key: e.Key(), revision: e.Revision()}
		obj := &desiredv1.DesiredObject{}
		if err := proto.Unmarshal(e.Value(), obj); err != nil {
			ent.decodeErr = err
			a.log.Warn("malformed desired object", zap.String("key", qk), zap.Uint64("revision", e.Revision()), zap.Error(err))
		} else {
			ent.obj = obj
		}
		a.store.put(ent)
	}
	a.queue.Add(qk)
}
