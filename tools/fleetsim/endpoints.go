package main

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"connectrpc.com/connect"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
)

// endpointPort is the one port of every simulated service, by name (xDS resources name it).
const endpointPort = "http"

// EndpointsResult is the endpoints scenario: every cluster reports the EndpointSlices of
// -services services through its agent's real report path (informer → report on
// fleet.agent.<cluster>.endpointslice.…), merged by the hub's endpoint collector.
type EndpointsResult struct {
	Services int `json:"services_per_cluster"`
	// LoadAllServedMS is from the first slice created until ListServices showed every service
	// with every cluster: N × services slices reported and merged.
	LoadAllServedMS float64 `json:"load_all_served_ms"`
	// Served is, per cluster and round, from the update of that cluster's slice of the round's
	// service in its (fake) apiserver until GetServiceEndpoints returned the new address; the
	// agent's informer and report are inside it, as they are for a real pod change.
	Served Dist `json:"served"`
	// XDS is the same until an xDS client (ADS, state of the world) subscribed to the service's
	// ClusterLoadAssignment received the new address; unset when the hub serves no xDS.
	XDS Dist `json:"xds,omitzero"`
	// Query is how long each GetServiceEndpoints call of the polling took: Served is stamped
	// when a call returns, so it is exact to within one call.
	Query    Dist             `json:"query"`
	Measured int              `json:"measured_clusters"`
	Rounds   []EndpointsRound `json:"rounds"`
}

// EndpointsRound is one round: one service's slice updated on every cluster, until the last
// cluster's new address was served (and received over xDS).
type EndpointsRound struct {
	ServedAllMS float64 `json:"served_all_ms"`
	XDSAllMS    float64 `json:"xds_all_ms,omitempty"`
}

// endpointIP is cluster i's address in round r (0: the load), unique per cluster and round: the
// collector keeps an address seen in two clusters once.
func endpointIP(i, r int) string {
	return netip.AddrFrom4([4]byte{10, byte(r % 250), byte(i / 250), byte(i % 250)}).String()
}

func serviceName(j int) string { return fmt.Sprintf("svc-%d", j) }

func endpointSlice(ns, cluster string, j int, ip string) *discoveryv1.EndpointSlice {
	ready, port, name, proto := true, int32(8080), endpointPort, corev1.ProtocolTCP
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: serviceName(j) + "-" + cluster,
			Labels: map[string]string{discoveryv1.LabelServiceName: serviceName(j)}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
	}
}

// endpointsScenario creates -services EndpointSlices on every cluster (in a namespace no
// project owns: the collector merges it across the fleet) and waits until the hub serves every
// service from every cluster; then, per round, updates one service's slice on every cluster and
// times each cluster's new address until GetServiceEndpoints returns it and an xDS client
// receives it.
func endpointsScenario(ctx context.Context, o options, h *hub, clusters []*simCluster, run string, res *Result) error {
	ns := "fleetsim-" + run + "-svc"
	er := &EndpointsResult{Services: o.services}
	res.Endpoints = er
	index := make(map[string]int, len(clusters))
	for i, c := range clusters {
		index[c.name] = i
	}
	start := time.Now()
	err := forEach(ctx, len(clusters), 0, func(i int) error {
		c := clusters[i]
		for j := range o.services {
			if _, err := c.kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, endpointSlice(ns, c.name, j, endpointIP(i, 0)), metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("endpoints: create slice of %s on %s: %w", serviceName(j), c.name, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	// Until every service lists every cluster.
	deadline := time.Now().Add(o.timeout)
	for {
		list, err := h.endpoints.ListServices(ctx, connect.NewRequest(&endpointv1.ListServicesRequest{Namespace: ns}))
		if err != nil {
			return fmt.Errorf("endpoints: list services: %w", err)
		}
		full := 0
		for _, s := range list.Msg.GetServices() {
			if len(s.GetClusters()) == len(clusters) {
				full++
			}
		}
		if full == o.services {
			er.LoadAllServedMS = ms(time.Since(start))
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			res.Lost = append(res.Lost, fmt.Sprintf("endpoints: after %v only %d of %d services served from all %d clusters", o.timeout, full, o.services, len(clusters)))
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}

	var ads *adsClient
	if h.xdsAddr != "" {
		if ads, err = dialADS(ctx, h.xdsAddr, h.token); err != nil {
			return fmt.Errorf("endpoints: xds client: %w", err)
		}
		defer ads.close()
	}
	var served, viaXDS, queries []time.Duration
	for r := 1; r <= o.rounds; r++ {
		j := (r - 1) % o.services
		svc := serviceName(j)
		want := make(map[string]string, len(clusters)) // cluster → its new address
		for i, c := range clusters {
			want[c.name] = endpointIP(i, r)
		}
		resource := ns + "/" + svc + ":" + endpointPort
		if ads != nil {
			ads.watch(resource, want)
		}
		updated := make([]time.Time, len(clusters))
		servedAt := make([]time.Time, len(clusters))
		var mu sync.Mutex
		// The poller runs from before the first update, so a cluster updated early is not timed
		// from when the last one was.
		pollCtx, stopPoll := context.WithTimeout(ctx, o.timeout)
		polled := make(chan error, 1)
		go func() {
			missing := len(clusters)
			for missing > 0 && pollCtx.Err() == nil {
				q0 := time.Now()
				resp, err := h.endpoints.GetServiceEndpoints(pollCtx, connect.NewRequest(&endpointv1.GetServiceEndpointsRequest{Namespace: ns, Name: svc}))
				if err != nil {
					if pollCtx.Err() != nil {
						break
					}
					polled <- fmt.Errorf("endpoints: get %s/%s: %w", ns, svc, err)
					return
				}
				now := time.Now()
				mu.Lock()
				queries = append(queries, now.Sub(q0))
				for _, ce := range resp.Msg.GetClusters() {
					i, ok := index[ce.GetClusterName()]
					if !ok || !servedAt[i].IsZero() {
						continue
					}
					for _, a := range ce.GetAddresses() {
						if a.GetIp() == want[ce.GetClusterName()] {
							servedAt[i] = now
							missing--
							break
						}
					}
				}
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
			polled <- nil
		}()
		t0 := time.Now()
		err := forEach(ctx, len(clusters), 0, func(i int) error {
			c := clusters[i]
			mu.Lock()
			updated[i] = time.Now()
			mu.Unlock()
			_, err := c.kube.DiscoveryV1().EndpointSlices(ns).Update(ctx, endpointSlice(ns, c.name, j, endpointIP(i, r)), metav1.UpdateOptions{})
			if err != nil {
				return fmt.Errorf("endpoints: update slice of %s on %s: %w", svc, c.name, err)
			}
			return nil
		})
		if err != nil {
			stopPoll()
			<-polled
			return err
		}
		err = <-polled
		stopPoll()
		if err != nil {
			return err
		}
		deadline := time.Now().Add(o.timeout)
		round := EndpointsRound{}
		var last time.Time
		for i, at := range servedAt {
			if at.IsZero() {
				res.Lost = append(res.Lost, fmt.Sprintf("endpoints round %d: %s's new address of %s never served", r, clusters[i].name, svc))
				continue
			}
			served = append(served, at.Sub(updated[i]))
			last = maxTime([]time.Time{last, at})
		}
		if !last.IsZero() {
			round.ServedAllMS = ms(last.Sub(t0))
		}
		if ads != nil {
			got := ads.wait(ctx, time.Until(deadline.Add(10*time.Second)))
			last = time.Time{}
			for i, c := range clusters {
				at, ok := got[c.name]
				if !ok {
					res.Lost = append(res.Lost, fmt.Sprintf("endpoints round %d: %s's new address of %s never received over xDS", r, c.name, svc))
					continue
				}
				viaXDS = append(viaXDS, at.Sub(updated[i]))
				last = maxTime([]time.Time{last, at})
			}
			if !last.IsZero() {
				round.XDSAllMS = ms(last.Sub(t0))
			}
			if err := ads.err(); err != nil {
				return fmt.Errorf("endpoints: xds stream: %w", err)
			}
		}
		er.Rounds = append(er.Rounds, round)
		er.Measured = len(clusters)
		er.Served, er.XDS, er.Query = newDist(served), newDist(viaXDS), newDist(queries)
	}
	return nil
}

// adsClient is a minimal state-of-the-world ADS client, as a proxy runs one: it subscribes to
// one ClusterLoadAssignment at a time, ACKs every response, and stamps when each cluster's
// expected address first arrives.
type adsClient struct {
	cc     *grpc.ClientConn
	cancel context.CancelFunc
	stream discoverygrpc.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	// sendMu: a gRPC stream takes one sender at a time (subscriptions and ACKs).
	sendMu sync.Mutex

	mu       sync.Mutex
	resource string
	want     map[string]string    // cluster → address expected this round
	got      map[string]time.Time // cluster → when it arrived
	done     chan struct{}        // closed when every wanted cluster arrived
	failed   error
}

type bearerCreds struct{ token string }

func (b bearerCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

func (bearerCreds) RequireTransportSecurity() bool { return false }

func dialADS(ctx context.Context, addr, token string) (*adsClient, error) {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(bearerCreds{token}), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	st, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(sctx)
	if err != nil {
		cancel()
		_ = cc.Close()
		return nil, err
	}
	c := &adsClient{cc: cc, cancel: cancel, stream: st}
	go c.recv()
	return c, nil
}

func (c *adsClient) close() {
	c.cancel()
	_ = c.cc.Close()
}

// watch subscribes to resource (replacing the previous one) and expects want.
func (c *adsClient) watch(resource string, want map[string]string) {
	c.mu.Lock()
	c.resource, c.want, c.got, c.done = resource, want, map[string]time.Time{}, make(chan struct{})
	c.mu.Unlock()
	if err := c.send(&discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "fleetsim"}, TypeUrl: resourcev3.EndpointType,
		ResourceNames: []string{resource}}); err != nil {
		c.fail(err)
	}
}

// wait returns what arrived of the current watch, once all did or timeout passed.
func (c *adsClient) wait(ctx context.Context, timeout time.Duration) map[string]time.Time {
	c.mu.Lock()
	done := c.done
	c.mu.Unlock()
	select {
	case <-done:
	case <-time.After(timeout):
	case <-ctx.Done():
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]time.Time, len(c.got))
	for k, v := range c.got {
		out[k] = v
	}
	return out
}

func (c *adsClient) send(r *discoverygrpc.DiscoveryRequest) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	return c.stream.Send(r)
}

func (c *adsClient) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failed
}

func (c *adsClient) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failed == nil {
		c.failed = err
	}
}

func (c *adsClient) recv() {
	for {
		r, err := c.stream.Recv()
		if err != nil {
			if c.stream.Context().Err() == nil {
				c.fail(err)
			}
			return
		}
		now := time.Now()
		c.mu.Lock()
		for _, a := range r.GetResources() {
			var cla endpointv3.ClusterLoadAssignment
			if a.UnmarshalTo(&cla) != nil || cla.GetClusterName() != c.resource {
				continue
			}
			for _, loc := range cla.GetEndpoints() {
				cluster := loc.GetLocality().GetZone() // the collector's locality: zone = cluster
				want, ok := c.want[cluster]
				if _, seen := c.got[cluster]; !ok || seen {
					continue
				}
				for _, e := range loc.GetLbEndpoints() {
					if e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress() == want {
						c.got[cluster] = now
						break
					}
				}
			}
		}
		if len(c.got) == len(c.want) && c.done != nil {
			select {
			case <-c.done:
			default:
				close(c.done)
			}
		}
		ack := &discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "fleetsim"}, TypeUrl: r.GetTypeUrl(),
			ResponseNonce: r.GetNonce(), VersionInfo: r.GetVersionInfo(), ResourceNames: []string{c.resource}}
		c.mu.Unlock()
		if err := c.send(ack); err != nil {
			c.fail(err)
			return
		}
	}
}
