package cli

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1/endpointv1connect"
)

// endpointStub records the requests fleetctl sends and answers with fixed data. The service
// itself is tested against real JetStream and kube-apiservers in services/endpoint-collector;
// this checks the command line: flags to requests, responses to output.
type endpointStub struct {
	endpointv1connect.UnimplementedEndpointServiceHandler
	mu   sync.Mutex
	reqs []any
}

func (s *endpointStub) record(r any) {
	s.mu.Lock()
	s.reqs = append(s.reqs, r)
	s.mu.Unlock()
}

func (s *endpointStub) GetServiceEndpoints(_ context.Context, req *connect.Request[endpointv1.GetServiceEndpointsRequest]) (*connect.Response[endpointv1.GetServiceEndpointsResponse], error) {
	s.record(req.Msg)
	return connect.NewResponse(&endpointv1.GetServiceEndpointsResponse{Namespace: "shop", Name: "cart", Clusters: []*endpointv1.ClusterEndpoints{
		{ClusterId: "c1", ClusterName: "east", Weight: 100, Addresses: []*endpointv1.Address{
			{Ip: "10.0.0.7", Port: 8080, Weight: 20, Ready: true, Serving: true, PortName: "http", Zone: "a", Node: "n1", Target: "Pod/cart-1"}}},
		{ClusterId: "c2", ClusterName: "west", Weight: 100, Stale: true, Addresses: []*endpointv1.Address{
			{Ip: "10.1.0.1", Port: 8080, Weight: 100, Serving: true, Terminating: true}}},
	}}), nil
}

func (s *endpointStub) SetEndpointWeight(_ context.Context, req *connect.Request[endpointv1.SetEndpointWeightRequest]) (*connect.Response[endpointv1.SetEndpointWeightResponse], error) {
	s.record(req.Msg)
	return connect.NewResponse(&endpointv1.SetEndpointWeightResponse{Weights: &endpointv1.ServiceWeights{
		EndpointWeights: []*endpointv1.EndpointWeight{{Ip: req.Msg.Ip, ClusterName: "east", Weight: req.Msg.Weight, TargetUid: "u1"}}}}), nil
}

func (s *endpointStub) SetClusterWeight(_ context.Context, req *connect.Request[endpointv1.SetClusterWeightRequest]) (*connect.Response[endpointv1.SetClusterWeightResponse], error) {
	s.record(req.Msg)
	return connect.NewResponse(&endpointv1.SetClusterWeightResponse{Weights: &endpointv1.ServiceWeights{
		ClusterWeights: map[string]uint32{req.Msg.Cluster: req.Msg.Weight}}}), nil
}

func TestEndpointsCommands(t *testing.T) {
	stub := &endpointStub{}
	mux := http.NewServeMux()
	mux.Handle(endpointv1connect.NewEndpointServiceHandler(stub))
	hs := httptest.NewServer(mux)
	defer hs.Close()
	env := &e2eEnv{url: hs.URL}
	run := func(args ...string) result {
		return env.runWith(t, context.Background(), nil, append([]string{"--server", hs.URL}, args...)...)
	}

	out := run("endpoints", "get", "shop/cart", "--filter", "all").ok(t).stdout
	for _, want := range []string{"CLUSTER", "east", "10.0.0.7", "8080/http", "20", "Ready", "Pod/cart-1", "west (stale)", "Terminating(serving)"} {
		if !strings.Contains(out, want) {
			t.Errorf("get output lacks %q:\n%s", want, out)
		}
	}
	run("endpoints", "weight", "shop/cart", "--ip", "10.0.0.7", "--weight", "0").ok(t)
	run("endpoints", "weight", "shop/cart", "--ip", "10.0.0.7", "--clear").ok(t)
	out = run("endpoints", "weight", "shop/cart", "--cluster", "west", "--weight", "50").ok(t).stdout
	if !strings.Contains(out, "west") || !strings.Contains(out, "50") {
		t.Errorf("cluster weight output:\n%s", out)
	}

	stub.mu.Lock()
	got := stub.reqs
	stub.mu.Unlock()
	if len(got) != 4 {
		t.Fatalf("requests: %v", got)
	}
	if r := got[0].(*endpointv1.GetServiceEndpointsRequest); r.Namespace != "shop" || r.Name != "cart" || r.Filter != endpointv1.EndpointFilter_ENDPOINT_FILTER_ALL {
		t.Errorf("get request: %v", r)
	}
	if r := got[1].(*endpointv1.SetEndpointWeightRequest); r.Ip != "10.0.0.7" || r.Weight != 0 || r.Clear {
		t.Errorf("weight request: %v", r)
	}
	if r := got[2].(*endpointv1.SetEndpointWeightRequest); !r.Clear {
		t.Errorf("clear request: %v", r)
	}
	if r := got[3].(*endpointv1.SetClusterWeightRequest); r.Cluster != "west" || r.Weight != 50 {
		t.Errorf("cluster weight request: %v", r)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"endpoints", "get", "cart"}, `error: service "cart": want NAMESPACE/NAME`},
		{[]string{"endpoints", "get", "shop/cart", "--filter", "some"}, `error: --filter "some"`},
		{[]string{"endpoints", "weight", "shop/cart", "--ip", "10.0.0.7"}, "error: give exactly one of --weight and --clear"},
		{[]string{"endpoints", "weight", "shop/cart", "--weight", "5"}, "error: give --ip, or --cluster"},
		{[]string{"endpoints", "weight", "shop/cart", "--ip", "10.0.0.7", "--weight", "70000"}, "error: --weight 70000"},
	} {
		run(tc.args...).fails(t, tc.want)
	}
}
