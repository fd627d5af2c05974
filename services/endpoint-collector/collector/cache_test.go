package collector

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"connectrpc.com/connect"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// memCollector is a collector without JetStream holding services svc-0..svc-(n-1) of namespace
// bench, eps endpoints in each of two clusters, applied as the ingester and workers would.
func memCollector(t testing.TB, cfg Config, services, eps int) *Collector {
	t.Helper()
	c := newCollector(cfg, quietLogger())
	now := time.Now()
	for s := range services {
		for _, cl := range []string{"east", "west"} {
			rep := benchSlice(cl, s, 0, eps, 0)
			if err := c.ingest.handle(subjects.AgentEndpointSlice(cl, "bench", rep.Slice), encodeReport(t, rep), now); err != nil {
				t.Fatal(err)
			}
		}
		for c.queue.Len() > 0 {
			key, _ := c.queue.Get()
			c.reconcile(key)
			c.queue.Done(key)
		}
	}
	close(c.ready)
	return c
}

// liveHeap returns the bytes of the heap still in use, after two collections (the second frees
// what finalizers of the first let go).
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// query gets a service as a Connect JSON client would: the response and its encoding.
func query(t testing.TB, c *Collector, svc int) *endpointv1.GetServiceEndpointsResponse {
	t.Helper()
	resp, err := c.GetServiceEndpoints(context.Background(), connect.NewRequest(&endpointv1.GetServiceEndpointsRequest{
		Namespace: "bench", Name: fmt.Sprintf("svc-%d", svc)}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (&jsonCodec{r: c.codec}).Marshal(resp.Msg); err != nil {
		t.Fatal(err)
	}
	return resp.Msg
}

// checkAccounts checks the cache's byte count against its entries, and its gzip index.
func checkAccounts(t testing.TB, r *responseCodec) (entries int, bytes int64) {
	t.Helper()
	defer checkGzipIndex(t, r) // after the unlock below
	r.mu.Lock()
	defer r.mu.Unlock()
	var sum int64
	for i, c := range r.ring {
		if c.slot != i {
			t.Fatalf("entry %d says it is at %d", i, c.slot)
		}
		if c.slots[c.filter].Load() != c || c.owner.resp.Load() != c.slots {
			t.Fatalf("entry %d is not in its snapshot", i)
		}
		sum += c.size
	}
	if sum != r.bytes {
		t.Fatalf("cache counts %d bytes, its entries hold %d", r.bytes, sum)
	}
	return len(r.ring), r.bytes
}

func TestResponseBytesEstimate(t *testing.T) {
	for _, eps := range []int{1, 10, 100} {
		c := memCollector(t, Config{}, 1, eps)
		sn := c.store.snapshot("bench/svc-0")
		const n = 2000
		// The least of three: whatever else the process allocates meanwhile only adds.
		measured := 0.0
		var held []*cachedResponse
		for range 3 {
			held = make([]*cachedResponse, n)
			codec := newResponseCodec(1<<40, nil)
			before := liveHeap()
			for i := range held {
				held[i] = &cachedResponse{msg: sn.build(c.store.strs, endpointv1.EndpointFilter_ENDPOINT_FILTER_READY, ""), slot: -1}
				codec.cache.Store(held[i].msg, held[i])
			}
			m := (float64(liveHeap()) - float64(before)) / n
			runtime.KeepAlive(held)
			runtime.KeepAlive(codec)
			if measured == 0 || m < measured {
				measured = m
			}
		}
		est := float64(responseBytes(held[0].msg))
		t.Logf("%d endpoints per cluster: measured %.0f B, estimated %.0f B", eps, measured, est)
		if est < 0.85*measured || est > 1.15*measured {
			t.Errorf("%d endpoints per cluster: estimate %.0f B is off the measured %.0f B by more than 15%%", eps, est, measured)
		}
	}
}

// What the cache charges for its entries is what they hold: the heap every service's cached
// response and its encoding take (the message, the entry and its records, the encoding and its
// gzip index record), within 5% below and 10% above. A charge short of the heap lets the cache
// exceed its budget (the charges before this test were 9% short at 1 endpoint per cluster).
func TestCachedBytesMatchHeap(t *testing.T) {
	for _, eps := range []int{1, 3, 10} {
		const n = 2000
		c := memCollector(t, Config{ResponseCacheBytes: 1 << 40}, n, eps)
		before := liveHeap()
		for s := range n {
			query(t, c, s)
		}
		measured := float64(liveHeap()) - float64(before)
		entries, charged := checkAccounts(t, c.codec)
		runtime.KeepAlive(c)
		t.Logf("%d endpoints per cluster: %d entries, charged %.0f B each, heap %.0f B each", eps, entries,
			float64(charged)/float64(entries), measured/float64(entries))
		if entries != n || float64(charged) < 0.95*measured || float64(charged) > 1.1*measured {
			t.Errorf("%d endpoints per cluster: %d entries charged %d B, the heap grew by %.0f B", eps, entries, charged, measured)
		}
	}
}

// The response cache stays within its budget while every service is queried once, keeps the
// response of a service polled meanwhile (its message and encoding are reused, not rebuilt),
// and lets go of what was asked once; a superseded snapshot's entries leave it.
func TestResponseCacheKeepsHotServicesWithinBudget(t *testing.T) {
	const services, budget = 300, 64 << 10 // a 20-endpoint response and its JSON: ~8 KB
	c := memCollector(t, Config{ResponseCacheBytes: budget}, services, 10)
	hot := query(t, c, 0)
	for s := 1; s < services; s++ {
		query(t, c, s)
		if got := query(t, c, 0); got != hot {
			t.Fatalf("after svc-%d was queried, the polled svc-0 was built again", s)
		}
		if c.codec.lookup(hot) == nil {
			t.Fatalf("after svc-%d was queried, svc-0's encoding is no longer cached", s)
		}
		if _, bytes := checkAccounts(t, c.codec); bytes > budget {
			t.Fatalf("after svc-%d: %d bytes cached, budget %d", s, bytes, budget)
		}
	}
	entries, bytes := checkAccounts(t, c.codec)
	if entries < 4 || entries > 12 {
		t.Errorf("%d responses (%d bytes) cached within %d bytes: the size estimate is off", entries, bytes, budget)
	}
	once := query(t, c, 1)
	if again := query(t, c, 1); again != once {
		t.Error("a response just cached was built again")
	}
	if sn := c.store.snapshot("bench/svc-2"); sn.cached(endpointv1.EndpointFilter_ENDPOINT_FILTER_READY) != nil {
		t.Error("svc-2, queried once long ago, is still cached")
	} else if sn.resp.Load() != nil {
		t.Error("svc-2's response was evicted, but its snapshot still holds the slots")
	}

	// A new snapshot of svc-0: the old response leaves the cache, the new one is cached.
	rep := benchSlice("east", 0, 0, 10, 1)
	if err := c.ingest.handle(subjects.AgentEndpointSlice("east", "bench", rep.Slice), encodeReport(t, rep), time.Now()); err != nil {
		t.Fatal(err)
	}
	key, _ := c.queue.Get()
	c.reconcile(key)
	c.queue.Done(key)
	if c.codec.lookup(hot) != nil {
		t.Error("the superseded response of svc-0 is still cached")
	}
	if fresh := query(t, c, 0); fresh == hot || c.codec.lookup(fresh) == nil {
		t.Error("the new response of svc-0 is not the one cached")
	}
	checkAccounts(t, c.codec)
}

// With caching off every query builds its response and nothing is kept.
func TestResponseCacheOff(t *testing.T) {
	c := memCollector(t, Config{ResponseCacheBytes: -1}, 3, 10)
	first, second := query(t, c, 0), query(t, c, 0)
	if first == second {
		t.Error("a response was cached with the cache off")
	}
	if entries, bytes := checkAccounts(t, c.codec); entries != 0 || bytes != 0 {
		t.Errorf("%d entries, %d bytes cached with the cache off", entries, bytes)
	}
}

// By default the budget follows the store: a share per address held, within its floor and cap,
// and it shrinks again as services go.
func TestResponseCacheDefaultBudgetScales(t *testing.T) {
	c := memCollector(t, Config{}, 5000, 10) // 100,000 addresses
	if got, want := c.codec.limit(), int64(100000*ResponseCacheBytesPerAddress); got != want {
		t.Errorf("budget %d with 100,000 addresses, want %d", got, want)
	}
	for s := range 4000 {
		for _, cl := range []string{"east", "west"} {
			rep := benchSlice(cl, s, 0, 10, 0)
			rep.Deleted = true
			if err := c.ingest.handle(subjects.AgentEndpointSlice(cl, "bench", rep.Slice), encodeReport(t, rep), time.Now()); err != nil {
				t.Fatal(err)
			}
		}
	}
	for c.queue.Len() > 0 {
		key, _ := c.queue.Get()
		c.reconcile(key)
		c.queue.Done(key)
	}
	if got := c.store.addresses.Load(); got != 20000 {
		t.Errorf("%d addresses held after 4,000 of 5,000 services went, want 20,000", got)
	}
	if got := c.codec.limit(); got != MinResponseCacheBytes {
		t.Errorf("budget %d with 20,000 addresses, want the floor %d", got, MinResponseCacheBytes)
	}
	if got := scaledBudget(10_000_000); got != DefaultResponseCacheBytes {
		t.Errorf("budget %d with 10,000,000 addresses, want the cap %d", got, DefaultResponseCacheBytes)
	}
}
