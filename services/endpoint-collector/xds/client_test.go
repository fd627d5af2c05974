package xds

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// tokenCreds sends a bearer token with every call, over plaintext (a test on loopback).
type tokenCreds struct{ token string }

func (c tokenCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	if c.token == "" {
		return nil, nil
	}
	return map[string]string{"authorization": "Bearer " + c.token}, nil
}

func (tokenCreds) RequireTransportSecurity() bool { return false }

func dial(t testing.TB, addr, token string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(tokenCreds{token})}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// adsClient is a minimal state-of-the-world ADS client: it subscribes, ACKs every response and
// keeps the latest resources it was sent, by type and name.
type adsClient struct {
	t      testing.TB
	stream discoverygrpc.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	mu     sync.Mutex
	res    map[string]map[string]*anypb.Any
	subs   map[string][]string
	err    error
	// nackNext makes the client reject the next response of that type.
	nackNext map[string]string
}

func newADSClient(t testing.TB, cc *grpc.ClientConn) *adsClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := &adsClient{t: t, stream: st, res: map[string]map[string]*anypb.Any{}, subs: map[string][]string{}, nackNext: map[string]string{}}
	go c.recv()
	return c
}

func (c *adsClient) subscribe(typeURL string, names ...string) {
	c.mu.Lock()
	c.subs[typeURL] = append(c.subs[typeURL], names...)
	names = c.subs[typeURL]
	c.mu.Unlock()
	if err := c.stream.Send(&discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "test-client"}, TypeUrl: typeURL,
		ResourceNames: names}); err != nil {
		c.t.Fatalf("subscribe: %v", err)
	}
}

func (c *adsClient) recv() {
	for {
		r, err := c.stream.Recv()
		if err != nil {
			c.mu.Lock()
			c.err = err
			c.mu.Unlock()
			return
		}
		c.mu.Lock()
		ack := &discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "test-client"}, TypeUrl: r.TypeUrl,
			ResponseNonce: r.Nonce, ResourceNames: c.subs[r.TypeUrl], VersionInfo: r.VersionInfo}
		if reason, ok := c.nackNext[r.TypeUrl]; ok {
			delete(c.nackNext, r.TypeUrl)
			ack.VersionInfo = "" // the version still in use: none
			ack.ErrorDetail = &statuspb.Status{Code: 3, Message: reason}
		} else {
			m := c.res[r.TypeUrl]
			if m == nil {
				m = map[string]*anypb.Any{}
				c.res[r.TypeUrl] = m
			}
			for _, a := range r.Resources {
				m[nameOf(c.t, a)] = a
			}
		}
		c.mu.Unlock()
		if err := c.stream.Send(ack); err != nil {
			return
		}
	}
}

func (c *adsClient) get(typeURL, name string) (*anypb.Any, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return nil, c.err
	}
	return c.res[typeURL][name], nil
}

func nameOf(t testing.TB, a *anypb.Any) string {
	m, err := a.UnmarshalNew()
	if err != nil {
		t.Errorf("unmarshal %s: %v", a.TypeUrl, err)
		return ""
	}
	return resourceNameOf(m)
}

func resourceNameOf(m proto.Message) string {
	if cla, ok := m.(*endpointv3.ClusterLoadAssignment); ok {
		return cla.ClusterName
	}
	f := m.ProtoReflect().Descriptor().Fields().ByName("name")
	return m.ProtoReflect().Get(f).String()
}

// render shows an assignment compactly: "east/a@200[10.0.0.1:9000 w100 HEALTHY ...] ...",
// localities sorted by cluster and zone (the weight after @ is the locality's; none when unset).
func render(cla *endpointv3.ClusterLoadAssignment) string {
	var locs []string
	for _, l := range cla.Endpoints {
		s := l.Locality.GetZone() + "/" + l.Locality.GetSubZone()
		if l.LoadBalancingWeight != nil {
			s += fmt.Sprintf("@%d", l.LoadBalancingWeight.GetValue())
		}
		var eps []string
		for _, e := range l.LbEndpoints {
			sa := e.GetEndpoint().GetAddress().GetSocketAddress()
			eps = append(eps, fmt.Sprintf("%s:%d w%d %s", sa.GetAddress(), sa.GetPortValue(), e.GetLoadBalancingWeight().GetValue(), e.HealthStatus))
		}
		sort.Strings(eps)
		locs = append(locs, s+"["+strings.Join(eps, ", ")+"]")
	}
	slices.Sort(locs)
	if len(locs) == 0 {
		return "<empty>"
	}
	return strings.Join(locs, " ")
}

func (c *adsClient) assignment(name string) (string, error) {
	a, err := c.get(resourcev3.EndpointType, name)
	if err != nil || a == nil {
		return "<none>", err
	}
	var cla endpointv3.ClusterLoadAssignment
	if err := a.UnmarshalTo(&cla); err != nil {
		return "", err
	}
	return render(&cla), nil
}
