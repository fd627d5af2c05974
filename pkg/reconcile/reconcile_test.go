package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/lease"
	"github.com/fleetstream/fleetstream/pkg/reconcile"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// recorder remembers when each key was reconciled, and fails the keys it is told to.
type recorder struct {
	mu      sync.Mutex
	calls   map[string][]time.Time
	failing map[string]bool
	changed chan struct{}
}

func newRecorder() *recorder {
	return &recorder{calls: map[string][]time.Time{}, failing: map[string]bool{}, changed: make(chan struct{})}
}

func (r *recorder) Reconcile(_ context.Context, key string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls[key] = append(r.calls[key], time.Now())
	close(r.changed)
	r.changed = make(chan struct{})
	if r.failing[key] {
		return errors.New("failing on purpose")
	}
	return nil
}

// changes returns a channel closed at the next reconcile.
func (r *recorder) changes() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed
}

func (r *recorder) fail(key string, fail bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failing[key] = fail
}

func (r *recorder) times(key string) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls[key])
}

// waitCalls waits until key has been reconciled at least n times and returns when each was.
func (r *recorder) waitCalls(t *testing.T, ctx context.Context, key string, n int) []time.Time {
	t.Helper()
	for {
		r.mu.Lock()
		calls, ch := slices.Clone(r.calls[key]), r.changed
		r.mu.Unlock()
		if len(calls) >= n {
			return calls
		}
		select {
		case <-ctx.Done():
			t.Fatalf("key %s reconciled %d times, want %d: %v", key, len(calls), n, ctx.Err())
		case <-ch:
		}
	}
}

func run(t *testing.T, c *reconcile.Controller, sources ...reconcile.Source) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, sources...) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	// Keys added before it runs are dropped.
	if err := c.Sync(testkit.Context(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// A key that keeps failing is retried after a backoff that doubles with each failure, while
// the keys queued meanwhile are reconciled at once by the same (single) worker; once it
// succeeds its backoff is forgotten.
func TestFailingKeyBacksOffWithoutDelayingOthers(t *testing.T) {
	const base = 100 * time.Millisecond
	r := newRecorder()
	r.fail("bad", true)
	c := reconcile.New(reconcile.Config{Name: "test-backoff", Workers: 1, BaseDelay: base, MaxDelay: time.Minute, Log: testkit.Logger(t)}, r)
	run(t, c)
	ctx := testkit.Context(t, 30*time.Second)
	c.Add("bad")
	calls := r.waitCalls(t, ctx, "bad", 3)
	for i := 1; i < len(calls); i++ {
		if gap, least := calls[i].Sub(calls[i-1]), base<<(i-1); gap < least {
			t.Fatalf("retry %d of the failing key after %s, want at least %s", i, gap, least)
		}
	}
	// Its next retry is at least 4*base away: the others go first.
	var others []string
	for i := range 5 {
		k := fmt.Sprintf("good-%d", i)
		others = append(others, k)
		c.Add(k)
	}
	fourth := r.waitCalls(t, ctx, "bad", 4)[3]
	for _, k := range others {
		got := r.times(k)
		if len(got) != 1 || !got[0].Before(fourth) {
			t.Fatalf("key %s reconciled at %v, after the failing key's next retry at %v: held up by it", k, got, fourth)
		}
	}
	if gap := fourth.Sub(calls[2]); gap < 4*base {
		t.Fatalf("third retry after %s, want at least %s", gap, 4*base)
	}

	// Success forgets the failures: a new failure is retried after the base delay again, not
	// after 16*base.
	r.fail("bad", false)
	c.Add("bad")
	n := len(r.waitCalls(t, ctx, "bad", 5))
	r.fail("bad", true)
	c.Add("bad")
	calls = r.waitCalls(t, ctx, "bad", n+2)
	if gap := calls[n+1].Sub(calls[n]); gap >= 16*base {
		t.Fatalf("first retry after a success took %s: the earlier failures were not forgotten", gap)
	}
}

// Keys queued several times before a worker takes them are reconciled once.
func TestQueuedKeyIsReconciledOnce(t *testing.T) {
	r := newRecorder()
	block := make(chan struct{})
	started := make(chan struct{}, 1)
	c := reconcile.New(reconcile.Config{Name: "test-dedup"}, reconcile.Func(func(ctx context.Context, key string) error {
		if key == "block" {
			started <- struct{}{}
			<-block
		}
		return r.Reconcile(ctx, key)
	}))
	run(t, c)
	ctx := testkit.Context(t, 10*time.Second)
	c.Add("block")
	<-started
	for range 10 {
		c.Add("k")
	}
	close(block)
	if err := c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := len(r.times("k")); got != 1 {
		t.Fatalf("key queued 10 times while the worker was busy reconciled %d times, want 1", got)
	}
}

func newCacheBucket(t *testing.T, js jetstream.JetStream, name string) (jetstream.KeyValue, *view.Cache[*clusterv1.Cluster]) {
	t.Helper()
	ctx := testkit.Context(t, 10*time.Second)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: name})
	if err != nil {
		t.Fatal(err)
	}
	cache := view.NewCache(js, kv, func() *clusterv1.Cluster { return &clusterv1.Cluster{} }, testkit.Logger(t))
	cctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = cache.Run(cctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-cache.Ready():
	case <-ctx.Done():
		t.Fatal("cache not ready")
	}
	return kv, cache
}

func putCluster(t *testing.T, kv jetstream.KeyValue, key string) {
	t.Helper()
	data, err := proto.Marshal(&clusterv1.Cluster{Name: key})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(context.Background(), key, data); err != nil {
		t.Fatal(err)
	}
}

// Changes of a cache queue their keys; the start queues every key; Sync returns once every
// key has been reconciled since it was called.
func TestWatchQueuesChangedKeys(t *testing.T) {
	j := testkit.StartJetStream(t)
	kv, cache := newCacheBucket(t, j.JS, "things")
	putCluster(t, kv, "a")
	if err := cache.WaitFor(testkit.Context(t, 10*time.Second), "a", func(_ *clusterv1.Cluster, ok bool) bool { return ok }); err != nil {
		t.Fatal(err)
	}
	r := newRecorder()
	c := reconcile.New(reconcile.Config{Name: "test-watch", Keys: func() []string {
		var out []string
		for _, e := range cache.Entries(nil) {
			out = append(out, e.Key)
		}
		return out
	}}, r)
	run(t, c, reconcile.Watch(cache, func(u view.Update[*clusterv1.Cluster]) []string { return []string{"of-" + u.Key} }))
	ctx := testkit.Context(t, 10*time.Second)
	r.waitCalls(t, ctx, "a", 1) // the start
	putCluster(t, kv, "b")
	r.waitCalls(t, ctx, "of-b", 1) // the change, mapped
	before := len(r.times("a"))
	if err := c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := len(r.times("b")); got != 1 {
		t.Fatalf("b reconciled %d times after Sync, want 1", got)
	}
	if got := len(r.times("a")); got != before+1 {
		t.Fatalf("a reconciled %d times after Sync, want %d", got, before+1)
	}
}

// Of two replicas running the same controller under one lease, only the holder reconciles;
// when it stops, the other takes over.
func TestOnlyTheLeaseHolderReconciles(t *testing.T) {
	j := testkit.StartJetStream(t)
	keys := func() []string { return []string{"k"} }
	type replica struct {
		r      *recorder
		c      *reconcile.Controller
		cancel context.CancelFunc
		done   chan error
	}
	start := func(name string) *replica {
		r := newRecorder()
		c := reconcile.New(reconcile.Config{Name: "test-lease-" + name, Keys: keys, Resync: 20 * time.Millisecond}, r)
		ctx, cancel := context.WithCancel(context.Background())
		rep := &replica{r: r, c: c, cancel: cancel, done: make(chan error, 1)}
		go func() {
			rep.done <- reconcile.RunLeased(ctx, j.JS, "test.reconcile", []lease.Option{lease.WithLogger(testkit.Logger(t))}, func(ctx context.Context) error { return c.Run(ctx) })
		}()
		t.Cleanup(func() { cancel(); <-rep.done })
		return rep
	}
	a, b := start("a"), start("b")
	ctx := testkit.Context(t, 30*time.Second)
	holder, other := a, b
	select {
	case <-a.r.changes():
	case <-b.r.changes():
		holder, other = b, a
	case <-ctx.Done():
		t.Fatal("nobody reconciled")
	}
	// The holder resyncs every 20 ms; in many of its rounds the other did nothing.
	holder.r.waitCalls(t, ctx, "k", 20)
	if n := len(other.r.times("k")); n != 0 {
		t.Fatalf("the replica not holding the lease reconciled %d times", n)
	}
	// Sync on the replica that does not hold the lease waits for it.
	sctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := other.c.Sync(sctx); err == nil {
		t.Fatal("Sync returned on a replica not holding the lease")
	}
	holder.cancel()
	if err := <-holder.done; err != nil {
		t.Fatal(err)
	}
	holder.done <- nil // for the cleanup
	other.r.waitCalls(t, ctx, "k", 1)
	if err := other.c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
}

// A delayed source queues a key only once its delay has passed since the change that named it,
// and the changes made while the key waits are reconciled by that one reconcile.
func TestDelayGathersChanges(t *testing.T) {
	const delay, puts = 300 * time.Millisecond, 20
	j := testkit.StartJetStream(t)
	kv, cache := newCacheBucket(t, j.JS, "gathered")
	r := newRecorder()
	c := reconcile.New(reconcile.Config{Name: "test-delay"}, r)
	run(t, c, reconcile.Delay(reconcile.Watch(cache, func(view.Update[*clusterv1.Cluster]) []string { return []string{"all"} }),
		func() time.Duration { return delay }))
	ctx := testkit.Context(t, 10*time.Second)
	start := time.Now()
	for i := range puts {
		putCluster(t, kv, fmt.Sprintf("c%d", i))
	}
	took := time.Since(start)
	first := r.waitCalls(t, ctx, "all", 1)[0]
	if waited := first.Sub(start); waited < delay {
		t.Fatalf("first reconcile %s after the first change, want at least the delay, %s", waited, delay)
	}
	// An upper bound, so a slow feed can only make it easier to meet: by the time a key added
	// twice the delay from now is reconciled, the puts have been reconciled at most once per
	// delay they spanned, and once more for the changes after the last wait began.
	c.AddAfter("barrier", 2*delay)
	r.waitCalls(t, ctx, "barrier", 1)
	if got, most := len(r.times("all")), int(took/delay)+2; got > most {
		t.Fatalf("%d changes over %s reconciled %d times with a delay of %s, want at most %d", puts, took, got, delay, most)
	}
}

// fleet_workqueue_retries_total counts failed reconciles queued again, not a reconciler's
// AddAfter for a moment a key will be due (client-go counts both as retries).
func TestRetriesCountFailuresOnly(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	var c *reconcile.Controller
	var mu sync.Mutex
	calls := map[string]int{}
	done := make(chan struct{})
	c = reconcile.New(reconcile.Config{Name: "test-retries", BaseDelay: time.Millisecond, Log: testkit.Logger(t)},
		reconcile.Func(func(_ context.Context, key string) error {
			mu.Lock()
			defer mu.Unlock()
			calls[key]++
			switch {
			case key == "later" && calls[key] <= 3:
				c.AddAfter(key, time.Millisecond) // not due yet
			case key == "bad" && calls[key] <= 2:
				return errors.New("failing on purpose")
			case calls["later"] == 4 && calls["bad"] == 3:
				close(done)
			}
			return nil
		}))
	run(t, c)
	c.Add("later")
	c.Add("bad")
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("reconciles: %v", calls)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c.Collectors()...)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "fleet_workqueue_retries_total" {
			if got := f.GetMetric()[0].GetCounter().GetValue(); got != 2 {
				t.Fatalf("retries_total %v, want 2 (the failures, not the delayed adds)", got)
			}
			return
		}
	}
	t.Fatal("no fleet_workqueue_retries_total")
}
