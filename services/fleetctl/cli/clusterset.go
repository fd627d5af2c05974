package cli

import (
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1/placementv1connect"
)

func newClusterSetCommand(f *factory) *cobra.Command {
	cmd := newGroupCommand("clusterset", "Group clusters into sets and bind sets to projects (what placements pick from)")
	cmd.Aliases = []string{"clustersets", "cs"}
	cmd.AddCommand(
		newClusterSetCreateCommand(f),
		newClusterSetListCommand(f),
		newClusterSetGetCommand(f),
		newClusterSetDeleteCommand(f),
		newClusterSetBindCommand(f),
		newClusterSetUnbindCommand(f),
		newClusterSetBindingsCommand(f),
		newClusterSetRoleCommand(f),
	)
	return cmd
}

func newClusterSetCreateCommand(f *factory) *cobra.Command {
	var selector string
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a cluster set (platform admins)",
		Long: "Create a cluster set. Without --selector it is an exclusive set: its members are the\n" +
			"clusters labelled fleetstream.io/clusterset=NAME (a cluster is in exactly one such set;\n" +
			"unlabelled clusters are in `default`). With --selector it holds every cluster matching\n" +
			"that label selector, in Kubernetes syntax; --selector '' selects every cluster.",
		Example: "  fleetctl clusterset create eu\n" +
			"  fleetctl cluster update c1 --label fleetstream.io/clusterset=eu\n" +
			"  fleetctl clusterset create prod --selector 'env=prod,region in (eu,us)'",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &placementv1.CreateClusterSetRequest{Name: args[0],
				Selector: &placementv1.ClusterSetSelector{Type: placementv1.SelectorType_SELECTOR_TYPE_EXCLUSIVE_LABEL}}
			if cmd.Flags().Changed("selector") {
				ls, err := parseSetSelector(selector)
				if err != nil {
					return err
				}
				req.Selector = &placementv1.ClusterSetSelector{Type: placementv1.SelectorType_SELECTOR_TYPE_LABEL_SELECTOR, LabelSelector: ls}
			}
			resp, err := call(cmd.Context(), f, placementv1connect.NewClusterSetServiceClient, placementv1connect.ClusterSetServiceClient.CreateClusterSet,
				req, "create cluster set %q", req.Name)
			if err != nil {
				return err
			}
			return f.printer().Print(resp.GetClusterSet(), clusterSetColumns()...)
		},
	}
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "label selector, Kubernetes syntax (env=prod); '' selects every cluster")
	return cmd
}

// parseSetSelector turns Kubernetes selector syntax into the API's structured selector.
func parseSetSelector(s string) (*placementv1.LabelSelector, error) {
	ls, err := metav1.ParseToLabelSelector(s)
	if err != nil {
		return nil, fmt.Errorf("--selector %q: %w", s, err)
	}
	out := &placementv1.LabelSelector{MatchLabels: ls.MatchLabels}
	for _, r := range ls.MatchExpressions {
		out.MatchExpressions = append(out.MatchExpressions, &placementv1.LabelSelectorRequirement{Key: r.Key, Operator: string(r.Operator), Values: r.Values})
	}
	return out, nil
}

func newClusterSetListCommand(f *factory) *cobra.Command {
	return &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List cluster sets with their member counts",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			resp, err := call(cmd.Context(), f, placementv1connect.NewClusterSetServiceClient, placementv1connect.ClusterSetServiceClient.ListClusterSets,
				&placementv1.ListClusterSetsRequest{}, "list cluster sets")
			if err != nil {
				return err
			}
			return f.printer().PrintList(Messages(resp.GetClusterSets()), clusterSetColumns()...)
		},
	}
}

func newClusterSetGetCommand(f *factory) *cobra.Command {
	return &cobra.Command{
		Use:   "get NAME",
		Short: "Show a cluster set and its members",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := call(cmd.Context(), f, placementv1connect.NewClusterSetServiceClient, placementv1connect.ClusterSetServiceClient.GetClusterSet,
				&placementv1.GetClusterSetRequest{Name: args[0]}, "get cluster set %q", args[0])
			if err != nil {
				return err
			}
			p := f.printer()
			set := resp.GetClusterSet()
			if err := p.Print(set, clusterSetColumns()...); err != nil || p.Format != formatTable {
				return err
			}
			if members := set.GetStatus().GetMembers(); len(members) > 0 {
				p.Note("")
				p.Note("members: %s", strings.Join(members, ", "))
			}
			return nil
		},
	}
}

func newClusterSetDeleteCommand(f *factory) *cobra.Command {
	return &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a cluster set (platform admins); its bindings stay and show it missing",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := call(cmd.Context(), f, placementv1connect.NewClusterSetServiceClient, placementv1connect.ClusterSetServiceClient.DeleteClusterSet,
				&placementv1.DeleteClusterSetRequest{Name: args[0]}, "delete cluster set %q", args[0])
			if err != nil {
				return err
			}
			return f.printer().PrintOrNote(resp, "cluster set %q deleted", args[0])
		},
	}
}

// projectFlag adds the required --project flag the binding commands share.
func projectFlag(cmd *cobra.Command, project *string, required bool) {
	cmd.Flags().StringVarP(project, "project", "p", "", "project the set is bound to")
	if required {
		_ = cmd.MarkFlagRequired("project")
	}
}

func newClusterSetBindCommand(f *factory) *cobra.Command {
	var project string
	cmd := &cobra.Command{
		Use:     "bind SET --project PROJECT",
		Short:   "Make a cluster set available to a project's placements (platform admins; the set's admins in projects where they manage placements)",
		Example: "  fleetctl clusterset bind eu --project team-a",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := call(cmd.Context(), f, placementv1connect.NewClusterSetServiceClient, placementv1connect.ClusterSetServiceClient.BindClusterSet,
				&placementv1.BindClusterSetRequest{Project: project, ClusterSet: args[0]}, "bind cluster set %q to project %q", args[0], project)
			if err != nil {
				return err
			}
			p := f.printer()
			b := resp.GetBinding()
			if err := p.Print(b, setBindingColumns()...); err != nil || p.Format != formatTable {
				return err
			}
			if !b.GetStatus().GetClusterSetExists() {
				p.Note("note: cluster set %q does not exist (yet); the binding takes effect once it does", args[0])
			}
			return nil
		},
	}
	projectFlag(cmd, &project, true)
	return cmd
}

func newClusterSetUnbindCommand(f *factory) *cobra.Command {
	var project string
	cmd := &cobra.Command{
		Use:   "unbind SET --project PROJECT",
		Short: "Withdraw a cluster set from a project (platform admins; the set's admins in projects where they manage placements)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := call(cmd.Context(), f, placementv1connect.NewClusterSetServiceClient, placementv1connect.ClusterSetServiceClient.UnbindClusterSet,
				&placementv1.UnbindClusterSetRequest{Project: project, ClusterSet: args[0]}, "unbind cluster set %q from project %q", args[0], project)
			if err != nil {
				return err
			}
			return f.printer().PrintOrNote(resp, "cluster set %q unbound from project %q", args[0], project)
		},
	}
	projectFlag(cmd, &project, true)
	return cmd
}

func newClusterSetBindingsCommand(f *factory) *cobra.Command {
	var project string
	cmd := &cobra.Command{
		Use:   "bindings",
		Short: "List cluster set bindings (of one project with --project); you see those of your projects and of the sets you hold a role on",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			resp, err := call(cmd.Context(), f, placementv1connect.NewClusterSetServiceClient, placementv1connect.ClusterSetServiceClient.ListClusterSetBindings,
				&placementv1.ListClusterSetBindingsRequest{Project: project}, "list cluster set bindings")
			if err != nil {
				return err
			}
			return f.printer().PrintList(Messages(resp.GetBindings()), setBindingColumns()...)
		},
	}
	projectFlag(cmd, &project, false)
	return cmd
}

func clusterSetColumns() []Column {
	return []Column{
		Col("NAME", (*placementv1.ClusterSet).GetName),
		Col("TYPE", func(c *placementv1.ClusterSet) string { return selectorType(c.GetSelector()) }),
		Col("SELECTOR", func(c *placementv1.ClusterSet) string { return describeSetSelector(c) }),
		Col("MEMBERS", func(c *placementv1.ClusterSet) string { return fmt.Sprint(c.GetStatus().GetMemberCount()) }),
	}
}

func setBindingColumns() []Column {
	return []Column{
		Col("PROJECT", (*placementv1.ClusterSetBinding).GetProject),
		Col("CLUSTER SET", (*placementv1.ClusterSetBinding).GetClusterSet),
		Col("SET EXISTS", func(b *placementv1.ClusterSetBinding) string { return fmt.Sprint(b.GetStatus().GetClusterSetExists()) }),
	}
}

func selectorType(s *placementv1.ClusterSetSelector) string {
	if s.GetType() == placementv1.SelectorType_SELECTOR_TYPE_LABEL_SELECTOR {
		return "LabelSelector"
	}
	return "ExclusiveLabel"
}

// describeSetSelector renders a set's selector the way a user would write it.
func describeSetSelector(c *placementv1.ClusterSet) string {
	sel := c.GetSelector()
	if sel.GetType() != placementv1.SelectorType_SELECTOR_TYPE_LABEL_SELECTOR {
		if c.GetName() == "default" {
			return "fleetstream.io/clusterset=default or unset"
		}
		return "fleetstream.io/clusterset=" + c.GetName()
	}
	ls := sel.GetLabelSelector()
	if ls == nil {
		return "<no cluster>"
	}
	var parts []string
	for k, v := range ls.GetMatchLabels() {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	for _, r := range ls.GetMatchExpressions() {
		switch r.GetOperator() {
		case string(metav1.LabelSelectorOpExists):
			parts = append(parts, r.GetKey())
		case string(metav1.LabelSelectorOpDoesNotExist):
			parts = append(parts, "!"+r.GetKey())
		default:
			parts = append(parts, fmt.Sprintf("%s %s (%s)", r.GetKey(), strings.ToLower(strings.ReplaceAll(r.GetOperator(), "NotIn", "notin")), strings.Join(r.GetValues(), ",")))
		}
	}
	if len(parts) == 0 {
		return "<every cluster>"
	}
	return strings.Join(parts, ",")
}
