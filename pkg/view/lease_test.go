package view_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// replica is one engine of the test view, as one replica of a service runs it.
type replica struct {
	name   string
	nc     *nats.Conn
	e      *view.Engine
	cancel context.CancelFunc
	done   chan error
}

func startReplica(t *testing.T, j *testkit.JetStream, name string, ttl time.Duration) *replica {
	t.Helper()
	nc, js := j.Connect(t)
	e, err := view.NewEngine(js, testProjection(1), testkit.Logger(t).With(zap.String("replica", name)),
		view.WithLeaseTTL(ttl), view.WithBatch(64))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{name: name, nc: nc, e: e, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- e.Run(ctx) }()
	t.Cleanup(cancel)
	return r
}

// appender appends a random history over nkeys keys (its own seed) until stopped.
type appender struct {
	mu    sync.Mutex
	last  uint64
	stop  chan struct{}
	done  chan struct{}
	count int
}

func startAppender(t *testing.T, js jetstream.JetStream, seed uint64, nkeys int) *appender {
	a := &appender{stop: make(chan struct{}), done: make(chan struct{})}
	store := events.NewStore(js, "test")
	rng := rand.New(rand.NewPCG(seed, 7))
	go func() {
		defer close(a.done)
		ctx := context.Background()
		for i := 0; ; i++ {
			select {
			case <-a.stop:
				return
			default:
			}
			key := fmt.Sprintf("k%03d", rng.IntN(nkeys))
			var ev proto.Message
			switch rng.IntN(10) {
			case 0:
				ev = &clusterv1.ClusterDeregistered{Id: key}
			case 1, 2:
				ev = &clusterv1.ClusterRegistered{Id: key, Name: key, Labels: map[string]string{"gen": strconv.Itoa(i)}}
			default:
				ev = &clusterv1.ClusterUpdated{Id: key, Labels: map[string]string{"gen": strconv.Itoa(i)}}
			}
			seq, err := store.Append(ctx, "test."+key, key, events.Any, ev)
			if err != nil {
				t.Errorf("append: %v", err)
				return
			}
			a.mu.Lock()
			a.last, a.count = seq, a.count+1
			a.mu.Unlock()
			if i%50 == 0 {
				time.Sleep(time.Millisecond) // a steady stream rather than one burst
			}
		}
	}()
	return a
}

// flowing waits until the appender has appended n events: the stream is being written.
func (a *appender) flowing(t *testing.T, n int) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, func() error {
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.count < n {
			return fmt.Errorf("%d events appended, want %d", a.count, n)
		}
		return nil
	})
}

func (a *appender) finish() uint64 {
	close(a.stop)
	<-a.done
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.last
}

// watchLeaders fails the test whenever more than one engine leads at once.
func watchLeaders(t *testing.T, rs *[]*replica, mu *sync.Mutex) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			mu.Lock()
			var leaders []string
			for _, r := range *rs {
				if r.e.Leading() {
					leaders = append(leaders, r.name)
				}
			}
			mu.Unlock()
			if len(leaders) > 1 {
				t.Errorf("several engines lead at once: %v", leaders)
				return
			}
			time.Sleep(time.Millisecond) // paces the poll: Leading has no change signal
		}
	}()
	return func() { cancel(); <-done }
}

func leaderOf(t *testing.T, within time.Duration, rs ...*replica) *replica {
	t.Helper()
	var found *replica
	testkit.Eventually(t, within, func() error {
		for _, r := range rs {
			if r.e.Leading() {
				found = r
				return nil
			}
		}
		return fmt.Errorf("no leader among %d engines", len(rs))
	})
	return found
}

// Several engines of one view run at once, as in replicas of a service: one writes, the others
// follow its checkpoint and are ready and current too; when the leader stops (cleanly, or its
// connection dies) another takes over and keeps the view current; and the view, with events
// appended all along, ends identical to a from-scratch rebuild.
func TestEnginesInSeveralReplicasOneWriterEqualsRebuild(t *testing.T) {
	j := testkit.StartJetStream(t)
	ensureStream(t, j.JS)
	appendHistory(t, j.JS, 2000, 120)
	ctx := testkit.Context(t, 120*time.Second)
	ttl := time.Second

	var mu sync.Mutex
	var rs []*replica
	add := func(r *replica) {
		mu.Lock()
		rs = append(rs, r)
		mu.Unlock()
	}
	stopWatch := watchLeaders(t, &rs, &mu)
	defer stopWatch()

	a := startAppender(t, j.JS, 11, 120)
	r1 := startReplica(t, j, "r1", ttl)
	add(r1)
	r2 := startReplica(t, j, "r2", ttl)
	add(r2)
	for _, r := range []*replica{r1, r2} {
		select {
		case <-r.e.Ready():
		case <-ctx.Done():
			t.Fatalf("%s not ready", r.name)
		}
	}
	lead := leaderOf(t, 5*time.Second, r1, r2)
	follower := r1
	if lead == r1 {
		follower = r2
	}
	if follower.e.Leading() {
		t.Fatal("both lead")
	}
	// The follower reports the leader's progress: WaitApplied works in every replica.
	mid := a.finish()
	for _, r := range []*replica{r1, r2} {
		if err := r.e.WaitApplied(ctx, mid); err != nil {
			t.Fatalf("%s: %v", r.name, err)
		}
	}

	// Clean stop: the follower takes over at once (the lease is released).
	a = startAppender(t, j.JS, 12, 120)
	a.flowing(t, 100) // the leader stops while events are being appended
	lead.cancel()
	if err := <-lead.done; err != nil {
		t.Fatalf("stopped leader: %v", err)
	}
	// Timed from the stopped leader's return, when it has released the lease (from the cancel,
	// the time also held the leader's own shutdown, 1 s under -race on a loaded machine). The
	// leader renews every ttl/3 until it releases, so a takeover by expiry comes at least 2/3
	// ttl after the release: within ttl/2 only the release does it.
	released := time.Now()
	if got := leaderOf(t, 5*time.Second, follower); time.Since(released) > ttl/2 {
		t.Fatalf("%s took over %s after the leader released the lease, want within %s", got.name, time.Since(released), ttl/2)
	}
	r3 := startReplica(t, j, "r3", ttl)
	add(r3)
	<-r3.e.Ready()
	last := a.finish()
	for _, r := range []*replica{follower, r3} {
		if err := r.e.WaitApplied(ctx, last); err != nil {
			t.Fatalf("%s: %v", r.name, err)
		}
	}

	// Dead leader: its connection is cut, so the lease runs out and r3 takes over.
	a = startAppender(t, j.JS, 13, 120)
	a.flowing(t, 100) // the leader dies while events are being appended
	dead := follower
	begin := time.Now()
	dead.nc.Close()
	if got := leaderOf(t, 3*ttl, r3); got != r3 {
		t.Fatalf("leader %s", got.name)
	}
	t.Logf("taken over %s after the leader's connection was cut (ttl %s)", time.Since(begin), ttl)
	dead.cancel()
	last = a.finish()
	if err := r3.e.WaitApplied(ctx, last); err != nil {
		t.Fatal(err)
	}
	r3.cancel()
	<-r3.done
	stopWatch()
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
		t.Fatalf("view written by several replicas in turn has %d keys, rebuilt %d", len(resumed), len(rebuilt))
	}
	for k, v := range rebuilt {
		if resumed[k] != v {
			t.Fatalf("key %s: replicas wrote %q, rebuilt %q", k, resumed[k], v)
		}
	}
}

// A follower started while the leader is behind becomes ready only once the leader's checkpoint
// has reached the stream as it was when the follower started.
func TestFollowerReadyWhenLeaderCaughtUp(t *testing.T) {
	j := testkit.StartJetStream(t)
	ensureStream(t, j.JS)
	ctx := testkit.Context(t, 60*time.Second)
	r1 := startReplica(t, j, "r1", time.Second)
	<-r1.e.Ready()
	last := appendHistory(t, j.JS, 3000, 100)
	r2 := startReplica(t, j, "r2", time.Second)
	select {
	case <-r2.e.Ready():
	case <-ctx.Done():
		t.Fatal("follower not ready")
	}
	if r2.e.Leading() {
		t.Fatal("follower leads while the leader is alive")
	}
	if got := r2.e.Applied(); got < last {
		t.Fatalf("follower ready at checkpoint %d < %d", got, last)
	}
}
