package placement

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/apiwait"
	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/reconcile"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/topology"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// testHub is placement alone on a real JetStream, with a registry bucket the test writes
// clusters into (cluster-import's, in production) and every project existing: the scheduler's
// tests need no namespace-binding around it.
type testHub struct {
	svc      *Service
	clusters jetstream.KeyValue
	rev      uint64
}

// testRegistry is the registry cache as namespace-binding's registry adapter serves it.
type testRegistry struct {
	*view.Cache[*clusterv1.Cluster]
}

func (r testRegistry) Watch(keys func(view.Update[*clusterv1.Cluster]) []string) reconcile.Source {
	return reconcile.Watch(r.Cache, keys)
}

// everyProject is a hub where every project exists and no namespace follows a placement.
type everyProject struct{}

func (everyProject) ProjectExists(string) bool           { return true }
func (everyProject) FollowersOf(string, string) []string { return nil }

// startTestHub starts placement and its scheduler; before runs on the service before the
// scheduler starts.
func startTestHub(t testing.TB, before func(*Service)) *testHub {
	t.Helper()
	j := testkit.StartJetStream(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 3)
	t.Cleanup(func() {
		cancel()
		for range 3 {
			<-done
		}
	})
	if err := topology.Ensure(ctx, j.JS, 1, topology.Merge(topology.DeadLetter(), topology.Topology{
		Streams: []jetstream.StreamConfig{topology.EventStream(Stream, "placement", SubjectPrefix+".>")},
	})); err != nil {
		t.Fatal(err)
	}
	kv, err := j.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "test-clusters"})
	if err != nil {
		t.Fatal(err)
	}
	log := testkit.Logger(t)
	registry := view.NewCache(j.JS, kv, func() *clusterv1.Cluster { return &clusterv1.Cluster{} }, log)
	ready := make(chan struct{})
	svc, err := New(ctx, j.JS, Config{Replicas: 1}, Deps{Store: events.NewStore(j.JS, "test"), Gate: apiwait.NewGate(ready, "placement"),
		Projects: everyProject{}, Followers: everyProject{}, Clusters: testRegistry{registry}}, log)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = registry.Run(ctx); done <- struct{}{} }()
	go func() { _ = svc.Run(ctx); done <- struct{}{} }()
	for _, ch := range []<-chan struct{}{registry.Ready(), svc.Ready()} {
		select {
		case <-ch:
		case <-time.After(30 * time.Second):
			t.Fatal("placement not ready")
		}
	}
	close(ready)
	if before != nil {
		before(svc)
	}
	go func() { _ = svc.RunScheduler(ctx); done <- struct{}{} }()
	return &testHub{svc: svc, clusters: kv}
}

// putCluster writes cluster name with labels into the registry, as a registration or a label
// change would.
func (h *testHub) putCluster(t testing.TB, name string, labels map[string]string) {
	t.Helper()
	h.rev++
	b, err := proto.Marshal(&clusterv1.Cluster{Name: name, Labels: labels, Revision: h.rev})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.clusters.Put(context.Background(), keys.Encode(name), b); err != nil {
		t.Fatal(err)
	}
}

func (h *testHub) bindSet(t testing.TB, project, set string) {
	t.Helper()
	if _, err := h.svc.ClusterSets().BindClusterSet(testkit.Context(t, 10*time.Second),
		connect.NewRequest(&placementv1.BindClusterSetRequest{Project: project, ClusterSet: set})); err != nil {
		t.Fatalf("bind set %s to %s: %v", set, project, err)
	}
}

func (h *testHub) createPlacement(t testing.TB, p *placementv1.Placement) {
	t.Helper()
	if _, err := h.svc.Placements().CreatePlacement(testkit.Context(t, 10*time.Second),
		connect.NewRequest(&placementv1.CreatePlacementRequest{Placement: p})); err != nil {
		t.Fatalf("create placement %s/%s: %v", p.Project, p.Name, err)
	}
}

// waitDecided waits until project's placement name decided n clusters.
func (h *testHub) waitDecided(t testing.TB, project, name string, n int, within time.Duration) {
	t.Helper()
	err := h.svc.decisions.WaitFor(testkit.Context(t, within), placementKey(project, name), func(d *placementv1.PlacementDecisions, ok bool) bool {
		return ok && len(decidedClusters(d)) == n
	})
	if err != nil {
		d, _ := h.svc.decisions.Get(placementKey(project, name))
		t.Fatalf("placement %s/%s did not decide %d clusters within %s (decided %v): %v", project, name, n, within, decidedClusters(d), err)
	}
}

func clusterName(i int) string { return fmt.Sprintf("c%05d", i) }
