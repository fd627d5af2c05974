package collector

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// Draining a cluster and restoring its default weight, again and again: each call returns
// promptly with its weight visible, including the restore that empties the service's weights.
func TestClusterWeightToggleAnswersPromptly(t *testing.T) {
	js := testkit.StartJetStream(t)
	h := startCollector(t, js.JS, Config{})
	a := newFakeAgent(t, js.JS, "east", "id-east")
	b := newFakeAgent(t, js.JS, "west", "id-west")
	stopA, stopB := a.heartbeats(50*time.Millisecond), b.heartbeats(50*time.Millisecond)
	defer stopA()
	defer stopB()
	a.report("shop", "cart", "cart-1", http8080, ep{ip: "10.0.0.7", conds: "RS"})
	a.sync()
	b.report("shop", "cart", "cart-w", http8080, ep{ip: "10.0.1.7", conds: "RS"})
	b.sync()
	h.eventually("shop", "cart", ready, "east[10.0.0.7:8080] west[10.0.1.7:8080]")
	for i := range 40 {
		for _, w := range []uint32{0, 100} {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			start := time.Now()
			_, err := h.client.SetClusterWeight(ctx, connect.NewRequest(&endpointv1.SetClusterWeightRequest{
				Namespace: "shop", Name: "cart", Cluster: "east", Weight: w}))
			cancel()
			if err != nil {
				t.Fatalf("round %d, weight %d: %v after %v", i, w, err, time.Since(start))
			}
		}
	}
}
