package xds

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/xds"
	xdsbootstrap "google.golang.org/grpc/xds/bootstrap"

	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/collector"
)

// TestMain registers the channel credentials the gRPC clients' bootstrap names: gRPC's xDS
// client takes its credentials from a registry filled at start-up.
func TestMain(m *testing.M) {
	xdsbootstrap.RegisterChannelCredentials(bearerCreds{})
	os.Exit(m.Run())
}

// bearerCreds ("fleetstream-bearer" in a bootstrap, config {"token": ...}) is plaintext with a
// bearer token on every call: how a gRPC client presents a Fleetstream token to the xDS server.
type bearerCreds struct{}

func (bearerCreds) Name() string { return "fleetstream-bearer" }

func (bearerCreds) Build(config json.RawMessage) (credentials.Bundle, func(), error) {
	var c struct{ Token string }
	if err := json.Unmarshal(config, &c); err != nil {
		return nil, nil, err
	}
	return bearerBundle{tokenCreds{c.Token}}, func() {}, nil
}

type bearerBundle struct{ call tokenCreds }

func (b bearerBundle) TransportCredentials() credentials.TransportCredentials {
	return insecure.NewCredentials()
}
func (b bearerBundle) PerRPCCredentials() credentials.PerRPCCredentials { return b.call }
func (b bearerBundle) NewWithMode(string) (credentials.Bundle, error)   { return b, nil }

// backend is a gRPC server standing in for a pod: it counts the RPCs it serves.
type backend struct {
	grpc_health_v1.UnimplementedHealthServer
	ip      string
	port    uint32
	cluster string
	calls   atomic.Int64
	last    atomic.Int64 // unix nanos of the last RPC
}

func (b *backend) Check(context.Context, *grpc_health_v1.HealthCheckRequest) (*grpc_health_v1.HealthCheckResponse, error) {
	b.calls.Add(1)
	b.last.Store(time.Now().UnixNano())
	return &grpc_health_v1.HealthCheckResponse{Status: grpc_health_v1.HealthCheckResponse_SERVING}, nil
}

func startBackend(t *testing.T, ip, cluster string) *backend {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatalf("listen on %s: %v", ip, err)
	}
	b := &backend{ip: ip, port: uint32(ln.Addr().(*net.TCPAddr).Port), cluster: cluster}
	g := grpc.NewServer()
	grpc_health_v1.RegisterHealthServer(g, b)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	return b
}

// TestGRPCClientsFollowWeights is the proof with a client no one here wrote: gRPC's own xDS
// resolver and balancers, bootstrapped at our server, dial xds:///cart.shop:grpc; the backends
// of two clusters (127.0.0.2-5 "east", 127.0.0.6-9 "west", reported as the agent reports
// EndpointSlices) count what they serve.
func TestGRPCClientsFollowWeights(t *testing.T) {
	h := startHarness(t, collector.Config{StaleAfter: time.Second, EvictAfter: 2 * time.Second}, testkit.Logger(t))
	agents := map[string]*agent{"east": newAgent(t, h.js, "east"), "west": newAgent(t, h.js, "west")}
	var backends []*backend
	for i := 2; i <= 9; i++ {
		cluster := "east"
		if i >= 6 {
			cluster = "west"
		}
		b := startBackend(t, "127.0.0."+strconv.Itoa(i), cluster)
		backends = append(backends, b)
		// One slice per pod: each backend listens on its own port.
		agents[cluster].report("shop", "cart", "cart-"+b.ip, b.port, pod{b.ip, "R", cluster + "-a"})
	}
	for _, a := range agents {
		a.startHeartbeats(100 * time.Millisecond)
	}
	h.setClusterWeight("shop", "cart", "west", 300)
	h.waitAssignment(func(cla *endpointv3.ClusterLoadAssignment) bool {
		return localityWeight(cla, "east") == 400 && localityWeight(cla, "west") == 1200
	})

	bootstrap := fmt.Sprintf(`{"xds_servers": [{"server_uri": %q, "channel_creds": [{"type": "fleetstream-bearer", "config": {"token": %q}}],
		"server_features": ["xds_v3"]}], "node": {"id": "grpc-e2e"}}`, h.addr, tokenReader)
	res, err := xds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("xds:///cart.shop:grpc", grpc.WithResolvers(res), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	client := grpc_health_v1.NewHealthClient(cc)
	call := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := client.Check(ctx, &grpc_health_v1.HealthCheckRequest{}, grpc.WaitForReady(true))
		return err
	}
	// send makes n RPCs, 8 at a time, and returns what each cluster's backends served.
	send := func(n int) map[string]int64 {
		t.Helper()
		before := counts(backends)
		var wg sync.WaitGroup
		var next atomic.Int64
		for range 8 {
			wg.Go(func() {
				for next.Add(1) <= int64(n) {
					if err := call(); err != nil {
						t.Errorf("rpc: %v", err)
						return
					}
				}
			})
		}
		wg.Wait()
		after := counts(backends)
		return map[string]int64{"east": after["east"] - before["east"], "west": after["west"] - before["west"]}
	}
	share := func(got map[string]int64, cluster string) float64 {
		return 100 * float64(got[cluster]) / float64(got["east"]+got["west"])
	}
	const n = 10000

	// 1. The split follows the weights: east 4 × 100, west 4 × 300 → 25% / 75%.
	got := send(n)
	t.Logf("weights east 100, west 300: %v", got)
	if s := share(got, "east"); s < 22 || s > 28 {
		t.Fatalf("east got %.1f%% of %d RPCs, want 25 ± 3", s, n)
	}

	// 2. Weight 0 on west: no new RPC reaches it within 1 s of the call.
	var stop atomic.Bool
	var loop sync.WaitGroup
	var afterDeadline atomic.Int64
	t0 := time.Now()
	deadline := t0.Add(time.Second)
	for range 4 {
		loop.Go(func() {
			for !stop.Load() {
				if err := call(); err != nil {
					t.Errorf("rpc: %v", err)
					return
				}
				if time.Now().After(deadline) {
					afterDeadline.Add(1)
				}
			}
		})
	}
	h.setClusterWeight("shop", "cart", "west", 0)
	// Keep the traffic flowing past the deadline, until plenty of RPCs were made after it.
	eventually(t, 30*time.Second, func() error {
		if n := afterDeadline.Load(); n < 2000 {
			return fmt.Errorf("%d RPCs after the deadline so far", n)
		}
		return nil
	})
	stop.Store(true)
	loop.Wait()
	var lastWest time.Time
	for _, b := range backends {
		if b.cluster == "west" {
			if l := time.Unix(0, b.last.Load()); l.After(lastWest) {
				lastWest = l
			}
		}
	}
	t.Logf("west's last RPC %v after the weight-0 call; %d RPCs after the 1 s deadline", lastWest.Sub(t0).Round(time.Millisecond), afterDeadline.Load())
	if lastWest.After(deadline) {
		t.Fatalf("west still served an RPC %v after its weight was set to 0", lastWest.Sub(t0))
	}
	if got := send(1000); got["west"] != 0 {
		t.Fatalf("west drained but served %d of 1000 RPCs", got["west"])
	}

	// 3. Evicting a cluster moves all traffic to the other: west back at 300, east's agent
	// goes silent until evicted.
	h.setClusterWeight("shop", "cart", "west", 300)
	h.waitAssignment(func(cla *endpointv3.ClusterLoadAssignment) bool { return localityWeight(cla, "west") == 1200 })
	agents["east"].stopHeartbeats()
	h.waitAssignment(func(cla *endpointv3.ClusterLoadAssignment) bool { return !hasLocality(cla, "east") })
	got = send(n)
	t.Logf("east evicted: %v", got)
	if got["east"] != 0 || got["west"] != n {
		t.Fatalf("east evicted, yet the split is %v", got)
	}

	// 4. Restoring brings it back: the agent returns and relists; the split is 25/75 again.
	agents["east"].startHeartbeats(100 * time.Millisecond)
	agents["east"].relist()
	h.waitAssignment(func(cla *endpointv3.ClusterLoadAssignment) bool {
		return localityWeight(cla, "east") == 400 && localityWeight(cla, "west") == 1200
	})
	// The client applies the update a moment after the cache has it: wait until east serves.
	eventually(t, 10*time.Second, func() error {
		if got := send(100); got["east"] == 0 {
			return fmt.Errorf("east not back yet")
		}
		return nil
	})
	got = send(n)
	t.Logf("east restored: %v", got)
	if s := share(got, "east"); s < 22 || s > 28 {
		t.Fatalf("east got %.1f%% of %d RPCs after coming back, want 25 ± 3", s, n)
	}
}

func counts(bs []*backend) map[string]int64 {
	out := map[string]int64{}
	for _, b := range bs {
		out[b.cluster] += b.calls.Load()
	}
	return out
}

// localityWeight sums the weights of cluster's localities in cla.
func localityWeight(cla *endpointv3.ClusterLoadAssignment, cluster string) uint32 {
	var w uint32
	for _, l := range cla.GetEndpoints() {
		if l.GetLocality().GetZone() == cluster {
			w += l.GetLoadBalancingWeight().GetValue()
		}
	}
	return w
}

func hasLocality(cla *endpointv3.ClusterLoadAssignment, cluster string) bool {
	for _, l := range cla.GetEndpoints() {
		if l.GetLocality().GetZone() == cluster {
			return true
		}
	}
	return false
}

// waitAssignment waits until the served assignment of shop/cart:grpc satisfies cond.
func (h *harness) waitAssignment(cond func(*endpointv3.ClusterLoadAssignment) bool) {
	h.t.Helper()
	eventually(h.t, 20*time.Second, func() error {
		r, ok := h.xds.eds.GetResources()[claName].(*endpointv3.ClusterLoadAssignment)
		if !ok || !cond(r) {
			return fmt.Errorf("assignment not there yet: %s", render(r))
		}
		return nil
	})
}
