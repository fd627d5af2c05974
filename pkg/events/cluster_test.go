package events_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/topology"
)

// In a three-node cluster with R3 streams, stopping a node (the stream leader, the worst case)
// while appends are in flight must not lose any event whose append was acknowledged.
func TestThreeNodeClusterLosesNoAcknowledgedEventWhenANodeStops(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	c := testkit.StartCluster(t, nil)
	ctx := testkit.Context(t, 120*time.Second)
	connect := func() (*nats.Conn, jetstream.JetStream) {
		nc, err := nats.Connect(c.ClientURLs(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return nc, js
	}
	_, js := connect()
	if err := topology.Ensure(ctx, js, 3, topology.Topology{Streams: []jetstream.StreamConfig{
		topology.EventStream("HA", "ha test", "ha.>"),
	}}); err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, "HA")
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leader := -1
	for i, n := range c.Nodes {
		if n.Name() == info.Cluster.Leader {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatalf("no stream leader among nodes (%q)", info.Cluster.Leader)
	}

	var (
		mu     sync.Mutex
		acked  = map[string]uint64{} // aggregate -> count of acknowledged events
		total  atomic.Int64
		failed atomic.Int64
	)
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, js := connect()
			store := events.NewStore(js, "test")
			for i := 0; loadCtx.Err() == nil; i++ {
				agg := fmt.Sprintf("w%d-%d", w, i%20)
				actx, cancel := context.WithTimeout(loadCtx, 5*time.Second)
				_, err := store.Append(actx, "ha."+agg, agg, events.Any, &clusterv1.ClusterUpdated{Id: agg, Fields: []string{fmt.Sprint(i)}})
				cancel()
				if err != nil {
					failed.Add(1) // not acknowledged: may or may not be stored
					continue
				}
				mu.Lock()
				acked[agg+"/"+fmt.Sprint(i)]++
				mu.Unlock()
				total.Add(1)
			}
		}()
	}
	testkit.Eventually(t, 30*time.Second, func() error {
		if total.Load() < 300 {
			return fmt.Errorf("%d appends so far", total.Load())
		}
		return nil
	})
	c.Nodes[leader].Stop()
	before := total.Load()
	testkit.Eventually(t, 60*time.Second, func() error {
		if total.Load() < before+300 {
			return fmt.Errorf("%d appends since the node stopped", total.Load()-before)
		}
		return nil
	})
	stopLoad()
	wg.Wait()
	t.Logf("acknowledged %d appends, %d failed or timed out, leader %d stopped after %d", total.Load(), failed.Load(), leader, before)

	// Read everything back from the surviving nodes, message by message.
	found := map[string]bool{}
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var state jetstream.StreamState
	testkit.Eventually(t, 30*time.Second, func() error {
		info, err := stream.Info(rctx)
		if err != nil {
			return err
		}
		state = info.State
		return nil
	})
	for seq := state.FirstSeq; seq <= state.LastSeq; seq++ {
		var m *jetstream.RawStreamMsg
		testkit.Eventually(t, 10*time.Second, func() error {
			var err error
			m, err = stream.GetMsg(rctx, seq)
			return err
		})
		ev, err := events.Decode(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		p := ev.Payload.(*clusterv1.ClusterUpdated)
		found[ev.AggregateId+"/"+p.Fields[0]] = true
	}
	mu.Lock()
	defer mu.Unlock()
	for k := range acked {
		if !found[k] {
			t.Fatalf("acknowledged event %s is missing from the stream", k)
		}
	}
}
