package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
)

func newNamespaceCommand(f *factory) *cobra.Command {
	cmd := newGroupCommand("namespace", "Bind namespaces of member clusters to projects, set their quotas, list idle ones")
	cmd.Aliases = []string{"namespaces", "ns"}
	cmd.AddCommand(
		newNamespaceBindCommand(f),
		newNamespaceQuotaCommand(f),
		newNamespaceUnbindCommand(f),
		newNamespaceListCommand(f),
		newNamespaceIdleCommand(f),
	)
	return cmd
}

// target is the (project, cluster) a namespace command acts in.
type target struct {
	project, cluster string
}

func (t *target) add(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&t.project, "project", "p", "", "project owning the namespace (required)")
	cmd.Flags().StringVarP(&t.cluster, "cluster", "c", "", "member cluster of the namespace (required)")
	_ = cmd.MarkFlagRequired("project")
	_ = cmd.MarkFlagRequired("cluster")
}

// placementTarget is a target that may be a placement instead of one cluster (bind, unbind).
type placementTarget struct {
	target
	placement string
}

func (t *placementTarget) add(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&t.project, "project", "p", "", "project owning the namespace (required)")
	cmd.Flags().StringVarP(&t.cluster, "cluster", "c", "", "member cluster of the namespace (this or --placement)")
	cmd.Flags().StringVar(&t.placement, "placement", "", "placement of the project whose clusters the namespace follows (this or --cluster)")
	_ = cmd.MarkFlagRequired("project")
	cmd.MarkFlagsOneRequired("cluster", "placement")
	cmd.MarkFlagsMutuallyExclusive("cluster", "placement")
}

// where names the target in error messages.
func (t *placementTarget) where() string {
	if t.placement != "" {
		return fmt.Sprintf("placement %q", t.placement)
	}
	return fmt.Sprintf("cluster %q", t.cluster)
}

func newNamespaceBindCommand(f *factory) *cobra.Command {
	var (
		t            placementTarget
		hard         []string
		unbindPolicy string
	)
	cmd := &cobra.Command{
		Use:   "bind NAMESPACE",
		Short: "Give a namespace of a cluster, or of every cluster a placement decides, to a project",
		Long: "Give a namespace of a cluster to a project. The cluster's agent creates it with the\n" +
			"project's label, or adopts an existing namespace that has no project label, and\n" +
			"applies a ResourceQuota with the --hard limits. A namespace belongs to one project.\n\n" +
			"With --placement instead of --cluster the namespace follows the project's placement: it\n" +
			"is bound on every cluster the placement decides, now and as the decision changes, and\n" +
			"released from a cluster that leaves the decision by --unbind-policy (keep or delete).",
		Example: "  fleetctl namespace bind web --project team-a --cluster c1 --hard cpu=2 --hard memory=4Gi\n" +
			"  fleetctl namespace bind web --project team-a --placement eu-3 --unbind-policy delete",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			limits, err := parseKeyValues("hard", hard)
			if err != nil {
				return err
			}
			req := &projectv1.BindNamespaceRequest{Project: t.project, Cluster: t.cluster, Placement: t.placement, Namespace: args[0], Hard: limits}
			if cmd.Flags().Changed("unbind-policy") {
				if t.placement == "" {
					return errors.New("--unbind-policy applies only with --placement; unbind a cluster's namespace with namespace unbind --policy")
				}
				if req.UnbindPolicy, err = parseUnbindPolicy(unbindPolicy); err != nil {
					return fmt.Errorf("--unbind-policy: %w", err)
				}
			}
			resp, err := call(cmd.Context(), f, projectv1connect.NewProjectServiceClient, projectv1connect.ProjectServiceClient.BindNamespace,
				req, "bind namespace %q of %s", args[0], t.where())
			if err != nil {
				return err
			}
			p := f.printer()
			if t.placement == "" {
				return p.Print(resp.GetBinding(), bindingColumns()...)
			}
			if p.Format != formatTable {
				return p.Print(resp)
			}
			if bs := resp.GetPlacementBindings(); len(bs) > 0 {
				if err := writeTable(p.Out, Messages(bs), bindingColumns()); err != nil {
					return err
				}
			}
			p.Note("namespace %q follows placement %q: it is bound on each cluster the placement decides (namespace list -p %s shows them)", args[0], t.placement, t.project)
			return nil
		},
	}
	t.add(cmd)
	cmd.Flags().StringArrayVar(&hard, "hard", nil, "quota limit resource=quantity, e.g. cpu=2, memory=4Gi, pods=20 (repeatable)")
	cmd.Flags().StringVar(&unbindPolicy, "unbind-policy", "keep", "with --placement: what happens to the namespace on a cluster that leaves the decision: keep or delete")
	return cmd
}

func newNamespaceQuotaCommand(f *factory) *cobra.Command {
	var (
		t    target
		hard []string
	)
	cmd := &cobra.Command{
		Use:   "quota NAMESPACE",
		Short: "Replace the quota limits of a bound namespace",
		Long: "Replace the quota limits of a bound namespace: the given --hard flags become the\n" +
			"whole set. Pass --hard= once to remove the quota.",
		Example: "  fleetctl namespace quota web --project team-a --cluster c1 --hard cpu=4 --hard memory=8Gi",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("hard") {
				return errors.New("give the new limits with --hard (or --hard= to remove the quota)")
			}
			limits, err := parseKeyValues("hard", clearable(hard))
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), f, projectv1connect.NewProjectServiceClient, projectv1connect.ProjectServiceClient.UpdateQuota,
				&projectv1.UpdateQuotaRequest{Project: t.project, Cluster: t.cluster, Namespace: args[0], Hard: limits}, "update quota of namespace %q of cluster %q", args[0], t.cluster)
			if err != nil {
				return err
			}
			return f.printer().Print(resp.GetBinding(), bindingColumns()...)
		},
	}
	t.add(cmd)
	cmd.Flags().StringArrayVar(&hard, "hard", nil, "quota limit resource=quantity (repeatable); replaces all")
	return cmd
}

func newNamespaceUnbindCommand(f *factory) *cobra.Command {
	var (
		t      placementTarget
		policy string
	)
	cmd := &cobra.Command{
		Use:   "unbind NAMESPACE",
		Short: "Release a namespace from its project, on one cluster or on every cluster of a placement",
		Long: "Release a namespace from its project. The project's quota is removed; the namespace\n" +
			"and its workloads stay on the cluster unless --policy delete. With --placement the\n" +
			"namespace stops following the placement and is released so on every cluster of it.",
		Example: "  fleetctl namespace unbind web --project team-a --cluster c1 --policy delete\n" +
			"  fleetctl namespace unbind web --project team-a --placement eu-3",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pol, err := parseUnbindPolicy(policy)
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), f, projectv1connect.NewProjectServiceClient, projectv1connect.ProjectServiceClient.UnbindNamespace,
				&projectv1.UnbindNamespaceRequest{Project: t.project, Cluster: t.cluster, Placement: t.placement, Namespace: args[0], Policy: pol}, "unbind namespace %q of %s", args[0], t.where())
			if err != nil {
				return err
			}
			p := f.printer()
			if t.placement != "" && resp.GetBinding() == nil {
				return p.PrintOrNote(resp, "namespace %q no longer follows placement %q", args[0], t.placement)
			}
			return p.Print(resp.GetBinding(), bindingColumns()...)
		},
	}
	t.add(cmd)
	cmd.Flags().StringVar(&policy, "policy", "keep", "what happens to the namespace on the cluster: keep or delete")
	return cmd
}

func newNamespaceListCommand(f *factory) *cobra.Command {
	var t target
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List namespace bindings of a project, of a cluster, or all",
		Example: "  fleetctl namespace list --project team-a\n  fleetctl namespace list --cluster c1",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bindings, err := allNamespaceBindings(cmd.Context(), f, &projectv1.ListNamespaceBindingsRequest{Project: t.project, Cluster: t.cluster})
			if err != nil {
				return err
			}
			return f.printer().PrintList(Messages(bindings), bindingColumns()...)
		},
	}
	cmd.Flags().StringVarP(&t.project, "project", "p", "", "only this project's bindings")
	cmd.Flags().StringVarP(&t.cluster, "cluster", "c", "", "only this cluster's bindings")
	return cmd
}

func newNamespaceIdleCommand(f *factory) *cobra.Command {
	return &cobra.Command{
		Use:   "idle CLUSTER",
		Short: "List a cluster's namespaces that belong to no project",
		Long: "List the namespaces a cluster's agent reports that belong to no project. Importing a\n" +
			"cluster that is already in use assigns none of its namespaces; bind them explicitly.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := call(cmd.Context(), f, projectv1connect.NewProjectServiceClient, projectv1connect.ProjectServiceClient.ListIdleNamespaces,
				&projectv1.ListIdleNamespacesRequest{Cluster: args[0]}, "list idle namespaces of cluster %q", args[0])
			if err != nil {
				return err
			}
			return f.printer().PrintList(Messages(resp.GetNamespaces()),
				Col("CLUSTER", (*projectv1.IdleNamespace).GetCluster),
				Col("NAMESPACE", (*projectv1.IdleNamespace).GetName),
				Col("PHASE", (*projectv1.IdleNamespace).GetPhase),
				Col("LABELS", func(n *projectv1.IdleNamespace) string { return joinMap(n.GetLabels()) }),
			)
		},
	}
}

func bindingColumns() []Column {
	return []Column{
		Col("PROJECT", (*projectv1.NamespaceBinding).GetProject),
		Col("CLUSTER", (*projectv1.NamespaceBinding).GetCluster),
		Col("NAMESPACE", (*projectv1.NamespaceBinding).GetNamespace),
		// The placement the namespace follows on this cluster; "-" for one bound by hand.
		Col("PLACEMENT", (*projectv1.NamespaceBinding).GetPlacement),
		Col("PHASE", func(b *projectv1.NamespaceBinding) string { return bindingPhase(b.GetPhase()) }),
		Col("REASON", func(b *projectv1.NamespaceBinding) string { return orNone(b.GetReason()) }),
		Col("HARD", func(b *projectv1.NamespaceBinding) string { return joinMap(b.GetHard()) }),
		Col("USED", func(b *projectv1.NamespaceBinding) string { return joinMap(b.GetUsed()) }),
	}
}

// bindingPhase renders BINDING_PHASE_AVAILABLE as Available.
func bindingPhase(p projectv1.BindingPhase) string {
	s := strings.ToLower(strings.TrimPrefix(p.String(), "BINDING_PHASE_"))
	if s == "" {
		return ""
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
