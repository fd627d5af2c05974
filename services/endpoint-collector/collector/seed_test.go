package collector

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// Heartbeats are not stored, so a collector started while an agent is quietly heartbeating
// replays only its slices, reported long ago. Judged by those alone the cluster would look
// evicted and be served stale until its agent relists (every 10 minutes); started from the
// last-seen time cluster-import recorded, it is served fresh.
func TestRestartedCollectorStartsFromRecordedLastSeen(t *testing.T) {
	js := testkit.StartJetStream(t)
	ctx := testkit.Context(t, time.Minute)
	cfg := Config{StaleAfter: time.Second, EvictAfter: 2 * time.Second}
	h := startCollector(t, js.JS, cfg)
	a := newFakeAgent(t, js.JS, "east", "id-east")
	a.report("shop", "cart", "cart-e", http8080, ep{ip: "10.0.0.1", conds: "RS"})
	a.sync()
	stop := a.heartbeats(50 * time.Millisecond)
	defer stop()
	h.eventually("shop", "cart", ready, "east[10.0.0.1:8080]")
	// Longer than EvictAfter: the replayed report is older than that when the next one starts.
	time.Sleep(2500 * time.Millisecond)

	status, err := js.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: subjects.ClusterStatusBucket})
	if err != nil {
		t.Fatal(err)
	}
	data, err := proto.Marshal(&clusterv1.AgentStatus{ClusterName: "east", LastSeen: timestamppb.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := status.Put(ctx, keys.Encode("east"), data); err != nil {
		t.Fatal(err)
	}
	restarted := startCollector(t, js.JS, cfg)
	restarted.eventually("shop", "cart", ready, "east[10.0.0.1:8080]")
}
