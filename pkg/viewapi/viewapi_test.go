package viewapi_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/apiwait"
	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/view"
	"github.com/fleetstream/fleetstream/pkg/viewapi"
)

// fixture is a Kind over a real bucket and cache; put and del write the bucket as a projection
// would.
type fixture struct {
	t     *testing.T
	kv    jetstream.KeyValue
	ready chan struct{}
	kind  viewapi.Kind[*clusterv1.Cluster]
}

func newFixture(t *testing.T, bucket string) *fixture {
	t.Helper()
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, time.Minute)
	kv, err := j.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket})
	if err != nil {
		t.Fatal(err)
	}
	c := view.NewCache(j.JS, kv, func() *clusterv1.Cluster { return &clusterv1.Cluster{} }, zap.NewNop())
	go func() { _ = c.Run(ctx) }()
	<-c.Ready()
	f := &fixture{t: t, kv: kv, ready: make(chan struct{})}
	f.kind = viewapi.Kind[*clusterv1.Cluster]{Name: "cluster", Cache: c, Key: func(name string) string { return "c." + name },
		Gate: apiwait.NewGate(f.ready, "test service")}
	return f
}

func (f *fixture) put(name string, rev uint64) {
	f.t.Helper()
	data, err := proto.Marshal(&clusterv1.Cluster{Name: name, Revision: rev})
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.kv.Put(context.Background(), "c."+name, data); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) del(name string) {
	f.t.Helper()
	if err := f.kv.Delete(context.Background(), "c."+name); err != nil {
		f.t.Fatal(err)
	}
}

// answer renders an outcome as a caller sees it: the code and message, or the cluster.
func answer(c *clusterv1.Cluster, err error) string {
	if err != nil {
		return connect.CodeOf(err).String() + ": " + err.Error()
	}
	return c.GetName()
}

func TestGetAndCurrent(t *testing.T) {
	f := newFixture(t, "VIEWAPIGET")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// Before the service is ready a valid request waits (here: its context is done) and gets
	// the retryable answer; an invalid one is refused as such at once.
	if got, want := answer(f.kind.Get(ctx, "c1")), "unavailable: unavailable: test service is starting"; got != want {
		t.Fatalf("get while starting: %s, want %s", got, want)
	}
	if _, err := f.kind.Get(ctx, "Not_A_Label"); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("bad name while starting: %v", err)
	}
	close(f.ready)
	f.put("c1", 7)
	if err := f.kind.Cache.WaitRevision(context.Background(), "c.c1", 7, false); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		expected uint64
		want     string
	}{
		{"c1", 0, "c1"},
		{"c1", 7, "c1"},
		{"c1", 6, "aborted: aborted: cluster \"c1\" is at revision 7, not 6"},
		{"c2", 0, "not_found: not_found: cluster \"c2\" not found"},
		{"c2", 3, "not_found: not_found: cluster \"c2\" not found"},
	} {
		if got := answer(f.kind.Current(tc.name, tc.expected)); got != tc.want {
			t.Errorf("Current(%s, %d) = %s, want %s", tc.name, tc.expected, got, tc.want)
		}
	}
	if got := answer(f.kind.Get(context.Background(), "c1")); got != "c1" {
		t.Errorf("get c1: %s", got)
	}
	if got, want := answer(f.kind.Get(context.Background(), "c2")), "not_found: not_found: cluster \"c2\" not found"; got != want {
		t.Errorf("get c2: %s, want %s", got, want)
	}
	list, err := f.kind.List(context.Background(), nil)
	if err != nil || len(list) != 1 || list[0].Name != "c1" {
		t.Errorf("list: %v %v", list, err)
	}
}

func TestAwaitAndAwaitPast(t *testing.T) {
	f := newFixture(t, "VIEWAPIAWAIT")
	close(f.ready)
	ctx := testkit.Context(t, 30*time.Second)
	// A write at 5 shows in the view a little later (read-your-writes).
	go func() {
		time.Sleep(50 * time.Millisecond)
		f.put("c1", 5)
	}()
	c, ok, err := f.kind.Await(ctx, "c1", 5)
	if err != nil || !ok || c.Revision != 5 {
		t.Fatalf("await 5: %v %v %v", c, ok, err)
	}
	// A deletion shows once the view has moved past the revision the deleter saw.
	go func() {
		time.Sleep(50 * time.Millisecond)
		f.del("c1")
	}()
	if err := f.kind.AwaitPast(ctx, "c1", 5); err != nil {
		t.Fatalf("await past 5: %v", err)
	}
	if _, ok := f.kind.Cache.Get("c.c1"); ok {
		t.Fatal("AwaitPast returned while the view still held revision 5")
	}
	// A write the view never shows: the write stands, the answer says so, retryably.
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, _, err = f.kind.Await(short, "c1", 9)
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("await a write that never shows: %v", err)
	}
}

func TestWatch(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	updates := make(chan view.Update[*clusterv1.Cluster], 3)
	updates <- view.Update[*clusterv1.Cluster]{Key: "c.a", Op: view.Put, Value: &clusterv1.Cluster{Name: "a"}}
	updates <- view.Update[*clusterv1.Cluster]{Key: "c.b", Op: view.Put, Value: &clusterv1.Cluster{Name: "b"}}
	close(updates) // what the view does to a subscriber that fell behind
	var got []string
	err := viewapi.Watch(ctx, updates, "clusters", func(u view.Update[*clusterv1.Cluster]) error {
		got = append(got, u.Value.Name)
		return nil
	})
	if connect.CodeOf(err) != connect.CodeResourceExhausted || err.Error() != "resource_exhausted: watch of clusters fell behind; watch again" || len(got) != 2 {
		t.Fatalf("fell behind: %v after %v", err, got)
	}
	// ErrStop ends the watch without an error; another error of send ends it with that error.
	updates = make(chan view.Update[*clusterv1.Cluster], 1)
	updates <- view.Update[*clusterv1.Cluster]{Key: "c.a", Op: view.Delete}
	if err := viewapi.Watch(ctx, updates, "clusters", func(view.Update[*clusterv1.Cluster]) error { return viewapi.ErrStop }); err != nil {
		t.Fatalf("stop: %v", err)
	}
	updates <- view.Update[*clusterv1.Cluster]{Key: "c.a", Op: view.Delete}
	boom := errors.New("send failed")
	if err := viewapi.Watch(ctx, updates, "clusters", func(view.Update[*clusterv1.Cluster]) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("send failed: %v", err)
	}
	// A watch whose caller went away ends quietly, even if the view then closes the channel.
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := viewapi.Watch(done, make(chan view.Update[*clusterv1.Cluster]), "clusters", nil); err != nil {
		t.Fatalf("caller gone: %v", err)
	}
}

// ensureFixture is a cluster view fed by a real projection engine from stream ENSURE, and a
// built-in cluster "builtin" in it.
func ensureFixture(t *testing.T) (*events.Store, func(decide func(cur *clusterv1.Cluster, ok bool) []proto.Message) viewapi.Builtin[*clusterv1.Cluster]) {
	t.Helper()
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, time.Minute)
	stream, err := j.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "ENSURE", Subjects: []string{"ensure.>"}})
	if err != nil {
		t.Fatal(err)
	}
	e, err := view.NewEngine(j.JS, view.Projection{
		Name: "ENSURED", Version: 1, Stream: "ENSURE", Bucket: jetstream.KeyValueConfig{Bucket: "ENSURED"},
		New: func() proto.Message { return &clusterv1.Cluster{} },
		Apply: func(ev *events.Event) ([]view.Change, error) {
			return []view.Change{view.ChangeOf("c.builtin", func(cur *clusterv1.Cluster) *clusterv1.Cluster {
				switch p := ev.Payload.(type) {
				case *clusterv1.ClusterRegistered:
					return &clusterv1.Cluster{Name: p.Name, Labels: p.Labels}
				case *clusterv1.ClusterUpdated:
					cur.Labels = p.Labels
					return cur
				}
				return nil
			})}, nil
		},
	}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = e.Run(ctx) }()
	<-e.Ready()
	kv, err := j.JS.KeyValue(ctx, "ENSURED")
	if err != nil {
		t.Fatal(err)
	}
	c := view.NewCache(j.JS, kv, func() *clusterv1.Cluster { return &clusterv1.Cluster{} }, zap.NewNop())
	go func() { _ = c.Run(ctx) }()
	<-c.Ready()
	store := events.NewStore(j.JS, "test")
	return store, func(decide func(cur *clusterv1.Cluster, ok bool) []proto.Message) viewapi.Builtin[*clusterv1.Cluster] {
		return viewapi.Builtin[*clusterv1.Cluster]{
			What: "cluster builtin", Cache: c, Key: "c.builtin",
			Store: store, Stream: stream, Subject: "ensure.builtin", AggregateID: "builtin",
			Ended: func(last proto.Message) bool {
				_, gone := last.(*clusterv1.ClusterDeregistered)
				return gone
			},
			Decide: decide,
		}
	}
}

func TestEnsure(t *testing.T) {
	store, builtin := ensureFixture(t)
	ctx := testkit.Context(t, 30*time.Second)
	log, logs := testkit.ObservedLogger(t)
	// The first write loses a race to another replica, whose write then shows; the second
	// decision finds the object as wanted and writes nothing.
	var decisions []string
	err := viewapi.Ensure(ctx, log, builtin(func(cur *clusterv1.Cluster, ok bool) []proto.Message {
		if !ok {
			decisions = append(decisions, "absent")
			if _, err := store.Append(ctx, "ensure.builtin", "builtin", events.At(0), &clusterv1.ClusterRegistered{Name: "builtin"}); err != nil {
				t.Error(err) // the other replica
			}
			return []proto.Message{&clusterv1.ClusterRegistered{Name: "builtin"}}
		}
		decisions = append(decisions, "present")
		return nil
	}))
	if err != nil || len(decisions) != 2 || decisions[1] != "present" {
		t.Fatalf("lost race: %v after %v", err, decisions)
	}
	if n := logs.FilterMessageSnippet("written").Len(); n != 0 {
		t.Fatalf("a replica that wrote nothing says it wrote, %d times", n)
	}
	// This replica writes: Ensure returns once the view shows it, and says so.
	b := builtin(func(cur *clusterv1.Cluster, ok bool) []proto.Message {
		if cur.GetLabels()["v"] == "2" {
			return nil
		}
		return []proto.Message{&clusterv1.ClusterUpdated{Fields: []string{"labels"}, Labels: map[string]string{"v": "2"}}}
	})
	if err := viewapi.Ensure(ctx, log, b); err != nil {
		t.Fatal(err)
	}
	if c, _ := b.Cache.Get("c.builtin"); c.GetRevision() != 2 || c.GetLabels()["v"] != "2" {
		t.Fatalf("returned before the view showed revision 2: %v", c)
	}
	testkit.Eventually(t, 5*time.Second, logs.Count("built-in cluster builtin written", 1))
	// Another failure is the caller's, named.
	b = builtin(func(*clusterv1.Cluster, bool) []proto.Message {
		return []proto.Message{&clusterv1.ClusterUpdated{Fields: []string{"labels"}}}
	})
	b.Subject = "nowhere.builtin" // in no stream
	err = viewapi.Ensure(ctx, log, b)
	if err == nil || !strings.HasPrefix(err.Error(), "built-in cluster builtin: ") {
		t.Fatalf("failure: %v", err)
	}
}
