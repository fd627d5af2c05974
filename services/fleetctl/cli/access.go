package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1/rbacv1connect"
)

func newAccessCommand(f *factory) *cobra.Command {
	cmd := newGroupCommand("access", "Review who can do what where, now or at a past moment")
	cmd.AddCommand(newAccessWhoCanCommand(f), newAccessAtCommand(f))
	return cmd
}

func newAccessWhoCanCommand(f *factory) *cobra.Command {
	var apiGroup string
	cmd := &cobra.Command{
		Use:   "who-can CLUSTER NAMESPACE [VERB RESOURCE]",
		Short: "List the subjects with a role in a namespace of a cluster, and the bindings that grant it",
		Example: "  fleetctl access who-can prod-eu-1 web\n" +
			"  fleetctl access who-can prod-eu-1 web delete pods\n" +
			"  fleetctl access who-can prod-eu-1 web update deployments --api-group apps",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 2 && len(args) != 4 {
				return fmt.Errorf("want CLUSTER NAMESPACE [VERB RESOURCE], got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &rbacv1.WhoCanRequest{Cluster: args[0], Namespace: args[1], ApiGroup: apiGroup}
			if len(args) == 4 {
				req.Verb, req.Resource = args[2], args[3]
			}
			resp, err := call(cmd.Context(), f, rbacv1connect.NewRBACServiceClient, rbacv1connect.RBACServiceClient.WhoCan,
				req, "who can in %s/%s", args[0], args[1])
			if err != nil {
				return err
			}
			p := f.printer()
			if p.Format != formatTable {
				return p.Print(resp)
			}
			if resp.GetProject() == "" {
				p.Note("%s/%s belongs to no project: Fleetstream grants nothing there.", args[0], args[1])
				return nil
			}
			p.Note("%s/%s belongs to project %q", args[0], args[1], resp.GetProject())
			return p.PrintList(Messages(resp.GetGrants()), grantColumns(false)...)
		},
	}
	cmd.Flags().StringVar(&apiGroup, "api-group", "", `API group of RESOURCE ("" is the core group)`)
	return cmd
}

func newAccessAtCommand(f *factory) *cobra.Command {
	var (
		subject subjectFlags
		at      string
	)
	cmd := &cobra.Command{
		Use:   "at (--user U | --group G | --service-account NS:NAME) --time TIME",
		Short: "What a subject could do where at a past moment, answered from the event log",
		Long: "List the roles a subject held, in which namespaces of which clusters and through which\n" +
			"project, at TIME (RFC 3339, e.g. 2026-11-21T10:00:00Z, or a duration ago such as 2h).",
		Example: "  fleetctl access at --user alice --time 2026-11-21T10:00:00Z\n  fleetctl access at --group ops --time 36h",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := subject.subject(false)
			if err != nil {
				return err
			}
			when, err := parseTime(at, time.Now())
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), f, rbacv1connect.NewRBACServiceClient, rbacv1connect.RBACServiceClient.AccessAt,
				&rbacv1.AccessAtRequest{Subject: s, Time: timestamppb.New(when)}, "access of %s at %s", formatSubject(s), when.Format(time.RFC3339))
			if err != nil {
				return err
			}
			p := f.printer()
			if p.Format != formatTable {
				return p.Print(resp)
			}
			p.Note("%s at %s:", formatSubject(s), when.UTC().Format(time.RFC3339))
			return p.PrintList(Messages(resp.GetGrants()), grantColumns(true)...)
		},
	}
	subject.add(cmd)
	cmd.Flags().StringVar(&at, "time", "", "the moment: RFC 3339 or a duration ago (required)")
	_ = cmd.MarkFlagRequired("time")
	return cmd
}

// parseTime accepts RFC 3339 or a Go duration meaning that long before now.
func parseTime(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("--time %q: want RFC 3339 (2026-11-21T10:00:00Z) or a duration ago (2h)", s)
}

func grantColumns(withPlace bool) []Column {
	var cols []Column
	if withPlace {
		cols = append(cols,
			Col("CLUSTER", (*rbacv1.Grant).GetCluster),
			Col("NAMESPACE", (*rbacv1.Grant).GetNamespace),
			Col("PROJECT", (*rbacv1.Grant).GetProject),
		)
	} else {
		cols = append(cols, Col("SUBJECT", func(g *rbacv1.Grant) string { return formatSubject(g.GetSubject()) }))
	}
	return append(cols,
		Col("ROLE", func(g *rbacv1.Grant) string {
			if g.GetTemplateMissing() {
				return g.GetRoleTemplate() + " (deleted)"
			}
			return g.GetRoleTemplate()
		}),
		Col("ROLEBINDING", (*rbacv1.Grant).GetRoleBinding),
		Col("RULES", func(g *rbacv1.Grant) string {
			rules := make([]string, len(g.GetRules()))
			for i, r := range g.GetRules() {
				rules[i] = shortRule(r)
			}
			return strings.Join(rules, " ")
		}),
	)
}

// shortRule renders a rule as verbs:resources, the --rule syntax.
func shortRule(r *rbacv1.PolicyRule) string {
	if len(r.GetNonResourceUrls()) > 0 {
		return strings.Join(r.GetVerbs(), ",") + ":" + strings.Join(r.GetNonResourceUrls(), ",")
	}
	var res []string
	for _, g := range r.GetApiGroups() {
		for _, rs := range r.GetResources() {
			if g != "" {
				rs += "." + g
			}
			res = append(res, rs)
		}
	}
	out := strings.Join(r.GetVerbs(), ",") + ":" + strings.Join(res, ",")
	if len(r.GetResourceNames()) > 0 {
		out += ":" + strings.Join(r.GetResourceNames(), ",")
	}
	return out
}
