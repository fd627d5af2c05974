package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
)

func newImportCommand(f *factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "import",
		Short: "Import clusters from other inventories with import policies (platform admins)",
	}
	cmd.AddCommand(newImportPreviewCommand(f), newImportPolicyCommand(f), newImportLifecyclesCommand(f))
	return cmd
}

func newImportPolicyCommand(f *factory) *cobra.Command {
	cmd := &cobra.Command{Use: "policy", Short: "Create, show and delete import policies"}
	var file string
	create := &cobra.Command{
		Use:     "create -f POLICY",
		Short:   "Create an import policy (YAML or JSON, proto field names)",
		Example: "  fleetctl import policy create -f capi-policy.yaml",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := readPolicy(f, file)
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), f, clusterv1connect.NewImportPolicyServiceClient, clusterv1connect.ImportPolicyServiceClient.CreateImportPolicy,
				&clusterv1.CreateImportPolicyRequest{Policy: p}, "create import policy %q", p.Name)
			if err != nil {
				return err
			}
			return f.printer().Print(resp.Policy, policyColumns()...)
		},
	}
	create.Flags().StringVarP(&file, "filename", "f", "", "the import policy")
	get := &cobra.Command{
		Use:   "get NAME",
		Short: "Show an import policy",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := call(cmd.Context(), f, clusterv1connect.NewImportPolicyServiceClient, clusterv1connect.ImportPolicyServiceClient.GetImportPolicy,
				&clusterv1.GetImportPolicyRequest{Name: args[0]}, "get import policy %q", args[0])
			if err != nil {
				return err
			}
			p := f.printer()
			if err := p.Print(resp.Policy, policyColumns()...); err != nil || p.Format != formatTable {
				return err
			}
			notePolicyConditions(p, resp.Policy.GetStatus())
			return nil
		},
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "List import policies",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			resp, err := call(cmd.Context(), f, clusterv1connect.NewImportPolicyServiceClient, clusterv1connect.ImportPolicyServiceClient.ListImportPolicies,
				&clusterv1.ListImportPoliciesRequest{}, "list import policies")
			if err != nil {
				return err
			}
			return f.printer().PrintList(Messages(resp.Policies), policyColumns()...)
		},
	}
	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete an import policy: the clusters it created are deregistered, adopted ones stay",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := call(cmd.Context(), f, clusterv1connect.NewImportPolicyServiceClient, clusterv1connect.ImportPolicyServiceClient.DeleteImportPolicy,
				&clusterv1.DeleteImportPolicyRequest{Name: args[0]}, "delete import policy %q", args[0]); err != nil {
				return err
			}
			fmt.Fprintf(f.streams.Out, "import policy %q deleted\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(create, get, list, del)
	return cmd
}

func newImportLifecyclesCommand(f *factory) *cobra.Command {
	return &cobra.Command{
		Use:   "lifecycles POLICY",
		Short: "List a policy's lifecycles: one per source object, with the cluster created or adopted and why not",
		Example: "  fleetctl import lifecycles capi\n" +
			"  fleetctl import lifecycles capi -o yaml   # every condition's reason and message",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := call(cmd.Context(), f, clusterv1connect.NewImportPolicyServiceClient, clusterv1connect.ImportPolicyServiceClient.ListImportLifecycles,
				&clusterv1.ListImportLifecyclesRequest{Policy: args[0]}, "list lifecycles of import policy %q", args[0])
			if err != nil {
				return err
			}
			return f.printer().PrintList(Messages(resp.Lifecycles), lifecycleColumns()...)
		},
	}
}

func lifecycleColumns() []Column {
	return []Column{
		Col("SOURCE", func(lc *clusterv1.ImportLifecycle) string {
			s := lc.GetSource()
			if s.GetNamespace() == "" {
				return s.GetName()
			}
			return s.GetNamespace() + "/" + s.GetName()
		}),
		Col("NAME", func(lc *clusterv1.ImportLifecycle) string { return lc.Name }),
		Col("CLUSTER", func(lc *clusterv1.ImportLifecycle) string { return lc.Cluster }),
		Col("MODE", func(lc *clusterv1.ImportLifecycle) string {
			switch lc.Mode {
			case clusterv1.ImportMode_IMPORT_MODE_CREATED:
				return "created"
			case clusterv1.ImportMode_IMPORT_MODE_ADOPTED:
				return "adopted"
			}
			return "-"
		}),
		// The first condition that does not hold says what the lifecycle waits for.
		Col("WAITING FOR", func(lc *clusterv1.ImportLifecycle) string {
			for _, c := range lc.Conditions {
				if c.Status == clusterv1.ConditionStatus_CONDITION_STATUS_TRUE || c.Type == "Adopted" && lc.Mode == clusterv1.ImportMode_IMPORT_MODE_CREATED ||
					c.Type == "Created" && lc.Mode == clusterv1.ImportMode_IMPORT_MODE_ADOPTED || c.Reason == "NotAdopted" {
					continue
				}
				if c.Message == "" {
					return c.Type + ": " + c.Reason
				}
				return c.Type + ": " + c.Reason + ": " + c.Message
			}
			return ""
		}),
		Col("LAST RENDER", func(lc *clusterv1.ImportLifecycle) string {
			if lc.LastRenderTime == nil {
				return ""
			}
			return lc.LastRenderTime.AsTime().UTC().Format("2006-01-02T15:04:05Z")
		}),
	}
}

func readPolicy(f *factory, path string) (*clusterv1.ImportPolicy, error) {
	if path == "" {
		return nil, fmt.Errorf("give the policy with -f")
	}
	js, err := readJSONOrYAML(f, path)
	if err != nil {
		return nil, err
	}
	p := &clusterv1.ImportPolicy{}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(js, p); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	return p, nil
}

func policyColumns() []Column {
	return []Column{
		Col("NAME", func(p *clusterv1.ImportPolicy) string { return p.Name }),
		Col("SOURCE CLUSTER", func(p *clusterv1.ImportPolicy) string { return p.GetSource().GetCluster() }),
		Col("SOURCE", func(p *clusterv1.ImportPolicy) string {
			r := p.GetSource().GetResource()
			if g := p.GetSource().GetGroup(); g != "" {
				r += "." + g
			}
			return r
		}),
		Col("REFERENCES", func(p *clusterv1.ImportPolicy) string { return fmt.Sprint(len(p.References)) }),
		Col("VALIDATED", func(p *clusterv1.ImportPolicy) string {
			for _, c := range p.GetStatus().GetConditions() {
				if c.Type == "Validated" {
					return conditionWord(c)
				}
			}
			return ""
		}),
		Col("SOURCES", func(p *clusterv1.ImportPolicy) string { return fmt.Sprint(p.GetStatus().GetSourceObjects()) }),
		Col("LIFECYCLES", func(p *clusterv1.ImportPolicy) string { return fmt.Sprint(p.GetStatus().GetLifecycles()) }),
		Col("CREATED", func(p *clusterv1.ImportPolicy) string { return fmt.Sprint(p.GetStatus().GetClustersCreated()) }),
		Col("ADOPTED", func(p *clusterv1.ImportPolicy) string { return fmt.Sprint(p.GetStatus().GetClustersAdopted()) }),
		Col("REVISION", func(p *clusterv1.ImportPolicy) string { return fmt.Sprint(p.Revision) }),
	}
}

// conditionWord is a condition's status as Kubernetes prints it, with the reason when it is not
// True.
func conditionWord(c *clusterv1.Condition) string {
	switch c.GetStatus() {
	case clusterv1.ConditionStatus_CONDITION_STATUS_TRUE:
		return "True"
	case clusterv1.ConditionStatus_CONDITION_STATUS_FALSE:
		return "False (" + c.GetReason() + ")"
	}
	return "Unknown (" + c.GetReason() + ")"
}

// notePolicyConditions prints a policy's conditions under its table, one per line.
func notePolicyConditions(p *Printer, s *clusterv1.ImportPolicyStatus) {
	if len(s.GetConditions()) == 0 {
		return
	}
	p.Note("")
	for _, c := range s.GetConditions() {
		st := strings.TrimPrefix(c.GetStatus().String(), "CONDITION_STATUS_")
		line := fmt.Sprintf("%s=%s%s %s", c.GetType(), st[:1], strings.ToLower(st[1:]), c.GetReason())
		if c.GetMessage() != "" {
			line += ": " + c.GetMessage()
		}
		p.Note("%s", line)
	}
}

func newImportPreviewCommand(f *factory) *cobra.Command {
	var policyFile, sourceFile string
	var refs []string
	cmd := &cobra.Command{
		Use:   "preview -f POLICY --source OBJECT [--ref KEY=FILE]...",
		Short: "Render an import policy against a source object, creating nothing",
		Long: "Render an import policy as the import would: the cluster's name, whether the creation\n" +
			"condition holds, its labels, claims, taints and server, and every problem with the policy\n" +
			"field it concerns. Credentials are rendered but never shown. Files are YAML or JSON, as\n" +
			"`kubectl get -o yaml` prints objects; - reads standard input.",
		Example: "  fleetctl import preview -f capi-policy.yaml --source cluster.yaml --ref kubeconfig=secret.yaml",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if policyFile == "" || sourceFile == "" {
				return fmt.Errorf("give the policy with -f and the source object with --source")
			}
			policy, err := readPolicy(f, policyFile)
			if err != nil {
				return err
			}
			req := &clusterv1.PreviewImportPolicyRequest{Policy: policy, References: map[string]string{}}
			js, err := readJSONOrYAML(f, sourceFile)
			if err != nil {
				return err
			}
			req.SourceObject = string(js)
			for _, r := range refs {
				key, file, ok := strings.Cut(r, "=")
				if !ok || key == "" || file == "" {
					return fmt.Errorf("--ref %q: want KEY=FILE", r)
				}
				if js, err = readJSONOrYAML(f, file); err != nil {
					return err
				}
				req.References[key] = string(js)
			}
			resp, err := call(cmd.Context(), f, clusterv1connect.NewImportPolicyServiceClient, clusterv1connect.ImportPolicyServiceClient.PreviewImportPolicy,
				req, "preview import policy %q", req.Policy.Name)
			if err != nil {
				return err
			}
			if err := f.printer().Print(resp, previewColumns()...); err != nil {
				return err
			}
			if len(resp.Errors) > 0 {
				return fmt.Errorf("the policy has %d problem(s)", len(resp.Errors))
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&policyFile, "filename", "f", "", "the import policy (YAML or JSON, proto field names)")
	fl.StringVar(&sourceFile, "source", "", "the source object")
	fl.StringArrayVar(&refs, "ref", nil, "a referenced object: KEY=FILE (repeatable)")
	return cmd
}

func readJSONOrYAML(f *factory, path string) ([]byte, error) {
	data, err := readFileOrStdin(path, f.streams.In)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	return js, nil
}

func previewColumns() []Column {
	return []Column{
		Col("NAME", func(p *clusterv1.PreviewImportPolicyResponse) string { return p.Name }),
		Col("CREATE", func(p *clusterv1.PreviewImportPolicyResponse) string { return fmt.Sprint(p.Create) }),
		Col("LABELS", func(p *clusterv1.PreviewImportPolicyResponse) string { return joinMap(p.GetCluster().GetLabels()) }),
		Col("SERVER", func(p *clusterv1.PreviewImportPolicyResponse) string { return p.GetCluster().GetServer() }),
		Col("CREDENTIALS", func(p *clusterv1.PreviewImportPolicyResponse) string {
			if p.GetCluster().GetCredentialsRendered() {
				return "rendered (not shown)"
			}
			return "none"
		}),
		Col("ERRORS", func(p *clusterv1.PreviewImportPolicyResponse) string {
			var out []string
			for _, e := range p.Errors {
				out = append(out, e.Field+": "+e.Message)
			}
			return strings.Join(out, "; ")
		}),
	}
}
