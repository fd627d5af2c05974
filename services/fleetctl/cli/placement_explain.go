package cli

import (
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1/placementv1connect"
)

func newPlacementExplainCommand(f *factory) *cobra.Command {
	var project string
	cmd := &cobra.Command{
		Use:   "explain PROJECT/NAME | NAME --project PROJECT",
		Short: "Show every cluster with whether the placement selects it, its score, and why not",
		Long: "Show every registered cluster: whether the placement selects it, its total score (the\n" +
			"sum of score × weight; -o json|yaml has each prioritizer's score), and for a cluster not\n" +
			"selected the first step that dropped it: not in a cluster set the placement may use, no\n" +
			"predicate matched (with the requirement), a taint not tolerated (fleetstream.io/unreachable:\n" +
			"its agent is not connected), or cut by numberOfClusters (its rank and total against the\n" +
			"last selected cluster's). The scheduler's own filters and prioritizers run on the inputs of\n" +
			"the last decision with the fleet as it is now.",
		Example: "  fleetctl placement explain eu-3 --project team-a\n  fleetctl placement explain team-a/eu-3 -o json",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			proj, name, err := placementRef(args[0], project)
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), f, placementv1connect.NewPlacementServiceClient, placementv1connect.PlacementServiceClient.ExplainPlacement,
				&placementv1.ExplainPlacementRequest{Project: proj, Name: name}, "explain placement %s/%s", proj, name)
			if err != nil {
				return err
			}
			return printExplanation(f.printer(), resp)
		},
	}
	placementRefFlag(cmd, &project)
	return cmd
}

// printExplanation prints the whole message with JSON and YAML, and with tables one row per
// cluster: CLUSTER SELECTED SCORE REASON.
func printExplanation(p *Printer, ex *placementv1.ExplainPlacementResponse) error {
	if p.Format != formatTable {
		return p.Print(ex)
	}
	if ex.GetMisconfigured() != "" {
		p.Note("placement %s/%s is misconfigured: %s", ex.GetProject(), ex.GetName(), ex.GetMisconfigured())
	}
	if len(ex.GetClusters()) == 0 {
		p.Note("no cluster is registered")
		return nil
	}
	cols := []Column{
		Col("CLUSTER", (*placementv1.ClusterExplanation).GetClusterName),
		Col("SELECTED", func(c *placementv1.ClusterExplanation) string { return strconv.FormatBool(c.GetSelected()) }),
		Col("SCORE", func(c *placementv1.ClusterExplanation) string {
			if c.GetRank() == 0 {
				return "-" // not scored: dropped before the prioritizers
			}
			return strconv.FormatInt(c.GetTotal(), 10)
		}),
		Col("REASON", func(c *placementv1.ClusterExplanation) string { return c.GetReason().GetMessage() }),
	}
	rows := make([]proto.Message, len(ex.GetClusters()))
	for i, c := range ex.GetClusters() {
		rows[i] = c
	}
	if err := writeTable(p.Out, rows, cols); err != nil {
		return err
	}
	if t := ex.GetEvaluatedAt(); t != nil {
		p.Note("")
		p.Note("evaluated %s", t.AsTime().UTC().Format(time.RFC3339))
	}
	return nil
}
