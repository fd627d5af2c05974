package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	auditv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/audit/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/audit/v1/auditv1connect"
)

func newAuditCommand(f *factory) *cobra.Command {
	var (
		req          auditv1.ListActivityRequest
		since, until string
		limit        int
	)
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "List who changed what, and which calls were denied, from the event log",
		Long: "List activity oldest first: one row per recorded change (with its actor) and per API call\n" +
			"the authorizer denied. Platform admins see everything; a project owner sees the rows of\n" +
			"their projects. --since and --until take RFC 3339 or a duration ago (7d is 168h).\n" +
			"Rows are fetched a page at a time up to --limit; the token to go on is printed when more match.",
		Example: "  fleetctl audit --actor alice --since 168h\n" +
			"  fleetctl audit -p team-a --kind rolebinding\n" +
			"  fleetctl audit --denied -o json",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			now := time.Now()
			if since != "" {
				t, err := parseTimeFlag("since", since, now)
				if err != nil {
					return err
				}
				req.Since = timestamppb.New(t)
			}
			if until != "" {
				t, err := parseTimeFlag("until", until, now)
				if err != nil {
					return err
				}
				req.Until = timestamppb.New(t)
			}
			if limit < 0 {
				return fmt.Errorf("--limit %d: want 0 (every row) or more", limit)
			}
			out := &auditv1.ListActivityResponse{}
			for {
				if limit > 0 {
					req.PageSize = int32(min(limit-len(out.Activities), 1000))
				}
				resp, err := call(cmd.Context(), f, auditv1connect.NewAuditServiceClient, auditv1connect.AuditServiceClient.ListActivity,
					&req, "list activity")
				if err != nil {
					return err
				}
				out.Activities = append(out.Activities, resp.GetActivities()...)
				out.NextPageToken = resp.GetNextPageToken()
				req.PageToken = out.NextPageToken
				if out.NextPageToken == "" || limit > 0 && len(out.Activities) >= limit {
					break
				}
			}
			p := f.printer()
			if p.Format != formatTable {
				return p.Print(out)
			}
			if err := p.PrintList(Messages(out.Activities), activityColumns()...); err != nil {
				return err
			}
			if out.NextPageToken != "" {
				p.Note("more rows match: go on with --page-token %s", out.NextPageToken)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&req.Actor, "actor", "", "only this actor's rows (a user, or system:<service>)")
	fl.StringVar(&req.Kind, "kind", "", "only objects of this kind (project, cluster, rolebinding, ...; a denied call's resource)")
	fl.StringVar(&req.Name, "name", "", "only the object of this name (with --kind)")
	fl.StringVarP(&req.Project, "project", "p", "", "only this project's rows")
	fl.StringVarP(&req.Cluster, "cluster", "c", "", "only rows naming this cluster")
	fl.BoolVar(&req.DeniedOnly, "denied", false, "only denied API calls")
	fl.StringVar(&since, "since", "", "rows at or after this time: RFC 3339 or a duration ago")
	fl.StringVar(&until, "until", "", "rows before this time: RFC 3339 or a duration ago")
	fl.StringVar(&req.PageToken, "page-token", "", "go on from a token an earlier call printed (same filters)")
	fl.IntVar(&limit, "limit", 100, "print at most this many rows (0: every matching row)")
	return cmd
}

// parseTimeFlag is parseTime with the flag's name in its error.
func parseTimeFlag(name, s string, now time.Time) (time.Time, error) {
	t, err := parseTime(s, now)
	if err != nil {
		return time.Time{}, fmt.Errorf("--%s %q: want RFC 3339 (2026-11-21T10:00:00Z) or a duration ago (2h)", name, s)
	}
	return t, nil
}

func activityColumns() []Column {
	return []Column{
		Col("TIME", func(a *auditv1.Activity) string { return a.GetTime().AsTime().UTC().Format(time.RFC3339) }),
		Col("ACTOR", (*auditv1.Activity).GetActor),
		Col("ACTION", func(a *auditv1.Activity) string {
			t := a.GetType()
			return t[strings.LastIndexByte(t, '.')+1:]
		}),
		Col("KIND", (*auditv1.Activity).GetKind),
		Col("NAME", (*auditv1.Activity).GetName),
		Col("PROJECT", (*auditv1.Activity).GetProject),
		Col("CLUSTER", (*auditv1.Activity).GetCluster),
		Col("DETAIL", func(a *auditv1.Activity) string {
			if a.GetProcedure() != "" {
				d := a.GetProcedure() + ": " + a.GetReason()
				if a.GetCount() > 1 {
					d += fmt.Sprintf(" (%d calls)", a.GetCount())
				}
				return d
			}
			return ""
		}),
	}
}
