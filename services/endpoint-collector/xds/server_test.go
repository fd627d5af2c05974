package xds

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/collector"
)

const claName = "shop/cart:grpc"

// TestAssignmentsFollowTheCollector: what the collector serves reaches an ADS client as
// ClusterLoadAssignments (state of the world and delta), with localities, weights and health
// following cluster weights, drains and staleness; a NACK is logged with its reason.
func TestAssignmentsFollowTheCollector(t *testing.T) {
	obs, logs := observer.New(zapcore.WarnLevel)
	log := zap.New(zapcore.NewTee(testkit.Logger(t).Core(), obs))
	h := startHarness(t, collector.Config{StaleAfter: time.Second, EvictAfter: time.Minute}, log)
	east, west := newAgent(t, h.js, "east"), newAgent(t, h.js, "west")
	east.startHeartbeats(100 * time.Millisecond)
	west.startHeartbeats(100 * time.Millisecond)
	east.report("shop", "cart", "cart-e1", 9000, pod{"10.0.1.1", "R", "a"}, pod{"10.0.1.2", "R", "b"}, pod{"10.0.1.3", "T", "b"})
	west.report("shop", "cart", "cart-w1", 9000, pod{"10.0.2.1", "R", "a"}, pod{"10.0.2.2", "", "a"})

	ads := newADSClient(t, dial(t, h.addr, tokenReader))
	ads.subscribe(resourcev3.EndpointType, claName)
	ads.subscribe(resourcev3.ListenerType, "cart.shop:grpc")
	delta := newDeltaClient(t, dial(t, h.addr, tokenReader), claName)
	expect := func(want string) {
		t.Helper()
		for name, got := range map[string]func() (string, error){"sotw": func() (string, error) { return ads.assignment(claName) },
			"delta": func() (string, error) { return delta.assignment(claName) }} {
			eventually(t, 10*time.Second, func() error {
				s, err := got()
				if err != nil {
					return err
				}
				if s != want {
					return fmt.Errorf("%s:\n got %s\nwant %s", name, s, want)
				}
				return nil
			})
		}
	}
	expect("east/a@100[10.0.1.1:9000 w100 HEALTHY] east/b@100[10.0.1.2:9000 w100 HEALTHY, 10.0.1.3:9000 w100 DRAINING] " +
		"west/a@100[10.0.2.1:9000 w100 HEALTHY, 10.0.2.2:9000 w100 UNHEALTHY]")

	// The listener gRPC resolves: routes by RDS over ADS.
	eventually(t, 10*time.Second, func() error {
		a, err := ads.get(resourcev3.ListenerType, "cart.shop:grpc")
		if err != nil || a == nil {
			return fmt.Errorf("listener: %v", err)
		}
		var l listenerv3.Listener
		if err := a.UnmarshalTo(&l); err != nil || l.ApiListener == nil {
			return fmt.Errorf("listener without api_listener: %v", err)
		}
		return nil
	})

	// Weights: endpoint weight × cluster weight; 0 drains.
	h.setClusterWeight("shop", "cart", "west", 300)
	h.setEndpointWeight("shop", "cart", "10.0.1.2", 50)
	expect("east/a@100[10.0.1.1:9000 w100 HEALTHY] east/b@50[10.0.1.2:9000 w50 HEALTHY, 10.0.1.3:9000 w100 DRAINING] " +
		"west/a@300[10.0.2.1:9000 w300 HEALTHY, 10.0.2.2:9000 w300 UNHEALTHY]")
	h.setClusterWeight("shop", "cart", "west", 0)
	expect("east/a@100[10.0.1.1:9000 w100 HEALTHY] east/b@50[10.0.1.2:9000 w50 HEALTHY, 10.0.1.3:9000 w100 DRAINING] " +
		"west/a[10.0.2.1:9000 w1 DRAINING, 10.0.2.2:9000 w1 UNHEALTHY]")

	// A silent cluster goes stale: its endpoints stay, UNHEALTHY, until evicted.
	east.stopHeartbeats()
	expect("east/a[10.0.1.1:9000 w100 UNHEALTHY] east/b[10.0.1.2:9000 w50 UNHEALTHY, 10.0.1.3:9000 w100 UNHEALTHY] " +
		"west/a[10.0.2.1:9000 w1 DRAINING, 10.0.2.2:9000 w1 UNHEALTHY]")

	// A NACK is logged with the client's reason.
	ads.mu.Lock()
	ads.nackNext[resourcev3.EndpointType] = "no healthy upstream, and I do not like it"
	ads.mu.Unlock()
	east.startHeartbeats(100 * time.Millisecond)
	eventually(t, 10*time.Second, func() error {
		for _, e := range logs.All() {
			if strings.Contains(e.Message, "NACK") && e.ContextMap()["reason"] == "no healthy upstream, and I do not like it" {
				return nil
			}
		}
		return fmt.Errorf("no NACK logged")
	})

	// A service gone leaves an empty assignment (state-of-the-world EDS has no deletion) and
	// removes its listener.
	east.remove("shop", "cart", "cart-e1")
	west.remove("shop", "cart", "cart-w1")
	expect("<empty>")
	eventually(t, 10*time.Second, func() error {
		if n := h.xds.lds.NumResources(); n != 0 {
			return fmt.Errorf("%d listeners left", n)
		}
		return nil
	})
}

// TestXDSNeedsAnXDSReader: the xDS streams take the same bearer tokens as the APIs, and only a
// platform admin's or an xds-reader's.
func TestXDSNeedsAnXDSReader(t *testing.T) {
	h := startHarness(t, collector.Config{}, testkit.Logger(t))
	for token, want := range map[string]codes.Code{"": codes.Unauthenticated, "wrong": codes.Unauthenticated,
		tokenNobody: codes.PermissionDenied, tokenReader: codes.OK, tokenAdmin: codes.OK} {
		for _, delta := range []bool{false, true} {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			client := discoverygrpc.NewAggregatedDiscoveryServiceClient(dial(t, h.addr, token))
			var err error
			if delta {
				var st discoverygrpc.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
				if st, err = client.DeltaAggregatedResources(ctx); err == nil {
					// Subscribed to the listeners (an empty set, so the server answers at once).
					// A refused stream may already be closed when Send runs: Send then says
					// io.EOF and Recv has the status (grpc.ClientStream's contract).
					if err = st.Send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resourcev3.ListenerType}); err == nil || errors.Is(err, io.EOF) {
						_, err = st.Recv()
					}
				}
			} else {
				var st discoverygrpc.AggregatedDiscoveryService_StreamAggregatedResourcesClient
				if st, err = client.StreamAggregatedResources(ctx); err == nil {
					if err = st.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: resourcev3.ListenerType}); err == nil || errors.Is(err, io.EOF) {
						_, err = st.Recv()
					}
				}
			}
			cancel()
			if got := status.Code(err); got != want {
				t.Errorf("token %q (delta %v): %v (%v), want %v", token, delta, got, err, want)
			}
		}
	}
}

// deltaClient is a minimal delta ADS client for EDS.
type deltaClient struct {
	mu  sync.Mutex
	res map[string]*endpointv3.ClusterLoadAssignment
	err error
}

func newDeltaClient(t testing.TB, cc *grpc.ClientConn, names ...string) *deltaClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoverygrpc.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "delta-client"}, TypeUrl: resourcev3.EndpointType,
		ResourceNamesSubscribe: names}); err != nil {
		t.Fatal(err)
	}
	c := &deltaClient{res: map[string]*endpointv3.ClusterLoadAssignment{}}
	go func() {
		for {
			r, err := st.Recv()
			c.mu.Lock()
			if err != nil {
				c.err = err
				c.mu.Unlock()
				return
			}
			for _, res := range r.Resources {
				var cla endpointv3.ClusterLoadAssignment
				if err := res.Resource.UnmarshalTo(&cla); err != nil {
					c.err = err
				}
				c.res[res.Name] = &cla
			}
			for _, n := range r.RemovedResources {
				delete(c.res, n)
			}
			c.mu.Unlock()
			if err := st.Send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: r.Nonce}); err != nil {
				return
			}
		}
	}()
	return c
}

func (c *deltaClient) assignment(name string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return "", c.err
	}
	cla, ok := c.res[name]
	if !ok {
		return "<none>", nil
	}
	return render(cla), nil
}
