package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
)

func newProjectCommand(f *factory) *cobra.Command {
	cmd := newGroupCommand("project", "Create, inspect and delete projects (tenants owning namespaces on member clusters)")
	cmd.Aliases = []string{"projects"}
	cmd.AddCommand(
		newProjectCreateCommand(f),
		newProjectListCommand(f),
		newProjectGetCommand(f),
		newProjectDeleteCommand(f),
		newProjectBudgetCommand(f),
	)
	return cmd
}

func newProjectCreateCommand(f *factory) *cobra.Command {
	var (
		displayName string
		labels      []string
	)
	cmd := &cobra.Command{
		Use:     "create NAME",
		Short:   "Create a project",
		Example: "  fleetctl project create team-a --display-name 'Team A' --label org=web",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &projectv1.CreateProjectRequest{Name: args[0], DisplayName: displayName}
			var err error
			if req.Labels, err = parseKeyValues("label", labels); err != nil {
				return err
			}
			resp, err := call(cmd.Context(), f, projectv1connect.NewProjectServiceClient, projectv1connect.ProjectServiceClient.CreateProject,
				req, "create project %q", req.Name)
			if err != nil {
				return err
			}
			return f.printer().Print(resp.GetProject(), projectColumns()...)
		},
	}
	cmd.Flags().StringVar(&displayName, "display-name", "", "human-readable name")
	cmd.Flags().StringArrayVar(&labels, "label", nil, "label key=value (repeatable)")
	return cmd
}

func newProjectListCommand(f *factory) *cobra.Command {
	var selector string
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List projects with their namespace counts",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			resp, err := call(cmd.Context(), f, projectv1connect.NewProjectServiceClient, projectv1connect.ProjectServiceClient.ListProjects,
				&projectv1.ListProjectsRequest{LabelSelector: selector}, "list projects")
			if err != nil {
				return err
			}
			return f.printer().PrintList(Messages(resp.GetProjects()), projectColumns()...)
		},
	}
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "label selector, Kubernetes syntax (org=web)")
	return cmd
}

func newProjectGetCommand(f *factory) *cobra.Command {
	return &cobra.Command{
		Use:   "get NAME",
		Short: "Show a project, its quota sums and its budgets per cluster",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := call(cmd.Context(), f, projectv1connect.NewProjectServiceClient, projectv1connect.ProjectServiceClient.GetProject,
				&projectv1.GetProjectRequest{Name: args[0]}, "get project %q", args[0])
			if err != nil {
				return err
			}
			p := f.printer()
			project := resp.GetProject()
			if err := p.Print(project, projectColumns()...); err != nil || p.Format != formatTable {
				return err
			}
			if clusters := project.GetStatus().GetClusters(); len(clusters) > 0 {
				p.Note("")
				if err := p.PrintList(Messages(clusters), clusterQuotaColumns()...); err != nil {
					return err
				}
			}
			return printBudgets(p, project)
		},
	}
}

func newProjectBudgetCommand(f *factory) *cobra.Command {
	var (
		cluster string
		hard    []string
	)
	cmd := &cobra.Command{
		Use:   "budget NAME",
		Short: "Set a project's budget on a cluster (platform admins)",
		Long: "Set the hard limits that the quotas of the project's namespaces on one cluster must fit\n" +
			"in together: the given --hard flags become the whole budget there. Every namespace of the\n" +
			"project on that cluster must then set a limit for each budgeted resource. A project\n" +
			"without a budget on a cluster is unlimited there; pass --hard= once to remove it.",
		Example: "  fleetctl project budget team-a --cluster c1 --hard cpu=10 --hard memory=20Gi",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("hard") {
				return errors.New("give the budget with --hard (or --hard= to remove it)")
			}
			limits, err := parseKeyValues("hard", clearable(hard))
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), f, projectv1connect.NewProjectServiceClient, projectv1connect.ProjectServiceClient.SetProjectBudget,
				&projectv1.SetProjectBudgetRequest{Project: args[0], Cluster: cluster, Hard: limits}, "set budget of project %q on cluster %q", args[0], cluster)
			if err != nil {
				return err
			}
			p := f.printer()
			project := resp.GetProject()
			if p.Format != formatTable {
				return p.Print(project)
			}
			if len(limits) == 0 {
				p.Note("project %q has no budget on cluster %q: unlimited there", args[0], cluster)
			}
			return printBudgets(p, project)
		},
	}
	cmd.Flags().StringVarP(&cluster, "cluster", "c", "", "member cluster the budget applies to")
	_ = cmd.MarkFlagRequired("cluster")
	cmd.Flags().StringArrayVar(&hard, "hard", nil, "budget resource=quantity, e.g. cpu=10, memory=20Gi (repeatable); replaces all")
	return cmd
}

// printBudgets prints a project's budgets with how much of each its namespaces hold.
func printBudgets(p *Printer, project *projectv1.Project) error {
	budgets := project.GetBudgets()
	if len(budgets) == 0 {
		return nil
	}
	p.Note("")
	return p.PrintList(Messages(budgets), budgetColumns()...)
}

func newProjectDeleteCommand(f *factory) *cobra.Command {
	var (
		force  bool
		policy string
	)
	cmd := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a project",
		Long: "Delete a project. It is refused while the project owns namespaces; --force unbinds\n" +
			"them first, keeping the namespaces on their clusters unless --unbind-policy delete.",
		Example: "  fleetctl project delete team-a --force --unbind-policy delete",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pol, err := parseUnbindPolicy(policy)
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), f, projectv1connect.NewProjectServiceClient, projectv1connect.ProjectServiceClient.DeleteProject,
				&projectv1.DeleteProjectRequest{Name: args[0], Force: force, UnbindPolicy: pol}, "delete project %q", args[0])
			if err != nil {
				return err
			}
			p := f.printer()
			if p.Format != formatTable {
				return p.Print(resp)
			}
			p.Note("project %q deleted", args[0])
			if n := len(resp.GetUnbound()); n > 0 {
				p.Note("%d namespace binding(s) unbound:", n)
				return p.PrintList(Messages(resp.GetUnbound()), bindingColumns()...)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "unbind the project's namespaces first")
	cmd.Flags().StringVar(&policy, "unbind-policy", "keep", "with --force, what happens to the namespaces on their clusters: keep or delete")
	return cmd
}

// parseUnbindPolicy maps keep/delete to the API's policy.
func parseUnbindPolicy(s string) (projectv1.UnbindPolicy, error) {
	switch strings.ToLower(s) {
	case "", "keep":
		return projectv1.UnbindPolicy_UNBIND_POLICY_KEEP, nil
	case "delete":
		return projectv1.UnbindPolicy_UNBIND_POLICY_DELETE, nil
	}
	return 0, fmt.Errorf("unbind policy %q: want keep or delete", s)
}

func projectColumns() []Column {
	return []Column{
		Col("NAME", (*projectv1.Project).GetName),
		Col("DISPLAY NAME", func(p *projectv1.Project) string { return orNone(p.GetDisplayName()) }),
		Col("NAMESPACES", func(p *projectv1.Project) string { return fmt.Sprint(p.GetStatus().GetNamespaceCount()) }),
		Col("AVAILABLE", func(p *projectv1.Project) string { return fmt.Sprint(p.GetStatus().GetAvailableCount()) }),
		Col("PENDING", func(p *projectv1.Project) string { return fmt.Sprint(p.GetStatus().GetPendingCount()) }),
		Col("FAILED", func(p *projectv1.Project) string { return fmt.Sprint(p.GetStatus().GetFailedCount()) }),
		Col("LABELS", func(p *projectv1.Project) string { return joinMap(p.GetLabels()) }),
	}
}

func clusterQuotaColumns() []Column {
	return []Column{
		Col("CLUSTER", (*projectv1.ClusterQuotaStatus).GetCluster),
		Col("NAMESPACES", func(c *projectv1.ClusterQuotaStatus) string { return fmt.Sprint(c.GetNamespaceCount()) }),
		Col("HARD", func(c *projectv1.ClusterQuotaStatus) string { return joinMap(c.GetHard()) }),
		Col("USED", func(c *projectv1.ClusterQuotaStatus) string { return joinMap(c.GetUsed()) }),
	}
}

func budgetColumns() []Column {
	return []Column{
		Col("CLUSTER", (*projectv1.ProjectBudget).GetCluster),
		Col("BUDGET", func(b *projectv1.ProjectBudget) string { return joinMap(b.GetHard()) }),
		Col("ALLOCATED", func(b *projectv1.ProjectBudget) string { return joinMap(b.GetAllocated()) }),
	}
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}
