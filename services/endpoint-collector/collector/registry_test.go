package collector

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// TestRegistryRebuiltWhileAClusterWasDeregistered: cluster-import's registry view is dropped and
// created again (a rebuild, as an upgrade that changes the projection does), and a cluster
// deregistered meanwhile is not in the new bucket. The collector attaches to the new bucket,
// stops serving the deregistered cluster's endpoints, and keeps following: a cluster
// registered in the new bucket is taken as registered.
func TestRegistryRebuiltWhileAClusterWasDeregistered(t *testing.T) {
	js := testkit.StartJetStream(t)
	ctx := testkit.Context(t, time.Minute)
	if _, err := js.JS.CreateStream(ctx, jetstream.StreamConfig{Name: subjects.ClusterStream, Subjects: []string{subjects.ClusterPrefix + ".>"}}); err != nil {
		t.Fatal(err)
	}
	registry := func() jetstream.KeyValue {
		kv, err := js.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: subjects.ClustersBucket})
		if err != nil {
			t.Fatal(err)
		}
		return kv
	}
	register := func(kv jetstream.KeyValue, name, id string) {
		data, err := proto.Marshal(&clusterv1.Cluster{Name: name, Id: id})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, keys.Encode(name), data); err != nil {
			t.Fatal(err)
		}
	}
	kv := registry()
	register(kv, "east", "id-east")
	register(kv, "west", "id-west")

	h := startCollector(t, js.JS, Config{})
	east, west := newFakeAgent(t, js.JS, "east", "id-east"), newFakeAgent(t, js.JS, "west", "id-west")
	east.report("shop", "cart", "cart-e", http8080, ep{ip: "10.0.0.1", conds: "RS"})
	west.report("shop", "cart", "cart-w", http8080, ep{ip: "10.1.0.1", conds: "RS"})
	h.eventually("shop", "cart", ready, "east[10.0.0.1:8080] west[10.1.0.1:8080]")

	// The view is rebuilt; west is deregistered in between, so the new bucket never holds it.
	if err := js.JS.DeleteKeyValue(ctx, subjects.ClustersBucket); err != nil {
		t.Fatal(err)
	}
	if _, err := events.NewStore(js.JS, "cluster-import").Append(ctx, subjects.Cluster("west"), "west", events.Any,
		&clusterv1.ClusterDeregistered{Id: "id-west"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // a gap, as a rebuild has
	kv = registry()
	register(kv, "east", "id-east")
	h.eventually("shop", "cart", ready, "east[10.0.0.1:8080]")

	// The new bucket is followed: north, registered there, is a registered cluster.
	register(kv, "north", "id-north")
	testkit.Eventually(t, 10*time.Second, func() error {
		got := h.c.store.Registered()
		slices.Sort(got)
		if !slices.Equal(got, []string{"east", "north"}) {
			return fmt.Errorf("registered %v, want east and north", got)
		}
		return nil
	})
}
