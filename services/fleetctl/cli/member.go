package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1/rbacv1connect"
)

func newMemberCommand(f *factory) *cobra.Command {
	cmd := newGroupCommand("member", "Grant users, groups and service accounts roles in projects")
	cmd.Aliases = []string{"members"}
	cmd.AddCommand(
		newMemberAddCommand(f),
		newMemberRemoveCommand(f),
		newMemberListCommand(f),
		newMemberStatusCommand(f),
	)
	return cmd
}

// subjectFlags name one subject: exactly one of --user, --group, --service-account.
type subjectFlags struct {
	user, group, serviceAccount string
}

func (s *subjectFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&s.user, "user", "", "the subject is this user")
	fl.StringVar(&s.group, "group", "", "the subject is this group")
	fl.StringVar(&s.serviceAccount, "service-account", "", "the subject is this service account, NAMESPACE:NAME")
}

// subject returns the subject the flags name; with optional, none given is allowed (nil).
func (s *subjectFlags) subject(optional bool) (*rbacv1.Subject, error) {
	var out []*rbacv1.Subject
	if s.user != "" {
		out = append(out, &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: s.user})
	}
	if s.group != "" {
		out = append(out, &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_GROUP, Name: s.group})
	}
	if s.serviceAccount != "" {
		ns, name, ok := strings.Cut(s.serviceAccount, ":")
		if !ok || ns == "" || name == "" {
			return nil, fmt.Errorf("--service-account %q: want NAMESPACE:NAME", s.serviceAccount)
		}
		out = append(out, &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_SERVICE_ACCOUNT, Name: name, Namespace: ns})
	}
	switch {
	case len(out) > 1:
		return nil, errors.New("give only one of --user, --group, --service-account")
	case len(out) == 0 && optional:
		return nil, nil
	case len(out) == 0:
		return nil, errors.New("give one of --user, --group, --service-account")
	}
	return out[0], nil
}

func newMemberAddCommand(f *factory) *cobra.Command {
	var (
		subject subjectFlags
		role    string
		dryRun  bool
	)
	cmd := &cobra.Command{
		Use:   "add PROJECT (--user U | --group G | --service-account NS:NAME) --role TEMPLATE",
		Short: "Grant a subject a role in every namespace of a project, on every cluster",
		Long: "Grant a subject a role template in every namespace the project owns, on every cluster.\n" +
			"You must hold every rule of the role in the project yourself (or be a platform admin).\n" +
			"--dry-run lists the RoleBindings that would be created or changed, per cluster.",
		Example: "  fleetctl member add team-a --user alice --role pod-reader\n" +
			"  fleetctl member add team-a --service-account ci:deployer --role deployer --dry-run",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := subject.subject(false)
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), f, rbacv1connect.NewRBACServiceClient, rbacv1connect.RBACServiceClient.BindProjectRole,
				&rbacv1.BindProjectRoleRequest{Project: args[0], Subject: s, RoleTemplate: role, DryRun: dryRun}, "add %s to project %q as %s", formatSubject(s), args[0], role)
			if err != nil {
				return err
			}
			verb := "granted"
			if dryRun {
				verb = "would be granted (dry run)"
			}
			return printRoleChange(f.printer(), resp,
				fmt.Sprintf("%s %s role %q in project %q", formatSubject(s), verb, role, args[0]))
		},
	}
	subject.add(cmd)
	cmd.Flags().StringVar(&role, "role", "", "role template to grant (required)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "only list the RoleBindings the change would create or change")
	_ = cmd.MarkFlagRequired("role")
	return cmd
}

func newMemberRemoveCommand(f *factory) *cobra.Command {
	var (
		subject subjectFlags
		role    string
		dryRun  bool
	)
	cmd := &cobra.Command{
		Use:     "remove PROJECT (--user U | --group G | --service-account NS:NAME) --role TEMPLATE",
		Aliases: []string{"rm"},
		Short:   "Revoke a subject's role in a project, everywhere",
		Example: "  fleetctl member remove team-a --user alice --role pod-reader --dry-run",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := subject.subject(false)
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), f, rbacv1connect.NewRBACServiceClient, rbacv1connect.RBACServiceClient.UnbindProjectRole,
				&rbacv1.UnbindProjectRoleRequest{Project: args[0], Subject: s, RoleTemplate: role, DryRun: dryRun}, "remove %s from project %q as %s", formatSubject(s), args[0], role)
			if err != nil {
				return err
			}
			verb := "revoked"
			if dryRun {
				verb = "would be revoked (dry run)"
			}
			return printRoleChange(f.printer(), resp,
				fmt.Sprintf("role %q of %s in project %q %s", role, formatSubject(s), args[0], verb))
		},
	}
	subject.add(cmd)
	cmd.Flags().StringVar(&role, "role", "", "role template to revoke (required)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "only list the RoleBindings the change would change or delete")
	_ = cmd.MarkFlagRequired("role")
	return cmd
}

// printRoleChange prints a bind or unbind response: as is with JSON or YAML; with a table,
// the note and then the planned RoleBinding changes.
func printRoleChange(p *Printer, msg interface {
	proto.Message
	GetPlan() []*rbacv1.PlannedChange
}, note string) error {
	if p.Format != formatTable {
		return p.Print(msg)
	}
	p.Note("%s", note)
	return printPlan(p, msg.GetPlan())
}

func printPlan(p *Printer, plan []*rbacv1.PlannedChange) error {
	if len(plan) == 0 {
		p.Note("No RoleBinding changes on any cluster.")
		return nil
	}
	p.Note("")
	return p.PrintList(Messages(plan), planColumns()...)
}

func newMemberListCommand(f *factory) *cobra.Command {
	var (
		subject subjectFlags
		role    string
	)
	cmd := &cobra.Command{
		Use:     "list [PROJECT]",
		Aliases: []string{"ls"},
		Short:   "List project role bindings",
		Example: "  fleetctl member list team-a\n  fleetctl member list --user alice",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := subject.subject(true)
			if err != nil {
				return err
			}
			req := &rbacv1.ListProjectRoleBindingsRequest{Subject: s, RoleTemplate: role}
			if len(args) == 1 {
				req.Project = args[0]
			}
			bindings, err := allProjectRoleBindings(cmd.Context(), f, req)
			if err != nil {
				return err
			}
			return f.printer().PrintList(Messages(bindings), memberColumns()...)
		},
	}
	subject.add(cmd)
	cmd.Flags().StringVar(&role, "role", "", "only bindings of this role template")
	return cmd
}

func newMemberStatusCommand(f *factory) *cobra.Command {
	var (
		subject subjectFlags
		role    string
	)
	cmd := &cobra.Command{
		Use:   "status PROJECT (--user U | --group G | --service-account NS:NAME) --role TEMPLATE",
		Short: "Show, per cluster and namespace, which revision of the binding's RoleBinding was applied",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := subject.subject(false)
			if err != nil {
				return err
			}
			return printPropagation(cmd, f, &rbacv1.GetPropagationStatusRequest{Target: &rbacv1.GetPropagationStatusRequest_Binding{
				Binding: &rbacv1.BindingRef{Project: args[0], Subject: s, RoleTemplate: role}}})
		},
	}
	subject.add(cmd)
	cmd.Flags().StringVar(&role, "role", "", "role template of the binding (required)")
	_ = cmd.MarkFlagRequired("role")
	return cmd
}

// formatSubject renders a subject as User:alice, Group:ops or ServiceAccount:ci:deployer.
func formatSubject(s *rbacv1.Subject) string {
	switch s.GetKind() {
	case rbacv1.SubjectKind_SUBJECT_KIND_USER:
		return "User:" + s.GetName()
	case rbacv1.SubjectKind_SUBJECT_KIND_GROUP:
		return "Group:" + s.GetName()
	case rbacv1.SubjectKind_SUBJECT_KIND_SERVICE_ACCOUNT:
		return "ServiceAccount:" + s.GetNamespace() + ":" + s.GetName()
	}
	return s.GetKind().String() + ":" + s.GetName()
}

func formatSubjects(ss []*rbacv1.Subject) string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = formatSubject(s)
	}
	return strings.Join(out, ",")
}

func memberColumns() []Column {
	return []Column{
		Col("PROJECT", (*rbacv1.ProjectRoleBinding).GetProject),
		Col("SUBJECT", func(b *rbacv1.ProjectRoleBinding) string { return formatSubject(b.GetSubject()) }),
		Col("ROLE", (*rbacv1.ProjectRoleBinding).GetRoleTemplate),
		Col("BY", (*rbacv1.ProjectRoleBinding).GetCreator),
		Col("SINCE", func(b *rbacv1.ProjectRoleBinding) string {
			if b.GetCreateTime() == nil {
				return ""
			}
			return b.GetCreateTime().AsTime().UTC().Format("2006-01-02T15:04:05Z")
		}),
	}
}

func planColumns() []Column {
	return []Column{
		Col("CLUSTER", (*rbacv1.PlannedChange).GetCluster),
		Col("NAMESPACE", (*rbacv1.PlannedChange).GetNamespace),
		Col("ROLEBINDING", (*rbacv1.PlannedChange).GetName),
		Col("ACTION", func(c *rbacv1.PlannedChange) string {
			return strings.ToLower(strings.TrimPrefix(c.GetAction().String(), "CHANGE_ACTION_"))
		}),
		Col("SUBJECTS AFTER", func(c *rbacv1.PlannedChange) string { return formatSubjects(c.GetSubjectsAfter()) }),
	}
}
