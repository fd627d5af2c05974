package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1/placementv1connect"
)

const placementFileHelp = "The file is an OCM Placement (cluster.open-cluster-management.io/v1beta1) with its spec\n" +
	"unchanged: clusterSets, numberOfClusters, predicates, tolerations, prioritizerPolicy and\n" +
	"decisionStrategy.groupStrategy, with OCM's names and values. The project is metadata.namespace\n" +
	"or a top-level project, else --project; the name is metadata.name or a top-level name. An\n" +
	"unknown field is an error. Several placements may be given as YAML documents; - reads stdin."

const placementExample = `  # placement.yaml
  apiVersion: cluster.open-cluster-management.io/v1beta1
  kind: Placement
  metadata: {name: eu-3, namespace: team-a}
  spec:
    clusterSets: [eu]
    numberOfClusters: 3
    predicates:
    - requiredClusterSelector:
        labelSelector: {matchLabels: {env: prod}}
        claimSelector:
          matchExpressions: [{key: region, operator: In, values: [eu-west-1, eu-central-1]}]
    prioritizerPolicy:
      configurations:
      - scoreCoordinate: {builtIn: ResourceAllocatableMemory}
        weight: 2
`

func newPlacementCommand(f *factory) *cobra.Command {
	cmd := newGroupCommand("placement", "Pick clusters for a project from its cluster sets (OCM placements) and show the decisions")
	cmd.Aliases = []string{"placements", "pl"}
	cmd.AddCommand(
		newPlacementCreateCommand(f),
		newPlacementUpdateCommand(f),
		newPlacementGetCommand(f),
		newPlacementListCommand(f),
		newPlacementDeleteCommand(f),
		newPlacementDecisionsCommand(f),
		newPlacementExplainCommand(f),
		newPlacementWatchCommand(f),
	)
	return cmd
}

func newPlacementCreateCommand(f *factory) *cobra.Command {
	var file, project string
	cmd := &cobra.Command{
		Use:     "create -f FILE",
		Short:   "Create placements from a file (project owners)",
		Long:    "Create placements from a file.\n\n" + placementFileHelp,
		Example: "  fleetctl placement create -f placement.yaml\n\n" + placementExample,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return writePlacements(f, file, project, false, func(p *placementv1.Placement) (*placementv1.Placement, error) {
				resp, err := call(cmd.Context(), f, placementv1connect.NewPlacementServiceClient, placementv1connect.PlacementServiceClient.CreatePlacement,
					&placementv1.CreatePlacementRequest{Placement: p}, "create placement %s/%s", p.Project, p.Name)
				return resp.GetPlacement(), err
			})
		},
	}
	placementFileFlags(cmd, &file, &project)
	return cmd
}

func newPlacementUpdateCommand(f *factory) *cobra.Command {
	var (
		file, project string
		revision      uint64
	)
	cmd := &cobra.Command{
		Use:   "update -f FILE",
		Short: "Replace placements' specs with a file's (project owners)",
		Long: "Replace the spec of existing placements with the file's: a field the file leaves out is\n" +
			"reset, as with kubectl replace.\n\n" + placementFileHelp,
		Example: "  fleetctl placement update -f placement.yaml",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// One revision cannot be the current one of two placements.
			return writePlacements(f, file, project, revision != 0, func(p *placementv1.Placement) (*placementv1.Placement, error) {
				resp, err := call(cmd.Context(), f, placementv1connect.NewPlacementServiceClient, placementv1connect.PlacementServiceClient.UpdatePlacement,
					&placementv1.UpdatePlacementRequest{Placement: p, ExpectedRevision: revision}, "update placement %s/%s", p.Project, p.Name)
				return resp.GetPlacement(), err
			})
		},
	}
	placementFileFlags(cmd, &file, &project)
	cmd.Flags().Uint64Var(&revision, "expected-revision", 0, "update only if the placement's revision is still this (see get -o yaml)")
	return cmd
}

func placementFileFlags(cmd *cobra.Command, file, project *string) {
	cmd.Flags().StringVarP(file, "filename", "f", "", "the placement file, YAML or JSON (- for stdin)")
	cmd.Flags().StringVarP(project, "project", "p", "", "project of placements whose file names none")
	_ = cmd.MarkFlagRequired("filename")
}

// writePlacements reads every placement of the file before sending any, so a mistake in the
// last document stores nothing, then writes them in order and prints what the server stored.
// With single, a file of several placements is refused.
func writePlacements(f *factory, file, project string, single bool,
	write func(*placementv1.Placement) (*placementv1.Placement, error)) error {
	ps, err := readPlacements(f, file, project)
	if err != nil {
		return err
	}
	if single && len(ps) > 1 {
		return fmt.Errorf("%s holds %d placements; --expected-revision applies to one", file, len(ps))
	}
	var stored []*placementv1.Placement
	for _, p := range ps {
		got, err := write(p)
		if err != nil {
			// What was written before the failure is shown, so a rerun can be adjusted.
			if len(stored) > 0 {
				_ = f.printer().PrintList(Messages(stored), placementColumns(time.Now)...)
			}
			return err
		}
		stored = append(stored, got)
	}
	if len(stored) == 1 {
		return f.printer().Print(stored[0], placementColumns(time.Now)...)
	}
	return f.printer().PrintList(Messages(stored), placementColumns(time.Now)...)
}

// placementRef resolves PROJECT/NAME or NAME with --project.
func placementRef(arg, project string) (string, string, error) {
	proj, name, found := strings.Cut(arg, "/")
	if !found {
		if project == "" {
			return "", "", fmt.Errorf("placement %q: give its project, as PROJECT/NAME or with --project", arg)
		}
		return project, arg, nil
	}
	if proj == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("placement %q: want PROJECT/NAME", arg)
	}
	if project != "" && project != proj {
		return "", "", fmt.Errorf("placement %q: --project %q names another project", arg, project)
	}
	return proj, name, nil
}

func placementRefFlag(cmd *cobra.Command, project *string) {
	cmd.Flags().StringVarP(project, "project", "p", "", "project of the placement (or give PROJECT/NAME)")
}

func newPlacementGetCommand(f *factory) *cobra.Command {
	var project string
	cmd := &cobra.Command{
		Use:     "get PROJECT/NAME | NAME --project PROJECT",
		Short:   "Show a placement and its conditions",
		Example: "  fleetctl placement get team-a/eu-3\n  fleetctl placement get eu-3 -p team-a -o yaml",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			proj, name, err := placementRef(args[0], project)
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), f, placementv1connect.NewPlacementServiceClient, placementv1connect.PlacementServiceClient.GetPlacement,
				&placementv1.GetPlacementRequest{Project: proj, Name: name}, "get placement %s/%s", proj, name)
			if err != nil {
				return err
			}
			p := f.printer()
			pl := resp.GetPlacement()
			if err := p.Print(pl, placementColumns(time.Now)...); err != nil || p.Format != formatTable {
				return err
			}
			noteConditions(p, pl.GetStatus())
			return nil
		},
	}
	placementRefFlag(cmd, &project)
	return cmd
}

func newPlacementListCommand(f *factory) *cobra.Command {
	var project string
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List placements (of one project with --project); you see those of your projects",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			resp, err := call(cmd.Context(), f, placementv1connect.NewPlacementServiceClient, placementv1connect.PlacementServiceClient.ListPlacements,
				&placementv1.ListPlacementsRequest{Project: project}, "list placements")
			if err != nil {
				return err
			}
			return f.printer().PrintList(Messages(resp.GetPlacements()), placementColumns(time.Now)...)
		},
	}
	cmd.Flags().StringVarP(&project, "project", "p", "", "only this project's placements")
	return cmd
}

func newPlacementDeleteCommand(f *factory) *cobra.Command {
	var (
		project  string
		revision uint64
	)
	cmd := &cobra.Command{
		Use:   "delete PROJECT/NAME | NAME --project PROJECT",
		Short: "Delete a placement (project owners); namespaces that follow it must be unbound first",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			proj, name, err := placementRef(args[0], project)
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), f, placementv1connect.NewPlacementServiceClient, placementv1connect.PlacementServiceClient.DeletePlacement,
				&placementv1.DeletePlacementRequest{Project: proj, Name: name, ExpectedRevision: revision}, "delete placement %s/%s", proj, name)
			if err != nil {
				return err
			}
			return f.printer().PrintOrNote(resp, "placement %s/%s deleted", proj, name)
		},
	}
	placementRefFlag(cmd, &project)
	cmd.Flags().Uint64Var(&revision, "expected-revision", 0, "delete only if the placement's revision is still this")
	return cmd
}

func newPlacementDecisionsCommand(f *factory) *cobra.Command {
	var project string
	cmd := &cobra.Command{
		Use:   "decisions PROJECT/NAME | NAME --project PROJECT",
		Short: "Show the clusters a placement selected, by group, with each prioritizer's score",
		Long: "Show the clusters a placement selected, best first within each decision group, with\n" +
			"each prioritizer's score (unweighted, in [-100, 100]) in a column headed NAME(w=WEIGHT),\n" +
			"and the total, the sum of score × weight. Prioritizers with weight 0 are left out.\n" +
			"Below: when these scores were evaluated, and the next evaluation due with no input\n" +
			"changing (a toleration's toleration_seconds or an add-on score's valid_until running out).",
		Example: "  fleetctl placement decisions eu-3 --project team-a",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			proj, name, err := placementRef(args[0], project)
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), f, placementv1connect.NewPlacementServiceClient, placementv1connect.PlacementServiceClient.GetPlacementDecisions,
				&placementv1.GetPlacementDecisionsRequest{Project: proj, Name: name}, "get decisions of placement %s/%s", proj, name)
			if err != nil {
				return err
			}
			return printDecisions(f.printer(), resp.GetDecisions())
		},
	}
	placementRefFlag(cmd, &project)
	return cmd
}

// printDecisions prints the whole message with JSON and YAML, and with tables one row per
// selected cluster, then the conditions that explain a short or empty decision.
func printDecisions(p *Printer, d *placementv1.PlacementDecisions) error {
	if p.Format != formatTable {
		return p.Print(d)
	}
	rows, cols := decisionRows(d)
	if len(rows) == 0 {
		p.Note("placement %s/%s selects no cluster", d.GetProject(), d.GetName())
	} else if err := writeTable(p.Out, rows, cols); err != nil {
		return err
	}
	noteEvaluation(p, d)
	noteConditions(p, d.GetStatus())
	return nil
}

// noteEvaluation says when the scores shown were computed and when the decision is next due
// with no input changing (a toleration_seconds or an add-on score's valid_until running out).
func noteEvaluation(p *Printer, d *placementv1.PlacementDecisions) {
	if d.GetDecideTime() == nil {
		return
	}
	next := "none (until an input changes)"
	if t := d.GetNextEvaluation(); t != nil {
		next = t.AsTime().UTC().Format(time.RFC3339) + " (a toleration or an add-on score runs out)"
	}
	p.Note("")
	p.Note("evaluated %s, next evaluation %s", d.GetDecideTime().AsTime().UTC().Format(time.RFC3339), next)
}

// decisionRows flattens groups and pages into one row per cluster, with columns GROUP,
// CLUSTER, one per prioritizer, and TOTAL.
func decisionRows(d *placementv1.PlacementDecisions) ([]proto.Message, []Column) {
	group := map[*placementv1.ClusterDecision]*placementv1.DecisionGroupDecisions{}
	var rows []proto.Message
	for _, g := range d.GetGroups() {
		for _, page := range g.GetPages() {
			for _, c := range page.GetClusters() {
				group[c] = g
				rows = append(rows, c)
			}
		}
	}
	cols := []Column{
		Col("GROUP", func(c *placementv1.ClusterDecision) string { return groupLabel(group[c]) }),
		Col("CLUSTER", (*placementv1.ClusterDecision).GetClusterName),
	}
	for i, pw := range d.GetPrioritizers() {
		cols = append(cols, Col(fmt.Sprintf("%s(w=%d)", pw.GetName(), pw.GetWeight()), func(c *placementv1.ClusterDecision) string {
			if i >= len(c.GetScores()) {
				return ""
			}
			return strconv.FormatInt(c.GetScores()[i], 10)
		}))
	}
	cols = append(cols, Col("TOTAL", func(c *placementv1.ClusterDecision) string { return strconv.FormatInt(c.GetTotal(), 10) }))
	return rows, cols
}

// groupLabel is the group's name, or "#INDEX" for a group without one (OCM's groups made by
// clustersPerDecisionGroup alone).
func groupLabel(g *placementv1.DecisionGroupDecisions) string {
	if g.GetDecisionGroupName() != "" {
		return g.GetDecisionGroupName()
	}
	return "#" + strconv.Itoa(int(g.GetDecisionGroupIndex()))
}

// noteConditions prints a placement's conditions under its table, one per line.
func noteConditions(p *Printer, s *placementv1.PlacementStatus) {
	if len(s.GetConditions()) == 0 {
		return
	}
	p.Note("")
	for _, c := range s.GetConditions() {
		line := fmt.Sprintf("%s=%s", c.GetType(), c.GetStatus())
		if c.GetReason() != "" {
			line += " " + c.GetReason()
		}
		if c.GetField() != "" {
			line += " (field " + c.GetField() + ")"
		}
		if c.GetMessage() != "" {
			line += ": " + c.GetMessage()
		}
		p.Note("%s", line)
	}
}

func newPlacementWatchCommand(f *factory) *cobra.Command {
	var project string
	cmd := &cobra.Command{
		Use:     "watch PROJECT/NAME | NAME --project PROJECT",
		Short:   "Print a placement's decision now and after every change, until interrupted",
		Example: "  fleetctl placement watch eu-3 --project team-a",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			proj, name, err := placementRef(args[0], project)
			if err != nil {
				return err
			}
			return watch(cmd.Context(), f, placementv1connect.NewPlacementServiceClient, placementv1connect.PlacementServiceClient.WatchPlacementDecisions,
				&placementv1.WatchPlacementDecisionsRequest{Project: proj, Name: name}, f.printer().Stream(watchDecisionColumns(time.Now)...),
				"watch placement: server closed the stream", "watch placement %s/%s", proj, name)
		},
	}
	placementRefFlag(cmd, &project)
	return cmd
}

func watchDecisionColumns(now func() time.Time) []Column {
	return []Column{
		Col("TIME", func(*placementv1.WatchPlacementDecisionsResponse) string { return now().Format(time.TimeOnly) }),
		Col("SELECTED", func(m *placementv1.WatchPlacementDecisionsResponse) string {
			if m.GetDecisions() == nil {
				return "<deleted>"
			}
			return strconv.Itoa(int(m.GetDecisions().GetStatus().GetNumberOfSelectedClusters()))
		}),
		Col("ADDED", func(m *placementv1.WatchPlacementDecisionsResponse) string { return strings.Join(m.GetAdded(), ",") }),
		Col("REMOVED", func(m *placementv1.WatchPlacementDecisionsResponse) string { return strings.Join(m.GetRemoved(), ",") }),
		Col("SATISFIED", func(m *placementv1.WatchPlacementDecisionsResponse) string {
			return satisfied(m.GetDecisions().GetStatus())
		}),
	}
}

func placementColumns(now func() time.Time) []Column {
	return []Column{
		Col("PROJECT", (*placementv1.Placement).GetProject),
		Col("NAME", (*placementv1.Placement).GetName),
		Col("CLUSTER SETS", func(p *placementv1.Placement) string {
			if len(p.GetClusterSets()) == 0 {
				return "<all bound>"
			}
			return strings.Join(p.GetClusterSets(), ",")
		}),
		Col("WANT", func(p *placementv1.Placement) string {
			if p.NumberOfClusters == nil {
				return "all"
			}
			return strconv.Itoa(int(p.GetNumberOfClusters()))
		}),
		Col("SELECTED", func(p *placementv1.Placement) string {
			return strconv.Itoa(int(p.GetStatus().GetNumberOfSelectedClusters()))
		}),
		Col("SATISFIED", func(p *placementv1.Placement) string { return satisfied(p.GetStatus()) }),
		Col("AGE", func(p *placementv1.Placement) string {
			if p.GetCreateTime() == nil {
				return ""
			}
			return age(now(), p.GetCreateTime().AsTime())
		}),
	}
}

// satisfied renders the PlacementSatisfied condition as "True", or "False(REASON)" so a
// table tells why without a second command; a misconfiguration wins, as it is the cause.
func satisfied(s *placementv1.PlacementStatus) string {
	var sat *placementv1.PlacementCondition
	for _, c := range s.GetConditions() {
		switch {
		case c.GetType() == "PlacementMisconfigured" && c.GetStatus() == "True":
			return "Misconfigured"
		case c.GetType() == "PlacementSatisfied":
			sat = c
		}
	}
	switch {
	case sat == nil:
		return ""
	case sat.GetStatus() == "True" || sat.GetReason() == "":
		return sat.GetStatus()
	}
	return sat.GetStatus() + "(" + sat.GetReason() + ")"
}
