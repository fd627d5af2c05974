package cli

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1/endpointv1connect"
)

func newEndpointsCommand(f *factory) *cobra.Command {
	cmd := newGroupCommand("endpoints", "Show a service's endpoints across clusters and shift traffic with weights")
	cmd.Aliases = []string{"endpoint", "ep"}
	cmd.AddCommand(
		newEndpointsGetCommand(f),
		newEndpointsListCommand(f),
		newEndpointsWatchCommand(f),
		newEndpointsWeightCommand(f),
		newEndpointsXDSConfigCommand(f),
	)
	return cmd
}

// serviceArg splits NAMESPACE/NAME.
func serviceArg(arg string) (ns, name string, err error) {
	ns, name, ok := strings.Cut(arg, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("service %q: want NAMESPACE/NAME", arg)
	}
	return ns, name, nil
}

// endpointFilter maps --filter to the API's enum.
func endpointFilter(s string) (endpointv1.EndpointFilter, error) {
	switch s {
	case "", "ready":
		return endpointv1.EndpointFilter_ENDPOINT_FILTER_READY, nil
	case "ready-or-terminating":
		return endpointv1.EndpointFilter_ENDPOINT_FILTER_READY_OR_TERMINATING, nil
	case "all":
		return endpointv1.EndpointFilter_ENDPOINT_FILTER_ALL, nil
	}
	return 0, fmt.Errorf("--filter %q: want ready, ready-or-terminating or all", s)
}

type endpointQuery struct {
	filter string
	port   string
}

func (q *endpointQuery) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&q.filter, "filter", "ready", "which endpoints: ready, ready-or-terminating (terminating ones when nothing is ready) or all")
	cmd.Flags().StringVar(&q.port, "port", "", "only this port name of the Service")
}

// parse checks the NAMESPACE/NAME argument and --filter, in that order.
func (q *endpointQuery) parse(arg string) (ns, name string, filter endpointv1.EndpointFilter, err error) {
	if ns, name, err = serviceArg(arg); err != nil {
		return "", "", 0, err
	}
	if filter, err = endpointFilter(q.filter); err != nil {
		return "", "", 0, err
	}
	return ns, name, filter, nil
}

// addressRows flattens clusters into one row per address, each a ClusterEndpoints holding that
// one address, so the table has a CLUSTER column while JSON and YAML keep the API's shape.
func addressRows(clusters []*endpointv1.ClusterEndpoints) []*endpointv1.ClusterEndpoints {
	var rows []*endpointv1.ClusterEndpoints
	for _, c := range clusters {
		for _, a := range c.GetAddresses() {
			rows = append(rows, &endpointv1.ClusterEndpoints{ClusterId: c.GetClusterId(), ClusterName: c.GetClusterName(),
				Weight: c.GetWeight(), Stale: c.GetStale(), Addresses: []*endpointv1.Address{a}})
		}
	}
	return rows
}

func addressColumns() []Column {
	addr := func(c *endpointv1.ClusterEndpoints) *endpointv1.Address { return c.GetAddresses()[0] }
	return []Column{
		Col("CLUSTER", func(c *endpointv1.ClusterEndpoints) string {
			if c.GetStale() {
				return c.GetClusterName() + " (stale)"
			}
			return c.GetClusterName()
		}),
		Col("IP", func(c *endpointv1.ClusterEndpoints) string { return addr(c).GetIp() }),
		Col("PORT", func(c *endpointv1.ClusterEndpoints) string {
			a := addr(c)
			s := strconv.Itoa(int(a.GetPort()))
			if a.GetPortName() != "" {
				s += "/" + a.GetPortName()
			}
			return s
		}),
		Col("WEIGHT", func(c *endpointv1.ClusterEndpoints) string { return strconv.Itoa(int(addr(c).GetWeight())) }),
		Col("STATE", func(c *endpointv1.ClusterEndpoints) string { return endpointState(addr(c)) }),
		Col("ZONE", func(c *endpointv1.ClusterEndpoints) string { return addr(c).GetZone() }),
		Col("NODE", func(c *endpointv1.ClusterEndpoints) string { return addr(c).GetNode() }),
		Col("TARGET", func(c *endpointv1.ClusterEndpoints) string { return addr(c).GetTarget() }),
	}
}

func endpointState(a *endpointv1.Address) string {
	switch {
	case a.GetReady():
		return "Ready"
	case a.GetServing() && a.GetTerminating():
		return "Terminating(serving)"
	case a.GetTerminating():
		return "Terminating"
	}
	return "NotReady"
}

func newEndpointsGetCommand(f *factory) *cobra.Command {
	var q endpointQuery
	cmd := &cobra.Command{
		Use:     "get NAMESPACE/NAME",
		Short:   "Show a service's endpoints in every cluster, with their weights",
		Example: "  fleetctl endpoints get shop/cart\n  fleetctl endpoints get shop/cart --filter all -o json",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, name, filter, err := q.parse(args[0])
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), f, endpointv1connect.NewEndpointServiceClient, endpointv1connect.EndpointServiceClient.GetServiceEndpoints,
				&endpointv1.GetServiceEndpointsRequest{Namespace: ns, Name: name, Filter: filter, PortName: q.port}, "get endpoints of %s", args[0])
			if err != nil {
				return err
			}
			p := f.printer()
			if p.Format != formatTable {
				return p.Print(resp)
			}
			return p.PrintList(Messages(addressRows(resp.GetClusters())), addressColumns()...)
		},
	}
	q.add(cmd)
	return cmd
}

func newEndpointsListCommand(f *factory) *cobra.Command {
	var namespace string
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the services that have endpoints in any cluster",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			resp, err := call(cmd.Context(), f, endpointv1connect.NewEndpointServiceClient, endpointv1connect.EndpointServiceClient.ListServices,
				&endpointv1.ListServicesRequest{Namespace: namespace}, "list services")
			if err != nil {
				return err
			}
			return f.printer().PrintList(Messages(resp.GetServices()),
				Col("NAMESPACE", (*endpointv1.ServiceSummary).GetNamespace),
				Col("NAME", (*endpointv1.ServiceSummary).GetName),
				Col("CLUSTERS", func(s *endpointv1.ServiceSummary) string { return listCell(s.GetClusters()) }),
				Col("READY", func(s *endpointv1.ServiceSummary) string {
					return fmt.Sprintf("%d/%d", s.GetReadyEndpoints(), s.GetTotalEndpoints())
				}),
			)
		},
	}
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", "only services of this namespace")
	return cmd
}

func newEndpointsWatchCommand(f *factory) *cobra.Command {
	var q endpointQuery
	cmd := &cobra.Command{
		Use:   "watch NAMESPACE/NAME",
		Short: "Print a service's endpoints per cluster now and after every change, until interrupted",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, name, filter, err := q.parse(args[0])
			if err != nil {
				return err
			}
			now := time.Now
			out := f.printer().Stream(
				Col("TIME", func(*endpointv1.WatchServiceEndpointsResponse) string { return now().Format(time.TimeOnly) }),
				Col("VERSION", func(m *endpointv1.WatchServiceEndpointsResponse) string {
					return strconv.FormatUint(m.GetVersion(), 10)
				}),
				Col("CLUSTERS", watchClustersCell),
			)
			return watch(cmd.Context(), f, endpointv1connect.NewEndpointServiceClient, endpointv1connect.EndpointServiceClient.WatchServiceEndpoints,
				&endpointv1.WatchServiceEndpointsRequest{Namespace: ns, Name: name, Filter: filter, PortName: q.port}, out,
				"watch endpoints: server closed the stream", "watch endpoints of %s", args[0])
		},
	}
	q.add(cmd)
	return cmd
}

// watchClustersCell summarizes a watch message: "east=10.0.0.1:8080(w100),... west(stale)=...".
func watchClustersCell(m *endpointv1.WatchServiceEndpointsResponse) string {
	if !m.GetExists() {
		return "<no endpoints>"
	}
	var parts []string
	for _, c := range m.GetClusters() {
		name := c.GetClusterName()
		if c.GetStale() {
			name += "(stale)"
		}
		var as []string
		for _, a := range c.GetAddresses() {
			as = append(as, fmt.Sprintf("%s:%d(w%d)", a.GetIp(), a.GetPort(), a.GetWeight()))
		}
		parts = append(parts, name+"="+strings.Join(as, ","))
	}
	return strings.Join(parts, " ")
}

func newEndpointsWeightCommand(f *factory) *cobra.Command {
	var (
		ip      string
		cluster string
		weight  int
		clear   bool
	)
	cmd := &cobra.Command{
		Use:   "weight NAMESPACE/NAME (--ip IP [--cluster NAME] | --cluster NAME) (--weight N | --clear)",
		Short: "Set the weight of one endpoint IP, or of a whole cluster, for a service",
		Long: "Set a weight: 100 is the default, 0 drains. With --ip it applies to that endpoint (the pod\n" +
			"behind the IP now; another pod that later gets the IP starts at 100). With only --cluster\n" +
			"it scales every endpoint of the service in that cluster, in percent.",
		Example: "  fleetctl endpoints weight shop/cart --ip 10.0.0.7 --weight 20\n" +
			"  fleetctl endpoints weight shop/cart --cluster eu-west --weight 0   # drain a cluster\n" +
			"  fleetctl endpoints weight shop/cart --ip 10.0.0.7 --clear",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, name, err := serviceArg(args[0])
			if err != nil {
				return err
			}
			weightSet := cmd.Flags().Changed("weight")
			switch {
			case weightSet == clear:
				return errors.New("give exactly one of --weight and --clear")
			case weightSet && (weight < 0 || weight > 65535):
				return fmt.Errorf("--weight %d: want 0..65535 (100 is the default, 0 drains)", weight)
			case ip == "" && cluster == "":
				return errors.New("give --ip, or --cluster for a cluster weight")
			case ip == "" && clear:
				return errors.New("--clear needs --ip; set a cluster back with --weight 100")
			}
			var weights *endpointv1.ServiceWeights
			if ip != "" {
				resp, err := call(cmd.Context(), f, endpointv1connect.NewEndpointServiceClient, endpointv1connect.EndpointServiceClient.SetEndpointWeight,
					&endpointv1.SetEndpointWeightRequest{Namespace: ns, Name: name, Ip: ip, Cluster: cluster, Weight: uint32(weight), Clear: clear},
					"set weight of %s in %s", ip, args[0])
				if err != nil {
					return err
				}
				weights = resp.GetWeights()
			} else {
				resp, err := call(cmd.Context(), f, endpointv1connect.NewEndpointServiceClient, endpointv1connect.EndpointServiceClient.SetClusterWeight,
					&endpointv1.SetClusterWeightRequest{Namespace: ns, Name: name, Cluster: cluster, Weight: uint32(weight)},
					"set weight of cluster %s for %s", cluster, args[0])
				if err != nil {
					return err
				}
				weights = resp.GetWeights()
			}
			p := f.printer()
			if p.Format != formatTable {
				return p.Print(weights)
			}
			return p.PrintList(weightRows(weights),
				Col("CLUSTER", (*endpointv1.EndpointWeight).GetClusterName),
				Col("IP", func(w *endpointv1.EndpointWeight) string {
					if w.GetIp() == "" {
						return "*"
					}
					return w.GetIp()
				}),
				Col("WEIGHT", func(w *endpointv1.EndpointWeight) string { return strconv.Itoa(int(w.GetWeight())) }),
				Col("POD UID", (*endpointv1.EndpointWeight).GetTargetUid),
			)
		},
	}
	cmd.Flags().StringVar(&ip, "ip", "", "endpoint IP")
	cmd.Flags().StringVar(&cluster, "cluster", "", "cluster name: with --ip, only that cluster's endpoint; alone, the cluster's weight")
	cmd.Flags().IntVar(&weight, "weight", 0, "weight 0..65535 (100 default, 0 drains)")
	cmd.Flags().BoolVar(&clear, "clear", false, "remove the endpoint's weight (back to 100)")
	return cmd
}

// weightRows lists every override of a service: cluster weights as "*" rows, then endpoints.
func weightRows(w *endpointv1.ServiceWeights) []proto.Message {
	var rows []proto.Message
	clusters := make([]string, 0, len(w.GetClusterWeights()))
	for c := range w.GetClusterWeights() {
		clusters = append(clusters, c)
	}
	sort.Strings(clusters)
	for _, c := range clusters {
		rows = append(rows, &endpointv1.EndpointWeight{ClusterName: c, Weight: w.GetClusterWeights()[c]})
	}
	for _, e := range w.GetEndpointWeights() {
		rows = append(rows, e)
	}
	return rows
}
