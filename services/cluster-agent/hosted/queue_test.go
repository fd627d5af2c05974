package hosted

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// fleet is a registry in a real JetStream, read by a supervisor's caches.
type fleet struct {
	clustersKV, statusKV jetstream.KeyValue
	r                    *registry
	s                    *Supervisor
}

func newFleet(t testing.TB, ctx context.Context) *fleet {
	t.Helper()
	js := testkit.StartJetStream(t).JS
	f := &fleet{}
	var err error
	if f.clustersKV, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: subjects.ClustersBucket}); err != nil {
		t.Fatal(err)
	}
	if f.statusKV, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: subjects.ClusterStatusBucket}); err != nil {
		t.Fatal(err)
	}
	f.s, err = New(Config{NATSURL: "nats://127.0.0.1:1", ServiceToken: "unused", InClusterGrace: 3 * time.Second}, js, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	f.r = &registry{
		clusters: view.NewCache(js, f.clustersKV, func() *clusterv1.Cluster { return &clusterv1.Cluster{} }, zap.NewNop()),
		status:   view.NewCache(js, f.statusKV, func() *clusterv1.AgentStatus { return &clusterv1.AgentStatus{} }, zap.NewNop()),
	}
	go func() { _ = f.r.clusters.Run(ctx) }()
	go func() { _ = f.r.status.Run(ctx) }()
	return f
}

func (f *fleet) put(t testing.TB, ctx context.Context, kv jetstream.KeyValue, name string, m proto.Message) {
	t.Helper()
	data, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, keys.Encode(name), data); err != nil {
		t.Fatal(err)
	}
}

// register puts cluster name into the clusters view, with credentials or not.
func (f *fleet) register(t testing.TB, ctx context.Context, name string, credentials bool) {
	t.Helper()
	st := &clusterv1.ClusterStatus{}
	if credentials {
		st.CredentialsSet, st.CredentialsFingerprint = true, "fp-"+name
	}
	f.put(t, ctx, f.clustersKV, name, &clusterv1.Cluster{Id: "id-" + name, Name: name, Status: st})
}

// heartbeat records a heartbeat of cluster name's own agent at at.
func (f *fleet) heartbeat(t testing.TB, ctx context.Context, name string, at time.Time) {
	t.Helper()
	ts := timestamppb.New(at)
	f.put(t, ctx, f.statusKV, name, &clusterv1.AgentStatus{ClusterName: name, SessionId: "s", LastSeen: ts, InClusterLastSeen: ts})
}

// caught waits until both caches hold what the buckets hold.
func (f *fleet) caught(t testing.TB, ctx context.Context) {
	t.Helper()
	if _, err := f.r.clusters.Current(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.r.status.Current(ctx); err != nil {
		t.Fatal(err)
	}
}

// Whether a cluster is hosted, decided for that cluster alone, as the whole-fleet pass did.
func TestDecide(t *testing.T) {
	ctx := testkit.Context(t, time.Minute)
	f := newFleet(t, ctx)
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	f.s.now = func() time.Time { return now }
	grace := f.s.cfg.InClusterGrace
	f.register(t, ctx, "no-credentials", false)
	f.register(t, ctx, "never-seen", true)
	f.register(t, ctx, "hosted-heartbeat", true)
	f.put(t, ctx, f.statusKV, "hosted-heartbeat", &clusterv1.AgentStatus{ClusterName: "hosted-heartbeat", Hosted: true, LastSeen: timestamppb.New(now)})
	f.register(t, ctx, "own-agent", true)
	f.heartbeat(t, ctx, "own-agent", now.Add(-time.Second))
	f.register(t, ctx, "own-agent-silent", true)
	f.heartbeat(t, ctx, "own-agent-silent", now.Add(-grace))
	f.register(t, ctx, "own-agent-no-credentials", false)
	f.heartbeat(t, ctx, "own-agent-no-credentials", now.Add(-time.Hour))
	f.register(t, ctx, "a.dotted/name", true)
	f.heartbeat(t, ctx, "not-registered", now.Add(-time.Hour))
	f.caught(t, ctx)

	for _, tc := range []struct {
		cluster string
		host    bool
		recheck time.Duration
	}{
		{"no-credentials", false, 0},
		{"never-seen", true, 0},
		{"hosted-heartbeat", true, 0},
		{"own-agent", false, grace - time.Second},
		{"own-agent-silent", true, 0},
		{"own-agent-no-credentials", false, 0},
		{"a.dotted/name", true, 0},
		{"not-registered", false, 0},
	} {
		t.Run(tc.cluster, func(t *testing.T) {
			c, host, recheck := f.s.decide(tc.cluster, f.r)
			if host != tc.host || recheck != tc.recheck {
				t.Errorf("host %v, recheck %s; want %v, %s", host, recheck, tc.host, tc.recheck)
			}
			if host && c.GetName() != tc.cluster {
				t.Errorf("decided on cluster %q", c.GetName())
			}
		})
	}
}

// take returns the next queued cluster, failing the test if none comes within a few seconds.
func take(t *testing.T, q queue) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		name, shutdown := q.Get()
		if !shutdown {
			q.Done(name)
		}
		got <- name
	}()
	select {
	case name := <-got:
		return name
	case <-time.After(5 * time.Second):
		q.ShutDown()
		t.Fatal("nothing queued")
		return ""
	}
}

// takeUntil takes queued clusters until last, and fails unless those taken are want.
func takeUntil(t *testing.T, q queue, last string, want ...string) {
	t.Helper()
	seen := map[string]bool{}
	for name := ""; name != last; {
		name = take(t, q)
		seen[name] = true
	}
	if got := slices.Sorted(maps.Keys(seen)); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Fatalf("queued %v, want %v", got, want)
	}
	if n := q.Len(); n != 0 {
		t.Fatalf("%d more clusters queued", n)
	}
}

// A heartbeat queues its own cluster and no other, and so does a change of one cluster: the
// supervisor no longer passes over the fleet on every heartbeat (issue 26, 70% of fleetd's CPU
// at 2,000 clusters). Every cluster is queued once at the start.
func TestChangeQueuesItsClusterOnly(t *testing.T) {
	ctx := testkit.Context(t, time.Minute)
	f := newFleet(t, ctx)
	const n = 200
	var names []string
	for i := range n {
		name := fmt.Sprintf("c-%03d", i)
		names = append(names, name)
		f.register(t, ctx, name, i%2 == 1)
		if i%2 == 1 {
			f.heartbeat(t, ctx, name, time.Now())
		}
	}
	f.caught(t, ctx)
	q := newQueue()
	defer q.ShutDown()
	go func() { _ = f.s.follow(ctx, f.r, q, nil, updatesBuffer) }()
	seen := map[string]bool{}
	for len(seen) < n {
		seen[take(t, q)] = true
	}
	if got := slices.Sorted(maps.Keys(seen)); !slices.Equal(got, names) {
		t.Fatalf("queued at the start: %v", got)
	}

	// Heartbeats, in order on one bucket: the last one taken means the others were queued.
	f.heartbeat(t, ctx, "c-007", time.Now())
	f.heartbeat(t, ctx, "c-011", time.Now())
	takeUntil(t, q, "c-011", "c-007", "c-011")

	f.register(t, ctx, "c-042", true) // credentials set
	f.register(t, ctx, "new", true)
	takeUntil(t, q, "new", "c-042", "new")

	if err := f.clustersKV.Delete(ctx, keys.Encode("c-100")); err != nil {
		t.Fatal(err)
	}
	takeUntil(t, q, "c-100", "c-100")

	// A heartbeat of an unregistered cluster queues it too: its hosted agent, if any, stops.
	f.heartbeat(t, ctx, "gone", time.Now())
	takeUntil(t, q, "gone", "gone")
}

// A supervisor that falls behind a cache's changes is cut off by the cache: it follows again
// from what the cache holds, queues every cluster once, and goes on queueing changes. Before,
// the closed channel stayed in its select, always ready: a pass over every cluster in a busy
// loop until the lease changed hands.
func TestCutOffFollowsAgain(t *testing.T) {
	ctx := testkit.Context(t, time.Minute)
	f := newFleet(t, ctx)
	for _, name := range []string{"a", "b", "c"} {
		f.register(t, ctx, name, false)
	}
	f.caught(t, ctx)
	q := newQueue()
	defer q.ShutDown()
	// Holding the supervisor's lock stops follow in its first resync (Hosting), subscribed
	// with room for one change: the burst below cuts it off.
	f.s.mu.Lock()
	go func() { _ = f.s.follow(ctx, f.r, q, nil, 1) }()
	for q.Len() < 3 {
		time.Sleep(10 * time.Millisecond)
	}
	for i := range 5 {
		f.heartbeat(t, ctx, "a", time.Now().Add(time.Duration(i)*time.Millisecond))
	}
	f.caught(t, ctx)
	f.s.mu.Unlock()
	// The start and the resync after the cut-off, and then quiet: nothing queued while nothing
	// changes.
	seen := map[string]bool{}
	for end, limit := time.Now().Add(300*time.Millisecond), time.Now().Add(5*time.Second); time.Now().Before(end); {
		if time.Now().After(limit) {
			t.Fatalf("still queueing after 5 s with no change: %v", slices.Sorted(maps.Keys(seen)))
		}
		if q.Len() == 0 {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		seen[take(t, q)] = true
		end = time.Now().Add(300 * time.Millisecond)
	}
	if got := slices.Sorted(maps.Keys(seen)); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("queued %v after the cut-off", got)
	}
	// Changes are followed again.
	f.heartbeat(t, ctx, "b", time.Now())
	takeUntil(t, q, "b", "b")
}

// A cluster left to its own agent is looked at again when the grace since that agent's last
// heartbeat runs out, with no other change and no pass over the fleet.
func TestGraceRunsOutWithoutAChange(t *testing.T) {
	ctx := testkit.Context(t, time.Minute)
	f := newFleet(t, ctx)
	f.s.cfg.InClusterGrace = 500 * time.Millisecond
	f.register(t, ctx, "solo", true)
	f.heartbeat(t, ctx, "solo", time.Now())
	f.caught(t, ctx)
	q := newQueue()
	defer q.ShutDown()
	q.Add("solo")
	start := time.Now()
	if !f.s.processNext(ctx, q, f.r) {
		t.Fatal("queue shut down")
	}
	if got := f.s.Hosting(); len(got) != 0 {
		t.Fatalf("hosted beside its own agent: %v", got)
	}
	if name := take(t, q); name != "solo" {
		t.Fatalf("queued %q", name)
	}
	if waited := time.Since(start); waited < 400*time.Millisecond {
		t.Fatalf("looked at again after %s, before the grace ran out", waited)
	}
	if _, host, _ := f.s.decide("solo", f.r); !host {
		t.Fatal("grace ran out, yet not to be hosted")
	}
}

// fullPass is the supervisor's reconcile before issue 26, kept as the benchmark's baseline: on
// every change it listed every cluster and looked at each one.
func (s *Supervisor) fullPass(ctx context.Context, r *registry) {
	want := map[string]*clusterv1.Cluster{}
	for _, c := range r.clusters.List(nil) {
		if !c.GetStatus().GetCredentialsSet() {
			continue
		}
		if st, ok := r.status.Get(keys.Encode(c.Name)); ok && st.InClusterLastSeen != nil &&
			s.now().Sub(st.InClusterLastSeen.AsTime()) < s.cfg.InClusterGrace {
			continue // its own agent runs
		}
		want[c.Name] = c
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, h := range s.running {
		if c, ok := want[name]; ok && c.Status.CredentialsFingerprint == h.fingerprint {
			continue
		}
		h.stop()
		delete(s.running, name)
	}
	if len(want) != 0 {
		panic("the benchmark's fleet has a cluster to host")
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkHeartbeat measures the supervisor's work for one heartbeat (a cluster-status
// update) in a fleet of N registered clusters, none hosted: half registered without
// credentials, half with credentials and their own agent heartbeating. full-pass is the
// reconcile before issue 26 (every cluster, on every heartbeat); per-key queues the
// heartbeat's cluster and reconciles it alone. cpu-ns/op is the process's CPU (getrusage);
// %core is that at one heartbeat per cluster every 5 s, the agents' default.
//
//	go test -run '^$' -bench Heartbeat -benchtime 2s ./hosted/
func BenchmarkHeartbeat(b *testing.B) {
	for _, n := range []int{1000, 2000} {
		ctx, cancel := context.WithCancel(context.Background())
		f := newFleet(b, ctx)
		now := time.Now()
		f.s.now = func() time.Time { return now } // no grace runs out while measured
		names := make([]string, n)
		for i := range n {
			names[i] = fmt.Sprintf("cluster-%05d", i)
			f.register(b, ctx, names[i], i%2 == 1)
			f.heartbeat(b, ctx, names[i], now)
		}
		f.caught(b, ctx)
		var fullNs float64
		report := func(b *testing.B, cpu time.Duration) float64 {
			perOp := float64(cpu.Nanoseconds()) / float64(b.N)
			b.ReportMetric(perOp, "cpu-ns/op")
			b.ReportMetric(perOp*float64(n)/5/1e9*100, "%core")
			return perOp
		}
		b.Run(fmt.Sprintf("clusters=%d/full-pass", n), func(b *testing.B) {
			start := cpuTime()
			for b.Loop() {
				f.s.fullPass(ctx, f.r)
			}
			fullNs = report(b, cpuTime()-start)
		})
		b.Run(fmt.Sprintf("clusters=%d/per-key", n), func(b *testing.B) {
			q := newQueue()
			defer q.ShutDown()
			start := cpuTime()
			for i := 0; b.Loop(); i++ {
				q.Add(names[i%n])
				f.s.processNext(ctx, q, f.r)
			}
			if perKey := report(b, cpuTime()-start); perKey > 0 && fullNs > 0 {
				b.ReportMetric(fullNs/perKey, "x-less-cpu")
			}
		})
		cancel()
	}
}
