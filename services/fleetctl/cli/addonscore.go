package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1/placementv1connect"
)

func newAddOnScoreCommand(f *factory) *cobra.Command {
	cmd := newGroupCommand("addonscore", "Record scores other systems computed for clusters (OCM's AddOnPlacementScore)")
	cmd.Aliases = []string{"addonscores"}
	cmd.AddCommand(newAddOnScoreSetCommand(f))
	return cmd
}

func newAddOnScoreSetCommand(f *factory) *cobra.Command {
	var validFor time.Duration
	cmd := &cobra.Command{
		Use:   "set CLUSTER RESOURCE SCORE_NAME SCORE",
		Short: "Set a cluster's add-on score, which placements use with an AddOn score coordinate",
		Long: "Set a cluster's add-on score: SCORE, in [-100, 100], under RESOURCE and SCORE_NAME\n" +
			"(OCM's AddOnPlacementScore name and score item). A placement uses it with\n" +
			"scoreCoordinate {type: AddOn, addOn: {resourceName: RESOURCE, scoreName: SCORE_NAME}}.\n" +
			"With --valid-for the score counts as absent after that long. A negative score needs --\n" +
			"before the arguments, as flags start with a dash.",
		Example: "  fleetctl addonscore set c1 resource-usage cpuAvailable 80 --valid-for 10m\n" +
			"  fleetctl addonscore set -- c1 resource-usage cpuAvailable -20",
		Args: cobra.ExactArgs(4),
		RunE: func(cmd *cobra.Command, args []string) error {
			score, err := strconv.ParseInt(args[3], 10, 32)
			if err != nil {
				return fmt.Errorf("score %q: want an integer in [-100, 100]", args[3])
			}
			if validFor < 0 {
				return fmt.Errorf("--valid-for %s: must not be negative", validFor)
			}
			req := &placementv1.SetAddOnScoreRequest{Cluster: args[0], ResourceName: args[1], ScoreName: args[2], Score: int32(score)}
			if validFor > 0 {
				req.ValidUntil = timestamppb.New(time.Now().Add(validFor))
			}
			resp, err := call(cmd.Context(), f, placementv1connect.NewPlacementServiceClient, placementv1connect.PlacementServiceClient.SetAddOnScore,
				req, "set add-on score %s/%s of cluster %q", req.ResourceName, req.ScoreName, req.Cluster)
			if err != nil {
				return err
			}
			return f.printer().Print(resp.GetScore(), addOnScoreColumns()...)
		},
	}
	cmd.Flags().DurationVar(&validFor, "valid-for", 0, "how long the score holds, e.g. 10m (default: until replaced)")
	// pflag reads "-20" as the shorthand flags -2 -0; say how to pass it instead of only
	// "unknown shorthand flag".
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		if strings.Contains(err.Error(), "unknown shorthand flag") {
			return fmt.Errorf("%w (a negative SCORE needs -- before the arguments: fleetctl addonscore set -- CLUSTER RESOURCE SCORE_NAME -20)", err)
		}
		return err
	})
	return cmd
}

func addOnScoreColumns() []Column {
	return []Column{
		Col("CLUSTER", (*placementv1.AddOnScore).GetCluster),
		Col("RESOURCE", (*placementv1.AddOnScore).GetResourceName),
		Col("SCORE NAME", (*placementv1.AddOnScore).GetScoreName),
		Col("SCORE", func(s *placementv1.AddOnScore) string { return strconv.Itoa(int(s.GetScore())) }),
		Col("VALID UNTIL", func(s *placementv1.AddOnScore) string {
			if s.GetValidUntil() == nil {
				return "<until replaced>"
			}
			return s.GetValidUntil().AsTime().Local().Format(time.RFC3339)
		}),
	}
}
