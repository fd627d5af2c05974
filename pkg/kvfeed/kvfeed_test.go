package kvfeed_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetstream/fleetstream/pkg/kvfeed"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

const bucket = "desired-test"

func newBucket(t *testing.T, js jetstream.JetStream, republish bool) jetstream.KeyValue {
	t.Helper()
	// A republishing bucket is configured as the hub configures the buckets agents watch; one
	// without is a hub older than its agents.
	cfg := jetstream.KeyValueConfig{Bucket: bucket, History: 1}
	if republish {
		cfg = subjects.FeedBucketConfig(bucket, "")
	}
	kv, err := js.CreateOrUpdateKeyValue(testkit.Context(t, 10*time.Second), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// view folds a Watcher's updates into key → value, as the agent's store does.
type view struct {
	w        *kvfeed.Watcher
	values   map[string]string
	replayed bool
}

func watch(t *testing.T, js jetstream.JetStream, filter string, o kvfeed.Options) *view {
	t.Helper()
	w, err := kvfeed.Watch(testkit.Context(t, time.Minute), js, bucket, filter, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	return &view{w: w, values: map[string]string{}}
}

// until reads updates until cond holds; it fails on a closed Watcher or after 10 s.
func (v *view) until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for !cond() {
		select {
		case e, ok := <-v.w.Updates():
			if !ok {
				t.Fatalf("%s: watcher ended: %v", what, v.w.Err())
			}
			v.apply(e)
		case <-deadline:
			t.Fatalf("%s: not within 10 s; have %v (replayed %v)", what, v.values, v.replayed)
		}
	}
}

func (v *view) apply(e jetstream.KeyValueEntry) {
	switch {
	case e == nil:
		v.replayed = true
	case e.Operation() == jetstream.KeyValuePut:
		v.values[e.Key()] = string(e.Value())
	default:
		delete(v.values, e.Key())
	}
}

// ended waits for the Watcher to end and returns why.
func (v *view) ended(t *testing.T) error {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case e, ok := <-v.w.Updates():
			if !ok {
				return v.w.Err()
			}
			v.apply(e)
		case <-deadline:
			t.Fatal("watcher did not end within 10 s")
		}
	}
}

func put(t *testing.T, kv jetstream.KeyValue, key, value string) uint64 {
	t.Helper()
	rev, err := kv.PutString(context.Background(), key, value)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

func consumers(t testing.TB, js jetstream.JetStream) int {
	t.Helper()
	s, err := js.Stream(context.Background(), "KV_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Consumers
}

// The point of the package: a watcher replays its own keys, then follows their changes with no
// JetStream consumer left on the stream, and never sees another cluster's keys.
func TestReplayThenChangesWithoutAConsumer(t *testing.T) {
	j := testkit.StartJetStream(t)
	kv := newBucket(t, j.JS, true)
	put(t, kv, "c1.ns.a", "1")
	put(t, kv, "c1.ns.b", "1")
	put(t, kv, "c2.ns.a", "other")
	if err := kv.Delete(context.Background(), "c1.ns.b"); err != nil {
		t.Fatal(err)
	}

	v := watch(t, j.JS, "c1.>", kvfeed.Options{Settle: 50 * time.Millisecond})
	if !v.w.Live() {
		t.Fatal("a republishing bucket is not followed live")
	}
	v.until(t, "replay", func() bool { return v.replayed })
	if fmt.Sprint(v.values) != "map[c1.ns.a:1]" {
		t.Fatalf("replay = %v, want only c1.ns.a", v.values)
	}
	// The replay's consumer is not deleted by a request: the server deletes it once it has had
	// no subscriber for its inactive threshold (2 s, and up to 1 s more).
	testkit.Eventually(t, 10*time.Second, func() error {
		if n := consumers(t, j.JS); n != 0 {
			return fmt.Errorf("%d consumers on the stream after the replay settled", n)
		}
		return nil
	})

	put(t, kv, "c2.ns.a", "other2")
	put(t, kv, "c1.ns.a", "2")
	put(t, kv, "c1.ns.c", "1")
	if err := kv.Delete(context.Background(), "c1.ns.c"); err != nil {
		t.Fatal(err)
	}
	put(t, kv, "c1.ns.d", "1")
	v.until(t, "changes", func() bool { return v.values["c1.ns.d"] == "1" })
	if fmt.Sprint(v.values) != "map[c1.ns.a:2 c1.ns.d:1]" {
		t.Fatalf("after changes = %v", v.values)
	}
}

// Changes written while the watcher starts are neither lost nor applied out of order.
func TestChangesDuringTheReplayAreKept(t *testing.T) {
	j := testkit.StartJetStream(t)
	kv := newBucket(t, j.JS, true)
	_, writer := j.Connect(t)
	wkv, err := writer.KeyValue(context.Background(), bucket)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 20 {
		key := "c1.k" + strconv.Itoa(round)
		done := make(chan int)
		go func() {
			i := 0
			for ; i < 200; i++ {
				if _, err := wkv.PutString(context.Background(), key, strconv.Itoa(i)); err != nil {
					t.Error(err)
					break
				}
			}
			done <- i - 1
		}()
		v := watch(t, j.JS, "c1.>", kvfeed.Options{Settle: 10 * time.Millisecond})
		last := strconv.Itoa(<-done)
		v.until(t, "last value of "+key, func() bool { return v.replayed && v.values[key] == last })
		_ = v.w.Stop()
	}
	_ = kv
}

// Each way a watcher can miss a change ends it with ErrResync, so its caller replays.
func TestWhatMayHaveLostAChangeAsksForAResync(t *testing.T) {
	for _, tc := range []struct {
		name string
		act  func(t *testing.T, j *testkit.JetStream, kv jetstream.KeyValue, seq uint64)
	}{
		{"reconnect", func(t *testing.T, j *testkit.JetStream, _ jetstream.KeyValue, _ uint64) {
			if err := j.Conn.ForceReconnect(); err != nil {
				t.Fatal(err)
			}
		}},
		{"bucket recreated", func(t *testing.T, j *testkit.JetStream, _ jetstream.KeyValue, _ uint64) {
			if err := j.JS.DeleteKeyValue(context.Background(), bucket); err != nil {
				t.Fatal(err)
			}
			kv := newBucket(t, j.JS, true)
			put(t, kv, "c1.ns.a", "again")
		}},
		{"a change whose predecessor was not seen", func(t *testing.T, j *testkit.JetStream, _ jetstream.KeyValue, seq uint64) {
			republish(t, j.Conn, "c1.ns.a", seq+10, seq+5)
		}},
		{"a new key whose predecessor was not seen", func(t *testing.T, j *testkit.JetStream, _ jetstream.KeyValue, seq uint64) {
			republish(t, j.Conn, "c1.ns.new", seq+10, seq+5)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := testkit.StartJetStream(t)
			kv := newBucket(t, j.JS, true)
			seq := put(t, kv, "c1.ns.a", "1")
			v := watch(t, j.JS, "c1.>", kvfeed.Options{Settle: 10 * time.Millisecond})
			v.until(t, "replay", func() bool { return v.replayed })
			time.Sleep(50 * time.Millisecond) // settled: the subscription alone delivers
			tc.act(t, j, kv, seq)
			if err := v.ended(t); !errors.Is(err, kvfeed.ErrResync) {
				t.Fatalf("watcher ended with %v, want ErrResync", err)
			}
		})
	}
}

func republish(t *testing.T, nc *nats.Conn, key string, seq, last uint64) {
	t.Helper()
	m := nats.NewMsg(subjects.FeedSubject(bucket, key))
	m.Header.Set(jetstream.SubjectHeader, "$KV."+bucket+"."+key)
	m.Header.Set(jetstream.SequenceHeader, strconv.FormatUint(seq, 10))
	m.Header.Set(jetstream.LastSequenceHeader, strconv.FormatUint(last, 10))
	m.Data = []byte("forged")
	if err := nc.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
}

// What is not a loss does not resync: a key deleted, its delete marker purged (rbac-sync does
// that), then written again.
func TestAPurgedDeleteMarkerIsNoLoss(t *testing.T) {
	j := testkit.StartJetStream(t)
	kv := newBucket(t, j.JS, true)
	put(t, kv, "c1.ns.a", "1")
	v := watch(t, j.JS, "c1.>", kvfeed.Options{Settle: 10 * time.Millisecond})
	v.until(t, "replay", func() bool { return v.replayed && v.values["c1.ns.a"] == "1" })
	time.Sleep(50 * time.Millisecond)
	if err := kv.Delete(context.Background(), "c1.ns.a"); err != nil {
		t.Fatal(err)
	}
	v.until(t, "delete", func() bool { return v.values["c1.ns.a"] == "" })
	if err := kv.PurgeDeletes(context.Background(), jetstream.DeleteMarkersOlderThan(-1)); err != nil {
		t.Fatal(err)
	}
	put(t, kv, "c1.ns.a", "2")
	put(t, kv, "c1.ns.b", "1")
	v.until(t, "written again", func() bool { return v.values["c1.ns.a"] == "2" && v.values["c1.ns.b"] == "1" })
}

func TestPeriodicResync(t *testing.T) {
	j := testkit.StartJetStream(t)
	newBucket(t, j.JS, true)
	start := time.Now()
	v := watch(t, j.JS, "c1.>", kvfeed.Options{Resync: 200 * time.Millisecond})
	if err := v.ended(t); !errors.Is(err, kvfeed.ErrResync) {
		t.Fatalf("watcher ended with %v, want ErrResync", err)
	}
	if d := time.Since(start); d < 150*time.Millisecond || d > 2*time.Second {
		t.Fatalf("resync after %v, want 150–250 ms", d)
	}
}

// A bucket created by a hub that does not republish yet is followed through the consumer.
func TestBucketWithoutRepublishIsWatchedThroughItsConsumer(t *testing.T) {
	j := testkit.StartJetStream(t)
	kv := newBucket(t, j.JS, false)
	put(t, kv, "c1.ns.a", "1")
	v := watch(t, j.JS, "c1.>", kvfeed.Options{Settle: 10 * time.Millisecond})
	if v.w.Live() {
		t.Fatal("Live() on a bucket without republish")
	}
	v.until(t, "replay", func() bool { return v.replayed && v.values["c1.ns.a"] == "1" })
	time.Sleep(50 * time.Millisecond)
	put(t, kv, "c1.ns.a", "2")
	v.until(t, "change", func() bool { return v.values["c1.ns.a"] == "2" })
	if n := consumers(t, j.JS); n != 1 {
		t.Fatalf("%d consumers, want the watch's one", n)
	}
}

// follow keeps a view of filter as the agent does: watch, replay into a fresh map, follow the
// changes, and watch again at once on ErrResync.
func follow(t *testing.T, js jetstream.JetStream, filter string) (current func() map[string]string, resyncs func() int) {
	var (
		mu   sync.Mutex
		cur  = map[string]string{}
		nres int
	)
	ctx := testkit.Context(t, 2*time.Minute)
	go func() {
		var w *kvfeed.Watcher
		for ctx.Err() == nil {
			// The default settle: in a NATS cluster the subscription's interest reaches the
			// stream leader asynchronously, and a short one lost changes on a loaded machine.
			var err error
			if w != nil {
				w, err = w.Resume(ctx) // as the agent does: the subscription is kept
			} else {
				w, err = kvfeed.Watch(ctx, js, bucket, filter, kvfeed.Options{})
			}
			if err != nil {
				t.Logf("watch: %v", err)
				w = nil
				time.Sleep(100 * time.Millisecond)
				continue
			}
			next, replayed := map[string]string{}, false
			for e := range w.Updates() {
				if e == nil {
					replayed = true
				} else if e.Operation() == jetstream.KeyValuePut {
					next[e.Key()] = string(e.Value())
				} else {
					delete(next, e.Key())
				}
				if replayed {
					mu.Lock()
					cur = maps.Clone(next)
					mu.Unlock()
				}
			}
			t.Logf("watch ended: %v (replayed %v, live %v)", w.Err(), replayed, w.Live())
			mu.Lock()
			if errors.Is(w.Err(), kvfeed.ErrResync) {
				nres++
			}
			mu.Unlock()
		}
		if w != nil {
			_ = w.Stop()
		}
	}()
	return func() map[string]string {
			mu.Lock()
			defer mu.Unlock()
			return maps.Clone(cur)
		}, func() int {
			mu.Lock()
			defer mu.Unlock()
			return nres
		}
}

// A member cluster's agent connected to a NATS node that goes away misses nothing written
// meanwhile: it reconnects to another node and replays.
func TestNothingMissedAcrossANodeRestart(t *testing.T) {
	c := testkit.StartCluster(t, nil)
	ctx := testkit.Context(t, 2*time.Minute)
	_, writer := testkit.ConnectURL(t, c.Nodes[1].ClientURL()+","+c.Nodes[2].ClientURL(), nats.MaxReconnects(-1))
	cfg := subjects.FeedBucketConfig(bucket, "")
	cfg.Replicas = 3
	kv, err := writer.CreateKeyValue(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	urls := c.Nodes[0].ClientURL() + "," + c.Nodes[1].ClientURL() + "," + c.Nodes[2].ClientURL()
	_, agent := testkit.ConnectURL(t, urls, nats.DontRandomize(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	want := map[string]string{}
	for i := range 10 {
		k := "c1.k" + strconv.Itoa(i)
		put(t, kv, k, "0")
		want[k] = "0"
	}
	put(t, kv, "c2.k0", "other")
	current, resyncs := follow(t, agent, "c1.>")
	same := func() error {
		if got := current(); !maps.Equal(got, want) {
			return fmt.Errorf("view %v, want %v", got, want)
		}
		return nil
	}
	testkit.Eventually(t, 10*time.Second, same)

	c.Nodes[0].Stop() // the agent's node
	for i := range 10 {
		k := "c1.k" + strconv.Itoa(i)
		put(t, kv, k, "1")
		want[k] = "1"
	}
	if err := kv.Delete(ctx, "c1.k5"); err != nil {
		t.Fatal(err)
	}
	delete(want, "c1.k5")
	put(t, kv, "c1.new", "1")
	want["c1.new"] = "1"
	if err := c.Restart(0); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 60*time.Second, same)
	if resyncs() == 0 {
		t.Fatal("the view converged without a resync: the test did not exercise the reconnect")
	}
}

// feedSID is the id of the one subscription a client holds on subject ("" if none): the
// client's, which it keeps when it resubscribes after a reconnect.
func feedSID(t *testing.T, j *testkit.JetStream, subject string) string {
	t.Helper()
	cz, err := j.Server.Connz(&server.ConnzOptions{SubscriptionsDetail: true})
	if err != nil {
		t.Fatal(err)
	}
	sid := ""
	for _, c := range cz.Conns {
		for _, sd := range c.SubsDetail {
			if sd.Subject == subject {
				if sid != "" {
					t.Fatalf("two subscriptions on %s", subject)
				}
				sid = sd.Sid
			}
		}
	}
	return sid
}

// A resync keeps the Watcher's subscription (nats-server walks every reply awaiting an answer
// on each wildcard unsubscribe: a fleet resyncing at once made that N², docs/scale.md), and
// the resumed Watcher's replay is whole: a key deleted meanwhile, its delete marker purged,
// is simply absent, so the caller's prune after the replay removes it.
func TestResumeKeepsTheSubscriptionAndReplaysAfresh(t *testing.T) {
	j := testkit.StartJetStream(t)
	kv := newBucket(t, j.JS, true)
	put(t, kv, "c1.a", "1")
	put(t, kv, "c1.b", "1")
	ctx := testkit.Context(t, time.Minute)
	w, err := kvfeed.Watch(ctx, j.JS, bucket, "c1.>", kvfeed.Options{Settle: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	v := &view{w: w, values: map[string]string{}}
	v.until(t, "replay", func() bool { return v.replayed && len(v.values) == 2 })
	subject := subjects.FeedSubject(bucket, "c1.>")
	before := feedSID(t, j, subject)
	if before == "" {
		t.Fatal("no subscription on the feed")
	}

	if err := j.Conn.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	if err := v.ended(t); !errors.Is(err, kvfeed.ErrResync) {
		t.Fatalf("watcher ended with %v, want ErrResync", err)
	}
	if err := kv.Delete(ctx, "c1.b"); err != nil {
		t.Fatal(err)
	}
	if err := kv.PurgeDeletes(ctx, jetstream.DeleteMarkersOlderThan(-1)); err != nil {
		t.Fatal(err)
	}
	put(t, kv, "c1.c", "1")

	w2, err := w.Resume(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w2.Stop() }()
	v2 := &view{w: w2, values: map[string]string{}}
	v2.until(t, "replay after the resync", func() bool { return v2.replayed })
	if fmt.Sprint(v2.values) != "map[c1.a:1 c1.c:1]" {
		t.Fatalf("replay after the resync = %v, want c1.a and c1.c only", v2.values)
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		if after := feedSID(t, j, subject); after != before {
			return fmt.Errorf("feed subscription %q, before the resync %q", after, before)
		}
		return nil
	})
	put(t, kv, "c1.a", "2")
	v2.until(t, "a change after the resync", func() bool { return v2.values["c1.a"] == "2" })

	_ = w2.Stop()
	testkit.Eventually(t, 5*time.Second, func() error {
		if sid := feedSID(t, j, subject); sid != "" {
			return fmt.Errorf("subscription %s left after Stop", sid)
		}
		return nil
	})
}

// The replay consumer of a wildcard filter has no flow control (nats-server's deletion of a
// consumer with flow control unsubscribes wildcard subjects: N² in a storm, docs/scale.md) and
// expires by itself.
func TestReplayConsumerHasNoFlowControl(t *testing.T) {
	j := testkit.StartJetStream(t)
	kv := newBucket(t, j.JS, true)
	put(t, kv, "c1.a", "1")
	v := watch(t, j.JS, "c1.>", kvfeed.Options{Settle: 5 * time.Second})
	v.until(t, "replay", func() bool { return v.replayed })
	// The legacy API: jetstream's ConsumerConfig has no push settings.
	js, err := j.Conn.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	var infos []*nats.ConsumerInfo
	for ci := range js.ConsumersInfo("KV_" + bucket) {
		infos = append(infos, ci)
	}
	if len(infos) != 1 {
		t.Fatalf("%d consumers while the replay settles, want 1", len(infos))
	}
	c := infos[0].Config
	if c.FlowControl || c.Heartbeat != 0 || c.AckPolicy != nats.AckNonePolicy || c.InactiveThreshold <= 0 || c.DeliverPolicy != nats.DeliverLastPerSubjectPolicy {
		t.Fatalf("replay consumer: flow control %v, heartbeat %v, ack %v, inactive threshold %v, deliver %v", c.FlowControl, c.Heartbeat, c.AckPolicy, c.InactiveThreshold, c.DeliverPolicy)
	}
	_ = v.w.Stop()
	testkit.Eventually(t, 10*time.Second, func() error {
		if n := consumers(t, j.JS); n != 0 {
			return fmt.Errorf("%d consumers after Stop", n)
		}
		return nil
	})
}

// A filter naming one key is replayed by a direct get: no consumer at all, its delete seen.
func TestOneKeyIsReplayedWithoutAConsumer(t *testing.T) {
	j := testkit.StartJetStream(t)
	kv := newBucket(t, j.JS, true)
	put(t, kv, "c1", "1")
	put(t, kv, "c2", "other")
	v := watch(t, j.JS, "c1", kvfeed.Options{Settle: 2 * time.Second})
	v.until(t, "replay", func() bool { return v.replayed })
	if fmt.Sprint(v.values) != "map[c1:1]" {
		t.Fatalf("replay = %v", v.values)
	}
	if n := consumers(t, j.JS); n != 0 {
		t.Fatalf("%d consumers during the replay of one key", n)
	}
	put(t, kv, "c1", "2")
	v.until(t, "change", func() bool { return v.values["c1"] == "2" })
	if err := kv.Delete(context.Background(), "c1"); err != nil {
		t.Fatal(err)
	}
	v.until(t, "delete", func() bool { _, ok := v.values["c1"]; return !ok })

	// A key never written: an empty replay.
	v3 := watch(t, j.JS, "c3", kvfeed.Options{Settle: 10 * time.Millisecond})
	v3.until(t, "replay of a key never written", func() bool { return v3.replayed })
	if len(v3.values) != 0 {
		t.Fatalf("replay of a key never written = %v", v3.values)
	}

	// Replayed while deleted: the delete marker, so the caller drops what it held.
	v2 := watch(t, j.JS, "c1", kvfeed.Options{Settle: 10 * time.Millisecond})
	v2.values["c1"] = "stale"
	v2.until(t, "replay of a deleted key", func() bool { return v2.replayed })
	if len(v2.values) != 0 {
		t.Fatalf("replay of a deleted key = %v", v2.values)
	}
}

// A replay of more keys than the buffer holds, read slower than the server pushes it (the
// replay consumer has no flow control), still completes, deletes included: the agent of a
// large cluster must be able to prune after a restart.
func TestReplayLargerThanTheBufferCompletes(t *testing.T) {
	j := testkit.StartJetStream(t)
	kv := newBucket(t, j.JS, true)
	const keys, buffer = 3000, 64
	ctx := testkit.Context(t, time.Minute)
	acks := make([]jetstream.PubAckFuture, 0, keys)
	for i := range keys {
		f, err := j.JS.PublishAsync(fmt.Sprintf("$KV.%s.c1.k%05d", bucket, i), []byte("v"))
		if err != nil {
			t.Fatal(err)
		}
		acks = append(acks, f)
	}
	for _, f := range acks {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatal(err)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	if err := kv.Delete(ctx, "c1.k00007"); err != nil {
		t.Fatal(err)
	}
	v := watch(t, j.JS, "c1.>", kvfeed.Options{Buffer: buffer, Settle: 100 * time.Millisecond})
	deadline := time.After(45 * time.Second)
	for !v.replayed {
		select {
		case e, ok := <-v.w.Updates():
			if !ok {
				t.Fatalf("watcher ended after %d keys: %v", len(v.values), v.w.Err())
			}
			v.apply(e)
			// Slower than the server: the replay piles up on the client.
			if len(v.values)%200 == 0 {
				time.Sleep(5 * time.Millisecond)
			}
		case <-deadline:
			t.Fatalf("replay not complete after 45 s: %d keys", len(v.values))
		}
	}
	if len(v.values) != keys-1 {
		t.Fatalf("replay holds %d keys, want %d", len(v.values), keys-1)
	}
	if _, ok := v.values["c1.k00007"]; ok {
		t.Fatal("a deleted key replayed as present")
	}
}

// Messages on the feed that are not the server's republishes (no republish headers: what a
// push consumer another agent pointed at this cluster's feed subject delivers) are ignored:
// they neither change the view nor make the watcher resync.
func TestForeignMessagesOnTheFeedAreIgnored(t *testing.T) {
	j := testkit.StartJetStream(t)
	kv := newBucket(t, j.JS, true)
	put(t, kv, "c1.a", "1")
	v := watch(t, j.JS, "c1.>", kvfeed.Options{Settle: 10 * time.Millisecond})
	v.until(t, "replay", func() bool { return v.replayed })
	v.until(t, "live", func() bool { return v.w.Live() })
	forged := []*nats.Msg{
		{Subject: subjects.FeedSubject(bucket, "c1.a"), Data: []byte("forged")},
		{Subject: subjects.FeedSubject(bucket, "c1.b"), Data: []byte("forged"), Header: nats.Header{jetstream.SubjectHeader: []string{"$KV." + bucket + ".c1.b"}}},
	}
	for _, m := range forged {
		if err := j.Conn.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Conn.Flush(); err != nil {
		t.Fatal(err)
	}
	put(t, kv, "c1.a", "2")
	v.until(t, "the real change after the forged ones", func() bool { return v.values["c1.a"] == "2" })
	if _, ok := v.values["c1.b"]; ok {
		t.Fatal("a forged key reached the view")
	}
	select {
	case e, ok := <-v.w.Updates():
		if !ok {
			t.Fatalf("watcher ended: %v", v.w.Err())
		}
		t.Fatalf("unexpected update %v", e)
	case <-time.After(200 * time.Millisecond):
	}
}

// The buckets agents watch keep two revisions per key (subjects.FeedBucketConfig, for a replay
// that reads the subject index instead of the whole bucket): a replay still delivers each key
// once, at its latest revision, and a deleted key as its delete, never an older value.
func TestReplayDeliversEachKeyOnceAtItsLatestRevision(t *testing.T) {
	j := testkit.StartJetStream(t)
	kv := newBucket(t, j.JS, true)
	for round := 1; round <= 3; round++ {
		for _, k := range []string{"c1.k0", "c1.k1", "c1.k2", "c2.k0"} {
			put(t, kv, k, strconv.Itoa(round))
		}
	}
	if err := kv.Delete(context.Background(), "c1.k2"); err != nil {
		t.Fatal(err)
	}
	w, err := kvfeed.Watch(testkit.Context(t, time.Minute), j.JS, bucket, "c1.>", kvfeed.Options{Settle: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	var got []string
	timeout := time.After(10 * time.Second)
	for done := false; !done; {
		select {
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				t.Fatalf("watcher ended: %v", w.Err())
			case e == nil:
				done = true
			case e.Operation() == jetstream.KeyValuePut:
				got = append(got, e.Key()+"="+string(e.Value()))
			default:
				got = append(got, e.Key()+" deleted")
			}
		case <-timeout:
			t.Fatalf("no end of replay within 10 s; got %v", got)
		}
	}
	slices.Sort(got)
	if want := []string{"c1.k0=3", "c1.k1=3", "c1.k2 deleted"}; !slices.Equal(got, want) {
		t.Fatalf("replay = %v, want %v", got, want)
	}
}
