package cli

import (
	"fmt"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3" // resolves the listener's typed_config
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"            // resolves the xDS cluster's protocol options
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/collector"
	xdsfeed "github.com/fleetstream/fleetstream/services/endpoint-collector/xds"
)

// parseBootstrap reads a printed bootstrap as Envoy does: YAML into envoy.config.bootstrap.v3.
// Bootstrap, strictly (an unknown field fails), then Envoy's own field validation rules.
func parseBootstrap(t *testing.T, out string) *bootstrapv3.Bootstrap {
	t.Helper()
	js, err := yaml.YAMLToJSON([]byte(out))
	if err != nil {
		t.Fatalf("not YAML: %v\n%s", err, out)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		t.Fatalf("not an Envoy bootstrap: %v\n%s", err, out)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("Envoy would reject the bootstrap: %v\n%s", err, out)
	}
	return &b
}

func TestEndpointsXDSConfig(t *testing.T) {
	h := startEndpointHub(t)
	h.run(t, "cluster", "register", "east").ok(t)
	east := h.agent("east", "")
	east.heartbeats(t)
	east.slice(t, "shop", "cart", "cart-abc", &endpointv1.EndpointPort{Name: "http", Port: 8080, Protocol: "TCP"},
		&endpointv1.Endpoint{Addresses: []string{"10.0.0.7"}, Ready: true, Serving: true})
	east.slice(t, "shop", "cart", "cart-grpc", &endpointv1.EndpointPort{Name: "grpc", Port: 9090, Protocol: "TCP"},
		&endpointv1.Endpoint{Addresses: []string{"10.0.0.7"}, Ready: true, Serving: true})

	// The service's ports are looked up; the token is a placeholder. The two slices arrive one
	// after the other: wait until the collector serves both ports.
	var out string
	testkit.Eventually(t, 10*time.Second, func() error {
		r := h.run(t, "endpoints", "xds-config", "shop/cart", "--xds-server", "xds.example:18000")
		out = r.stdout
		if err := errOf(r); err != nil {
			return err
		}
		if !strings.Contains(out, "shop/cart:grpc") || !strings.Contains(out, "shop/cart:http") {
			return fmt.Errorf("not both ports yet:\n%s", out)
		}
		return nil
	})
	b := parseBootstrap(t, out)
	var eds []string
	for _, c := range b.GetStaticResources().GetClusters() {
		if sn := c.GetEdsClusterConfig().GetServiceName(); sn != "" {
			eds = append(eds, sn)
		}
	}
	if got := strings.Join(eds, ","); got != "shop/cart:grpc,shop/cart:http" {
		t.Errorf("EDS clusters %s, want shop/cart:grpc,shop/cart:http", got)
	}
	xds := b.GetStaticResources().GetClusters()[0].GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
	if xds.GetAddress() != "xds.example" || xds.GetPortValue() != 18000 {
		t.Errorf("xDS server %s:%d, want xds.example:18000", xds.GetAddress(), xds.GetPortValue())
	}
	if ls := b.GetStaticResources().GetListeners(); len(ls) != 2 || ls[1].GetAddress().GetSocketAddress().GetPortValue() != 10001 {
		t.Errorf("want listeners on 10000 and 10001, got %v", ls)
	}
	if !strings.Contains(out, "Bearer "+tokenPlaceholder) {
		t.Errorf("no token placeholder in\n%s", out)
	}

	// --include-token embeds fleetctl's token; --port skips the lookup.
	out = h.run(t, "endpoints", "xds-config", "shop/cart", "--port", "http", "--include-token").ok(t).stdout
	b = parseBootstrap(t, out)
	if md := b.GetDynamicResources().GetAdsConfig().GetGrpcServices()[0].GetInitialMetadata()[0]; md.GetValue() != "Bearer "+e2eToken {
		t.Errorf("authorization metadata %q, want fleetctl's token", md.GetValue())
	}
	if !strings.Contains(out, "port_value: 18000") {
		t.Errorf("default xDS port not 18000:\n%s", out)
	}

	// A project's service in a namespace it owns is named as the xDS feed names it.
	out = h.run(t, "endpoints", "xds-config", "shop/cart@team-a", "--port", "http").ok(t).stdout
	b = parseBootstrap(t, out)
	want := xdsfeed.ServiceResourceName(collector.ServiceRef{Namespace: "shop", Name: "cart", Project: "team-a"}, "http")
	if sn := b.GetStaticResources().GetClusters()[1].GetEdsClusterConfig().GetServiceName(); sn != want {
		t.Errorf("EDS cluster %q, want the feed's %q", sn, want)
	}
	if r := h.run(t, "endpoints", "xds-config", "shop/cart@", "--port", "http"); r.code == 0 || !strings.Contains(r.stderr, "NAMESPACE/NAME@PROJECT") {
		t.Errorf("empty project: exit %d, %s", r.code, r.stderr)
	}

	// An unknown service says what to do.
	if r := h.run(t, "endpoints", "xds-config", "shop/nope"); r.code == 0 || !strings.Contains(r.stderr, "--port") {
		t.Errorf("unknown service: exit %d, %s", r.code, r.stderr)
	}
}
