package lease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetstream/fleetstream/pkg/lease"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// work records who runs under a lease and fails the test if two ever run at once.
type work struct {
	t       testing.TB
	active  atomic.Int32
	mu      sync.Mutex
	starts  []string
	started chan string
}

func newWork(t testing.TB) *work { return &work{t: t, started: make(chan string, 100)} }

func (w *work) fn(name string, stopped chan<- time.Time) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		if n := w.active.Add(1); n != 1 {
			w.t.Errorf("%s started while %d others work", name, n-1)
		}
		w.mu.Lock()
		w.starts = append(w.starts, name)
		w.mu.Unlock()
		w.started <- name
		<-ctx.Done()
		w.active.Add(-1)
		if stopped != nil {
			stopped <- time.Now()
		}
		return nil
	}
}

type contender struct {
	cancel context.CancelFunc
	done   chan error
}

func start(t testing.TB, js jetstream.JetStream, name string, ttl time.Duration, fn func(context.Context) error, opts ...lease.Option) *contender {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &contender{cancel: cancel, done: make(chan error, 1)}
	go func() {
		c.done <- lease.Run(ctx, js, "test.lease", name, ttl, fn, append(opts, lease.WithLogger(testkit.Logger(t)))...)
	}()
	t.Cleanup(func() { cancel(); <-c.done })
	return c
}

func (c *contender) stop(t testing.TB) {
	t.Helper()
	c.cancel()
	select {
	case err := <-c.done:
		if err != nil {
			t.Errorf("run: %v", err)
		}
		c.done <- nil // for Cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func waitStart(t testing.TB, w *work, within time.Duration) string {
	t.Helper()
	select {
	case name := <-w.started:
		return name
	case <-time.After(within):
		t.Fatalf("nobody acquired the lease within %s", within)
		return ""
	}
}

func noStart(t testing.TB, w *work, during time.Duration) {
	t.Helper()
	select {
	case name := <-w.started:
		t.Fatalf("%s acquired the lease while it was held", name)
	case <-time.After(during):
	}
}

// Among N contenders exactly one works at a time; stopping the holder hands over at once, again
// and again.
func TestOneHolderAmongContenders(t *testing.T) {
	j := testkit.StartJetStream(t)
	w := newWork(t)
	const n = 5
	ttl := 3 * time.Second
	cs := map[string]*contender{}
	for i := range n {
		_, js := j.Connect(t)
		name := fmt.Sprintf("c%d", i)
		cs[name] = start(t, js, name, ttl, w.fn(name, nil))
	}
	holder := waitStart(t, w, 5*time.Second)
	noStart(t, w, ttl+ttl/2) // renewals keep it: nobody takes over a live holder
	for range n - 1 {
		begin := time.Now()
		cs[holder].stop(t)
		delete(cs, holder)
		next := waitStart(t, w, ttl/2)
		if d := time.Since(begin); d > ttl/2 {
			t.Fatalf("handover took %s", d)
		}
		holder = next
		noStart(t, w, 300*time.Millisecond)
	}
	if len(w.starts) != n {
		t.Fatalf("starts %v", w.starts)
	}
}

// A holder whose connection dies stops working within 2/3 TTL, and another contender takes over
// within about a TTL, after the first stopped.
func TestDeadHolderIsReplacedWithinTTL(t *testing.T) {
	j := testkit.StartJetStream(t)
	w := newWork(t)
	ttl := 1500 * time.Millisecond
	ncA, jsA := j.Connect(t)
	stoppedA := make(chan time.Time, 1)
	start(t, jsA, "a", ttl, w.fn("a", stoppedA))
	if got := waitStart(t, w, 5*time.Second); got != "a" {
		t.Fatalf("first holder %s", got)
	}
	_, jsB := j.Connect(t)
	start(t, jsB, "b", ttl, w.fn("b", nil))
	noStart(t, w, ttl)

	died := time.Now()
	ncA.Close() // no release: the lease has to run out
	var aStopped time.Time
	select {
	case aStopped = <-stoppedA:
	case <-time.After(ttl):
		t.Fatal("holder kept working after losing its connection")
	}
	if got := waitStart(t, w, 2*ttl); got != "b" {
		t.Fatalf("next holder %s", got)
	}
	took := time.Since(died)
	t.Logf("holder stopped after %s, replaced after %s (ttl %s)", aStopped.Sub(died), took, ttl)
	if took > ttl+ttl/2 {
		t.Fatalf("replaced after %s, want about %s", took, ttl)
	}
}

// A holder that stops cleanly releases the lease; a contender takes it at once rather than after
// a TTL.
func TestReleaseHandsOverAtOnce(t *testing.T) {
	j := testkit.StartJetStream(t)
	w := newWork(t)
	ttl := 5 * time.Second
	_, jsA := j.Connect(t)
	a := start(t, jsA, "a", ttl, w.fn("a", nil))
	waitStart(t, w, 5*time.Second)
	_, jsB := j.Connect(t)
	start(t, jsB, "b", ttl, w.fn("b", nil))
	noStart(t, w, 500*time.Millisecond)
	begin := time.Now()
	a.stop(t)
	if got := waitStart(t, w, ttl/2); got != "b" {
		t.Fatalf("next holder %s", got)
	}
	if d := time.Since(begin); d > 500*time.Millisecond {
		t.Fatalf("handover after release took %s", d)
	}
}

// The work's context is cancelled as soon as someone else deletes or overwrites the key; the
// holder then contends again like anyone.
func TestLostLeaseCancelsWork(t *testing.T) {
	j := testkit.StartJetStream(t)
	w := newWork(t)
	ttl := 3 * time.Second
	stopped := make(chan time.Time, 10)
	start(t, j.JS, "a", ttl, w.fn("a", stopped))
	waitStart(t, w, 5*time.Second)
	ctx := testkit.Context(t, 30*time.Second)
	kv, err := j.JS.KeyValue(ctx, lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}

	// Deleted: the holder notices at once (it watches the key) and takes the free lease again.
	begin := time.Now()
	if err := kv.Delete(ctx, "test.lease"); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-stopped:
		if d := at.Sub(begin); d > ttl/3 {
			t.Fatalf("work stopped %s after the key was deleted", d)
		}
	case <-time.After(ttl):
		t.Fatal("work not stopped when the lease key was deleted")
	}
	waitStart(t, w, ttl/2)

	// Overwritten by an intruder that then never renews: the holder stops at once and takes the
	// lease back a TTL later.
	begin = time.Now()
	if _, err := kv.Put(ctx, "test.lease", []byte("intruder")); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-stopped:
		if d := at.Sub(begin); d > ttl/3 {
			t.Fatalf("work stopped %s after the key was overwritten", d)
		}
	case <-time.After(ttl):
		t.Fatal("work not stopped when the lease key was overwritten")
	}
	noStart(t, w, ttl*3/4)
	waitStart(t, w, ttl)
}

// fn returning an error releases the lease and ends Run with that error; a standby callback
// runs while someone else holds the lease and ends before fn starts.
func TestErrorAndStandby(t *testing.T) {
	j := testkit.StartJetStream(t)
	ttl := 2 * time.Second
	ctx := testkit.Context(t, 30*time.Second)
	boom := errors.New("boom")
	holding := make(chan struct{})
	fail := make(chan struct{})
	aDone := make(chan error, 1)
	go func() {
		aDone <- lease.Run(ctx, j.JS, "test.lease", "a", ttl, func(ctx context.Context) error {
			close(holding)
			<-fail
			return boom
		})
	}()
	<-holding

	var inStandby atomic.Bool
	standbyRan := make(chan struct{})
	var once sync.Once
	bStarted := make(chan bool, 1)
	bCtx, bCancel := context.WithCancel(ctx)
	defer bCancel()
	bDone := make(chan error, 1)
	go func() {
		bDone <- lease.Run(bCtx, j.JS, "test.lease", "b", ttl, func(ctx context.Context) error {
			bStarted <- inStandby.Load()
			<-ctx.Done()
			return nil
		}, lease.WithStandby(func(ctx context.Context) error {
			inStandby.Store(true)
			once.Do(func() { close(standbyRan) })
			<-ctx.Done()
			inStandby.Store(false)
			return nil
		}))
	}()
	select {
	case <-standbyRan:
	case <-time.After(5 * time.Second):
		t.Fatal("standby did not run while the lease was held elsewhere")
	}
	close(fail)
	if err := <-aDone; !errors.Is(err, boom) {
		t.Fatalf("Run returned %v, want fn's error", err)
	}
	select {
	case stillStandby := <-bStarted:
		if stillStandby {
			t.Fatal("fn started before standby returned")
		}
	case <-time.After(ttl / 2):
		t.Fatal("lease not handed over after the holder failed")
	}
	bCancel()
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
}

func TestTTLAboveBucketMaxAgeIsRefused(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 10*time.Second)
	err := lease.Run(ctx, j.JS, "test.lease", "a", 2*lease.DefaultTTL, func(context.Context) error { return nil })
	if err == nil {
		t.Fatal("a TTL above the bucket's MaxAge was accepted")
	}
}

// On a three-node cluster (R3 lease bucket), when the server its holder is connected to stops,
// cutting the holder off (its client does not fail over), the holder stops working and a
// contender connected elsewhere takes over; never two at once.
func TestClusterHolderNodeStops(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	c := testkit.StartCluster(t, nil)
	w := newWork(t)
	ttl := 3 * time.Second
	ctx := testkit.Context(t, 60*time.Second)
	connect := func(i int) jetstream.JetStream {
		nc, err := nats.Connect(c.Nodes[i].ClientURL(), nats.IgnoreDiscoveredServers(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	cfg := lease.BucketConfig()
	cfg.Replicas = 3
	if _, err := connect(0).CreateOrUpdateKeyValue(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	node := map[string]int{}
	for i := range 3 {
		name := fmt.Sprintf("c%d", i)
		node[name] = i
		start(t, connect(i), name, ttl, w.fn(name, nil), lease.WithReplicas(3))
	}
	holder := waitStart(t, w, 10*time.Second)
	noStart(t, w, ttl+ttl/2)
	c.Nodes[node[holder]].Stop()
	next := waitStart(t, w, 4*ttl)
	if next == holder {
		t.Fatalf("%s kept the lease although its server stopped", holder)
	}
	noStart(t, w, ttl)
}
