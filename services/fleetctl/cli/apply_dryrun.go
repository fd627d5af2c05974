package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1/endpointv1connect"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1/placementv1connect"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1/rbacv1connect"
	"github.com/fleetstream/fleetstream/pkg/weights"
	"github.com/fleetstream/fleetstream/services/fleetctl/manifest"
)

// The server dry run: every object apply would create, configure or prune is sent to its
// service with dry_run, which decides as the write would (the same validation, authorization
// and refusals) and answers what it would do, writing nothing. What each kind answers is what
// serverDryRun prints under the object; `fleetctl apply --help` and docs/fleet-as-code.md say
// the same.

// dryCall is call with the request sent as JSON. A server that predates an RPC's dry_run field
// would take a binary request's unknown field as protobuf promises (kept, unread) and write;
// pkg/server's JSON decoding refuses an unknown field (invalid_argument naming it), so an
// older hub refuses the dry run instead of applying it.
func dryCall[C, Req, Resp any](ctx context.Context, f *factory, newC clientConstructor[C],
	method func(C, context.Context, *connect.Request[Req]) (*connect.Response[Resp], error),
	req *Req, what string, args ...any) (*Resp, error) {
	asJSON := func(hc connect.HTTPClient, base string, opts ...connect.ClientOption) C {
		return newC(hc, base, append(opts, connect.WithProtoJSON())...)
	}
	return call(ctx, f, asJSON, method, req, what, args...)
}

// probeField is the field the strictness probe sends that no request declares.
const probeField = "fleetctlDryRunProbe"

// probeCodec sends a request as JSON with probeField added, so a hub's answer tells whether it
// refuses an unknown field; answers are read as protojson does.
type probeCodec struct{}

func (probeCodec) Name() string { return "json" }

func (probeCodec) Marshal(any) ([]byte, error) { return []byte(`{"` + probeField + `":true}`), nil }

func (probeCodec) Unmarshal(data []byte, m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return fmt.Errorf("%T is not a protobuf message", m)
	}
	return protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(data, pm)
}

// checkStrictHub makes sure the hub refuses a JSON request's unknown field before any dry run
// is sent. A hub from before strict decoding (pkg/server's codec) reads JSON with Connect's
// own codec, which drops unknown fields: it would drop dry_run and make the write (register a
// cluster and lose its token, delete a pruned project). ListProjects reads only, so a hub that
// takes the probe's field writes nothing either.
func checkStrictHub(ctx context.Context, f *factory) error {
	base, err := f.serverURL()
	if err != nil {
		return err
	}
	procedure := projectv1connect.ProjectServiceListProjectsProcedure
	client, err := newClient(f, func(hc connect.HTTPClient, base string, opts ...connect.ClientOption) *connect.Client[projectv1.ListProjectsRequest, projectv1.ListProjectsResponse] {
		return connect.NewClient[projectv1.ListProjectsRequest, projectv1.ListProjectsResponse](hc, base+procedure, append(opts, connect.WithCodec(probeCodec{}))...)
	})
	if err != nil {
		return err
	}
	ctx, cancel := f.requestContext(ctx)
	defer cancel()
	_, err = client.CallUnary(ctx, connect.NewRequest(&projectv1.ListProjectsRequest{}))
	var ce *connect.Error
	switch {
	case err == nil:
		// It read the request and dropped the field.
	case connect.CodeOf(err) == connect.CodeInvalidArgument && errors.As(err, &ce) && strings.Contains(ce.Message(), probeField):
		return nil
	case connect.CodeOf(err) != connect.CodeInvalidArgument:
		return fmt.Errorf("checking that the hub at %s refuses what it does not know (before --dry-run=server): %w", base, err)
	}
	return fmt.Errorf("the hub at %s is too old for --dry-run=server: it would ignore dry_run and write; upgrade it or use --dry-run=client", base)
}

// dryRunContext is what a server dry run knows of the apply around an object: the objects the
// same apply creates or prunes first, which the services cannot know of.
type dryRunContext struct {
	state     *fleetState
	created   map[string]bool // keys of the objects apply creates
	pruned    map[string]bool // keys of the objects apply prunes
	prunedIn  map[string]int  // per project, how many of its objects apply prunes
	following map[string]bool // "project/placement" of pruned bindings that follow a placement
}

func newDryRunContext(planned []*plannedObject, pruned []*liveObject, state *fleetState) *dryRunContext {
	d := &dryRunContext{state: state, created: map[string]bool{}, pruned: map[string]bool{}, prunedIn: map[string]int{}, following: map[string]bool{}}
	for _, p := range planned {
		if p.outcome == outcomeCreated {
			d.created[p.obj.Key()] = true
		}
	}
	for _, l := range pruned {
		d.pruned[l.obj.Key()] = true
		if l.obj.Kind.Project {
			d.prunedIn[l.obj.Project]++
		}
		if b, ok := l.obj.Spec.(*projectv1.NamespaceBinding); ok && b.Placement != "" {
			d.following[l.obj.Project+"/"+b.Placement] = true
		}
	}
	return d
}

// pending names what o needs that this apply creates first (so no service can be asked about
// o before it exists), or "" when o can be asked about now.
func (d *dryRunContext) pending(o *manifest.Object) string {
	var needs []string
	need := func(key, what string) {
		if d.created[key] {
			needs = append(needs, what)
		}
	}
	if o.Kind.Project {
		need("Project/"+o.Project, "project "+o.Project)
	}
	switch s := o.Spec.(type) {
	case *rbacv1.RoleTemplate:
		for _, t := range s.Inherits {
			need("RoleTemplate/"+t, "role template "+t)
		}
	case *rbacv1.ProjectRoleBinding:
		need("RoleTemplate/"+s.RoleTemplate, "role template "+s.RoleTemplate)
	case *projectv1.Project:
		for _, b := range s.Budgets {
			need("Cluster/"+b.Cluster, "cluster "+b.Cluster)
		}
	case *projectv1.NamespaceBinding:
		if s.Cluster != "" {
			need("Cluster/"+s.Cluster, "cluster "+s.Cluster)
		}
		if s.Placement != "" {
			need("Placement/"+o.Project+"/"+s.Placement, "placement "+s.Placement)
		}
	case *clusterv1.ImportPolicy:
		need("Cluster/"+s.GetSource().GetCluster(), "cluster "+s.GetSource().GetCluster())
	}
	return strings.Join(needs, ", ")
}

// serverDryRun prints, for every object, what apply would do and what its service answers to
// the same write made with dry_run, and returns an error when a service refuses one (the real
// apply would fail there too). Unchanged objects are not sent: apply sends nothing for them.
func serverDryRun(ctx context.Context, f *factory, planned []*plannedObject, pruned []*liveObject, state *fleetState, cascade bool) error {
	if err := checkStrictHub(ctx, f); err != nil {
		return err
	}
	d := newDryRunContext(planned, pruned, state)
	out := f.streams.Out
	refused := 0
	report := func(key, outcome, waiting string, ask func(w io.Writer) error) {
		if waiting != "" {
			fmt.Fprintf(out, "%s %s (dry run; %s: created by this apply first, so the server cannot be asked yet)\n", key, outcome, waiting)
			return
		}
		var b bytes.Buffer
		if err := ask(&b); err != nil {
			refused++
			fmt.Fprintf(out, "%s %s (server dry run: refused)\n  ", key, outcome)
			PrintError(out, err)
			return
		}
		fmt.Fprintf(out, "%s %s (server dry run)\n", key, outcome)
		io.Copy(out, &b)
	}
	for _, p := range planned {
		o := p.obj
		if p.outcome == outcomeUnchanged {
			fmt.Fprintf(out, "%s %s (dry run)\n", o.Key(), p.outcome)
			continue
		}
		report(o.Key(), p.outcome, d.pending(o), func(w io.Writer) error {
			if p.outcome == outcomeCreated {
				return dryRunCreate(ctx, f, w, o)
			}
			return dryRunUpdate(ctx, f, w, o, p.live)
		})
	}
	for _, l := range pruned {
		o := l.obj
		waiting := ""
		switch o.Kind.Name {
		case "Project":
			if n := d.prunedIn[o.Name]; n > 0 {
				waiting = fmt.Sprintf("%d object(s) of the project are pruned before it", n)
			}
		case "Placement":
			if d.following[o.Project+"/"+o.Name] {
				waiting = "the namespaces that follow it are unbound before it"
			}
		}
		if waiting != "" {
			fmt.Fprintf(out, "%s %s (dry run; %s, so the server cannot be asked yet)\n", o.Key(), outcomePruned, waiting)
			continue
		}
		report(o.Key(), outcomePruned, "", func(w io.Writer) error { return dryRunDelete(ctx, f, w, o, l, cascade) })
	}
	if refused > 0 {
		return fmt.Errorf("%d of %d objects would be refused by the server (above); nothing was changed", refused, len(planned)+len(pruned))
	}
	return nil
}

// dryRunCreate asks o's service to create it with dry_run and writes what it answers.
func dryRunCreate(ctx context.Context, f *factory, w io.Writer, o *manifest.Object) error {
	switch s := o.Spec.(type) {
	case *clusterv1.Cluster:
		res, err := dryCall(ctx, f, clusterv1connect.NewClusterServiceClient, clusterv1connect.ClusterServiceClient.RegisterCluster,
			&clusterv1.RegisterClusterRequest{Name: o.Name, Labels: o.Labels, Claims: s.Claims, Taints: s.Taints, DryRun: true}, "dry run of registering cluster %s", o.Name)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "  the registry would register it with taints %s (its agent token is handed out by the real apply only)\n", taintList(res.GetCluster().GetTaints()))
		return nil
	case *clusterv1.Subscriber:
		res, err := dryCall(ctx, f, clusterv1connect.NewSubscriberServiceClient, clusterv1connect.SubscriberServiceClient.CreateSubscriber,
			&clusterv1.CreateSubscriberRequest{Name: o.Name, Streams: s.Streams, DryRun: true}, "dry run of creating subscriber %s", o.Name)
		if err != nil {
			return err
		}
		c := res.GetSubscriber().GetConsumers()
		for _, st := range slices.Sorted(maps.Keys(c)) {
			fmt.Fprintf(w, "  would read %s through consumer %s\n", st, c[st])
		}
		return nil
	case *clusterv1.ImportPolicy:
		p := proto.CloneOf(s)
		p.Name = o.Name
		if _, err := dryCall(ctx, f, clusterv1connect.NewImportPolicyServiceClient, clusterv1connect.ImportPolicyServiceClient.CreateImportPolicy,
			&clusterv1.CreateImportPolicyRequest{Policy: p, DryRun: true}, "dry run of creating import policy %s", o.Name); err != nil {
			return err
		}
		fmt.Fprintf(w, "  valid, and no other policy imports from %s\n", sourceText(s.GetSource()))
		return nil
	case *rbacv1.RoleTemplate:
		t := proto.CloneOf(s)
		t.Name = o.Name
		res, err := dryCall(ctx, f, rbacv1connect.NewRBACServiceClient, rbacv1connect.RBACServiceClient.CreateRoleTemplate,
			&rbacv1.CreateRoleTemplateRequest{Template: t, DryRun: true}, "dry run of creating role template %s", o.Name)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "  valid; effective rules: %s\n", ruleList(res.GetTemplate().GetEffectiveRules()))
		printRBACPlan(w, res.GetPlan())
		return nil
	case *placementv1.ClusterSet:
		res, err := dryCall(ctx, f, placementv1connect.NewClusterSetServiceClient, placementv1connect.ClusterSetServiceClient.CreateClusterSet,
			&placementv1.CreateClusterSetRequest{Name: o.Name, Selector: s.Selector, DryRun: true}, "dry run of creating cluster set %s", o.Name)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "  would hold clusters: %s\n", nameList(res.GetClusterSet().GetStatus().GetMembers()))
		return nil
	case *projectv1.Project:
		if _, err := dryCall(ctx, f, projectv1connect.NewProjectServiceClient, projectv1connect.ProjectServiceClient.CreateProject,
			&projectv1.CreateProjectRequest{Name: o.Name, DisplayName: s.DisplayName, Labels: o.Labels, DryRun: true}, "dry run of creating project %s", o.Name); err != nil {
			return err
		}
		fmt.Fprintln(w, "  valid, and the name is free")
		for _, b := range s.Budgets {
			// SetProjectBudget, which apply calls once the project exists, validates the
			// budget before it looks the project up: the project's not_found means the budget
			// passed, anything else is the refusal apply would meet after creating the project.
			// A new project holds no namespaces, so any valid budget holds.
			_, err := dryCall(ctx, f, projectv1connect.NewProjectServiceClient, projectv1connect.ProjectServiceClient.SetProjectBudget,
				&projectv1.SetProjectBudgetRequest{Project: o.Name, Cluster: b.Cluster, Hard: b.Hard, DryRun: true},
				"dry run of setting the budget of project %s on cluster %s", o.Name, b.Cluster)
			if err == nil {
				return fmt.Errorf("dry run of setting the budget of project %s on cluster %s: the project exists already", o.Name, b.Cluster)
			}
			var ce *connect.Error
			if !errors.As(err, &ce) || ce.Code() != connect.CodeNotFound || ce.Message() != fmt.Sprintf("project %q not found", o.Name) {
				return err
			}
			// The cluster is checked after the project, so it is asked here.
			if _, err := dryCall(ctx, f, clusterv1connect.NewClusterServiceClient, clusterv1connect.ClusterServiceClient.GetCluster,
				&clusterv1.GetClusterRequest{Name: b.Cluster}, "budget of project %s on cluster %s", o.Name, b.Cluster); err != nil {
				return err
			}
			fmt.Fprintf(w, "  budget on %s: %s (set once the project exists)\n", b.Cluster, quantities(b.Hard))
		}
		return nil
	case *placementv1.Placement:
		p := proto.CloneOf(s)
		p.Project, p.Name = o.Project, o.Name
		res, err := dryCall(ctx, f, placementv1connect.NewPlacementServiceClient, placementv1connect.PlacementServiceClient.CreatePlacement,
			&placementv1.CreatePlacementRequest{Placement: p, DryRun: true}, "dry run of creating placement %s in project %s", o.Name, o.Project)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "  would decide clusters now: %s\n", nameList(res.GetDecidedClusters()))
		return nil
	case *placementv1.ClusterSetBinding:
		res, err := dryCall(ctx, f, placementv1connect.NewClusterSetServiceClient, placementv1connect.ClusterSetServiceClient.BindClusterSet,
			&placementv1.BindClusterSetRequest{Project: o.Project, ClusterSet: s.ClusterSet, DryRun: true}, "dry run of binding cluster set %s to project %s", s.ClusterSet, o.Project)
		if err != nil {
			return err
		}
		if !res.GetBinding().GetStatus().GetClusterSetExists() {
			fmt.Fprintf(w, "  cluster set %s does not exist (yet): the binding selects nothing until it does\n", s.ClusterSet)
		} else {
			fmt.Fprintf(w, "  would bind cluster set %s\n", s.ClusterSet)
		}
		return nil
	case *projectv1.NamespaceBinding:
		res, err := dryCall(ctx, f, projectv1connect.NewProjectServiceClient, projectv1connect.ProjectServiceClient.BindNamespace,
			&projectv1.BindNamespaceRequest{Project: o.Project, Cluster: s.Cluster, Placement: s.Placement, Namespace: o.Name, Hard: s.Hard, UnbindPolicy: s.UnbindPolicy, DryRun: true},
			"dry run of binding namespace %s", o.Name)
		if err != nil {
			return err
		}
		printBindingDryRun(w, s, res.GetBinding(), res.GetPlacementBindings(), res.GetBudget())
		return nil
	case *rbacv1.ProjectRoleBinding:
		res, err := dryCall(ctx, f, rbacv1connect.NewRBACServiceClient, rbacv1connect.RBACServiceClient.BindProjectRole,
			&rbacv1.BindProjectRoleRequest{Project: o.Project, Subject: s.Subject, RoleTemplate: s.RoleTemplate, DryRun: true}, "dry run of %s", o.Key())
		if err != nil {
			return err
		}
		printRBACPlan(w, res.GetPlan())
		return nil
	case *endpointv1.ServiceWeights:
		return dryRunWeights(ctx, f, w, o.Name, s, &endpointv1.ServiceWeights{})
	}
	return fmt.Errorf("%s: kind %s cannot be created", o.Key(), o.Kind.Name)
}

// dryRunUpdate asks o's service to change live into o with dry_run, carrying live's revision as
// the update would, and writes what it answers.
func dryRunUpdate(ctx context.Context, f *factory, w io.Writer, o *manifest.Object, live *liveObject) error {
	switch s := o.Spec.(type) {
	case *clusterv1.Cluster:
		res, err := dryCall(ctx, f, clusterv1connect.NewClusterServiceClient, clusterv1connect.ClusterServiceClient.UpdateCluster,
			&clusterv1.UpdateClusterRequest{Name: o.Name, Labels: o.Labels, Claims: s.Claims, Taints: s.Taints,
				UpdateMask:       &fieldmaskpb.FieldMask{Paths: []string{"labels", "claims", "taints"}},
				ExpectedRevision: live.revision, DryRun: true}, "dry run of updating cluster %s", o.Name)
		if err != nil {
			return err
		}
		c := res.GetCluster()
		fmt.Fprintf(w, "  would have labels %s, claims %s, taints %s\n", quantities(c.GetLabels()), quantities(c.GetClaims()), taintList(c.GetTaints()))
		return nil
	case *clusterv1.ImportPolicy:
		p := proto.CloneOf(s)
		p.Name = o.Name
		if _, err := dryCall(ctx, f, clusterv1connect.NewImportPolicyServiceClient, clusterv1connect.ImportPolicyServiceClient.UpdateImportPolicy,
			&clusterv1.UpdateImportPolicyRequest{Policy: p, ExpectedRevision: live.revision, DryRun: true}, "dry run of updating import policy %s", o.Name); err != nil {
			return err
		}
		fmt.Fprintf(w, "  valid, and no other policy imports from %s\n", sourceText(s.GetSource()))
		return nil
	case *rbacv1.RoleTemplate:
		t := proto.CloneOf(s)
		t.Name = o.Name
		res, err := dryCall(ctx, f, rbacv1connect.NewRBACServiceClient, rbacv1connect.RBACServiceClient.UpdateRoleTemplate,
			&rbacv1.UpdateRoleTemplateRequest{Template: t,
				UpdateMask:       &fieldmaskpb.FieldMask{Paths: []string{"display_name", "rules", "inherits", "locked"}},
				ExpectedRevision: live.revision, DryRun: true}, "dry run of updating role template %s", o.Name)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "  valid; effective rules would be: %s\n", ruleList(res.GetTemplate().GetEffectiveRules()))
		printRBACPlan(w, res.GetPlan())
		return nil
	case *placementv1.ClusterSet:
		res, err := dryCall(ctx, f, placementv1connect.NewClusterSetServiceClient, placementv1connect.ClusterSetServiceClient.UpdateClusterSet,
			&placementv1.UpdateClusterSetRequest{Name: o.Name, Selector: s.Selector, ExpectedRevision: live.revision, DryRun: true}, "dry run of updating cluster set %s", o.Name)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "  would hold clusters: %s\n", nameList(res.GetClusterSet().GetStatus().GetMembers()))
		return nil
	case *projectv1.Project:
		want := map[string]map[string]string{}
		for _, b := range s.Budgets {
			want[b.Cluster] = b.Hard
		}
		have := map[string]map[string]string{}
		for _, b := range live.obj.Spec.(*projectv1.Project).Budgets {
			have[b.Cluster] = b.Hard
		}
		// Set budgets first, then removed ones, each in cluster order, as apply does.
		clusters := slices.Sorted(maps.Keys(want))
		var removed []string
		for c := range have {
			if _, ok := want[c]; !ok {
				removed = append(removed, c)
			}
		}
		slices.Sort(removed)
		clusters = append(clusters, removed...)
		for _, c := range clusters {
			if maps.Equal(want[c], have[c]) {
				continue
			}
			res, err := dryCall(ctx, f, projectv1connect.NewProjectServiceClient, projectv1connect.ProjectServiceClient.SetProjectBudget,
				&projectv1.SetProjectBudgetRequest{Project: o.Name, Cluster: c, Hard: want[c], DryRun: true}, "dry run of setting the budget of project %s on cluster %s", o.Name, c)
			if err != nil {
				return err
			}
			if len(want[c]) == 0 {
				fmt.Fprintf(w, "  budget on %s removed\n", c)
				continue
			}
			for _, b := range res.GetProject().GetBudgets() {
				if b.Cluster == c {
					fmt.Fprintf(w, "  budget on %s: %s; its namespaces there hold %s, within it\n", c, quantities(b.Hard), quantities(b.Allocated))
				}
			}
		}
		return nil
	case *placementv1.Placement:
		p := proto.CloneOf(s)
		p.Project, p.Name = o.Project, o.Name
		res, err := dryCall(ctx, f, placementv1connect.NewPlacementServiceClient, placementv1connect.PlacementServiceClient.UpdatePlacement,
			&placementv1.UpdatePlacementRequest{Placement: p, ExpectedRevision: live.revision, DryRun: true}, "dry run of updating placement %s in project %s", o.Name, o.Project)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "  would decide clusters now: %s\n", nameList(res.GetDecidedClusters()))
		return nil
	case *projectv1.NamespaceBinding:
		if s.Placement != "" {
			return dryRunCreate(ctx, f, w, o) // apply binds it to its placement again
		}
		res, err := dryCall(ctx, f, projectv1connect.NewProjectServiceClient, projectv1connect.ProjectServiceClient.UpdateQuota,
			&projectv1.UpdateQuotaRequest{Project: o.Project, Cluster: s.Cluster, Namespace: o.Name, Hard: s.Hard, DryRun: true}, "dry run of updating the quota of namespace %s", o.Name)
		if err != nil {
			return err
		}
		printBindingDryRun(w, s, res.GetBinding(), nil, res.GetBudget())
		return nil
	case *endpointv1.ServiceWeights:
		return dryRunWeights(ctx, f, w, o.Name, s, live.obj.Spec.(*endpointv1.ServiceWeights))
	}
	return fmt.Errorf("%s: kind %s cannot be updated", o.Key(), o.Kind.Name)
}

// dryRunDelete asks o's service to delete it (prune) with dry_run.
func dryRunDelete(ctx context.Context, f *factory, w io.Writer, o *manifest.Object, live *liveObject, cascade bool) error {
	var err error
	switch s := o.Spec.(type) {
	case *clusterv1.Cluster:
		_, err = dryCall(ctx, f, clusterv1connect.NewClusterServiceClient, clusterv1connect.ClusterServiceClient.DeregisterCluster,
			&clusterv1.DeregisterClusterRequest{Name: o.Name, ExpectedRevision: live.revision, DryRun: true}, "dry run of deregistering cluster %s", o.Name)
	case *projectv1.Project:
		var res *projectv1.DeleteProjectResponse
		// The prune's own request (deleteObject): with --cascade it unbinds what is left;
		// without, the service refuses a project that gained a namespace since the plan.
		res, err = dryCall(ctx, f, projectv1connect.NewProjectServiceClient, projectv1connect.ProjectServiceClient.DeleteProject,
			&projectv1.DeleteProjectRequest{Name: o.Name, Force: cascade, DryRun: true}, "dry run of deleting project %s", o.Name)
		for _, b := range res.GetUnbound() {
			fmt.Fprintf(w, "  would unbind namespace %s on %s (%s)\n", b.Namespace, b.Cluster, policyText(b.UnbindPolicy))
		}
	case *placementv1.Placement:
		_, err = dryCall(ctx, f, placementv1connect.NewPlacementServiceClient, placementv1connect.PlacementServiceClient.DeletePlacement,
			&placementv1.DeletePlacementRequest{Project: o.Project, Name: o.Name, ExpectedRevision: live.revision, DryRun: true}, "dry run of deleting placement %s in project %s", o.Name, o.Project)
	case *placementv1.ClusterSetBinding:
		_, err = dryCall(ctx, f, placementv1connect.NewClusterSetServiceClient, placementv1connect.ClusterSetServiceClient.UnbindClusterSet,
			&placementv1.UnbindClusterSetRequest{Project: o.Project, ClusterSet: s.ClusterSet, DryRun: true}, "dry run of unbinding cluster set %s from project %s", s.ClusterSet, o.Project)
	case *projectv1.NamespaceBinding:
		var res *projectv1.UnbindNamespaceResponse
		res, err = dryCall(ctx, f, projectv1connect.NewProjectServiceClient, projectv1connect.ProjectServiceClient.UnbindNamespace,
			&projectv1.UnbindNamespaceRequest{Project: o.Project, Cluster: s.Cluster, Placement: s.Placement, Namespace: o.Name, DryRun: true}, "dry run of unbinding namespace %s", o.Name)
		if b := res.GetBinding(); err == nil && b != nil {
			fmt.Fprintf(w, "  would release it on %s (%s)\n", b.Cluster, policyText(b.UnbindPolicy))
		}
	case *rbacv1.ProjectRoleBinding:
		var res *rbacv1.UnbindProjectRoleResponse
		res, err = dryCall(ctx, f, rbacv1connect.NewRBACServiceClient, rbacv1connect.RBACServiceClient.UnbindProjectRole,
			&rbacv1.UnbindProjectRoleRequest{Project: o.Project, Subject: s.Subject, RoleTemplate: s.RoleTemplate, DryRun: true}, "dry run of %s", o.Key())
		if err == nil {
			printRBACPlan(w, res.GetPlan())
		}
	default:
		return fmt.Errorf("%s: kind %s cannot be deleted", o.Key(), o.Kind.Name)
	}
	return err
}

// dryRunWeights asks for each weight call setWeights would make with dry_run, in its order.
func dryRunWeights(ctx context.Context, f *factory, w io.Writer, name string, want, have *endpointv1.ServiceWeights) error {
	ns := want.Namespace
	for _, c := range weights.Changes(want, have) {
		var err error
		switch {
		case c.IP == "":
			_, err = dryCall(ctx, f, endpointv1connect.NewEndpointServiceClient, endpointv1connect.EndpointServiceClient.SetClusterWeight,
				&endpointv1.SetClusterWeightRequest{Namespace: ns, Name: name, Cluster: c.Cluster, Weight: c.To, DryRun: true},
				"dry run of setting the weight of cluster %s for service %s/%s", c.Cluster, ns, name)
		default:
			_, err = dryCall(ctx, f, endpointv1connect.NewEndpointServiceClient, endpointv1connect.EndpointServiceClient.SetEndpointWeight,
				&endpointv1.SetEndpointWeightRequest{Namespace: ns, Name: name, Ip: c.IP, Cluster: c.Cluster, Weight: c.To, Clear: c.Reset, DryRun: true},
				"dry run of setting the weight of %s in cluster %s of service %s/%s", c.IP, c.Cluster, ns, name)
		}
		if err != nil {
			return err
		}
		what := "cluster " + c.Cluster
		if c.IP != "" {
			what = "endpoint " + c.IP + " in cluster " + c.Cluster
		}
		fmt.Fprintf(w, "  %s: weight %d → %d\n", what, c.From, c.To)
	}
	return nil
}

// printBindingDryRun writes what namespace-binding answered to a bind or quota dry run: where
// the namespace would be bound, with which quota, and the budget check.
func printBindingDryRun(w io.Writer, s *projectv1.NamespaceBinding, b *projectv1.NamespaceBinding, placed []*projectv1.NamespaceBinding, budget *projectv1.ProjectBudget) {
	if s.Placement != "" {
		if len(placed) == 0 {
			fmt.Fprintf(w, "  placement %s decides no cluster now: bound wherever it decides later\n", s.Placement)
		}
		for _, p := range placed {
			if p.Phase == projectv1.BindingPhase_BINDING_PHASE_FAILED {
				fmt.Fprintf(w, "  on %s: not bound: %s\n", p.Cluster, p.Message)
				continue
			}
			fmt.Fprintf(w, "  on %s: quota %s\n", p.Cluster, quantities(p.Hard))
		}
		return
	}
	fmt.Fprintf(w, "  on %s: quota %s\n", b.GetCluster(), quantities(b.GetHard()))
	if budget == nil {
		fmt.Fprintf(w, "  the project has no budget on %s\n", s.Cluster)
		return
	}
	fmt.Fprintf(w, "  within the project's budget on %s: %s of %s\n", s.Cluster, quantities(budget.Allocated), quantities(budget.Hard))
}

// printRBACPlan writes rbac-sync's plan: per cluster, the RoleBindings (namespace/name) or
// ClusterRoles (of a role template's dry run) that would change.
func printRBACPlan(w io.Writer, plan []*rbacv1.PlannedChange) {
	if len(plan) == 0 {
		fmt.Fprintln(w, "  no RoleBinding or ClusterRole changes on any cluster")
	}
	for _, c := range plan {
		action := strings.ToLower(strings.TrimPrefix(c.GetAction().String(), "CHANGE_ACTION_"))
		if c.GetNamespace() == "" {
			fmt.Fprintf(w, "  %s %s ClusterRole %s\n", action, c.GetCluster(), c.GetName())
			continue
		}
		fmt.Fprintf(w, "  %s %s %s/%s\n", action, c.GetCluster(), c.GetNamespace(), c.GetName())
	}
}

// quantities prints a map as {k: v, ...} in key order, "none" when empty.
func quantities(m map[string]string) string {
	if len(m) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ", ")
}

func nameList(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

func taintList(ts []*clusterv1.Taint) string {
	if len(ts) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(ts))
	for _, t := range ts {
		parts = append(parts, t.Key+"="+t.Value+":"+strings.TrimPrefix(t.Effect.String(), "TAINT_EFFECT_"))
	}
	return strings.Join(parts, ", ")
}

func ruleList(rules []*rbacv1.PolicyRule) string {
	if len(rules) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(rules))
	for _, r := range rules {
		parts = append(parts, strings.Join(r.Verbs, ",")+":"+strings.Join(r.Resources, ","))
	}
	return strings.Join(parts, "; ")
}

func sourceText(s *clusterv1.ImportSource) string {
	return fmt.Sprintf("cluster %s %s.%s/%s", s.GetCluster(), s.GetResource(), s.GetGroup(), s.GetVersion())
}

func policyText(p projectv1.UnbindPolicy) string {
	return "unbind policy " + strings.TrimPrefix(p.String(), "UNBIND_POLICY_")
}
