package desired

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/wait"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	"github.com/fleetstream/fleetstream/pkg/kvfeed"
)

// Backoff between attempts to watch a bucket: it may not exist yet (its owning service has not
// started) or the hub may be unreachable or too busy to create the watch's consumer in time.
// Each wait is drawn from the upper half of the current step: after a hub restart thousands of
// agents fail together, and without jitter they would retry together, every 5 s, into a
// server still creating the consumers they gave up on (10,000 clusters, docs/scale.md).
const (
	watchRetryBase = 250 * time.Millisecond
	watchRetryMax  = 5 * time.Second
)

// feedResync is how often a watch replays even though nothing suggested it missed a change
// (pkg/kvfeed: the safety net for a change no NATS node republished).
const feedResync = 15 * time.Minute

// watchBucket keeps a watch on this cluster's keys of bucket until ctx ends, re-establishing it
// (with a fresh replay) whenever it ends: at once when it asked for a resync, after a backoff
// when it failed. A watch that ended is resumed, not started anew, so that it keeps its
// subscription (pkg/kvfeed: after a hub restart every agent resyncs at once).
func (a *Applier) watchBucket(ctx context.Context, bucket string) {
	var w *kvfeed.Watcher
	defer func() {
		if w != nil {
			_ = w.Stop()
		}
	}()
	delay := watchRetryBase
	for ctx.Err() == nil {
		started := time.Now()
		var (
			replayed bool
			err      error
		)
		w, replayed, err = a.watchOnce(ctx, bucket, w)
		if ctx.Err() != nil {
			return
		}
		if replayed {
			delay = watchRetryBase
		}
		pause := wait.Jitter(delay/2, 1)
		switch {
		case errors.Is(err, kvfeed.ErrResync) && replayed && time.Since(started) > watchRetryMax:
			// A resync right after the last one backs off instead: never a busy loop of replays.
			a.log.Info("desired watch resyncing", zap.String("bucket", bucket), zap.Error(err))
			continue
		case errors.Is(err, jetstream.ErrBucketNotFound):
			a.log.Debug("desired bucket does not exist yet", zap.String("bucket", bucket))
		default:
			a.log.Warn("desired watch failed; retrying", zap.String("bucket", bucket), zap.Duration("in", pause), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		delay = min(2*delay, watchRetryMax)
	}
}

// watchOnce replays this cluster's keys of bucket and then streams changes into the store,
// until the watch ends. It resumes prev when there is one, and returns the watch (nil when none
// could be made, to be stopped by the caller) and whether the replay completed.
func (a *Applier) watchOnce(ctx context.Context, bucket string, prev *kvfeed.Watcher) (w *kvfeed.Watcher, replayed bool, err error) {
	// Only the latest value per key: history would replay superseded objects.
	if prev != nil {
		w, err = prev.Resume(ctx)
	} else {
		w, err = kvfeed.Watch(ctx, a.js, bucket, a.keyPrefix+".>", kvfeed.Options{Resync: feedResync})
	}
	if err != nil {
		return nil, false, err
	}
	a.store.beginReplay(bucket)
	for e := range w.Updates() {
		if e == nil {
			// The replay is complete: this bucket's view is whole, so absence now means
			// "no longer desired" and a prune pass may run.
			replayed = true
			for _, qk := range a.store.endReplay(bucket) {
				a.queue.Add(qk)
			}
			a.queue.Add(queueKey(bucket, sweepKey))
			a.log.Info("desired state replayed", zap.String("bucket", bucket), zap.Int("keys", len(a.store.list(bucket))), zap.Bool("live", w.Live()))
			continue
		}
		a.observe(bucket, e)
	}
	if ctx.Err() != nil {
		return w, replayed, nil
	}
	if err := w.Err(); err != nil {
		return w, replayed, err
	}
	return w, replayed, fmt.Errorf("watch of %s ended", bucket)
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
