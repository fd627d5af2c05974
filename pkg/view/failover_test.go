package view_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/lease"
	"github.com/fleetstream/fleetstream/pkg/natsembed"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/topology"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// A view whose ordered consumer lived on a NATS node that crashed must move to a live node
// within a few seconds (consumer.Heartbeat), not after nats.go's default ten seconds of missed
// heartbeats: API writes wait for their view (read-your-writes) and time out meanwhile. The
// crashed node leads nothing of the view's (the stream's and the bucket's leaders and the meta
// leader are on the node the engine is connected to), so no Raft election is involved and what
// is timed is the engine's own recovery.
func TestViewLeavesACrashedConsumerNode(t *testing.T) {
	c, home, nc, js := clusterAtMetaLeader(t)
	ctx := testkit.Context(t, 3*time.Minute)
	if err := topology.Ensure(ctx, js, 3, topology.Merge(topology.DeadLetter(), topology.Topology{
		Streams: []jetstream.StreamConfig{topology.EventStream("TEST", "test", "test.>")},
	})); err != nil {
		t.Fatal(err)
	}
	store := events.NewStore(js, "test")
	if _, err := store.Append(ctx, "test.a", "a", events.Any, &clusterv1.ClusterRegistered{Id: "a", Name: "a"}); err != nil {
		t.Fatal(err)
	}
	p := testProjection(1)
	p.Bucket.Replicas = 3

	// The ordered consumer lands on a random replica of the stream: start the engine until it
	// is on another node than home (two in three each time).
	var (
		e    *view.Engine
		host string
	)
	for attempt := 0; ; attempt++ {
		var cancel context.CancelFunc
		var done chan error
		e, cancel, done = runEngine(t, js, p, view.WithReplicas(3))
		select {
		case <-e.Ready():
		case <-ctx.Done():
			t.Fatal("engine not ready")
		}
		moveLeader(t, ctx, nc, js, "TEST", home.Name())
		moveLeader(t, ctx, nc, js, "KV_"+p.Bucket.Bucket, home.Name())
		moveLeader(t, ctx, nc, js, "KV_"+lease.Bucket, home.Name())
		host = onlyConsumerHost(t, ctx, js, "TEST")
		if host != home.Name() {
			break
		}
		cancel()
		<-done
		deleteConsumers(t, ctx, js, "TEST")
		if attempt == 30 {
			t.Fatalf("the view's consumer was on %s in 30 starts", home.Name())
		}
	}
	stopNode(c, host)
	crashed := time.Now()
	seq, err := store.Append(ctx, "test.b", "b", events.Any, &clusterv1.ClusterRegistered{Id: "b", Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := e.WaitApplied(wctx, seq); err != nil {
		t.Fatalf("the view did not apply an event appended after its consumer's node %s stopped: %v", host, err)
	}
	// nats.go's default ordered-consumer heartbeat (5 s) notices a silent consumer after 5-10 s.
	if d := time.Since(crashed); d > 5*time.Second {
		t.Fatalf("the view applied the event %s after its consumer's node stopped; want within 5 s", d.Round(time.Millisecond))
	} else {
		t.Logf("the view applied the event %s after its consumer's node %s stopped", d.Round(time.Millisecond), host)
	}
}

// clusterAtMetaLeader starts a three-node cluster and connects to its meta leader, home: the
// node the tests keep every leader on, so that stopping another one involves no election.
func clusterAtMetaLeader(t *testing.T) (*natsembed.Cluster, *natsembed.Server, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	c := testkit.StartCluster(t, nil)
	var home *natsembed.Server
	for _, n := range c.Nodes {
		if n.JetStreamIsLeader() {
			home = n
		}
	}
	if home == nil {
		t.Fatal("no meta leader")
	}
	nc, js := testkit.ConnectURL(t, home.ClientURL())
	return c, home, nc, js
}

func stopNode(c *natsembed.Cluster, name string) {
	for _, n := range c.Nodes {
		if n.Name() == name {
			n.Stop()
		}
	}
}

// moveLeader makes server the leader of stream (a preferred-leader step-down, nats-server 2.11+).
func moveLeader(t *testing.T, ctx context.Context, nc *nats.Conn, js jetstream.JetStream, stream, server string) {
	t.Helper()
	req, _ := json.Marshal(map[string]any{"placement": map[string]string{"preferred": server}})
	testkit.Eventually(t, 30*time.Second, func() error {
		// A stream between two leaders does not answer: each try gets its own deadline.
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		if info.Cluster != nil && info.Cluster.Leader == server {
			return nil
		}
		resp, err := nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+stream, req, 2*time.Second)
		if err != nil {
			return fmt.Errorf("step down %s: %w", stream, err)
		}
		if !strings.Contains(string(resp.Data), `"success":true`) {
			return fmt.Errorf("step down %s: %s", stream, resp.Data)
		}
		return fmt.Errorf("stream %s led by %v, not %s", stream, info.Cluster, server)
	})
}

func onlyConsumerHost(t *testing.T, ctx context.Context, js jetstream.JetStream, stream string) string {
	t.Helper()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	// A clustered consumer is listed, with its leader, only once the meta layer has assigned it
	// and a replica leads it, which can come after the watch already delivers: wait for it.
	var hosts []string
	testkit.Eventually(t, 10*time.Second, func() error {
		hosts = hosts[:0]
		for ci := range s.ListConsumers(ctx).Info() {
			if ci.Cluster != nil {
				hosts = append(hosts, ci.Cluster.Leader)
			}
		}
		if len(hosts) != 1 || hosts[0] == "" {
			return fmt.Errorf("consumers of %s are on %q, want one", stream, hosts)
		}
		return nil
	})
	return hosts[0]
}

func deleteConsumers(t *testing.T, ctx context.Context, js jetstream.JetStream, stream string) {
	t.Helper()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	for name := range s.ConsumerNames(ctx).Name() {
		// A stopped watch may delete its own consumer meanwhile.
		if err := s.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			t.Fatal(err)
		}
	}
}

// A cache whose consumer lived on a NATS node that crashed must see a change the bucket has
// within a few seconds (its reader misses two 1 s heartbeats and moves), not after the 10 s
// nats.go's KV watch needs to notice its missing heartbeats: authorization and read-your-writes
// wait on caches. The crashed node leads nothing of the bucket's.
func TestCacheLeavesACrashedWatchNode(t *testing.T) {
	c, home, nc, js := clusterAtMetaLeader(t)
	ctx := testkit.Context(t, 3*time.Minute)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "CACHETEST", Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	moveLeader(t, ctx, nc, js, "KV_CACHETEST", home.Name())
	put := func(key string) uint64 {
		t.Helper()
		b, _ := proto.Marshal(&clusterv1.Cluster{Name: key})
		rev, err := kv.Put(ctx, key, b)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	put("a")

	// The watch's consumer lands on a random replica: start caches until one's is not on home.
	var (
		cache *view.Cache[*clusterv1.Cluster]
		host  string
	)
	for attempt := 0; ; attempt++ {
		cctx, cancel := context.WithCancel(ctx)
		cache = view.NewCache(js, kv, func() *clusterv1.Cluster { return &clusterv1.Cluster{} }, zap.NewNop())
		done := make(chan error, 1)
		go func() { done <- cache.Run(cctx) }()
		t.Cleanup(cancel)
		select {
		case <-cache.Ready():
		case <-ctx.Done():
			t.Fatal("cache not ready")
		}
		host = onlyConsumerHost(t, ctx, js, "KV_CACHETEST")
		if host != home.Name() {
			break
		}
		cancel()
		<-done
		deleteConsumers(t, ctx, js, "KV_CACHETEST")
		if attempt == 30 {
			t.Fatalf("the cache's watch was on %s in 30 starts", home.Name())
		}
	}
	stopNode(c, host)
	crashed := time.Now()
	rev := put("b")
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := cache.WaitSeen(wctx, rev); err != nil {
		t.Fatalf("the cache did not see a put made after its watch's node %s stopped: %v", host, err)
	}
	if d := time.Since(crashed); d > 5*time.Second {
		t.Fatalf("the cache saw the put %s after its watch's node stopped; want within 5 s", d.Round(time.Millisecond))
	} else {
		t.Logf("the cache saw the put %s after its watch's node %s stopped", d.Round(time.Millisecond), host)
	}
	if v, ok := cache.Get("b"); !ok || v.Name != "b" {
		t.Fatalf("cache entry b = %v, %v", v, ok)
	}
	if v, ok := cache.Get("a"); !ok || v.Name != "a" {
		t.Fatalf("cache entry a = %v, %v after the restart", v, ok)
	}
}
