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

// BenchmarkAppendProjectVisible measures events appended → projected → visible in the view,
// per second, against the raw nats.go an expert would write for the same work, on the same
// embedded server in the same run, in three lines so the cost of each stage shows:
//
//   - e2e: 16 concurrent appenders (ours: events.Store.Append, with message id and CloudEvents
//     headers; raw: js.Publish of a pre-marshalled envelope with a message id) while the
//     projection runs, until the last event is visible. Reported: fleet_ev/s, raw_ev/s, ratio
//     (goal ≥ 0.7).
//   - publish only: the same 16 appenders, no projection. pub_fleet_ev/s, pub_raw_ev/s, pub_ratio.
//   - catch-up: the same events already in the stream, projection start → the last one visible.
//     catchup_fleet_ev/s, catchup_raw_ev/s, catchup_ratio.
//
// The raw projection (rawProjector) consumes as the engine does — an ordered consumer, a batch
// of whatever is buffered, each touched key written once per batch with pipelined publishes to
// $KV.<bucket>.<key>, one compare-and-set checkpoint per batch — but does less work: it writes
// the message's bytes as they came, with no envelope decode, no projection and no encode.
//
// Run with -benchtime 4x: the order of the two sides alternates between iterations.
func BenchmarkAppendProjectVisible(b *testing.B) {
	var fleet, raw, pubFleet, pubRaw, cuFleet, cuRaw float64
	for i := 0; i < b.N; i++ {
		// Alternate which side goes first, so neither always meets the machine's load first.
		if i%2 == 0 {
			fleet += runFleetPipeline(b, true)
			raw += runRawPipeline(b, true)
			pubFleet += runFleetPipeline(b, false)
			pubRaw += runRawPipeline(b, false)
		} else {
			raw += runRawPipeline(b, true)
			fleet += runFleetPipeline(b, true)
			pubRaw += runRawPipeline(b, false)
			pubFleet += runFleetPipeline(b, false)
		}
		f, r := runCatchUp(b, i%2 == 1)
		cuFleet += f
		cuRaw += r
	}
	n := float64(b.N)
	b.ReportMetric(fleet/n, "fleet_ev/s")
	b.ReportMetric(raw/n, "raw_ev/s")
	b.ReportMetric(fleet/raw, "ratio")
	b.ReportMetric(pubFleet/n, "pub_fleet_ev/s")
	b.ReportMetric(pubRaw/n, "pub_raw_ev/s")
	b.ReportMetric(pubFleet/pubRaw, "pub_ratio")
	b.ReportMetric(cuFleet/n, "catchup_fleet_ev/s")
	b.ReportMetric(cuRaw/n, "catchup_raw_ev/s")
	b.ReportMetric(cuFleet/cuRaw, "catchup_ratio")
}

func sampleEvent(i int) (string, proto.Message) {
	key := fmt.Sprintf("k%04d", i%benchKeys)
	return key, &clusterv1.ClusterUpdated{Id: key, Fields: []string{"labels"}, Labels: map[string]string{"env": "prod", "seq": fmt.Sprint(i)}}
}

func registerEvent(k int) (string, proto.Message) {
	key := fmt.Sprintf("k%04d", k)
	return key, &clusterv1.ClusterRegistered{Id: key, Name: key}
}

// appendConcurrently runs benchPublishers appenders over events 0..benchEvents-1 and returns
// the highest stream sequence they got.
func appendConcurrently(b *testing.B, publish func(i int) (uint64, error)) uint64 {
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
				seq, err := publish(i)
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
	if b.Failed() {
		b.FailNow()
	}
	return last.Load()
}

// runFleetPipeline appends benchEvents updates with events.Store (keys registered first, not
// timed) and, with project, runs the engine until the last is applied.
func runFleetPipeline(b *testing.B, project bool) float64 {
	j := testkit.StartJetStream(b)
	ensureStream(b, j.JS)
	ctx := testkit.Context(b, 5*time.Minute)
	store := events.NewStore(j.JS, "bench")
	// Register every key first (not timed) so updates have something to apply to.
	for k := 0; k < benchKeys; k++ {
		key, ev := registerEvent(k)
		if _, err := store.Append(ctx, "test."+key, key, events.Empty, ev); err != nil {
			b.Fatal(err)
		}
	}
	var e *view.Engine
	if project {
		var cancel context.CancelFunc
		e, cancel, _ = runEngine(b, j.JS, testProjection(1))
		defer cancel()
		if err := e.WaitApplied(ctx, benchKeys); err != nil {
			b.Fatal(err)
		}
	}
	start := time.Now()
	last := appendConcurrently(b, func(i int) (uint64, error) {
		key, ev := sampleEvent(i)
		return store.Append(ctx, "test."+key, key, events.Any, ev)
	})
	if project {
		if err := e.WaitApplied(ctx, last); err != nil {
			b.Fatal(err)
		}
	}
	return benchEvents / time.Since(start).Seconds()
}

// encodedEvents returns the envelopes of the register events and of the benchEvents updates,
// marshalled ahead (the raw publisher is not charged for encoding).
func encodedEvents(b *testing.B, ctx context.Context) (regs, updates [][]byte, regKeys, updKeys []string) {
	enc := func(key string, ev proto.Message) []byte {
		env, err := events.NewEnvelope(ctx, key, ev, "bench")
		if err != nil {
			b.Fatal(err)
		}
		data, err := proto.Marshal(env)
		if err != nil {
			b.Fatal(err)
		}
		return data
	}
	for k := 0; k < benchKeys; k++ {
		key, ev := registerEvent(k)
		regs, regKeys = append(regs, enc(key, ev)), append(regKeys, key)
	}
	for i := 0; i < benchEvents; i++ {
		key, ev := sampleEvent(i)
		updates, updKeys = append(updates, enc(key, ev)), append(updKeys, key)
	}
	return regs, updates, regKeys, updKeys
}

// runRawPipeline is runFleetPipeline in raw nats.go: the same keys registered first, the same
// 16 appenders publishing synchronously with message ids and, with project, a rawProjector
// until the last event is visible.
func runRawPipeline(b *testing.B, project bool) float64 {
	j := testkit.StartJetStream(b)
	ensureStream(b, j.JS)
	ctx := testkit.Context(b, 5*time.Minute)
	regs, updates, regKeys, updKeys := encodedEvents(b, ctx)
	for k, data := range regs {
		if _, err := j.JS.Publish(ctx, "test."+regKeys[k], data, jetstream.WithMsgID(fmt.Sprint("raw-reg-", k))); err != nil {
			b.Fatal(err)
		}
	}
	var p *rawProjector
	if project {
		p = startRawProjector(b, ctx, j.JS, "RAW")
		defer p.stop()
		p.wait(b, ctx, benchKeys)
	}
	start := time.Now()
	last := appendConcurrently(b, func(i int) (uint64, error) {
		ack, err := j.JS.Publish(ctx, "test."+updKeys[i], updates[i], jetstream.WithMsgID(fmt.Sprint("raw-", i)))
		if err != nil {
			return 0, err
		}
		return ack.Sequence, nil
	})
	if project {
		p.wait(b, ctx, last)
	}
	return benchEvents / time.Since(start).Seconds()
}

// runCatchUp preloads the registers and updates (async publishes, not timed), then times the
// engine and a rawProjector (rawFirst: in that order), each from its start until the last
// event is visible in its bucket.
func runCatchUp(b *testing.B, rawFirst bool) (fleet, raw float64) {
	j := testkit.StartJetStream(b)
	ensureStream(b, j.JS)
	ctx := testkit.Context(b, 5*time.Minute)
	regs, updates, regKeys, updKeys := encodedEvents(b, ctx)
	// In rounds of 1,000, under the client's limit of outstanding async publishes (4,000),
	// which a loaded machine otherwise hits.
	preload := func(keys []string, data [][]byte) {
		for i := range data {
			if _, err := j.JS.PublishAsync("test."+keys[i], data[i]); err != nil {
				b.Fatal(err)
			}
			if i%1000 == 999 || i == len(data)-1 {
				select {
				case <-j.JS.PublishAsyncComplete():
				case <-ctx.Done():
					b.Fatal("preloading timed out")
				}
			}
		}
	}
	preload(regKeys, regs)
	preload(updKeys, updates)
	last := uint64(benchKeys + benchEvents)
	n := float64(last)

	runFleet := func() {
		start := time.Now()
		e, cancel, _ := runEngine(b, j.JS, testProjection(1))
		if err := e.WaitApplied(ctx, last); err != nil {
			b.Fatal(err)
		}
		fleet = n / time.Since(start).Seconds()
		cancel()
	}
	runRaw := func() {
		start := time.Now()
		p := startRawProjector(b, ctx, j.JS, "RAWCATCHUP")
		p.wait(b, ctx, last)
		raw = n / time.Since(start).Seconds()
		p.stop()
	}
	if rawFirst {
		runRaw()
		runFleet()
	} else {
		runFleet()
		runRaw()
	}
	return fleet, raw
}

// rawProjector is what a nats.go expert would write to keep a KV view of a stream: an ordered
// consumer from the start pulling 2×view.DefaultBatch, a batch of whatever is already buffered
// (up to view.DefaultBatch, 512, the engine's default), the last message of each key in the batch written once with pipelined async
// publishes to $KV.<bucket>.<key>, and then one checkpoint per batch with a compare-and-set
// (kv.Update), as the engine does.
type rawProjector struct {
	mu      sync.Mutex
	applied uint64
	changed chan struct{}
	cancel  context.CancelFunc
	done    chan struct{}
}

func startRawProjector(b *testing.B, ctx context.Context, js jetstream.JetStream, bucket string) *rawProjector {
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1})
	if err != nil {
		b.Fatal(err)
	}
	metaRev, err := kv.Create(ctx, "checkpoint", []byte("0"))
	if err != nil {
		b.Fatal(err)
	}
	cons, err := js.OrderedConsumer(ctx, "TEST", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"test.>"}})
	if err != nil {
		b.Fatal(err)
	}
	const batchMax = view.DefaultBatch
	it, err := cons.Messages(jetstream.PullMaxMessages(2 * batchMax))
	if err != nil {
		b.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	p := &rawProjector{changed: make(chan struct{}), cancel: cancel, done: make(chan struct{})}
	prefix := "$KV." + bucket + "."
	go func() {
		defer close(p.done)
		defer it.Stop()
		go func() { <-rctx.Done(); it.Stop() }()
		batch := make([]jetstream.Msg, 0, batchMax)
		latest := make(map[string]int, batchMax)
		futures := make([]jetstream.PubAckFuture, 0, batchMax)
		for {
			m, err := it.Next()
			if err != nil {
				return
			}
			batch = append(batch[:0], m)
			for len(batch) < batchMax {
				m, err := it.Next(jetstream.NextMaxWait(100 * time.Microsecond))
				if err != nil {
					break
				}
				batch = append(batch, m)
			}
			clear(latest)
			for i, m := range batch {
				latest[m.Subject()[len("test."):]] = i
			}
			futures = futures[:0]
			for key, i := range latest {
				f, err := js.PublishAsync(prefix+key, batch[i].Data())
				if err != nil {
					b.Error(err)
					return
				}
				futures = append(futures, f)
			}
			for _, f := range futures {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					b.Error(err)
					return
				case <-rctx.Done():
					return
				}
			}
			md, err := batch[len(batch)-1].Metadata()
			if err != nil {
				b.Error(err)
				return
			}
			seq := md.Sequence.Stream
			if metaRev, err = kv.Update(rctx, "checkpoint", strconv.AppendUint(nil, seq, 10), metaRev); err != nil {
				if rctx.Err() == nil {
					b.Error(err)
				}
				return
			}
			p.mu.Lock()
			p.applied = seq
			close(p.changed)
			p.changed = make(chan struct{})
			p.mu.Unlock()
		}
	}()
	return p
}

// wait returns when the projector's checkpoint has reached seq.
func (p *rawProjector) wait(b *testing.B, ctx context.Context, seq uint64) {
	for {
		p.mu.Lock()
		applied, changed := p.applied, p.changed
		p.mu.Unlock()
		if applied >= seq {
			return
		}
		select {
		case <-changed:
		case <-p.done:
			b.Fatalf("raw projector stopped at %d, before %d", applied, seq)
		case <-ctx.Done():
			b.Fatalf("raw projector at %d, not %d: %v", applied, seq, ctx.Err())
		}
	}
}

func (p *rawProjector) stop() {
	p.cancel()
	<-p.done
}

// BenchmarkRebuild100kKeys measures rebuilding a 100,000-key view from its stream (goal ≤ 5 s)
// against raw nats.go replaying the same stream with an ordered consumer and putting every
// message into a KV bucket with pipelined publishes, in the same run.
//
// Timed for ours: view.NewEngine with the deployed settings (no options, so batch
// view.DefaultBatch and a pull of twice that, as every service runs it) → Run → WaitApplied
// sees the 100,000th event applied. For raw: creating the consumer → the 100,000th put
// acknowledged, pulling 2×view.DefaultBatch as the engine does. Each iteration starts from a
// new view and a new bucket; the order of the two sides alternates between iterations (ABBA
// over -benchtime 4x), so neither always runs first on a warm server.
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
		// Wait out a full publish window (a loaded machine stalls it) instead of failing.
		if _, err := j.JS.PublishAsync("test."+key, data, jetstream.WithStallWait(30*time.Second)); err != nil {
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
	runFleet := func(i int) {
		start := time.Now()
		e, err := view.NewEngine(j.JS, testProjection(100+i), zap.NewNop())
		if err != nil {
			b.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() { _ = e.Run(rctx) }()
		if err := e.WaitApplied(ctx, n); err != nil {
			b.Fatal(err)
		}
		fleet += time.Since(start)
	}
	runRaw := func(i int) {
		start := time.Now()
		rawReplay(b, ctx, j.JS, n, i)
		raw += time.Since(start)
	}
	for i := 0; i < b.N; i++ {
		// ABBA: ours first in iterations 0 and 3 (mod 4), raw first in 1 and 2.
		if i%4 == 0 || i%4 == 3 {
			runFleet(i)
			runRaw(i)
		} else {
			runRaw(i)
			runFleet(i)
		}
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
	it, err := cons.Messages(jetstream.PullMaxMessages(2 * view.DefaultBatch))
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
		f, err := js.PublishAsync("$KV."+bucket+"."+m.Subject()[len("test."):], m.Data(), jetstream.WithStallWait(30*time.Second))
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
