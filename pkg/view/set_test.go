package view_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// A view declared once in a set is projected, its cache opened and loaded before the set is
// ready, and it is listed with its bucket in declaration order.
func TestSetRunsEnginesAndOpensCaches(t *testing.T) {
	j := testkit.StartJetStream(t)
	ensureStream(t, j.JS)
	appendHistory(t, j.JS, 300, 20)

	second := testProjection(1)
	second.Name, second.Bucket.Bucket = "test-copy", "TESTVIEW2"
	var first, copied *view.Cache[*clusterv1.Cluster]
	set := view.NewSet(j.JS, zap.NewNop())
	e1 := view.Add(set, testProjection(1), &first)
	e2 := view.Add(set, second, &copied, view.WithFilter("k001"))
	if err := set.Err(); err != nil || e1 == nil || e2 == nil {
		t.Fatalf("declaring the set: %v", err)
	}
	if got := set.Projections(); len(got) != 2 || got[0].Name != "test" || got[1].Name != "test-copy" {
		t.Fatalf("projections out of declaration order: %v", got)
	}
	if got := set.Buckets(); len(got) != 2 || got[0].Bucket != "TESTVIEW" || got[1].Bucket != "TESTVIEW2" {
		t.Fatalf("buckets: %v", got)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- set.Run(ctx) }()
	select {
	case <-set.Ready():
	case err := <-done:
		t.Fatalf("set stopped before it was ready: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("set not ready")
	}
	want := snapshot(t, j.JS)
	if first.Len() != len(want) || first.Len() == 0 {
		t.Errorf("first cache holds %d entries, bucket %d", first.Len(), len(want))
	}
	// The cache options given to Add apply: the copy mirrors k001 only.
	n := 0
	if _, ok := want["k001"]; ok {
		n = 1
	}
	if copied.Len() != n || first.Len() <= n {
		t.Errorf("filtered cache holds %d entries, want %d", copied.Len(), n)
	}
	if e2.Applied() != e1.Applied() || e1.Applied() == 0 {
		t.Errorf("engines applied %d and %d", e1.Applied(), e2.Applied())
	}
	cancel()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("set did not stop")
	}
}

// A view whose entries are not the cache's type is refused when declared, not at run time.
func TestSetRefusesMismatchedCache(t *testing.T) {
	var wrong *view.Cache[*clusterv1.AgentStatus]
	set := view.NewSet(nil, nil)
	if e := view.Add(set, testProjection(1), &wrong); e != nil || set.Err() == nil {
		t.Fatal("a cache of another type was accepted")
	}
	bad := testProjection(1)
	bad.New = func() proto.Message { return &clusterv1.ClusterRegistered{} }
	var c *view.Cache[*clusterv1.ClusterRegistered]
	if view.Add(view.NewSet(nil, nil), bad, &c) != nil {
		t.Fatal("an entry type without a revision field was accepted")
	}
	if err := set.Run(context.Background()); err == nil {
		t.Fatal("a set with a declaration error ran")
	}
}
