package xds

// Benchmarks for docs/benchmarks.md (## Endpoints, xDS):
//
//	go test -run '^$' -bench XDS -benchtime 1x ./xds/

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/authz"
	"github.com/fleetstream/fleetstream/pkg/events"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/collector"
)

// benchReport is service svc's slice in cluster: eps endpoints; seq, when not 0, is encoded in
// the first endpoint's IP (11.x.y.z) so a reader can tell which update it sees.
func benchReport(cluster string, svc, eps int, seq uint32) *endpointv1.EndpointSliceReport {
	r := &endpointv1.EndpointSliceReport{ClusterName: cluster, ClusterId: "id-" + cluster, Namespace: "bench",
		Service: fmt.Sprintf("svc-%d", svc), Slice: fmt.Sprintf("svc-%d-%s", svc, cluster), AddressType: "IPv4",
		SessionId: "bench-" + cluster, Generation: 1, Time: timestamppb.Now(),
		Ports: []*endpointv1.EndpointPort{{Name: "http", Port: 8080, Protocol: "TCP"}}}
	c := byte(1)
	if cluster == "west" {
		c = 2
	}
	for i := range eps {
		ip := netip.AddrFrom4([4]byte{10 + c*10, byte(svc >> 8), byte(svc), byte(i)})
		if i == 0 && seq != 0 {
			ip = netip.AddrFrom4([4]byte{11, byte(seq >> 16), byte(seq >> 8), byte(seq)})
		}
		r.Endpoints = append(r.Endpoints, &endpointv1.Endpoint{Addresses: []string{ip.String()}, Ready: true, Serving: true,
			Zone: fmt.Sprintf("%s-zone-%d", cluster, i%3), Node: fmt.Sprintf("%s-node-%d", cluster, (svc+i)%100),
			Target: &endpointv1.TargetRef{Kind: "Pod", Namespace: "bench", Name: fmt.Sprintf("svc-%d-pod-%d", svc, i)}})
	}
	return r
}

func benchMsg(b *testing.B, r *endpointv1.EndpointSliceReport) *nats.Msg {
	env, err := events.NewEnvelope(context.Background(), r.ClusterName, r, "bench")
	if err != nil {
		b.Fatal(err)
	}
	m := nats.NewMsg(subjects.AgentEndpointSlice(r.ClusterName, r.Namespace, r.Slice))
	if m.Data, err = proto.Marshal(env); err != nil {
		b.Fatal(err)
	}
	return m
}

// seqIn returns the seq encoded in an address list (0 when none).
func seqIn(ips []string) uint32 {
	for _, s := range ips {
		if a, err := netip.ParseAddr(s); err == nil && a.Is4() && a.As4()[0] == 11 {
			v := a.As4()
			return uint32(v[1])<<16 | uint32(v[2])<<8 | uint32(v[3])
		}
	}
	return 0
}

func heapAfterGC() uint64 {
	var m runtime.MemStats
	for range 2 {
		runtime.GC()
	}
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkXDSPushLatency: 5,000 services × 2 clusters × 10 endpoints served over xDS to one
// connected ADS client subscribed to every ClusterLoadAssignment. Updates (one per service, at
// 100/s and 500/s, agent-format reports on FLEET_AGENT) are timed from the agent's publish to (a) the
// collector serving them (its change feed shows the new state: the existing report→query
// latency) and (b) the client receiving the new ClusterLoadAssignment, in the same run. Also
// the heap the xDS server holds at that size (its caches, with the connected client's view).
func BenchmarkXDSPushLatency(b *testing.B) {
	for _, rate := range []int{100, 500} {
		b.Run(fmt.Sprintf("updates=%d/s", rate), func(b *testing.B) { benchPush(b, rate, 4*rate) })
	}
}

func benchPush(b *testing.B, rate, updates int) {
	const (
		services = 5000
		eps      = 10
	)
	for range b.N {
		js := testkit.StartJetStream(b)
		_, pubJS := js.Connect(b)
		ctx, cancel := context.WithCancel(context.Background())
		log := zap.NewNop()
		col, err := collector.New(ctx, js.JS, collector.Config{NoViewWrites: true}, log)
		if err != nil {
			b.Fatal(err)
		}
		// The fleet: every slice in the stream before the collector starts.
		var msgs []*nats.Msg
		for svc := range services {
			for _, cl := range []string{"east", "west"} {
				msgs = append(msgs, benchMsg(b, benchReport(cl, svc, eps, 0)))
			}
		}
		for i, m := range msgs {
			if _, err := pubJS.PublishMsgAsync(m); err != nil {
				b.Fatal(err)
			}
			if i%1000 == 999 { // a bounded window of unacknowledged publishes
				<-pubJS.PublishAsyncComplete()
			}
		}
		<-pubJS.PublishAsyncComplete()
		var wg sync.WaitGroup
		wg.Go(func() { _ = col.Run(ctx) })
		<-col.Ready()
		// The collector's own responses (ALL filter) are built before the baseline heap: the
		// xDS server reads them, but the collector caches them for its API too.
		for svc := range services {
			col.Endpoints("bench", fmt.Sprintf("svc-%d", svc))
		}
		heapBefore := heapAfterGC()

		srv, err := server.New(server.Config{InsecureDev: true}, log)
		if err != nil {
			b.Fatal(err)
		}
		az := testkit.Authorize(b, js.JS, srv, authz.Config{}.ForInsecureDev())
		x := New(col, srv.Authenticator(), az, log)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() { _ = x.Run(ctx) })
		wg.Go(func() { _ = x.Serve(ctx, ln) })
		<-x.Ready()

		heapLoaded := heapAfterGC()

		// Two clients, each subscribed to every assignment and ACKing every response: one state
		// of the world, one delta.
		names := make([]string, services)
		for i := range names {
			names[i] = ResourceName("bench", fmt.Sprintf("svc-%d", i), "http")
		}
		sentAt := make([]atomic.Int64, updates+1)
		type probe struct {
			lat      []time.Duration
			seen     atomic.Int64
			received atomic.Int64
		}
		newProbe := func() *probe { return &probe{lat: make([]time.Duration, updates+1)} }
		sotw, delta, query, built, cached := newProbe(), newProbe(), newProbe(), newProbe(), newProbe()
		record := func(p *probe, now int64, ips []string) {
			if s := seqIn(ips); s != 0 && s <= uint32(updates) && p.lat[s] == 0 {
				if t := sentAt[s].Load(); t != 0 {
					p.lat[s] = time.Duration(now - t)
					p.seen.Add(1)
				}
			}
		}
		claIPs := func(a *anypb.Any) []string {
			var cla endpointv3.ClusterLoadAssignment
			if err := a.UnmarshalTo(&cla); err != nil {
				b.Error(err)
				return nil
			}
			var ips []string
			for _, l := range cla.Endpoints {
				for _, e := range l.LbEndpoints {
					ips = append(ips, e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress())
				}
			}
			return ips
		}
		// The first state-of-the-world response carries all 5,000 assignments (~8 MB): more than
		// gRPC clients accept by default (4 MB). Envoy accepts it; a gRPC client must raise its
		// limit (or use delta, which sends one resource per response... in one message too).
		cc := dial(b, ln.Addr().String(), "", grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
		ads := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc)
		stream, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := stream.Send(&discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "bench-sotw"}, TypeUrl: resourcev3.EndpointType,
			ResourceNames: names}); err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			for {
				r, err := stream.Recv()
				if err != nil {
					if ctx.Err() == nil {
						b.Errorf("sotw client: %v", err)
					}
					return
				}
				now := time.Now().UnixNano()
				for _, a := range r.Resources {
					sotw.received.Add(1)
					record(sotw, now, claIPs(a))
				}
				_ = stream.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: r.TypeUrl, ResponseNonce: r.Nonce,
					VersionInfo: r.VersionInfo, ResourceNames: names})
			}
		})
		dstream, err := ads.DeltaAggregatedResources(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := dstream.Send(&discoverygrpc.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "bench-delta"}, TypeUrl: resourcev3.EndpointType,
			ResourceNamesSubscribe: names}); err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			for {
				r, err := dstream.Recv()
				if err != nil {
					if ctx.Err() == nil {
						b.Errorf("delta client: %v", err)
					}
					return
				}
				now := time.Now().UnixNano()
				for _, res := range r.Resources {
					delta.received.Add(1)
					record(delta, now, claIPs(res.Resource))
				}
				_ = dstream.Send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: r.TypeUrl, ResponseNonce: r.Nonce})
			}
		})
		testkit.Eventually(b, time.Minute, func() error {
			if n, m := sotw.received.Load(), delta.received.Load(); n < services || m < services {
				return fmt.Errorf("clients have %d and %d of %d assignments", n, m, services)
			}
			return nil
		})
		heapAfter := heapAfterGC()

		// The baseline in the same run: the collector's change feed, as its API serves.
		feed := col.Feed()
		feed.Take()
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-feed.Changed():
				}
				for _, ref := range feed.Take() {
					resp, ok := col.Endpoints(ref.Namespace, ref.Name)
					if !ok {
						continue
					}
					now := time.Now().UnixNano()
					var ips []string
					for _, c := range resp.Clusters {
						for _, a := range c.Addresses {
							ips = append(ips, a.Ip)
						}
					}
					record(query, now, ips)
				}
			}
		})

		// When the xDS server has built the new assignment (our feed, before go-control-plane),
		// and when UpdateResources has returned: it is in the cache and handed to every watch
		// waiting for it (before any client has it).
		stage := func(p *probe) func(map[string]types.Resource) {
			return func(set map[string]types.Resource) {
				now := time.Now().UnixNano()
				for _, r := range set {
					var ips []string
					for _, l := range r.(*endpointv3.ClusterLoadAssignment).Endpoints {
						for _, e := range l.LbEndpoints {
							ips = append(ips, e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress())
						}
					}
					record(p, now, ips)
				}
			}
		}
		// How long each batch's UpdateResources took (go-control-plane's share of the cache
		// stage), and how much of the update phase the feeding goroutine spent in it.
		var (
			updMu    sync.Mutex
			updStart time.Time
			updDur   []time.Duration
		)
		onBuilt, onPushed := stage(built), stage(cached)
		x.hooks.Store(&hooks{
			built: func(set map[string]types.Resource) {
				onBuilt(set)
				updMu.Lock()
				updStart = time.Now()
				updMu.Unlock()
			},
			pushed: func(set map[string]types.Resource) {
				updMu.Lock()
				updDur = append(updDur, time.Since(updStart))
				updMu.Unlock()
				onPushed(set)
			},
		})
		phase := time.Now()

		// Updates: seq 1..updates, each to another service's east slice, paced.
		upd := make([]*nats.Msg, updates+1)
		for s := 1; s <= updates; s++ {
			upd[s] = benchMsg(b, benchReport("east", (s*7)%services, eps, uint32(s)))
		}
		tick := time.NewTicker(time.Second / time.Duration(rate))
		for s := 1; s <= updates; s++ {
			<-tick.C
			sentAt[s].Store(time.Now().UnixNano())
			if _, err := pubJS.PublishMsgAsync(upd[s]); err != nil {
				b.Fatal(err)
			}
		}
		tick.Stop()
		<-pubJS.PublishAsyncComplete()
		testkit.Eventually(b, time.Minute, func() error {
			if x, d, q := sotw.seen.Load(), delta.seen.Load(), query.seen.Load(); x < int64(updates) || d < int64(updates) || q < int64(updates) {
				return fmt.Errorf("sotw %d, delta %d, served %d of %d updates", x, d, q, updates)
			}
			return nil
		})
		phaseDur := time.Since(phase)
		updMu.Lock()
		var busy time.Duration
		for _, d := range updDur {
			busy += d
		}
		p50, p99 := percentiles(updDur)
		b.ReportMetric(ms(p50), "update-p50-ms")
		b.ReportMetric(ms(p99), "update-p99-ms")
		b.ReportMetric(float64(len(updDur)), "batches")
		b.ReportMetric(100*busy.Seconds()/phaseDur.Seconds(), "in-update-%")
		updMu.Unlock()
		for _, m := range []struct {
			name string
			p    *probe
		}{{"query", query}, {"built", built}, {"cache", cached}, {"sotw", sotw}, {"delta", delta}} {
			p50, p99 := percentiles(m.p.lat[1:])
			b.ReportMetric(ms(p50), m.name+"-p50-ms")
			b.ReportMetric(ms(p99), m.name+"-p99-ms")
		}
		b.ReportMetric(float64(heapLoaded-heapBefore)/(1<<20), "cache-MB")
		b.ReportMetric(float64(heapLoaded-heapBefore)/float64(services*2*eps), "cache-bytes/endpoint")
		b.ReportMetric(float64(heapAfter-heapBefore)/(1<<20), "cache+2clients-MB")
		cancel()
		wg.Wait()
		feed.Close()
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func percentiles(d []time.Duration) (p50, p99 time.Duration) {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2], s[len(s)*99/100]
}
