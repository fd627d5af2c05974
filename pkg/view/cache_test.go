package view_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"strings"
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

func newCluster() *clusterv1.Cluster { return &clusterv1.Cluster{} }

// teamIndex lists a cluster under its team label and under the first part of its key.
func teamIndex(key string, c *clusterv1.Cluster) []string {
	terms := []string{"prefix:" + strings.SplitN(key, ".", 2)[0]}
	if team := c.Labels["team"]; team != "" {
		terms = append(terms, "team:"+team)
	}
	return terms
}

// cacheOp is one write to a bucket: a put of a cluster named name with label team, a delete
// (del), or a put of bytes that do not decode (garbage).
type cacheOp struct {
	key, name, team string
	del, garbage    bool
}

func put(key, name, team string) cacheOp { return cacheOp{key: key, name: name, team: team} }
func del(key string) cacheOp             { return cacheOp{key: key, del: true} }
func garbage(key string) cacheOp         { return cacheOp{key: key, garbage: true} }

// wantEntry is a cached entry: the cluster's name and the op (1-based: a fresh bucket's KV
// revisions count its writes) that stored it.
type wantEntry struct {
	name string
	op   uint64
}

func TestCacheEntries(t *testing.T) {
	j := testkit.StartJetStream(t)
	for i, tc := range []struct {
		name   string
		opts   []view.CacheOption
		ops    []cacheOp
		sync   string // a key the cache sees after every op
		want   map[string]wantEntry
		lookup map[string][]string // index term → keys listed under it
	}{{
		name: "revisions of the last writes",
		ops:  []cacheOp{put("a.1", "one", ""), put("b.1", "two", ""), put("a.1", "uno", "")},
		sync: "sync",
		want: map[string]wantEntry{"a.1": {"uno", 3}, "b.1": {"two", 2}},
	}, {
		name: "filter keeps other keys out",
		opts: []view.CacheOption{view.WithFilter("a.>")},
		ops:  []cacheOp{put("a.1", "one", ""), put("b.1", "two", ""), put("a.2", "three", ""), del("a.2")},
		sync: "a.sync",
		want: map[string]wantEntry{"a.1": {"one", 1}},
	}, {
		name: "index follows puts and deletes",
		opts: []view.CacheOption{view.WithIndex(teamIndex)},
		ops:  []cacheOp{put("a.x", "x", "red"), put("a.y", "y", "red"), put("b.z", "z", "red"), put("a.x", "x", "blue"), del("a.y")},
		sync: "sync",
		want: map[string]wantEntry{"a.x": {"x", 4}, "b.z": {"z", 3}},
		lookup: map[string][]string{
			"team:red": {"b.z"}, "team:blue": {"a.x"}, "prefix:a": {"a.x"}, "prefix:b": {"b.z"}, "team:green": nil,
		},
	}, {
		name: "filter and index",
		opts: []view.CacheOption{view.WithFilter("a.>"), view.WithIndex(teamIndex)},
		ops:  []cacheOp{put("a.x", "x", "red"), put("b.x", "x", "red"), put("a.y", "y", "red")},
		sync: "a.sync",
		want: map[string]wantEntry{"a.x": {"x", 1}, "a.y": {"y", 3}},
		lookup: map[string][]string{
			"team:red": {"a.x", "a.y"}, "prefix:a": {"a.sync", "a.x", "a.y"}, "prefix:b": nil,
		},
	}, {
		name: "undecodable put keeps the entry and its terms",
		opts: []view.CacheOption{view.WithIndex(teamIndex)},
		ops:  []cacheOp{put("a.x", "x", "red"), garbage("a.x"), garbage("a.y")},
		sync: "sync",
		want: map[string]wantEntry{"a.x": {"x", 1}},
		lookup: map[string][]string{
			"team:red": {"a.x"}, "prefix:a": {"a.x"},
		},
	}, {
		name: "delete of an absent key",
		opts: []view.CacheOption{view.WithIndex(teamIndex)},
		ops:  []cacheOp{del("a.x"), put("a.y", "y", ""), del("a.y"), del("a.y")},
		sync: "sync",
		want: map[string]wantEntry{},
		lookup: map[string][]string{
			"prefix:a": nil,
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testkit.Context(t, 30*time.Second)
			kv, err := j.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: fmt.Sprintf("CACHE%d", i)})
			if err != nil {
				t.Fatal(err)
			}
			c := view.NewCache(j.JS, kv, newCluster, zap.NewNop(), tc.opts...)
			go func() { _ = c.Run(ctx) }()
			<-c.Ready()
			var last uint64 // KV revision of the last write
			for _, op := range tc.ops {
				var err error
				switch {
				case op.del:
					err = kv.Delete(ctx, op.key)
				case op.garbage:
					// The cache must have seen what came before: the watch's ordered consumer,
					// when it is reset before its first delivery (seen under -race on a loaded
					// machine), starts again from the last value per key and would never show
					// the valid value this garbage is meant to follow.
					if err = c.WaitSeen(ctx, last); err != nil {
						t.Fatal(err)
					}
					last, err = kv.Put(ctx, op.key, []byte{0xff, 0xff, 0xff})
				default:
					var data []byte
					data, err = proto.Marshal(&clusterv1.Cluster{Name: op.name, Labels: map[string]string{"team": op.team}})
					if err == nil {
						last, err = kv.Put(ctx, op.key, data)
					}
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			// The watch delivers in order: once the cache has the sync key, it has every op.
			if _, err := kv.Put(ctx, tc.sync, nil); err != nil {
				t.Fatal(err)
			}
			if err := c.WaitFor(ctx, tc.sync, func(_ *clusterv1.Cluster, ok bool) bool { return ok }); err != nil {
				t.Fatal(err)
			}

			got := map[string]wantEntry{}
			for _, e := range c.Entries(func(key string, _ *clusterv1.Cluster) bool { return key != tc.sync }) {
				got[e.Key] = wantEntry{e.Value.Name, e.KVRevision}
				if ge, ok := c.GetEntry(e.Key); !ok || !reflect.DeepEqual(ge, e) {
					t.Errorf("GetEntry(%s) = %+v, %v; Entries has %+v", e.Key, ge, ok, e)
				}
				if v, ok := c.Get(e.Key); !ok || v != e.Value {
					t.Errorf("Get(%s) = %v, %v; Entries has %v", e.Key, v, ok, e.Value)
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("entries %v, want %v", got, tc.want)
			}
			if c.Len() != len(tc.want)+1 {
				t.Errorf("Len %d, want %d", c.Len(), len(tc.want)+1)
			}
			for _, op := range tc.ops {
				if _, want := tc.want[op.key]; !want {
					if v, ok := c.Get(op.key); ok {
						t.Errorf("Get(%s) = %v, want absent", op.key, v)
					}
				}
			}
			for term, want := range tc.lookup {
				keys := c.Keys(term)
				if len(keys) != len(want) || (len(want) > 0 && !reflect.DeepEqual(keys, want)) {
					t.Errorf("Keys(%s) = %v, want %v", term, keys, want)
				}
				if n := c.Count(term); n != len(want) {
					t.Errorf("Count(%s) = %d, want %d", term, n, len(want))
				}
				var names []string
				for _, v := range c.Lookup(term) {
					names = append(names, v.Name)
				}
				var wantNames []string
				for _, k := range want {
					wantNames = append(wantNames, tc.want[k].name) // the sync key's is ""
				}
				if !reflect.DeepEqual(names, wantNames) {
					t.Errorf("Lookup(%s) = %v, want %v", term, names, wantNames)
				}
				var unordered []string
				for _, v := range c.LookupUnordered(term) {
					unordered = append(unordered, v.Name)
				}
				slices.Sort(unordered)
				if sortedWant := slices.Sorted(slices.Values(wantNames)); !slices.Equal(unordered, sortedWant) {
					t.Errorf("LookupUnordered(%s) = %v, want %v in any order", term, unordered, sortedWant)
				}
			}
		})
	}
}

func TestCacheUpdatesAndChanged(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 30*time.Second)
	kv, err := j.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "CACHEUPDATES"})
	if err != nil {
		t.Fatal(err)
	}
	putName := func(key, name string) {
		t.Helper()
		data, _ := proto.Marshal(&clusterv1.Cluster{Name: name})
		if _, err := kv.Put(ctx, key, data); err != nil {
			t.Fatal(err)
		}
	}
	putName("before", "before")
	c := view.NewCache(j.JS, kv, newCluster, zap.NewNop())
	go func() { _ = c.Run(ctx) }()
	<-c.Ready()
	updates := c.Updates(ctx, 16)
	snap, subscribed := c.Subscribe(ctx, 16)
	if len(snap) != 1 || snap[0].Key != "before" || snap[0].Value.Name != "before" {
		t.Fatalf("snapshot %+v", snap)
	}

	for _, tc := range []struct {
		name       string
		write      func()
		op         view.Op
		value      string
		prev       string // "" for none
		noPrevious bool
	}{
		{name: "create", write: func() { putName("k", "v1") }, op: view.Put, value: "v1", noPrevious: true},
		{name: "update", write: func() { putName("k", "v2") }, op: view.Put, value: "v2", prev: "v1"},
		{name: "delete", write: func() {
			if err := kv.Delete(ctx, "k"); err != nil {
				t.Fatal(err)
			}
		}, op: view.Delete, value: "v2", prev: "v2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			changed := c.Changed()
			tc.write()
			select {
			case <-changed:
			case <-ctx.Done():
				t.Fatal("Changed not closed")
			}
			for _, ch := range []<-chan view.Update[*clusterv1.Cluster]{updates, subscribed} {
				u := <-ch
				if u.Op != tc.op || u.Key != "k" || u.Value.GetName() != tc.value || u.Prev.GetName() != tc.prev || (u.Prev == nil) != tc.noPrevious {
					t.Fatalf("update %+v", u)
				}
			}
		})
	}
}

// A cache whose Run returned (its caller restarts it after an error) goes on from the last
// change it read when run again: later changes arrive, earlier ones are not sent twice, and a
// purge (KV-Operation: PURGE) removes the entry as a delete does.
func TestCacheRunAgainGoesOn(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 30*time.Second)
	kv, err := j.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "CACHERERUN"})
	if err != nil {
		t.Fatal(err)
	}
	putName := func(key string) uint64 {
		t.Helper()
		data, _ := proto.Marshal(&clusterv1.Cluster{Name: key})
		rev, err := kv.Put(ctx, key, data)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	putName("a")
	c := view.NewCache(j.JS, kv, newCluster, zap.NewNop())
	first, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(first) }()
	<-c.Ready()
	updates := c.Updates(ctx, 16)
	if err := c.WaitSeen(ctx, putName("b")); err != nil {
		t.Fatal(err)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	putName("c")
	if err := kv.Purge(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Run(ctx) }()
	if err := c.WaitFor(ctx, "a", func(_ *clusterv1.Cluster, ok bool) bool { return !ok }); err != nil {
		t.Fatal(err)
	}
	var got []string
	for range 3 {
		u := <-updates
		got = append(got, fmt.Sprintf("%d %s", u.Op, u.Key))
	}
	if want := []string{fmt.Sprintf("%d b", view.Put), fmt.Sprintf("%d c", view.Put), fmt.Sprintf("%d a", view.Delete)}; !reflect.DeepEqual(got, want) {
		t.Fatalf("updates %v, want %v", got, want)
	}
	select {
	case u := <-updates:
		t.Fatalf("an update more: %+v", u)
	case <-time.After(200 * time.Millisecond):
	}
	if c.Len() != 2 {
		t.Fatalf("%d entries, want b and c", c.Len())
	}
}

func TestCacheWaitCheckpoint(t *testing.T) {
	j := testkit.StartJetStream(t)
	ensureStream(t, j.JS)
	ctx := testkit.Context(t, 60*time.Second)
	e, _, _ := runEngine(t, j.JS, testProjection(1))
	<-e.Ready()
	kv, err := j.JS.KeyValue(ctx, "TESTVIEW")
	if err != nil {
		t.Fatal(err)
	}
	c := view.NewCache(j.JS, kv, newCluster, zap.NewNop())
	go func() { _ = c.Run(ctx) }()
	<-c.Ready()
	store := events.NewStore(j.JS, "test")

	for _, tc := range []struct {
		name    string
		events  map[string]proto.Message // subject key → event
		beyond  uint64                   // wait for the last sequence plus beyond
		wantErr error
		wantLen int
	}{{
		name:    "entries of every event up to seq are visible",
		events:  map[string]proto.Message{"a": &clusterv1.ClusterRegistered{Id: "a", Name: "a"}, "b": &clusterv1.ClusterRegistered{Id: "b", Name: "b"}},
		wantLen: 2,
	}, {
		name:    "an event that writes no entry moves the checkpoint",
		events:  map[string]proto.Message{"never": &clusterv1.ClusterDeregistered{Id: "never"}},
		wantLen: 2,
	}, {
		name:    "deletes are visible",
		events:  map[string]proto.Message{"a": &clusterv1.ClusterDeregistered{Id: "a"}},
		wantLen: 1,
	}, {
		name:    "a sequence not yet in the stream times out",
		beyond:  1,
		wantErr: context.DeadlineExceeded,
		wantLen: 1,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var last uint64
			if info, err := j.JS.Stream(ctx, "TEST"); err != nil {
				t.Fatal(err)
			} else {
				last = info.CachedInfo().State.LastSeq
			}
			for key, ev := range tc.events {
				seq, err := store.Append(ctx, "test."+key, key, events.Any, ev)
				if err != nil {
					t.Fatal(err)
				}
				last = max(last, seq)
			}
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if tc.wantErr != nil {
				wctx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
			}
			err := c.WaitCheckpoint(wctx, last+tc.beyond)
			cancel()
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("WaitCheckpoint(%d): %v, want %v", last+tc.beyond, err, tc.wantErr)
			}
			// No WaitRevision or WaitFor: the checkpoint alone says the entries are there.
			if c.Len() != tc.wantLen {
				t.Fatalf("Len %d, want %d: %v", c.Len(), tc.wantLen, c.List(nil))
			}
			if _, ok := c.Get(view.MetaKey); ok {
				t.Fatal("the checkpoint is listed as an entry")
			}
		})
	}
}

func TestCacheIndexOfAnotherTypePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	view.NewCache[*clusterv1.Cluster](nil, nil, newCluster, zap.NewNop(),
		view.WithIndex(func(string, *clusterv1.Taint) []string { return nil }))
}

// A key written through another client is found by GetFresh right after the write returns,
// however far the cache's watch is behind; a deleted key is not found, and neither is one that
// was never there.
func TestCacheGetFreshReadsItsWriters(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 60*time.Second)
	kv, err := j.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "FRESH"})
	if err != nil {
		t.Fatal(err)
	}
	c := view.NewCache(j.JS, kv, newCluster, zap.NewNop())
	go func() { _ = c.Run(ctx) }()
	<-c.Ready()

	// The writer is another connection, as cluster-import is to namespace-binding.
	_, other := j.Connect(t)
	okv, err := other.KeyValue(ctx, "FRESH")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		key := fmt.Sprintf("c%d", i)
		b, _ := proto.Marshal(&clusterv1.Cluster{Name: key})
		if _, err := okv.Put(ctx, key, b); err != nil {
			t.Fatal(err)
		}
		v, ok, err := c.GetFresh(ctx, key)
		if err != nil || !ok || v.Name != key {
			t.Fatalf("GetFresh(%s) right after its put: %v, %v, %v", key, v, ok, err)
		}
	}
	if err := okv.Delete(ctx, "c7"); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitFor(ctx, "c7", func(_ *clusterv1.Cluster, ok bool) bool { return !ok }); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"c7", "never"} {
		if v, ok, err := c.GetFresh(ctx, key); err != nil || ok {
			t.Fatalf("GetFresh(%s): %v, %v, %v; want not found", key, v, ok, err)
		}
	}
}

// A subscriber that falls behind is cut off (its channel closed), and what watched its context
// goes with it: a loop that resubscribes with one long-lived context must not keep a goroutine
// and a buffer per cut-off until that context ends.
func TestCutOffSubscribersLeaveNothingBehind(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 30*time.Second)
	kv, err := j.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "CACHECUTOFF"})
	if err != nil {
		t.Fatal(err)
	}
	c := view.NewCache(j.JS, kv, newCluster, zap.NewNop())
	go func() { _ = c.Run(ctx) }()
	<-c.Ready()
	data, _ := proto.Marshal(&clusterv1.Cluster{Name: "x"})
	before := runtime.NumGoroutine()
	const n = 50
	for i := range n {
		ch := c.Updates(ctx, 1) // one long-lived ctx, as a resubscribing loop has
		for k := range 3 {
			if _, err := kv.Put(ctx, fmt.Sprintf("k%d-%d", i, k), data); err != nil {
				t.Fatal(err)
			}
		}
		// Nothing is read until the cache has sent all three: the second overflowed the
		// subscriber's buffer of one and cut it off.
		if err := c.WaitFor(ctx, fmt.Sprintf("k%d-2", i), func(_ *clusterv1.Cluster, ok bool) bool { return ok }); err != nil {
			t.Fatal(err)
		}
		for range ch { // drained until its close, which the cut-off made
		}
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		if g := runtime.NumGoroutine(); g > before+n/5 {
			return fmt.Errorf("%d goroutines after %d cut-off subscribers, %d before", g, n, before)
		}
		return nil
	})
}
