package cli

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1/endpointv1connect"
)

// defaultXDSPort is the port of fleetd's xDS listener (--xds-listen 127.0.0.1:18000).
const defaultXDSPort = "18000"

// tokenPlaceholder stands for the token in a printed bootstrap unless --include-token is given.
const tokenPlaceholder = "REPLACE-WITH-THE-TOKEN-OF-AN-XDS-READER"

func newEndpointsXDSConfigCommand(f *factory) *cobra.Command {
	var (
		xdsServer    string
		ports        []string
		listenPort   int
		includeToken bool
		nodeID       string
	)
	cmd := &cobra.Command{
		Use:   "xds-config NAMESPACE/NAME[@PROJECT]",
		Short: "Print an Envoy bootstrap that load-balances a service across clusters with Fleetstream's xDS feed",
		Long: "Print an Envoy bootstrap (YAML): a static cluster pointing at Fleetstream's xDS server\n" +
			"(ADS over gRPC, authenticated with a bearer token), one EDS cluster per port of the\n" +
			"service fed by it, and a TCP listener per port on 127.0.0.1 forwarding to it. The token is\n" +
			"a placeholder unless --include-token embeds fleetctl's own (it must be a platform admin's\n" +
			"or an xds-reader's). Without --port the service's ports are looked up. In a namespace a\n" +
			"project owns, the service is that project's: name it NAMESPACE/NAME@PROJECT, as the xDS\n" +
			"feed does (docs/endpoints.md, \"Who owns a service's endpoints\").",
		Example: "  fleetctl endpoints xds-config shop/cart --include-token > envoy.yaml && envoy -c envoy.yaml\n" +
			"  fleetctl endpoints xds-config shop/cart --port http --xds-server xds.fleet.example:18000",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			svc, project, _ := strings.Cut(args[0], "@")
			ns, name, err := serviceArg(svc)
			if err != nil {
				return err
			}
			if strings.Contains(args[0], "@") && project == "" {
				return fmt.Errorf("service %q: want NAMESPACE/NAME@PROJECT", args[0])
			}
			if listenPort < 1 || listenPort > 65535 {
				return fmt.Errorf("--listen-port %d: want 1..65535", listenPort)
			}
			if xdsServer == "" {
				if xdsServer, err = f.defaultXDSServer(); err != nil {
					return err
				}
			}
			host, port, err := net.SplitHostPort(xdsServer)
			if err != nil {
				return fmt.Errorf("--xds-server %q: want host:port: %w", xdsServer, err)
			}
			if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
				return fmt.Errorf("--xds-server %q: port %q is not a port number", xdsServer, port)
			}
			token := tokenPlaceholder
			if includeToken {
				if token, err = f.bearerToken(); err != nil {
					return err
				}
				if token == "" {
					return errors.New("--include-token: fleetctl has no token (--token, --token-file, " + envToken + ")")
				}
			}
			if len(ports) == 0 {
				if ports, err = f.servicePorts(cmd, ns, name); err != nil {
					return err
				}
			}
			if listenPort+len(ports)-1 > 65535 {
				return fmt.Errorf("--listen-port %d: no room for %d listeners", listenPort, len(ports))
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), envoyBootstrap(bootstrapParams{namespace: ns, name: name, project: project, ports: ports,
				xdsHost: host, xdsPort: port, token: token, listenPort: listenPort, nodeID: nodeID}))
			return err
		},
	}
	cmd.Flags().StringVar(&xdsServer, "xds-server", "", "host:port of the xDS server (default: the --server host, port "+defaultXDSPort+")")
	cmd.Flags().StringSliceVar(&ports, "port", nil, "port names (or numbers, for an unnamed port) of the service; default: all its ports")
	cmd.Flags().IntVar(&listenPort, "listen-port", 10000, "local port of Envoy's listener for the first port (the next ports count up)")
	cmd.Flags().BoolVar(&includeToken, "include-token", false, "embed fleetctl's bearer token instead of a placeholder (keep the file private)")
	cmd.Flags().StringVar(&nodeID, "node-id", "envoy-fleetstream", "Envoy's node id (the xDS server logs it with every NACK)")
	return cmd
}

// defaultXDSServer is the API server's host with fleetd's xDS port.
func (f *factory) defaultXDSServer() (string, error) {
	raw, err := f.serverURL()
	if err != nil {
		return "", err
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("--server %q: %w", raw, err)
	}
	return net.JoinHostPort(u.Hostname(), defaultXDSPort), nil
}

// servicePorts asks the API for the ports of ns/name, as xDS resource names spell them.
func (f *factory) servicePorts(cmd *cobra.Command, ns, name string) ([]string, error) {
	resp, err := call(cmd.Context(), f, endpointv1connect.NewEndpointServiceClient, endpointv1connect.EndpointServiceClient.GetServiceEndpoints,
		&endpointv1.GetServiceEndpointsRequest{Namespace: ns, Name: name, Filter: endpointv1.EndpointFilter_ENDPOINT_FILTER_ALL},
		"look up the ports of %s/%s (or give --port)", ns, name)
	if connect.CodeOf(err) == connect.CodeNotFound {
		return nil, fmt.Errorf("%s/%s has no endpoints in any cluster: give --port to print a bootstrap anyway", ns, name)
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, c := range resp.GetClusters() {
		for _, a := range c.GetAddresses() {
			if a.GetPort() == 0 || a.GetProtocol() != "TCP" {
				continue // what xDS serves no Cluster for
			}
			p := a.GetPortName()
			if p == "" {
				p = strconv.Itoa(int(a.GetPort()))
			}
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s/%s has no TCP port with endpoints", ns, name)
	}
	slices.Sort(out)
	return out, nil
}

type bootstrapParams struct {
	namespace, name string
	project         string // the owning project's, "" in a namespace no project owns
	ports           []string
	xdsHost         string
	xdsPort         string
	token           string
	listenPort      int
	nodeID          string
}

// envoyBootstrap renders the bootstrap. Clusters are static EDS clusters named as the xDS
// server names them ("<namespace>/<service>:<port>"), so Envoy subscribes to exactly those
// ClusterLoadAssignments over ADS; no CDS or LDS is asked for.
// resourceName is the xDS feed's name of one port of the service (services/endpoint-collector/xds,
// ServiceResourceName): a project's service carries the project.
func (p bootstrapParams) resourceName(port string) string {
	if p.project == "" {
		return p.namespace + "/" + p.name + ":" + port
	}
	return p.namespace + "/" + p.name + "@" + p.project + ":" + port
}

func envoyBootstrap(p bootstrapParams) string {
	q := strconv.Quote
	var b strings.Builder
	fmt.Fprintf(&b, `# Envoy bootstrap for %s/%s from fleetctl endpoints xds-config.
# Endpoints come from Fleetstream's xDS server: one locality per member cluster (zone = cluster,
# sub_zone = the endpoint's zone), endpoint weights = endpoint weight x cluster weight,
# drained endpoints DRAINING, a stale cluster's endpoints UNHEALTHY.
node:
  id: %s
  cluster: fleetstream-envoy
dynamic_resources:
  ads_config:
    api_type: GRPC
    transport_api_version: V3
    grpc_services:
    - envoy_grpc:
        cluster_name: fleetstream_xds
      initial_metadata:
      - key: authorization
        value: %s
static_resources:
  clusters:
  - name: fleetstream_xds
    type: STRICT_DNS
    connect_timeout: 5s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options: {}
    load_assignment:
      cluster_name: fleetstream_xds
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address:
                address: %s
                port_value: %s
`, p.namespace, p.name, q(p.nodeID), q("Bearer "+p.token), q(p.xdsHost), p.xdsPort)
	for _, port := range p.ports {
		name := p.resourceName(port)
		fmt.Fprintf(&b, `  - name: %s
    type: EDS
    connect_timeout: 2s
    lb_policy: ROUND_ROBIN
    eds_cluster_config:
      service_name: %s
      eds_config:
        ads: {}
        resource_api_version: V3
`, q(name), q(name))
	}
	b.WriteString("  listeners:\n")
	for i, port := range p.ports {
		name := p.resourceName(port)
		fmt.Fprintf(&b, `  - name: %s
    address:
      socket_address:
        address: 127.0.0.1
        port_value: %d
    filter_chains:
    - filters:
      - name: envoy.filters.network.tcp_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: %s
          cluster: %s
`, q(name), p.listenPort+i, q(strings.NewReplacer("/", "_", ":", "_", "@", "_").Replace(name)), q(name))
	}
	return b.String()
}
