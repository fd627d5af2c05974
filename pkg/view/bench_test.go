package view_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/view"
)

const (
	benchEvents     = 20000
	benchKeys       = 1000
	benchPublishers = 16
)

// BenchmarkAppendProjectVisible measures events appended (with optimistic-concurrency headers
// and message ids) → projected → written to the view, per second, against raw nats.go doing the
// same publishes, a durable consumer with explicit acks and a KV put per message, on the same
// embedded server in the same run. Reported: fleet_ev/s, raw_ev/s and their ratio (goal ≥ 0.7).
func BenchmarkAppendProjectVisible(b *testing.B) {
	var fleetRate, rawRate float64
	for i := 0; i < b.N; i++ {
		fleetRate += runFleetPipeline(b)
		rawRate += runRawPipeline(b)
	}
	fleetRate /= float64(b.N)
	rawRate /= float64(b.N)
	b.ReportMetric(fleetRate, "fleet_ev/s")
	b.ReportMetric(rawRate, "raw_ev/s")
	b.ReportMetric(fleetRate/rawRate, "ratio")
}

func sampleEvent(i int) (string, proto.Message) {
	key := fmt.Sprintf("k%04d", i%benchKeys)
	return key, &clusterv1.ClusterUpdated{Id: key, Fields: []string{"labels"}, Labels: map[string]string{"env": "prod", "seq": fmt.Sprint(i)}}
}

func runFleetPipeline(b *testing.B) float64 {
	j := testkit.StartJetStream(b)
	ensureStream(b, j.JS)
	ctx := testkit.Context(b, 5*time.Minute)
	store := events.NewStore(j.JS, "bench")
	// Register every key first (not timed) so updates have something to apply to.
	for k := 0; k < benchKeys; k++ {
		key := fmt.Sprintf("k%04d", k)
		if _, err := store.Append(ctx, "test."+key, key, events.Empty, &clusterv1.ClusterRegistered{Id: key, Name: key}); err != nil {
			b.Fatal(err)
		}
	}
	e, cancel, _ := runEngine(b, j.JS, testProjection(1))
	defer cancel()
	<-e.Ready()
	start := time.Now()
	var next atomic.Int64
	var last atomic.Uint64
	var wg sync.WaitGroup
	for w := 0; w < benchPublishers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= benchEvents {
					return
				}
				key, ev := sampleEvent(i)
				seq, err := store.Append(ctx, "test."+key, key, events.Any, ev)
				if err != nil {
					b.Error(err)
					return
				}
				for {
					cur := last.Load()
					if seq <= cur || last.CompareAndSwap(cur, seq) {
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	if err := e.WaitApplied(ctx, last.Load()); err != nil {
		b.Fatal(err)
	}
	return benchEvents / time.Since(start).Seconds()
}

func runRawPipeline(b *testing.B) float64 {
	j := testkit.StartJetStream(b)
	ensureStream(b, j.JS)
	ctx := testkit.Context(b, 5*time.Minute)
	kv, err := j.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "RAW", History: 1})
	if err != nil {
		b.Fatal(err)
	}
	cons, err := j.JS.CreateOrUpdateConsumer(ctx, "TEST", jetstream.ConsumerConfig{
		Durable: "raw", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1024,
	})
	if err != nil {
		b.Fatal(err)
	}
	payloads := make([][]byte, benchEvents)
	keysOf := make([]string, benchEvents)
	for i := range payloads {
		key, ev := sampleEvent(i)
		env, err := events.NewEnvelope(ctx, key, ev, "bench")
		if err != nil {
			b.Fatal(err)
		}
		payloads[i], _ = proto.Marshal(env)
		keysOf[i] = key
	}
	var consumed atomic.Int64
	done := make(chan struct{})
	cctx, err := cons.Consume(func(m jetstream.Msg) {
		key := m.Subject()[len("test."):]
		if _, err := kv.Put(ctx, key, m.Data()); err != nil {
			b.Error(err)
		}
		_ = m.Ack()
		if consumed.Add(1) == benchEvents {
			close(done)
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	defer cctx.Stop()
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < benchPublishers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= benchEvents {
					return
				}
				if _, err := j.JS.Publish(ctx, "test."+keysOf[i], payloads[i], jetstream.WithMsgID(fmt.Sprint("raw-", i))); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case <-done:
	case <-ctx.Done():
		b.Fatal("raw consumer did not finish")
	}
	return benchEvents / time.Since(start).Seconds()
}

// BenchmarkRebuild100kKeys measures rebuilding a 100,000-key view from its stream (goal ≤ 5 s)
// against raw nats.go replaying the same stream with an ordered consumer and putting every
// message into a KV bucket with pipelined publishes, in the same run.
func BenchmarkRebuild100kKeys(b *testing.B) {
	const n = 100_000
	j := testkit.StartJetStream(b)
	ensureStream(b, j.JS)
	ctx := testkit.Context(b, 10*time.Minute)
	// Seed the stream fast with async publishes (not timed).
	for i := 0; i < n; i++ {
		key := fmt.Sprintf("k%06d", i)
		env, err := events.NewEnvelope(ctx, key, &clusterv1.ClusterRegistered{Id: key, Name: key, Labels: map[string]string{"env": "prod"}}, "bench")
		if err != nil {
			b.Fatal(err)
		}
		data, _ := proto.Marshal(env)
		if _, err := j.JS.PublishAsync("test."+key, data); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-j.JS.PublishAsyncComplete():
	case <-ctx.Done():
		b.Fatal("seeding timed out")
	}
	b.ResetTimer()
	var fleet, raw time.Duration
	for i := 0; i < b.N; i++ {
		start := time.Now()
		e, err := view.NewEngine(j.JS, testProjection(100+i), zap.NewNop(), view.WithBatch(2048))
		if err != nil {
			b.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		go func() { _ = e.Run(rctx) }()
		if err := e.WaitApplied(ctx, n); err != nil {
			b.Fatal(err)
		}
		fleet += time.Since(start)
		cancel()

		start = time.Now()
		rawReplay(b, ctx, j.JS, n, i)
		raw += time.Since(start)
	}
	b.ReportMetric(fleet.Seconds()/float64(b.N), "fleet_rebuild_s")
	b.ReportMetric(raw.Seconds()/float64(b.N), "raw_replay_put_s")
	b.ReportMetric(raw.Seconds()/fleet.Seconds(), "ratio")
}

func rawReplay(b *testing.B, ctx context.Context, js jetstream.JetStream, n, round int) {
	bucket := fmt.Sprintf("RAWREBUILD%d", round)
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1}); err != nil {
		b.Fatal(err)
	}
	cons, err := js.OrderedConsumer(ctx, "TEST", jetstream.OrderedConsumerConfig{})
	if err != nil {
		b.Fatal(err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(4096))
	if err != nil {
		b.Fatal(err)
	}
	defer it.Stop()
	futures := make([]jetstream.PubAckFuture, 0, n)
	for i := 0; i < n; i++ {
		m, err := it.Next()
		if err != nil {
			b.Fatal(err)
		}
		f, err := js.PublishAsync("$KV."+bucket+"."+m.Subject()[len("test."):], m.Data())
		if err != nil {
			b.Fatal(err)
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			b.Fatal(err)
		}
	}
}

// BenchmarkViewAboveCacheLimit measures applying 20,000 updates to random entries of a view
// with 1×, 2× and 10× as many entries as the engine's cache holds (a cache of 2,000 here; the
// default is 200,000, too many to seed in a benchmark), each from a cold start that resumes at
// the checkpoint, and reports each size's rate and its ratio to the 1× rate of the same run.
func BenchmarkViewAboveCacheLimit(b *testing.B) {
	const limit, updates = 2_000, 20_000
	var base float64
	for _, times := range []int{1, 2, 10} {
		keys := limit * times
		j := testkit.StartJetStream(b)
		ensureStream(b, j.JS)
		ctx := testkit.Context(b, 10*time.Minute)
		publish := func(ev proto.Message, key string) {
			env, err := events.NewEnvelope(ctx, key, ev, "bench")
			if err != nil {
				b.Fatal(err)
			}
			data, _ := proto.Marshal(env)
			if _, err := j.JS.PublishAsync("test."+key, data); err != nil {
				b.Fatal(err)
			}
		}
		for i := 0; i < keys; i++ {
			key := fmt.Sprintf("k%06d", i)
			publish(&clusterv1.ClusterRegistered{Id: key, Name: key, Labels: map[string]string{"gen": "0"}}, key)
		}
		<-j.JS.PublishAsyncComplete()
		e, cancel, _ := runEngine(b, j.JS, testProjection(1), view.WithCacheLimit(limit))
		if err := e.WaitApplied(ctx, uint64(keys)); err != nil {
			b.Fatal(err)
		}
		cancel()
		rng := rand.New(rand.NewPCG(uint64(times), 7))
		var rate float64
		for n := 0; n < b.N; n++ {
			for i := 0; i < updates; i++ {
				key := fmt.Sprintf("k%06d", rng.IntN(keys))
				publish(&clusterv1.ClusterUpdated{Id: key, Labels: map[string]string{"gen": strconv.Itoa(i)}}, key)
			}
			<-j.JS.PublishAsyncComplete()
			target := uint64(keys + (n+1)*updates)
			start := time.Now()
			e, cancel, _ := runEngine(b, j.JS, testProjection(1), view.WithCacheLimit(limit))
			if err := e.WaitApplied(ctx, target); err != nil {
				b.Fatal(err)
			}
			rate += updates / time.Since(start).Seconds()
			cancel()
		}
		rate /= float64(b.N)
		if times == 1 {
			base = rate
		}
		b.ReportMetric(rate, fmt.Sprintf("ev/s_%dx", times))
		b.ReportMetric(rate/base, fmt.Sprintf("ratio_%dx", times))
	}
}
