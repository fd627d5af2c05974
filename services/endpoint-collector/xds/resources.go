package xds

import (
	"math"
	"net/netip"
	"strconv"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/collector"
)

// ResourceName is the name of a service port's ClusterLoadAssignment, Cluster and
// RouteConfiguration: "<namespace>/<service>:<port>", the port by name, or by number when the
// port has none (a Service with one unnamed port).
func ResourceName(namespace, service, port string) string {
	return namespace + "/" + service + ":" + port
}

// ListenerName is the name of a service port's Listener for proxyless gRPC: the target of
// xds:///<service>.<namespace>:<port>.
func ListenerName(namespace, service, port string) string {
	return service + "." + namespace + ":" + port
}

// The names of a project's service in a namespace projects own (docs/endpoints.md, "Who owns a
// service's endpoints"): the project is part of the service's identity, since another project
// owning a namespace of the same name on other clusters has a service of the same name, with
// other endpoints and weights. "<namespace>/<service>@<project>:<port>", and the listener
// xds:///<service>.<namespace>.<project>:<port> (names are DNS labels: no dots of their own).

// ServiceResourceName is ResourceName of the service ref names.
func ServiceResourceName(ref collector.ServiceRef, port string) string {
	if ref.Project == "" {
		return ResourceName(ref.Namespace, ref.Name, port)
	}
	return ref.Namespace + "/" + ref.Name + "@" + ref.Project + ":" + port
}

// ServiceListenerName is ListenerName of the service ref names.
func ServiceListenerName(ref collector.ServiceRef, port string) string {
	if ref.Project == "" {
		return ListenerName(ref.Namespace, ref.Name, port)
	}
	return ref.Name + "." + ref.Namespace + "." + ref.Project + ":" + port
}

// portKey is how a port is named in resource names.
func portKey(a *endpointv1.Address) string {
	if a.PortName != "" {
		return a.PortName
	}
	return strconv.FormatUint(uint64(a.Port), 10)
}

// servicePort is one port of a service, as xDS resources.
type servicePort struct {
	name string // ResourceName
	port string
	tcp  bool
	cla  *endpointv3.ClusterLoadAssignment
}

// buildAssignments turns a service's endpoints (every endpoint, the collector's ALL filter) into
// one ClusterLoadAssignment per port:
//
//   - each member cluster is a locality: zone = cluster name, sub_zone = the endpoint's zone;
//   - an endpoint's load_balancing_weight is its weight scaled by its cluster's weight (the
//     address weight of the JSON API: endpoint weight × cluster weight / 100);
//   - health: a stale cluster's endpoints are UNHEALTHY; a ready endpoint with weight 0 (its own
//     or its cluster's) is DRAINING, as is a serving, terminating one; ready is HEALTHY; the
//     rest is UNHEALTHY;
//   - a locality's load_balancing_weight is the sum of its HEALTHY endpoints' weights (omitted
//     when 0), so that clients weighting localities (gRPC) split traffic as clients weighting
//     endpoints (Envoy) do.
//
// Ports without a number (headless services) and SCTP ports are skipped: a proxy cannot use them.
func buildAssignments(ref collector.ServiceRef, resp *endpointv1.GetServiceEndpointsResponse) map[string]*servicePort {
	out := map[string]*servicePort{}
	type locKey struct{ port, cluster, zone string }
	locs := map[locKey]*endpointv3.LocalityLbEndpoints{}
	seen := map[string]map[netip.AddrPort]bool{} // per port: gRPC rejects a duplicate address
	for _, c := range resp.GetClusters() {
		for _, a := range c.Addresses {
			if a.Port == 0 || a.Port > math.MaxUint16 || (a.Protocol != "TCP" && a.Protocol != "UDP") {
				continue
			}
			ip, err := netip.ParseAddr(a.Ip)
			if err != nil {
				continue
			}
			pk := portKey(a)
			sp := out[pk]
			if sp == nil {
				name := ServiceResourceName(ref, pk)
				sp = &servicePort{name: name, port: pk, tcp: a.Protocol == "TCP",
					cla: &endpointv3.ClusterLoadAssignment{ClusterName: name}}
				out[pk] = sp
				seen[pk] = map[netip.AddrPort]bool{}
			}
			// The same address in two clusters (overlapping pod networks) is kept once, in the
			// first cluster by name: a proxy could not tell the two apart anyway.
			ap := netip.AddrPortFrom(ip, uint16(a.Port))
			if seen[pk][ap] {
				continue
			}
			seen[pk][ap] = true
			lk := locKey{pk, c.ClusterName, a.Zone}
			loc := locs[lk]
			if loc == nil {
				loc = &endpointv3.LocalityLbEndpoints{Locality: &corev3.Locality{Zone: c.ClusterName, SubZone: a.Zone}}
				locs[lk] = loc
				sp.cla.Endpoints = append(sp.cla.Endpoints, loc)
			}
			proto := corev3.SocketAddress_TCP
			if a.Protocol == "UDP" {
				proto = corev3.SocketAddress_UDP
			}
			loc.LbEndpoints = append(loc.LbEndpoints, &endpointv3.LbEndpoint{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
					Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
						Protocol: proto, Address: a.Ip, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: a.Port}}}},
					Hostname: a.Target,
				}},
				HealthStatus: health(a, c.Stale),
				// The field must be at least 1 when set; a weight of 0 is expressed as DRAINING.
				LoadBalancingWeight: wrapperspb.UInt32(max(a.Weight, 1)),
			})
		}
	}
	for _, sp := range out {
		setLocalityWeights(sp.cla)
	}
	return out
}

func health(a *endpointv1.Address, stale bool) corev3.HealthStatus {
	switch {
	case stale:
		return corev3.HealthStatus_UNHEALTHY
	case a.Ready && a.Weight == 0:
		return corev3.HealthStatus_DRAINING
	case a.Ready:
		return corev3.HealthStatus_HEALTHY
	case a.Serving && a.Terminating:
		return corev3.HealthStatus_DRAINING
	}
	return corev3.HealthStatus_UNHEALTHY
}

// setLocalityWeights sets each locality's weight to the sum of its healthy endpoints' weights,
// first scaling every weight down if a sum could pass what clients accept (uint32).
func setLocalityWeights(cla *endpointv3.ClusterLoadAssignment) {
	sum := func(loc *endpointv3.LocalityLbEndpoints, healthyOnly bool) uint64 {
		var s uint64
		for _, e := range loc.LbEndpoints {
			if !healthyOnly || e.HealthStatus == corev3.HealthStatus_HEALTHY {
				s += uint64(e.LoadBalancingWeight.GetValue())
			}
		}
		return s
	}
	var total uint64
	for _, loc := range cla.Endpoints {
		total += sum(loc, false)
	}
	if total > math.MaxUint32 {
		shift := 0
		for total>>shift > math.MaxUint32/2 {
			shift++
		}
		for _, loc := range cla.Endpoints {
			for _, e := range loc.LbEndpoints {
				e.LoadBalancingWeight = wrapperspb.UInt32(max(e.LoadBalancingWeight.GetValue()>>shift, 1))
			}
		}
	}
	for _, loc := range cla.Endpoints {
		if w := sum(loc, true); w > 0 {
			loc.LoadBalancingWeight = wrapperspb.UInt32(uint32(w))
		}
	}
}

// adsSource is the config source of a resource that comes over the same ADS stream.
func adsSource() *corev3.ConfigSource {
	return &corev3.ConfigSource{ResourceApiVersion: corev3.ApiVersion_V3,
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}}
}

// buildCluster is the CDS Cluster of a service port: type EDS, endpoints by ADS.
func buildCluster(name string) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: adsSource(), ServiceName: name},
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
		ConnectTimeout:       durationpb.New(5 * time.Second),
	}
}

// buildRoute sends every request of the port's listener to its cluster.
func buildRoute(name string) *routev3.RouteConfiguration {
	return &routev3.RouteConfiguration{Name: name, VirtualHosts: []*routev3.VirtualHost{{
		Name: name, Domains: []string{"*"},
		Routes: []*routev3.Route{{
			Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: ""}},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: name}}},
		}},
	}}}
}

// buildListener is the API listener proxyless gRPC resolves xds:///<service>.<namespace>:<port>
// with: an HTTP connection manager whose routes come by RDS.
func buildListener(listenerName, routeName string) (*listenerv3.Listener, error) {
	router, err := anypb.New(&routerv3.Router{})
	if err != nil {
		return nil, err
	}
	hcm, err := anypb.New(&hcmv3.HttpConnectionManager{
		StatPrefix: routeName,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			ConfigSource: adsSource(), RouteConfigName: routeName}},
		HttpFilters: []*hcmv3.HttpFilter{{Name: "envoy.filters.http.router",
			ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}}},
	})
	if err != nil {
		return nil, err
	}
	return &listenerv3.Listener{Name: listenerName, ApiListener: &listenerv3.ApiListener{ApiListener: hcm}}, nil
}

// sameResource reports whether a resource is unchanged, so an unchanged one is not pushed again.
func sameResource(a, b proto.Message) bool { return a != nil && b != nil && proto.Equal(a, b) }
