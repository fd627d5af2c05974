package rbacsync_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetstream/fleetstream/pkg/reconcile"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// BenchmarkDesiredWriteShape weighs the fan-out's writes against a keyed controller's
// (docs/architecture.md, "Hub loops"): the 2,000 desired RoleBindings of benchmark (a), ~400
// bytes each, written into a bucket configured as desired-rbac, as the fan-out writes them
// (every put published, then every acknowledgement awaited) and as a reconcile.Controller
// keyed by desired key would (one put per reconcile, waiting for its acknowledgement) with 1,
// 16 and 64 workers. Reported: the median of 7 rounds of each, from the first write to the
// last acknowledgement.
func BenchmarkDesiredWriteShape(b *testing.B) {
	j := testkit.StartJetStream(b)
	ctx := testkit.Context(b, 10*time.Minute)
	kv, err := j.JS.CreateKeyValue(ctx, subjects.FeedBucketConfig("shape", "desired-rbac's configuration"))
	if err != nil {
		b.Fatal(err)
	}
	const n, rounds = benchClusters * benchNamespaces, 7
	key := func(i int) string {
		return fmt.Sprintf("c%03d.rb.ns%02d.fleetstream-viewer", i/benchNamespaces, i%benchNamespaces)
	}
	round := 0
	value := func() []byte { return append(bytes.Repeat([]byte{'x'}, 400), byte(round)) }
	pipelined := func() time.Duration {
		v := value()
		t0 := time.Now()
		futs := make([]jetstream.PubAckFuture, n)
		for i := range n {
			m := nats.NewMsg("$KV.shape." + key(i))
			m.Data = v
			if futs[i], err = j.JS.PublishMsgAsync(m); err != nil {
				b.Fatal(err)
			}
		}
		for _, f := range futs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				b.Fatal(err)
			}
		}
		return time.Since(t0)
	}
	controller := func(workers int) func() time.Duration {
		return func() time.Duration {
			v := value()
			c := reconcile.New(reconcile.Config{Name: fmt.Sprintf("shape-%d-%d", workers, round), Workers: workers},
				reconcile.Func(func(ctx context.Context, k string) error { _, err := kv.Put(ctx, k, v); return err }))
			rctx, cancel := context.WithCancel(ctx)
			var wg sync.WaitGroup
			wg.Go(func() { _ = c.Run(rctx) })
			defer func() { cancel(); wg.Wait() }()
			if err := c.Sync(ctx); err != nil { // running
				b.Fatal(err)
			}
			t0 := time.Now()
			for i := range n {
				c.Add(key(i))
			}
			if err := c.Sync(ctx); err != nil {
				b.Fatal(err)
			}
			return time.Since(t0)
		}
	}
	pipelined() // the bucket's first keys, which every round after only updates
	b.ResetTimer()
	for range b.N {
		for _, m := range []struct {
			metric string
			f      func() time.Duration
		}{{"pipelined_ms", pipelined}, {"controller_1_worker_ms", controller(1)},
			{"controller_16_workers_ms", controller(16)}, {"controller_64_workers_ms", controller(64)}} {
			var ds []time.Duration
			for range rounds {
				round++
				ds = append(ds, m.f())
			}
			slices.Sort(ds)
			b.ReportMetric(ms(ds[rounds/2]), m.metric)
		}
	}
}
