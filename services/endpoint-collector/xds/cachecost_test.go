package xds

// The floor that go-control-plane's LinearCache sets under the push latency, without NATS, the
// collector, gRPC or this package's feed (docs/benchmarks.md, xDS):
//
//	go test -run '^$' -bench LinearCacheCost -benchtime 2000x ./xds/

import (
	"fmt"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	streamv3 "github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// benchCLA is an assignment of the push benchmark's shape: 2 clusters × 10 endpoints, seq in
// the first address.
func benchCLA(name string, svc, seq int) *endpointv3.ClusterLoadAssignment {
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	for c, cl := range []string{"east", "west"} {
		for z := range 3 {
			loc := &endpointv3.LocalityLbEndpoints{Locality: &corev3.Locality{Zone: cl, SubZone: fmt.Sprintf("%s-zone-%d", cl, z)},
				LoadBalancingWeight: wrapperspb.UInt32(300)}
			for i := z; i < 10; i += 3 {
				ip := fmt.Sprintf("%d.%d.%d.%d", 20+c*10, svc>>8&255, svc&255, i)
				if c == 0 && i == 0 && seq != 0 {
					ip = fmt.Sprintf("11.%d.%d.%d", seq>>16&255, seq>>8&255, seq&255)
				}
				loc.LbEndpoints = append(loc.LbEndpoints, &endpointv3.LbEndpoint{
					HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
						Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
							Address: ip, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 8080}}}},
						Hostname: fmt.Sprintf("svc-%d-pod-%d", svc, i)}},
					HealthStatus: corev3.HealthStatus_HEALTHY, LoadBalancingWeight: wrapperspb.UInt32(100)})
			}
			cla.Endpoints = append(cla.Endpoints, loc)
		}
	}
	return cla
}

// BenchmarkLinearCacheCost: one EDS LinearCache holding 5,000 assignments, one state-of-the-world
// and one delta watch each subscribed to all of them (the push benchmark's two clients). Each
// iteration updates one assignment and times, as the xDS server's streams do it:
//
//   - update: UpdateResources while both watches wait (the cache stage of the push benchmark);
//   - sotw-ack / delta-ack: the client's ACK opening its next watch (CreateWatch /
//     CreateDeltaWatch, with the server's subscription bookkeeping), which holds the cache's lock
//     as long as it runs; a state-of-the-world ACK carries all 5,000 names again.
//
// It runs with 5,000 and 500 names to show that both scale with the subscription.
func BenchmarkLinearCacheCost(b *testing.B) {
	for _, n := range []int{5000, 500} {
		b.Run(fmt.Sprintf("names=%d", n), func(b *testing.B) { linearCacheCost(b, n) })
	}
}

func linearCacheCost(b *testing.B, services int) {
	names := make([]string, services)
	res := make(map[string]types.Resource, services)
	for i := range names {
		names[i] = ResourceName("bench", fmt.Sprintf("svc-%d", i), "http")
		res[names[i]] = benchCLA(names[i], i, 0)
	}
	c := cachev3.NewLinearCache(resourcev3.EndpointType, cachev3.WithVersionPrefix("p-"), cachev3.WithLogger(cacheLogger{zap.NewNop()}))
	if err := c.UpdateResources(res, nil); err != nil {
		b.Fatal(err)
	}
	sotwCh := make(chan cachev3.Response, 1)
	deltaCh := make(chan cachev3.DeltaResponse, 1)
	sotwSub := streamv3.NewSotwSubscription(names, false)
	deltaSub := streamv3.NewDeltaSubscription(names, nil, nil, false)
	sotwReq := &discoverygrpc.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: names}
	deltaReq := &discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: names}
	var sotwCancel, deltaCancel func()
	// ack takes the pending responses (initial: all 5,000) and opens the next watches as the
	// server does on the client's ACK; it returns how long each CreateWatch took.
	ack := func() (sotw, delta time.Duration) {
		r := <-sotwCh
		v, _ := r.GetVersion()
		sotwSub.SetReturnedResources(r.GetReturnedResources())
		t0 := time.Now()
		sotwReq = &discoverygrpc.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: names, VersionInfo: v}
		sotwSub.SetResourceSubscription(sotwReq.ResourceNames)
		cancel, err := c.CreateWatch(sotwReq, sotwSub, sotwCh)
		if err != nil {
			b.Fatal(err)
		}
		sotw = time.Since(t0)
		sotwCancel = cancel
		d := <-deltaCh
		deltaSub.SetReturnedResources(d.GetReturnedResources())
		t0 = time.Now()
		cancel, err = c.CreateDeltaWatch(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: "n"}, deltaSub, deltaCh)
		if err != nil {
			b.Fatal(err)
		}
		delta = time.Since(t0)
		deltaCancel = cancel
		return sotw, delta
	}
	var err error
	if sotwCancel, err = c.CreateWatch(sotwReq, sotwSub, sotwCh); err != nil {
		b.Fatal(err)
	}
	if deltaCancel, err = c.CreateDeltaWatch(deltaReq, deltaSub, deltaCh); err != nil {
		b.Fatal(err)
	}
	ack()
	var upd, sa, da []time.Duration
	b.ResetTimer()
	for i := range b.N {
		name := names[(i*7)%services]
		cla := benchCLA(name, (i*7)%services, i+1)
		t0 := time.Now()
		if err := c.UpdateResources(map[string]types.Resource{name: cla}, nil); err != nil {
			b.Fatal(err)
		}
		upd = append(upd, time.Since(t0))
		s, d := ack()
		sa, da = append(sa, s), append(da, d)
	}
	b.StopTimer()
	sotwCancel()
	deltaCancel()
	for _, m := range []struct {
		name string
		d    []time.Duration
	}{{"update", upd}, {"sotw-ack", sa}, {"delta-ack", da}} {
		p50, p99 := percentiles(m.d)
		b.ReportMetric(float64(p50.Microseconds()), m.name+"-p50-µs")
		b.ReportMetric(float64(p99.Microseconds()), m.name+"-p99-µs")
	}
}
