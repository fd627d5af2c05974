package fleetd_test

import (
	"context"
	"strings"
	"testing"
	"time"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fleetstream/fleetstream/pkg/authz"
)

// roleXDSReader holds the xds-reader role (authz.Config.XDSReaders) and nothing else.
const roleXDSReader = "envoy"

// xdsProcedures are the gRPC procedures of fleetd's xDS listener (--xds-listen): ADS and the
// per-type discovery services, each state of the world, delta, and fetch.
var xdsProcedures = []string{
	"/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
	"/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources",
	"/envoy.service.endpoint.v3.EndpointDiscoveryService/StreamEndpoints",
	"/envoy.service.endpoint.v3.EndpointDiscoveryService/DeltaEndpoints",
	"/envoy.service.endpoint.v3.EndpointDiscoveryService/FetchEndpoints",
	"/envoy.service.cluster.v3.ClusterDiscoveryService/StreamClusters",
	"/envoy.service.cluster.v3.ClusterDiscoveryService/DeltaClusters",
	"/envoy.service.cluster.v3.ClusterDiscoveryService/FetchClusters",
	"/envoy.service.listener.v3.ListenerDiscoveryService/StreamListeners",
	"/envoy.service.listener.v3.ListenerDiscoveryService/DeltaListeners",
	"/envoy.service.listener.v3.ListenerDiscoveryService/FetchListeners",
	"/envoy.service.route.v3.RouteDiscoveryService/StreamRoutes",
	"/envoy.service.route.v3.RouteDiscoveryService/DeltaRoutes",
	"/envoy.service.route.v3.RouteDiscoveryService/FetchRoutes",
}

type tokenCreds string

func (c tokenCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	if c == "" {
		return nil, nil
	}
	return map[string]string{"authorization": "Bearer " + string(c)}, nil
}

func (tokenCreds) RequireTransportSecurity() bool { return false }

// TestXDSAuthorizationMatrix is the matrix's row for the xDS listener: every procedure, every
// caller; only platform admins and xds-readers get through.
func TestXDSAuthorizationMatrix(t *testing.T) {
	api := startTenants(t)
	for _, proc := range xdsProcedures {
		if _, ok := authz.Lookup(proc); !ok {
			t.Errorf("%s has no row in pkg/authz's table", proc)
		}
	}
	for _, caller := range append(append([]string{}, matrixCallers...), roleXDSReader) {
		token := ""
		if caller != roleAnonymous {
			token = "token-" + caller
		}
		cc, err := grpc.NewClient(api.xds, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(tokenCreds(token)))
		if err != nil {
			t.Fatal(err)
		}
		for _, proc := range xdsProcedures {
			code := callXDS(cc, proc)
			name := caller
			if name == "" {
				name = "anonymous"
			}
			switch {
			case caller == roleAnonymous:
				if code != codes.Unauthenticated {
					t.Errorf("%s without a token: %v, want Unauthenticated", proc, code)
				}
			case caller == roleAdmin || caller == roleXDSReader:
				if code == codes.PermissionDenied || code == codes.Unauthenticated {
					t.Errorf("%s as %s: refused (%v)", proc, name, code)
				}
			default:
				if code != codes.PermissionDenied {
					t.Errorf("%s as %s: %v, want PermissionDenied", proc, name, code)
				}
			}
		}
		_ = cc.Close()
	}
}

// callXDS calls proc with an empty request and returns the status code; a stream still open
// after a moment counts as let through (OK).
func callXDS(cc *grpc.ClientConn, proc string) codes.Code {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if strings.Contains(proc, "/Fetch") {
		return status.Code(cc.Invoke(ctx, proc, &discoverygrpc.DiscoveryRequest{}, &discoverygrpc.DiscoveryResponse{}))
	}
	st, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, proc)
	if err != nil {
		return status.Code(err)
	}
	var req, resp any = &discoverygrpc.DiscoveryRequest{}, &discoverygrpc.DiscoveryResponse{}
	if strings.Contains(proc, "/Delta") {
		req, resp = &discoverygrpc.DeltaDiscoveryRequest{}, &discoverygrpc.DeltaDiscoveryResponse{}
	}
	// A refused stream may already be closed when the request goes out (io.EOF): its status
	// comes with the receive.
	_ = st.SendMsg(req)
	err = st.RecvMsg(resp)
	if ctx.Err() != nil {
		return codes.OK
	}
	return status.Code(err)
}
