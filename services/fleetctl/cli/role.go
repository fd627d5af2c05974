package cli

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"sigs.k8s.io/yaml"

	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1/rbacv1connect"
)

func newRoleCommand(f *factory) *cobra.Command {
	cmd := newGroupCommand("role", "Manage role templates, the custom roles every member cluster gets")
	cmd.Aliases = []string{"roles", "roletemplate"}
	cmd.AddCommand(
		newRoleCreateCommand(f),
		newRoleUpdateCommand(f),
		newRoleDeleteCommand(f),
		newRoleGetCommand(f),
		newRoleListCommand(f),
		newRoleStatusCommand(f),
	)
	return cmd
}

// roleFlags are the mutable fields of a template, shared by create and update.
type roleFlags struct {
	rules       []string
	inherits    []string
	displayName string
	locked      bool
	file        string
}

const ruleSyntax = "VERBS:RESOURCES[:NAMES], comma-separated lists; a resource is resource[.group] as kubectl writes it " +
	"(pods, deployments.apps, pods/log), a non-resource URL starts with / (get:/healthz)"

func (r *roleFlags) add(cmd *cobra.Command, verb string) {
	fl := cmd.Flags()
	fl.StringArrayVar(&r.rules, "rule", nil, "policy rule "+ruleSyntax+" (repeatable)"+verb)
	fl.StringSliceVar(&r.inherits, "inherits", nil, "templates whose rules this one also grants, comma-separated"+verb)
	fl.StringVar(&r.displayName, "display-name", "", "human-readable name")
	fl.BoolVar(&r.locked, "locked", false, "accept no new bindings (existing ones stay)")
	fl.StringVarP(&r.file, "filename", "f", "", "read the template from a JSON or YAML file (- for stdin), as `role get -o yaml` prints it")
}

// parseRule parses one --rule. Resources of different API groups become one rule per group,
// because a PolicyRule grants every listed resource in every listed group.
func parseRule(s string) ([]*rbacv1.PolicyRule, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return nil, fmt.Errorf("--rule %q: want %s", s, ruleSyntax)
	}
	verbs := splitCSV(parts[0])
	targets := splitCSV(parts[1])
	var names []string
	if len(parts) == 3 {
		names = splitCSV(parts[2])
	}
	if strings.HasPrefix(targets[0], "/") {
		for _, u := range targets {
			if !strings.HasPrefix(u, "/") {
				return nil, fmt.Errorf("--rule %q: mixes resources and non-resource URLs", s)
			}
		}
		if len(names) > 0 {
			return nil, fmt.Errorf("--rule %q: non-resource URLs take no resource names", s)
		}
		return []*rbacv1.PolicyRule{{Verbs: verbs, NonResourceUrls: targets}}, nil
	}
	byGroup := map[string][]string{}
	var groups []string
	for _, t := range targets {
		if strings.HasPrefix(t, "/") {
			return nil, fmt.Errorf("--rule %q: mixes resources and non-resource URLs", s)
		}
		res, group := splitResource(t)
		if _, ok := byGroup[group]; !ok {
			groups = append(groups, group)
		}
		byGroup[group] = append(byGroup[group], res)
	}
	out := make([]*rbacv1.PolicyRule, 0, len(groups))
	for _, g := range groups {
		out = append(out, &rbacv1.PolicyRule{Verbs: verbs, ApiGroups: []string{g}, Resources: byGroup[g], ResourceNames: names})
	}
	return out, nil
}

// splitResource splits kubectl's resource.group (the subresource stays with the resource):
// "deployments.apps" -> deployments, apps; "pods/log" -> pods/log, ""; "*.*" -> *, *.
func splitResource(s string) (resource, group string) {
	sub := ""
	if i := strings.Index(s, "/"); i >= 0 {
		s, sub = s[:i], s[i:]
	}
	resource, group, _ = strings.Cut(s, ".")
	return resource + sub, group
}

func splitCSV(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// template builds the template from a file or from the flags.
func (r *roleFlags) template(f *factory, name string) (*rbacv1.RoleTemplate, error) {
	t := &rbacv1.RoleTemplate{}
	if r.file != "" {
		data, err := readFileOrStdin(r.file, f.streams.In)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", r.file, err)
		}
		js, err := yaml.YAMLToJSON(data)
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", r.file, err)
		}
		// Strict, as the server decodes JSON and as the other files fleetctl reads: a field
		// misspelt in the file would otherwise vanish, and a template lose its rules.
		if err := (protojson.UnmarshalOptions{}).Unmarshal(js, t); err != nil {
			return nil, fmt.Errorf("parse %s: %w", r.file, err)
		}
	}
	if name != "" {
		if t.Name != "" && t.Name != name {
			return nil, fmt.Errorf("name %q given and %q in %s", name, t.Name, r.file)
		}
		t.Name = name
	}
	for _, s := range r.rules {
		rules, err := parseRule(s)
		if err != nil {
			return nil, err
		}
		t.Rules = append(t.Rules, rules...)
	}
	if len(r.inherits) > 0 {
		t.Inherits = r.inherits
	}
	if r.displayName != "" {
		t.DisplayName = r.displayName
	}
	if r.locked {
		t.Locked = true
	}
	return t, nil
}

func newRoleCreateCommand(f *factory) *cobra.Command {
	var flags roleFlags
	cmd := &cobra.Command{
		Use:   "create [NAME]",
		Short: "Create a role template (platform admins)",
		Long: "Create a role template. It becomes the ClusterRole fleetstream:NAME on every member\n" +
			"cluster, with its own rules and those of every template it inherits.",
		Example: "  fleetctl role create pod-reader --rule get,list,watch:pods,pods/log\n" +
			"  fleetctl role create deployer --inherits pod-reader --rule '*:deployments.apps,services'\n" +
			"  fleetctl role create -f auditor.yaml",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			t, err := flags.template(f, name)
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), f, rbacv1connect.NewRBACServiceClient, rbacv1connect.RBACServiceClient.CreateRoleTemplate,
				&rbacv1.CreateRoleTemplateRequest{Template: t}, "create role template %q", t.Name)
			if err != nil {
				return err
			}
			return f.printer().Print(resp.GetTemplate(), roleColumns(time.Now)...)
		},
	}
	flags.add(cmd, "")
	return cmd
}

func newRoleUpdateCommand(f *factory) *cobra.Command {
	var (
		flags    roleFlags
		revision uint64
	)
	cmd := &cobra.Command{
		Use:   "update NAME",
		Short: "Replace a role template's rules, inherited templates, display name or lock",
		Long: "Replace the fields whose flags are given; a given flag replaces the whole field\n" +
			"(--rule replaces every rule). --locked=false unlocks. Every member cluster's ClusterRole\n" +
			"follows, and so do the ClusterRoles of every template that inherits this one.",
		Example: "  fleetctl role update pod-reader --rule get,list,watch:pods\n  fleetctl role update legacy --locked",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			t, err := flags.template(f, args[0])
			if err != nil {
				return err
			}
			var paths []string
			for flag, path := range map[string]string{"rule": "rules", "inherits": "inherits", "display-name": "display_name", "locked": "locked"} {
				if cmd.Flags().Changed(flag) {
					paths = append(paths, path)
				}
			}
			if flags.file != "" {
				paths = []string{"display_name", "rules", "inherits", "locked"}
			}
			if len(paths) == 0 {
				return fmt.Errorf("nothing to update: give at least one of --rule, --inherits, --display-name, --locked, -f")
			}
			sort.Strings(paths)
			resp, err := call(cmd.Context(), f, rbacv1connect.NewRBACServiceClient, rbacv1connect.RBACServiceClient.UpdateRoleTemplate,
				&rbacv1.UpdateRoleTemplateRequest{Template: t, UpdateMask: &fieldmaskpb.FieldMask{Paths: paths}, ExpectedRevision: revision}, "update role template %q", t.Name)
			if err != nil {
				return err
			}
			return f.printer().Print(resp.GetTemplate(), roleColumns(time.Now)...)
		},
	}
	flags.add(cmd, "; replaces all")
	cmd.Flags().Uint64Var(&revision, "expected-revision", 0, "apply only if the template's revision still equals this (0: unconditionally)")
	return cmd
}

func newRoleDeleteCommand(f *factory) *cobra.Command {
	var revision uint64
	cmd := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a role template; its ClusterRoles and RoleBindings are removed everywhere",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := call(cmd.Context(), f, rbacv1connect.NewRBACServiceClient, rbacv1connect.RBACServiceClient.DeleteRoleTemplate,
				&rbacv1.DeleteRoleTemplateRequest{Name: args[0], ExpectedRevision: revision}, "delete role template %q", args[0])
			if err != nil {
				return err
			}
			return f.printer().PrintOrNote(resp, "role template %q deleted", args[0])
		},
	}
	cmd.Flags().Uint64Var(&revision, "expected-revision", 0, "delete only if the template's revision still equals this (0: unconditionally)")
	return cmd
}

func newRoleGetCommand(f *factory) *cobra.Command {
	return &cobra.Command{
		Use:   "get NAME",
		Short: "Show one role template with its effective rules",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := call(cmd.Context(), f, rbacv1connect.NewRBACServiceClient, rbacv1connect.RBACServiceClient.GetRoleTemplate,
				&rbacv1.GetRoleTemplateRequest{Name: args[0]}, "get role template %q", args[0])
			if err != nil {
				return err
			}
			p := f.printer()
			t := resp.GetTemplate()
			if err := p.Print(t, roleColumns(time.Now)...); err != nil || p.Format != formatTable {
				return err
			}
			p.Note("")
			return p.PrintList(Messages(t.GetEffectiveRules()), ruleColumns()...)
		},
	}
}

func newRoleListCommand(f *factory) *cobra.Command {
	return &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List role templates",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			resp, err := call(cmd.Context(), f, rbacv1connect.NewRBACServiceClient, rbacv1connect.RBACServiceClient.ListRoleTemplates,
				&rbacv1.ListRoleTemplatesRequest{}, "list role templates")
			if err != nil {
				return err
			}
			list := resp.GetTemplates()
			sort.Slice(list, func(i, j int) bool { return list[i].GetName() < list[j].GetName() })
			return f.printer().PrintList(Messages(list), roleColumns(time.Now)...)
		},
	}
}

func newRoleStatusCommand(f *factory) *cobra.Command {
	return &cobra.Command{
		Use:   "status NAME",
		Short: "Show which revision of the template's ClusterRole each cluster applied, and what failed",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return printPropagation(cmd, f, &rbacv1.GetPropagationStatusRequest{Target: &rbacv1.GetPropagationStatusRequest_RoleTemplate{RoleTemplate: args[0]}})
		},
	}
}

// printPropagation asks for and prints a propagation status.
func printPropagation(cmd *cobra.Command, f *factory, req *rbacv1.GetPropagationStatusRequest) error {
	resp, err := call(cmd.Context(), f, rbacv1connect.NewRBACServiceClient, rbacv1connect.RBACServiceClient.GetPropagationStatus,
		req, "propagation status")
	if err != nil {
		return err
	}
	p := f.printer()
	if p.Format != formatTable {
		return p.Print(resp)
	}
	if err := p.PrintList(Messages(resp.GetClusters()), propagationColumns()...); err != nil {
		return err
	}
	p.Note("\n%d up to date, %d pending, %d failed", resp.GetUpToDate(), resp.GetPending(), resp.GetFailed())
	return nil
}

func roleColumns(now func() time.Time) []Column {
	return []Column{
		Col("NAME", (*rbacv1.RoleTemplate).GetName),
		Col("CLUSTERROLE", func(t *rbacv1.RoleTemplate) string { return "fleetstream:" + t.GetName() }),
		Col("RULES", func(t *rbacv1.RoleTemplate) string { return strconv.Itoa(len(t.GetEffectiveRules())) }),
		Col("INHERITS", func(t *rbacv1.RoleTemplate) string { return strings.Join(t.GetInherits(), ",") }),
		Col("LOCKED", func(t *rbacv1.RoleTemplate) string { return strconv.FormatBool(t.GetLocked()) }),
		Col("AGE", func(t *rbacv1.RoleTemplate) string {
			if t.GetCreateTime() == nil {
				return ""
			}
			return age(now(), t.GetCreateTime().AsTime())
		}),
	}
}

func ruleColumns() []Column {
	return []Column{
		Col("API GROUPS", func(r *rbacv1.PolicyRule) string { return joinGroups(r.GetApiGroups()) }),
		Col("RESOURCES", func(r *rbacv1.PolicyRule) string {
			if len(r.GetNonResourceUrls()) > 0 {
				return strings.Join(r.GetNonResourceUrls(), ",")
			}
			return strings.Join(r.GetResources(), ",")
		}),
		Col("NAMES", func(r *rbacv1.PolicyRule) string { return strings.Join(r.GetResourceNames(), ",") }),
		Col("VERBS", func(r *rbacv1.PolicyRule) string { return strings.Join(r.GetVerbs(), ",") }),
	}
}

// joinGroups shows the core group as "" the way kubectl describe does.
func joinGroups(groups []string) string {
	out := make([]string, len(groups))
	for i, g := range groups {
		if g == "" {
			g = `""`
		}
		out[i] = g
	}
	return strings.Join(out, ",")
}

func propagationColumns() []Column {
	return []Column{
		Col("CLUSTER", (*rbacv1.ClusterPropagation).GetCluster),
		Col("KIND", (*rbacv1.ClusterPropagation).GetKind),
		Col("NAMESPACE", (*rbacv1.ClusterPropagation).GetNamespace),
		Col("NAME", (*rbacv1.ClusterPropagation).GetName),
		Col("DESIRED", func(c *rbacv1.ClusterPropagation) string {
			s := strconv.FormatUint(c.GetDesiredRevision(), 10)
			if c.GetTombstone() {
				s += " (delete)"
			}
			return s
		}),
		Col("APPLIED", func(c *rbacv1.ClusterPropagation) string {
			if c.GetAppliedRevision() == 0 {
				return ""
			}
			return strconv.FormatUint(c.GetAppliedRevision(), 10)
		}),
		Col("STATE", func(c *rbacv1.ClusterPropagation) string {
			switch {
			case c.GetUpToDate():
				return "UpToDate"
			case c.GetPhase().String() == "PHASE_FAILED":
				return "Failed"
			}
			return "Pending"
		}),
		Col("REASON", func(c *rbacv1.ClusterPropagation) string {
			if c.GetMessage() != "" {
				return c.GetReason() + ": " + c.GetMessage()
			}
			return c.GetReason()
		}),
	}
}
