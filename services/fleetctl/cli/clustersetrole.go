package cli

import (
	"github.com/spf13/cobra"

	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1/placementv1connect"
)

func newClusterSetRoleCommand(f *factory) *cobra.Command {
	cmd := newGroupCommand("role", "Grant users and groups a role on one cluster set (clusterset-admin, clusterset-view)")
	cmd.Aliases = []string{"roles"}
	cmd.AddCommand(
		newClusterSetRoleBindCommand(f),
		newClusterSetRoleUnbindCommand(f),
		newClusterSetRoleListCommand(f),
	)
	return cmd
}

// setRoleFlags name a set role binding's subject (a user or a group: service accounts never
// call the API) and its role.
type setRoleFlags struct {
	subject subjectFlags
	role    string
}

func (s *setRoleFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&s.subject.user, "user", "", "the subject is this user")
	fl.StringVar(&s.subject.group, "group", "", "the subject is this group")
	fl.StringVar(&s.role, "role", "", "clusterset-admin or clusterset-view (required)")
	_ = cmd.MarkFlagRequired("role")
}

func newClusterSetRoleBindCommand(f *factory) *cobra.Command {
	var fl setRoleFlags
	cmd := &cobra.Command{
		Use:   "bind SET (--user U | --group G) --role clusterset-admin|clusterset-view",
		Short: "Grant a user or group a role on a cluster set (platform admins and the set's admins)",
		Long: "Grant a user or a group a role on one cluster set.\n" +
			"clusterset-admin updates the labels and taints of the set's clusters, moves clusters into and\n" +
			"out of the set (moving one between sets needs the role on both), binds the set to projects\n" +
			"where it may also manage placements, and binds the set's roles. clusterset-view reads the\n" +
			"set, its role bindings and the projects it is bound to.",
		Example: "  fleetctl clusterset role bind eu --user alice --role clusterset-admin\n" +
			"  fleetctl clusterset role bind eu --group sre --role clusterset-view",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := fl.subject.subject(false)
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), f, placementv1connect.NewClusterSetServiceClient, placementv1connect.ClusterSetServiceClient.BindClusterSetRole,
				&placementv1.BindClusterSetRoleRequest{ClusterSet: args[0], Subject: s, Role: fl.role}, "grant %s %s on cluster set %q", formatSubject(s), fl.role, args[0])
			if err != nil {
				return err
			}
			return f.printer().Print(resp.GetBinding(), setRoleColumns()...)
		},
	}
	fl.add(cmd)
	return cmd
}

func newClusterSetRoleUnbindCommand(f *factory) *cobra.Command {
	var fl setRoleFlags
	cmd := &cobra.Command{
		Use:     "unbind SET (--user U | --group G) --role clusterset-admin|clusterset-view",
		Short:   "Revoke a user's or group's role on a cluster set (platform admins and the set's admins)",
		Example: "  fleetctl clusterset role unbind eu --user alice --role clusterset-admin",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := fl.subject.subject(false)
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), f, placementv1connect.NewClusterSetServiceClient, placementv1connect.ClusterSetServiceClient.UnbindClusterSetRole,
				&placementv1.UnbindClusterSetRoleRequest{ClusterSet: args[0], Subject: s, Role: fl.role}, "revoke %s %s on cluster set %q", formatSubject(s), fl.role, args[0])
			if err != nil {
				return err
			}
			return f.printer().PrintOrNote(resp, "role %q of %s on cluster set %q revoked", fl.role, formatSubject(s), args[0])
		},
	}
	fl.add(cmd)
	return cmd
}

func newClusterSetRoleListCommand(f *factory) *cobra.Command {
	return &cobra.Command{
		Use:     "list [SET]",
		Aliases: []string{"ls"},
		Short:   "List cluster set role bindings (of one set); you see those of the sets you hold a role on",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &placementv1.ListClusterSetRoleBindingsRequest{}
			if len(args) == 1 {
				req.ClusterSet = args[0]
			}
			resp, err := call(cmd.Context(), f, placementv1connect.NewClusterSetServiceClient, placementv1connect.ClusterSetServiceClient.ListClusterSetRoleBindings,
				req, "list cluster set role bindings")
			if err != nil {
				return err
			}
			return f.printer().PrintList(Messages(resp.GetBindings()), setRoleColumns()...)
		},
	}
}

func setRoleColumns() []Column {
	return []Column{
		Col("CLUSTER SET", (*placementv1.ClusterSetRoleBinding).GetClusterSet),
		Col("SUBJECT", func(b *placementv1.ClusterSetRoleBinding) string { return formatSubject(b.GetSubject()) }),
		Col("ROLE", (*placementv1.ClusterSetRoleBinding).GetRole),
		Col("BY", (*placementv1.ClusterSetRoleBinding).GetCreator),
		Col("SINCE", func(b *placementv1.ClusterSetRoleBinding) string {
			if b.GetCreateTime() == nil {
				return ""
			}
			return b.GetCreateTime().AsTime().UTC().Format("2006-01-02T15:04:05Z")
		}),
	}
}
