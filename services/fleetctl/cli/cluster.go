package cli

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
)

func newClusterCommand(f *factory) *cobra.Command {
	cmd := newGroupCommand("cluster", "Register, inspect and update member clusters")
	cmd.Aliases = []string{"clusters"}
	cmd.AddCommand(
		newClusterRegisterCommand(f),
		newClusterListCommand(f),
		newClusterGetCommand(f),
		newClusterUpdateCommand(f),
		newClusterDeregisterCommand(f),
		newClusterWatchCommand(f),
	)
	return cmd
}

// clusterFlags are the mutable fields of a cluster, shared by register and update.
type clusterFlags struct {
	labels     []string
	claims     []string
	taints     []string
	kubeconfig string
}

func (c *clusterFlags) add(cmd *cobra.Command, verb string) {
	fl := cmd.Flags()
	// StringArray rather than StringSlice: a slice flag parses its value as CSV, mangling
	// quotes, and one pair per flag keeps parse errors pointing at exactly what was typed.
	fl.StringArrayVar(&c.labels, "label", nil, "label key=value (repeatable)"+verb)
	fl.StringArrayVar(&c.claims, "claim", nil, "claim key=value, a fact used by placement (repeatable)"+verb)
	fl.StringArrayVar(&c.taints, "taint", nil, "taint key[=value]:Effect, Effect one of "+strings.Join(taintEffectNames(), ", ")+" (repeatable)"+verb)
	fl.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file the hub uses to reach the cluster, - for stdin")
}

// credentials reads --kubeconfig into write-only connection credentials.
func (c *clusterFlags) credentials(f *factory) (*clusterv1.ConnectionCredentials, error) {
	data, err := readFileOrStdin(c.kubeconfig, f.streams.In)
	if err != nil {
		return nil, fmt.Errorf("read kubeconfig: %w", err)
	}
	if len(data) == 0 {
		return nil, fmt.Errorf("kubeconfig %s is empty", c.kubeconfig)
	}
	return &clusterv1.ConnectionCredentials{Kubeconfig: data}, nil
}

func newClusterRegisterCommand(f *factory) *cobra.Command {
	var flags clusterFlags
	cmd := &cobra.Command{
		Use:   "register NAME",
		Short: "Register a cluster and print its agent token",
		Long: "Register a cluster. The response holds the token the cluster's agent connects with;\n" +
			"it is stored hashed by the server and printed here only once.",
		Example: "  fleetctl cluster register prod-eu-1 --label env=prod --claim region=eu-west-1 \\\n" +
			"    --taint maintenance=true:NoSelectIfNew --kubeconfig ./prod-eu-1.kubeconfig",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &clusterv1.RegisterClusterRequest{Name: args[0]}
			var err error
			if req.Labels, err = parseKeyValues("label", flags.labels); err != nil {
				return err
			}
			if req.Claims, err = parseKeyValues("claim", flags.claims); err != nil {
				return err
			}
			if req.Taints, err = parseTaints(flags.taints); err != nil {
				return err
			}
			if flags.kubeconfig != "" {
				if req.Credentials, err = flags.credentials(f); err != nil {
					return err
				}
			}
			resp, err := call(cmd.Context(), f, clusterv1connect.NewClusterServiceClient, clusterv1connect.ClusterServiceClient.RegisterCluster,
				req, "register cluster %q", req.Name)
			if err != nil {
				return err
			}
			return printRegistered(f.printer(), resp)
		},
	}
	flags.add(cmd, "")
	return cmd
}

// printRegistered prints the new cluster and its agent token. With JSON or YAML the token is
// part of the printed response so scripts can capture it; the warning goes to stderr.
func printRegistered(p *Printer, resp *clusterv1.RegisterClusterResponse) error {
	const warning = "The agent token is shown only this once and cannot be retrieved later; store it now."
	if p.Format != formatTable {
		if err := p.Print(resp); err != nil {
			return err
		}
		p.Note("%s", warning)
		return nil
	}
	if err := p.Print(resp.GetCluster(), clusterColumns(time.Now)...); err != nil {
		return err
	}
	p.Note("\nAgent token: %s\n%s", resp.GetAgentToken(), warning)
	return nil
}

func newClusterListCommand(f *factory) *cobra.Command {
	var selector string
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List clusters",
		Example: "  fleetctl cluster list -l 'env=prod,tier!=edge'",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			clusters, err := allClusters(cmd.Context(), f, &clusterv1.ListClustersRequest{LabelSelector: selector})
			if err != nil {
				return err
			}
			// Sorted here so the order does not depend on the server's storage.
			sort.Slice(clusters, func(i, j int) bool { return clusters[i].GetName() < clusters[j].GetName() })
			return f.printer().PrintList(Messages(clusters), clusterColumns(time.Now)...)
		},
	}
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "label selector, Kubernetes syntax (env=prod,tier!=edge)")
	return cmd
}

func newClusterGetCommand(f *factory) *cobra.Command {
	var inventory bool
	cmd := &cobra.Command{
		Use:   "get NAME",
		Short: "Show one cluster",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := call(cmd.Context(), f, clusterv1connect.NewClusterServiceClient, clusterv1connect.ClusterServiceClient.GetCluster,
				&clusterv1.GetClusterRequest{Name: args[0], IncludeInventory: inventory}, "get cluster %q", args[0])
			if err != nil {
				return err
			}
			p := f.printer()
			if !inventory {
				return p.Print(resp.GetCluster(), clusterColumns(time.Now)...)
			}
			if p.Format != formatTable {
				return p.Print(resp)
			}
			if err := p.Print(resp.GetCluster(), clusterColumns(time.Now)...); err != nil {
				return err
			}
			if len(resp.GetInventory().GetNamespaces()) == 0 {
				p.Note("\nNo namespace inventory reported by the cluster's agent yet.")
				return nil
			}
			p.Note("")
			return p.PrintList(Messages(resp.GetInventory().GetNamespaces()), inventoryColumns()...)
		},
	}
	cmd.Flags().BoolVar(&inventory, "inventory", false, "also show the namespaces the cluster's agent last reported")
	return cmd
}

func newClusterUpdateCommand(f *factory) *cobra.Command {
	var (
		flags    clusterFlags
		revision uint64
	)
	cmd := &cobra.Command{
		Use:   "update NAME",
		Short: "Replace a cluster's labels, claims, taints or credentials",
		Long: "Replace the fields whose flags are given; the others are left alone. A given flag\n" +
			"replaces the whole field: --label env=prod leaves env=prod as the only label.\n" +
			"Pass the flag once with an empty value (--taint=) to clear the field.",
		Example: "  fleetctl cluster update prod-eu-1 --label env=prod --label tier=gold\n" +
			"  fleetctl cluster update prod-eu-1 --taint=",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := buildUpdateRequest(cmd, f, &flags, args[0])
			if err != nil {
				return err
			}
			req.ExpectedRevision = revision
			resp, err := call(cmd.Context(), f, clusterv1connect.NewClusterServiceClient, clusterv1connect.ClusterServiceClient.UpdateCluster,
				req, "update cluster %q", req.Name)
			if err != nil {
				return err
			}
			return f.printer().Print(resp.GetCluster(), clusterColumns(time.Now)...)
		},
	}
	flags.add(cmd, "; replaces all")
	cmd.Flags().Uint64Var(&revision, "expected-revision", 0, "apply only if the cluster's revision still equals this (0: unconditionally)")
	return cmd
}

// buildUpdateRequest fills the fields whose flags were given and names exactly those in
// update_mask, so an update never resets a field the user did not mention.
func buildUpdateRequest(cmd *cobra.Command, f *factory, flags *clusterFlags, name string) (*clusterv1.UpdateClusterRequest, error) {
	req := &clusterv1.UpdateClusterRequest{Name: name}
	var paths []string
	var err error
	if cmd.Flags().Changed("label") {
		if req.Labels, err = parseKeyValues("label", clearable(flags.labels)); err != nil {
			return nil, err
		}
		paths = append(paths, "labels")
	}
	if cmd.Flags().Changed("claim") {
		if req.Claims, err = parseKeyValues("claim", clearable(flags.claims)); err != nil {
			return nil, err
		}
		paths = append(paths, "claims")
	}
	if cmd.Flags().Changed("taint") {
		if req.Taints, err = parseTaints(clearable(flags.taints)); err != nil {
			return nil, err
		}
		paths = append(paths, "taints")
	}
	if cmd.Flags().Changed("kubeconfig") {
		if req.Credentials, err = flags.credentials(f); err != nil {
			return nil, err
		}
		paths = append(paths, "credentials")
	}
	if len(paths) == 0 {
		return nil, errors.New("nothing to update: give at least one of --label, --claim, --taint, --kubeconfig")
	}
	req.UpdateMask = &fieldmaskpb.FieldMask{Paths: paths}
	return req, nil
}

// clearable maps the single empty value of `--label=` to no values, which with the field named
// in the mask clears it.
func clearable(values []string) []string {
	if len(values) == 1 && values[0] == "" {
		return nil
	}
	return values
}

func newClusterDeregisterCommand(f *factory) *cobra.Command {
	var revision uint64
	cmd := &cobra.Command{
		Use:   "deregister NAME",
		Short: "Remove a cluster from the fleet",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := call(cmd.Context(), f, clusterv1connect.NewClusterServiceClient, clusterv1connect.ClusterServiceClient.DeregisterCluster,
				&clusterv1.DeregisterClusterRequest{Name: args[0], ExpectedRevision: revision}, "deregister cluster %q", args[0])
			if err != nil {
				return err
			}
			return f.printer().PrintOrNote(resp, "cluster %q deregistered", args[0])
		},
	}
	cmd.Flags().Uint64Var(&revision, "expected-revision", 0, "deregister only if the cluster's revision still equals this (0: unconditionally)")
	return cmd
}

func newClusterWatchCommand(f *factory) *cobra.Command {
	var selector string
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "Print the clusters, then every change, until interrupted",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cols := append([]Column{Col("EVENT", func(e *clusterv1.WatchClustersResponse) string {
				return strings.TrimPrefix(e.GetType().String(), "EVENT_TYPE_")
			})}, ColumnsOf(func(e *clusterv1.WatchClustersResponse) *clusterv1.Cluster { return e.GetCluster() }, clusterColumns(time.Now)...)...)
			return watch(cmd.Context(), f, clusterv1connect.NewClusterServiceClient, clusterv1connect.ClusterServiceClient.WatchClusters,
				&clusterv1.WatchClustersRequest{LabelSelector: selector}, f.printer().Stream(cols...),
				"watch clusters: server closed the stream", "watch clusters")
		},
	}
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "label selector, Kubernetes syntax (env=prod,tier!=edge)")
	return cmd
}

// clusterColumns are the table columns of a cluster. now is read per row so that ages stay
// right during a long watch.
func clusterColumns(now func() time.Time) []Column {
	return []Column{
		Col("NAME", (*clusterv1.Cluster).GetName),
		Col("ID", (*clusterv1.Cluster).GetId),
		Col("LABELS", func(c *clusterv1.Cluster) string { return joinMap(c.GetLabels()) }),
		Col("CONNECTED", clusterConnected),
		Col("AGENT", clusterAgent),
		Col("K8S", func(c *clusterv1.Cluster) string { return c.GetStatus().GetKubernetesVersion() }),
		Col("LAST SEEN", func(c *clusterv1.Cluster) string {
			if c.GetStatus().GetLastSeen() == nil {
				return "never"
			}
			return age(now(), c.GetStatus().GetLastSeen().AsTime())
		}),
		Col("TAINTS", clusterTaints),
	}
}

// clusterConnected reports the AgentConnected condition: True, False or Unknown.
func clusterConnected(c *clusterv1.Cluster) string {
	for _, cond := range c.GetStatus().GetConditions() {
		if cond.GetType() != "AgentConnected" {
			continue
		}
		switch cond.GetStatus() {
		case clusterv1.ConditionStatus_CONDITION_STATUS_TRUE:
			return "True"
		case clusterv1.ConditionStatus_CONDITION_STATUS_FALSE:
			return "False"
		}
	}
	return "Unknown"
}

// clusterAgent says where the connected agent runs: "in-cluster", or "hosted" when the hub runs
// it (cluster-agent --hosted, for imported clusters); empty while none is connected.
func clusterAgent(c *clusterv1.Cluster) string {
	switch {
	case clusterConnected(c) != "True":
		return ""
	case c.GetStatus().GetAgentHosted():
		return "hosted"
	}
	return "in-cluster"
}

// clusterTaints lists taint keys while they fit a table cell, and a count beyond that.
func clusterTaints(c *clusterv1.Cluster) string {
	const maxKeys = 3
	taints := c.GetTaints()
	switch {
	case len(taints) == 0:
		return "<none>"
	case len(taints) > maxKeys:
		return fmt.Sprintf("%d taints", len(taints))
	}
	keys := make([]string, len(taints))
	for i, t := range taints {
		keys[i] = t.GetKey()
	}
	return strings.Join(keys, ",")
}

func inventoryColumns() []Column {
	return []Column{
		Col("NAMESPACE", (*clusterv1.InventoryNamespace).GetName),
		Col("PHASE", (*clusterv1.InventoryNamespace).GetPhase),
		Col("LABELS", func(n *clusterv1.InventoryNamespace) string { return joinMap(n.GetLabels()) }),
	}
}

// joinMap renders k=v pairs sorted by key, or <none>.
func joinMap(m map[string]string) string {
	if len(m) == 0 {
		return "<none>"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = k + "=" + m[k]
	}
	return strings.Join(keys, ",")
}
