package fleetd_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1/endpointv1connect"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// Deregistering a cluster evicts its endpoints at once, not after minutes of its agent's
// silence: whoever routes by them must stop sending traffic to a cluster that left the fleet.
func TestDeregisteredClusterEndpointsAreNoLongerServed(t *testing.T) {
	inst, clusters := startFleetd(t)
	ctx := testkit.Context(t, 60*time.Second)
	for _, c := range []string{"east", "west"} {
		if _, err := clusters.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: c})); err != nil {
			t.Fatal(err)
		}
		rep := &endpointv1.EndpointSliceReport{ClusterName: c, Namespace: "shop", Service: "cart", Slice: "cart-" + c, AddressType: "IPv4",
			SessionId: "s1", Generation: 1, Ports: []*endpointv1.EndpointPort{{Name: "http", Port: 8080, Protocol: "TCP"}},
			Endpoints: []*endpointv1.Endpoint{{Addresses: []string{fmt.Sprintf("10.0.%d.1", len(c))}, Ready: true, Serving: true}}}
		if _, err := events.NewStore(inst.JS, "agent").Append(ctx, subjects.AgentEndpointSlice(c, "shop", rep.Slice), c, events.Any, rep); err != nil {
			t.Fatal(err)
		}
	}
	eps := endpointv1connect.NewEndpointServiceClient(http.DefaultClient, "http://"+inst.Addr, connect.WithInterceptors(bearer(apiToken)))
	served := func() []string {
		res, err := eps.GetServiceEndpoints(ctx, connect.NewRequest(&endpointv1.GetServiceEndpointsRequest{Namespace: "shop", Name: "cart"}))
		if err != nil {
			return []string{err.Error()}
		}
		var out []string
		for _, c := range res.Msg.GetClusters() {
			out = append(out, c.ClusterName)
		}
		slices.Sort(out)
		return out
	}
	testkit.Eventually(t, 20*time.Second, func() error {
		if got := served(); !slices.Equal(got, []string{"east", "west"}) {
			return fmt.Errorf("served from %v, want east and west", got)
		}
		return nil
	})
	if _, err := clusters.DeregisterCluster(ctx, connect.NewRequest(&clusterv1.DeregisterClusterRequest{Name: "west"})); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	testkit.Eventually(t, 10*time.Second, func() error {
		if got := served(); !slices.Equal(got, []string{"east"}) {
			return fmt.Errorf("served from %v after west's deregistration, want east only", got)
		}
		return nil
	})
	t.Logf("west's endpoints gone %v after its deregistration", time.Since(start).Round(10*time.Millisecond))
}

func bearer(token string) connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("Authorization", "Bearer "+token)
			return next(ctx, req)
		}
	})
}
