package view_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/consumer"
	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/topology"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// testProjection folds cluster events on test.<key> into bucket TESTVIEW: registered creates,
// updated replaces labels and counts updates in a claim, deregistered deletes.
func testProjection(version int) view.Projection {
	return view.Projection{
		Name: "test", Version: version, Stream: "TEST", Subjects: []string{"test.>"},
		Bucket: jetstream.KeyValueConfig{Bucket: "TESTVIEW", History: 1},
		New:    func() proto.Message { return &clusterv1.Cluster{} },
		Apply: func(ev *events.Event) ([]view.Change, error) {
			key := strings.TrimPrefix(ev.Subject, "test.")
			switch p := ev.Payload.(type) {
			case *clusterv1.ClusterRegistered:
				return []view.Change{{Key: key, Update: func(proto.Message) proto.Message {
					return &clusterv1.Cluster{Id: p.Id, Name: p.Name, Labels: p.Labels, Claims: map[string]string{"updates": "0"}}
				}}}, nil
			case *clusterv1.ClusterUpdated:
				return []view.Change{{Key: key, Update: func(cur proto.Message) proto.Message {
					c, _ := cur.(*clusterv1.Cluster)
					if c == nil {
						return nil
					}
					n, _ := strconv.Atoi(c.Claims["updates"])
					c.Labels = p.Labels
					c.Claims["updates"] = strconv.Itoa(n + 1)
					return c
				}}}, nil
			case *clusterv1.ClusterDeregistered:
				return []view.Change{{Key: key, Update: func(proto.Message) proto.Message { return nil }}}, nil
			}
			return nil, fmt.Errorf("unexpected %s", ev.Type)
		},
	}
}

func ensureStream(t testing.TB, js jetstream.JetStream) {
	t.Helper()
	ctx := testkit.Context(t, 10*time.Second)
	if err := topology.Ensure(ctx, js, 1, topology.Merge(topology.DeadLetter(), topology.Topology{
		Streams: []jetstream.StreamConfig{topology.EventStream("TEST", "test", "test.>")},
	})); err != nil {
		t.Fatal(err)
	}
}

// appendHistory writes a random but reproducible history over nkeys keys and returns the last
// stream sequence.
func appendHistory(t testing.TB, js jetstream.JetStream, n, nkeys int) uint64 {
	t.Helper()
	ctx := testkit.Context(t, 60*time.Second)
	store := events.NewStore(js, "test")
	rng := rand.New(rand.NewPCG(1, 2))
	alive := make([]bool, nkeys)
	var last uint64
	for i := 0; i < n; i++ {
		k := rng.IntN(nkeys)
		key := fmt.Sprintf("k%03d", k)
		var ev proto.Message
		switch {
		case !alive[k]:
			ev = &clusterv1.ClusterRegistered{Id: key, Name: key, Labels: map[string]string{"gen": strconv.Itoa(i)}}
			alive[k] = true
		case rng.IntN(10) == 0:
			ev = &clusterv1.ClusterDeregistered{Id: key}
			alive[k] = false
		default:
			ev = &clusterv1.ClusterUpdated{Id: key, Labels: map[string]string{"gen": strconv.Itoa(i)}}
		}
		seq, err := store.Append(ctx, "test."+key, key, events.Any, ev)
		if err != nil {
			t.Fatal(err)
		}
		last = seq
	}
	return last
}

func snapshot(t testing.TB, js jetstream.JetStream) map[string]string {
	t.Helper()
	ctx := testkit.Context(t, 30*time.Second)
	kv, err := js.KeyValue(ctx, "TESTVIEW")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for k := range lister.Keys() {
		if k == view.MetaKey {
			continue
		}
		e, err := kv.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		c := &clusterv1.Cluster{}
		if err := proto.Unmarshal(e.Value(), c); err != nil {
			t.Fatal(err)
		}
		out[k] = c.String()
	}
	return out
}

func runEngine(t testing.TB, js jetstream.JetStream, p view.Projection, opts ...view.Option) (*view.Engine, context.CancelFunc, chan error) {
	t.Helper()
	e, err := view.NewEngine(js, p, zap.NewNop(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(cancel)
	return e, cancel, done
}

// A projection killed mid-way (its connection cut without a goodbye, between KV writes and
// acks) and restarted must end exactly where a from-scratch rebuild ends.
func TestRestartMidProjectionEqualsRebuild(t *testing.T) {
	j := testkit.StartJetStream(t)
	ensureStream(t, j.JS)
	last := appendHistory(t, j.JS, 6000, 150)

	for crash := 0; crash < 3; crash++ {
		nc, js := j.Connect(t)
		e, cancel, _ := runEngine(t, js, testProjection(1), view.WithBatch(64))
		target := last * uint64(crash+1) / 4
		testkit.Eventually(t, 30*time.Second, func() error {
			if e.Applied() < target {
				return fmt.Errorf("applied %d < %d", e.Applied(), target)
			}
			return nil
		})
		nc.Close() // abrupt: in-flight writes and acks are lost
		cancel()
	}
	nc, js := j.Connect(t)
	defer nc.Close()
	e, cancel, _ := runEngine(t, js, testProjection(1))
	ctx := testkit.Context(t, 30*time.Second)
	if err := e.WaitApplied(ctx, last); err != nil {
		t.Fatal(err)
	}
	cancel()
	resumed := snapshot(t, j.JS)

	// Version 2 of the same projection rebuilds the bucket from the stream.
	e2, cancel2, _ := runEngine(t, j.JS, testProjection(2))
	if err := e2.WaitApplied(ctx, last); err != nil {
		t.Fatal(err)
	}
	cancel2()
	rebuilt := snapshot(t, j.JS)

	if len(rebuilt) == 0 {
		t.Fatal("empty view")
	}
	if len(resumed) != len(rebuilt) {
		t.Fatalf("resumed view has %d keys, rebuilt %d", len(resumed), len(rebuilt))
	}
	for k, v := range rebuilt {
		if resumed[k] != v {
			t.Fatalf("key %s: resumed %q, rebuilt %q", k, resumed[k], v)
		}
	}
}

func TestMalformedEventIsDeadLetteredAndProjectionContinues(t *testing.T) {
	j := testkit.StartJetStream(t)
	ensureStream(t, j.JS)
	ctx := testkit.Context(t, 30*time.Second)
	store := events.NewStore(j.JS, "test")
	if _, err := store.Append(ctx, "test.a", "a", events.Any, &clusterv1.ClusterRegistered{Id: "a", Name: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := j.JS.Publish(ctx, "test.a", []byte("\xff\xffnot an envelope")); err != nil {
		t.Fatal(err)
	}
	// A well-formed envelope the projection does not understand is poison for it too.
	if _, err := store.Append(ctx, "test.a", "a", events.Any, &clusterv1.ClusterAgentLost{Id: "a"}); err != nil {
		t.Fatal(err)
	}
	last, err := store.Append(ctx, "test.a", "a", events.Any, &clusterv1.ClusterUpdated{Id: "a", Labels: map[string]string{"after": "poison"}})
	if err != nil {
		t.Fatal(err)
	}
	e, _, done := runEngine(t, j.JS, testProjection(1))
	if err := e.WaitApplied(ctx, last); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Fatalf("engine stopped: %v", err)
	default:
	}
	got := snapshot(t, j.JS)["a"]
	if !strings.Contains(got, "poison") {
		t.Fatalf("event after the poison not applied: %s", got)
	}
	dlq, err := j.JS.Stream(ctx, topology.DeadLetterStreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := dlq.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Fatalf("dead letters: %d, want 2", info.State.Msgs)
	}
	m, err := dlq.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Get(consumer.HeaderStream) != "TEST" || m.Header.Get(consumer.HeaderSeq) != "2" || m.Header.Get(consumer.HeaderError) == "" {
		t.Fatalf("dead letter headers %v", m.Header)
	}
}

func TestCacheFollowsBucket(t *testing.T) {
	j := testkit.StartJetStream(t)
	ensureStream(t, j.JS)
	ctx := testkit.Context(t, 30*time.Second)
	e, _, _ := runEngine(t, j.JS, testProjection(1))
	<-e.Ready()
	kv, err := j.JS.KeyValue(ctx, "TESTVIEW")
	if err != nil {
		t.Fatal(err)
	}
	cache := view.NewCache(j.JS, kv, func() *clusterv1.Cluster { return &clusterv1.Cluster{} }, zap.NewNop())
	go func() { _ = cache.Run(ctx) }()
	<-cache.Ready()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	snap, updates := cache.Subscribe(sctx, 16)
	if len(snap) != 0 {
		t.Fatalf("snapshot %v", snap)
	}
	store := events.NewStore(j.JS, "test")
	seq, err := store.Append(ctx, "test.b", "b", events.Any, &clusterv1.ClusterRegistered{Id: "b", Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if err := cache.WaitRevision(ctx, "b", seq, false); err != nil {
		t.Fatal(err)
	}
	if u := <-updates; u.Op != view.Put || u.Key != "b" || u.Value.Name != "b" {
		t.Fatalf("update %+v", u)
	}
	if _, err := store.Append(ctx, "test.b", "b", events.Any, &clusterv1.ClusterDeregistered{Id: "b"}); err != nil {
		t.Fatal(err)
	}
	if err := cache.WaitRevision(ctx, "b", 0, true); err != nil {
		t.Fatal(err)
	}
	if u := <-updates; u.Op != view.Delete || u.Key != "b" {
		t.Fatalf("update %+v", u)
	}
	_ = nats.ErrTimeout
}
