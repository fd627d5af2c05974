package collector

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/lease"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// WriterLease is the lease whose holder writes bucket `endpoints` and cleans up weights of
// gone endpoints: every replica serves the API from its own memory, one writes.
const WriterLease = "endpoint-collector.writer"

// runWriter contends for WriterLease once the collector is ready, and while it holds it writes
// bucket `endpoints` and runs the weight cleanup.
func (c *Collector) runWriter(ctx context.Context) error {
	select {
	case <-c.ready:
	case <-ctx.Done():
		return nil
	}
	return lease.Run(ctx, c.js, WriterLease, lease.DefaultHolder(), c.leaseTTL, func(ctx context.Context) error {
		g, ctx := errgroup.WithContext(ctx)
		g.Go(func() error { return c.kv.run(ctx) })
		g.Go(func() error { return c.runWeightCleanup(ctx) })
		return g.Wait()
	}, lease.WithLogger(c.log), lease.WithReplicas(c.cfg.Replicas), lease.WithMetrics(c.leases))
}

// kvWriter mirrors the merged view into bucket `endpoints` for other services. It is derived
// state (rebuilt from the agent stream on restart), so writes are coalesced: each flush writes
// the latest snapshot of every service that changed since the last one, with async publishes
// to the bucket's subjects, and waits for their acks before the next round. It records changes
// only while it writes (holds WriterLease).
type kvWriter struct {
	c *Collector

	active atomic.Bool
	mu     sync.Mutex
	dirty  map[string]struct{}
}

func (w *kvWriter) mark(key string) {
	if !w.active.Load() {
		return
	}
	w.mu.Lock()
	w.dirty[key] = struct{}{}
	w.mu.Unlock()
}

// run writes the bucket until ctx ends (the lease is lost). It starts by rewriting every
// service and deleting the entries of services that are gone: what the previous writer wrote
// last is unknown.
func (w *kvWriter) run(ctx context.Context) error {
	w.active.Store(true)
	defer func() {
		w.active.Store(false)
		w.mu.Lock()
		w.dirty = map[string]struct{}{}
		w.mu.Unlock()
	}()
	for _, key := range w.c.store.keys() {
		w.mark(key)
	}
	w.dropVanished(ctx)
	t := time.NewTicker(w.c.cfg.ViewFlushInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			w.flush(ctx)
		}
	}
}

func (w *kvWriter) flush(ctx context.Context) {
	if ctx.Err() != nil {
		return // the lease is lost: not one more write
	}
	w.mu.Lock()
	if len(w.dirty) == 0 {
		w.mu.Unlock()
		return
	}
	batch := w.dirty
	w.dirty = make(map[string]struct{}, len(batch))
	w.mu.Unlock()

	var failed []string
	acks := make(map[string]jetstream.PubAckFuture, len(batch))
	for key := range batch {
		msg := nats.NewMsg("$KV." + subjects.EndpointsBucket + "." + bucketKey(key))
		if sn := w.c.store.snapshot(key); sn != nil {
			data, err := proto.Marshal(sn.serviceEndpoints(w.c.store.strs))
			if err != nil {
				w.c.log.Error("encode endpoints view", zap.String("service", key), zap.Error(err))
				continue
			}
			msg.Data = data
		} else {
			msg.Header.Set("KV-Operation", "DEL")
		}
		f, err := w.c.js.PublishMsgAsync(msg)
		if err != nil {
			failed = append(failed, key)
			continue
		}
		acks[key] = f
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for key, f := range acks {
		select {
		case <-f.Ok():
		case <-f.Err():
			failed = append(failed, key)
		case <-wctx.Done():
			failed = append(failed, key)
		}
	}
	if ctx.Err() != nil {
		return
	}
	if len(failed) > 0 {
		w.c.log.Warn("endpoints view not written; retrying", zap.Int("services", len(failed)))
		for _, key := range failed {
			w.mark(key)
		}
	}
}

// dropVanished deletes the entries of services that disappeared while no collector was writing:
// the bucket is derived state, and nothing else would ever remove them.
func (w *kvWriter) dropVanished(ctx context.Context) {
	kv, err := w.c.js.KeyValue(ctx, subjects.EndpointsBucket)
	if err != nil {
		w.c.log.Warn("endpoints view: open bucket", zap.Error(err))
		return
	}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		w.c.log.Warn("endpoints view: list keys", zap.Error(err))
		return
	}
	defer func() { _ = lister.Stop() }()
	for key := range lister.Keys() {
		parts, err := keys.Split(key)
		if err != nil || len(parts) != 2 && len(parts) != 3 {
			continue
		}
		svc := serviceKey(parts[0], parts[1])
		if len(parts) == 3 { // a project's view
			svc = projectKey(svc, parts[2])
		}
		if w.c.store.snapshot(svc) == nil {
			w.mark(svc)
		}
	}
}

// keys returns the key of every service and view served.
func (st *Store) keys() []string {
	st.mu.RLock()
	defer st.mu.RUnlock()
	out := make([]string, 0, st.services.len())
	st.services.each(func(sn *snapshot) { out = append(out, sn.key) })
	return out
}
