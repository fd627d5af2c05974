package view_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// Verify finds a view equal to its rebuild, and names every key where the bucket was changed
// behind the engine's back: a changed entry, a lost one and one the stream never produced.
func TestVerifyComparesTheBucketWithARebuild(t *testing.T) {
	j := testkit.StartJetStream(t)
	ensureStream(t, j.JS)
	last := appendHistory(t, j.JS, 2000, 80)
	e, cancel, _ := runEngine(t, j.JS, testProjection(1), view.WithBatch(50))
	ctx := testkit.Context(t, 60*time.Second)
	if err := e.WaitApplied(ctx, last); err != nil {
		t.Fatal(err)
	}
	cancel()

	v, err := view.Verify(ctx, j.JS, testProjection(1))
	if err != nil {
		t.Fatal(err)
	}
	if !v.Equal() || v.Checkpoint != last || v.Entries == 0 {
		t.Fatalf("fresh view: %+v, want equal at checkpoint %d with entries", v, last)
	}

	kv, err := j.JS.KeyValue(ctx, "TESTVIEW")
	if err != nil {
		t.Fatal(err)
	}
	snap := snapshot(t, j.JS)
	var changed, lost string
	for k := range snap {
		switch {
		case changed == "":
			changed = k
		case lost == "":
			lost = k
		}
	}
	e1, err := kv.Get(ctx, changed)
	if err != nil {
		t.Fatal(err)
	}
	c := &clusterv1.Cluster{}
	if err := proto.Unmarshal(e1.Value(), c); err != nil {
		t.Fatal(err)
	}
	c.Labels = map[string]string{"gen": "tampered"}
	data, _ := proto.Marshal(c)
	if _, err := kv.Put(ctx, changed, data); err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, lost); err != nil {
		t.Fatal(err)
	}
	extra, _ := proto.Marshal(&clusterv1.Cluster{Name: "ghost"})
	if _, err := kv.Put(ctx, "zzz-ghost", extra); err != nil {
		t.Fatal(err)
	}

	v, err = view.Verify(ctx, j.JS, testProjection(1))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]view.Mismatch{}
	for _, m := range v.Mismatches {
		got[m.Key] = m
	}
	if len(got) != 3 {
		t.Fatalf("mismatches %+v, want exactly %s, %s and zzz-ghost", v.Mismatches, changed, lost)
	}
	if m := got[changed]; !strings.Contains(m.Got, "tampered") || strings.Contains(m.Want, "tampered") {
		t.Errorf("changed entry: %+v", m)
	}
	if m := got[lost]; m.Want == "" || m.Got != "" {
		t.Errorf("lost entry: %+v", m)
	}
	if m := got["zzz-ghost"]; m.Want != "" || !strings.Contains(m.Got, "ghost") {
		t.Errorf("extra entry: %+v", m)
	}

	// Another version's bucket is not this projection's view.
	if _, err := view.Verify(ctx, j.JS, testProjection(2)); err == nil || !strings.Contains(err.Error(), "version") {
		t.Errorf("verify against version 2: %v, want a version error", err)
	}
}

// A view much larger than the engine's cache (150 keys, a cache of 16) reads forgotten entries
// back from the bucket and still equals a rebuild from the stream.
func TestViewAboveTheCacheLimitEqualsRebuild(t *testing.T) {
	j := testkit.StartJetStream(t)
	ensureStream(t, j.JS)
	last := appendHistory(t, j.JS, 3000, 150)
	e, cancel, _ := runEngine(t, j.JS, testProjection(1), view.WithBatch(40), view.WithCacheLimit(16))
	ctx := testkit.Context(t, 60*time.Second)
	if err := e.WaitApplied(ctx, last); err != nil {
		t.Fatal(err)
	}
	cancel()
	v, err := view.Verify(ctx, j.JS, testProjection(1))
	if err != nil {
		t.Fatal(err)
	}
	if !v.Equal() || v.Entries < 50 {
		t.Fatalf("%d entries, mismatches %+v", v.Entries, v.Mismatches)
	}
}
