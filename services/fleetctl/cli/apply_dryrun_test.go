package cli

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1/placementv1connect"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1/rbacv1connect"
)

// TestApplyServerDryRun: --dry-run=server sends every object apply would create, configure or
// prune to its service with dry_run and prints what each answers (the clusters a placement
// would decide, a binding's quota against its project's budget, a cluster set's members, ...),
// a refusal as the real write gives it, and writes nothing: every List answers the same,
// revisions included, and no token file appears.
func TestApplyServerDryRun(t *testing.T) {
	h := startRBACHub(t)
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	doc := func(kind, meta, spec string) string {
		return "---\napiVersion: fleetstream.io/v1alpha1\nkind: " + kind + "\nmetadata: " + meta + "\nspec: " + spec + "\n"
	}
	// bob may read team-a, not change it.
	viewer := doc("ProjectRoleBinding", "{project: team-a}", "{subject: {kind: SUBJECT_KIND_USER, name: bob}, roleTemplate: project-viewer}")
	policy := func(name, resource string) string {
		return doc("ImportPolicy", "{name: "+name+"}", "{source: {cluster: eu-1, group: cluster.x-k8s.io, version: v1beta1, resource: "+resource+
			"}, nameTemplate: \"{{ .source.metadata.name }}\", template: \"labels: {provider: capi}\", creationCondition: \"true\"}")
	}
	legacy := policy("legacy", "clusters")
	base := doc("Cluster", "{name: eu-1, labels: {region: eu}}", "{}") +
		doc("Cluster", "{name: eu-2, labels: {region: eu}}", "{}") +
		doc("Cluster", "{name: old-1}", "{}") +
		doc("RoleTemplate", "{name: reader}", "{rules: [{verbs: [get], apiGroups: [\"\"], resources: [pods]}]}") +
		doc("ClusterSet", "{name: europe}", "{selector: {type: SELECTOR_TYPE_LABEL_SELECTOR, labelSelector: {matchLabels: {region: eu}}}}") +
		doc("Project", "{name: team-a}", "{displayName: A, budgets: [{cluster: eu-1, hard: {cpu: \"4\"}}]}") +
		doc("ClusterSetBinding", "{project: team-a}", "{clusterSet: europe}") +
		doc("Placement", "{name: best-eu, project: team-a}", "{clusterSets: [europe], numberOfClusters: 1, tolerations: [{operator: Exists}]}") +
		doc("NamespaceBinding", "{name: web, project: team-a}", "{cluster: eu-1, hard: {cpu: \"1\"}}") +
		doc("NamespaceBinding", "{name: old, project: team-a}", "{cluster: old-1}") +
		viewer +
		legacy +
		// team-c goes whole: its placement and set binding are pruned before it.
		doc("Project", "{name: team-c}", "{displayName: C}") +
		doc("ClusterSetBinding", "{project: team-c}", "{clusterSet: europe}") +
		doc("Placement", "{name: two, project: team-c}", "{clusterSets: [europe], numberOfClusters: 2}")
	writeFile(t, filepath.Join(dir, "base.yaml"), base)
	h.run(t, "apply", "-f", filepath.Join(dir, "base.yaml"), "--applyset", "prod", "--token-dir", tokens).ok(t)
	waitFor(t, 30*time.Second, "best-eu decided", func() bool {
		return strings.Contains(h.run(t, "-o", "json", "placement", "decisions", "best-eu", "--project", "team-a").ok(t).stdout, `"clusterName"`)
	})

	v2 := doc("Cluster", "{name: eu-1, labels: {region: eu, tier: gold}}", "{}") + // configured
		doc("Cluster", "{name: eu-2, labels: {region: eu}}", "{}") + // unchanged
		doc("Cluster", "{name: us-1, labels: {region: us}}", "{}") + // created; old-1 pruned
		doc("RoleTemplate", "{name: reader}", "{rules: [{verbs: [get, list], apiGroups: [\"\"], resources: [pods]}]}") +
		doc("RoleTemplate", "{name: writer}", "{inherits: [reader], rules: [{verbs: [delete], apiGroups: [\"\"], resources: [pods]}]}") +
		doc("RoleTemplate", "{name: boss}", "{inherits: [writer]}") + // waits for writer
		doc("ClusterSet", "{name: europe}", "{selector: {type: SELECTOR_TYPE_LABEL_SELECTOR, labelSelector: {matchLabels: {region: eu, tier: gold}}}}") +
		doc("ClusterSet", "{name: everything}", "{selector: {type: SELECTOR_TYPE_LABEL_SELECTOR, labelSelector: {}}}") +
		doc("Subscriber", "{name: audit}", "{streams: [FLEET_NS]}") +
		legacy + policy("capi", "machinedeployments") +
		policy("dup", "clusters") + // legacy's source: refused

		doc("Project", "{name: team-a}", "{displayName: A, budgets: [{cluster: eu-1, hard: {cpu: \"4\"}}, {cluster: eu-2, hard: {cpu: \"2\"}}]}") +
		doc("Project", "{name: team-b}", "{displayName: B, budgets: [{cluster: eu-2, hard: {cpu: \"1\"}}]}") +
		doc("Project", "{name: team-d}", "{displayName: D, budgets: [{cluster: nowhere, hard: {cpu: \"1\"}}]}") + // an unknown cluster
		doc("Project", "{name: team-e}", "{displayName: E, budgets: [{cluster: eu-2, hard: {cpu: lots}}]}") + // not a quantity

		doc("ClusterSetBinding", "{project: team-a}", "{clusterSet: europe}") +
		doc("ClusterSetBinding", "{project: team-b}", "{clusterSet: europe}") + // waits for team-b
		doc("Placement", "{name: best-eu, project: team-a}", "{clusterSets: [europe], numberOfClusters: 2, tolerations: [{operator: Exists}]}") +
		doc("NamespaceBinding", "{name: web, project: team-a}", "{cluster: eu-1, hard: {cpu: \"2\"}}") +
		doc("NamespaceBinding", "{name: api, project: team-a}", "{cluster: eu-1, hard: {cpu: \"4\"}}") + // over the budget
		doc("NamespaceBinding", "{name: shop, project: team-a}", "{placement: best-eu, hard: {cpu: \"1\"}}") +
		doc("ProjectRoleBinding", "{project: team-a}", "{subject: {kind: SUBJECT_KIND_GROUP, name: devs}, roleTemplate: reader}") +
		viewer
	writeFile(t, filepath.Join(dir, "v2.yaml"), v2)

	before := rawFleet(t, h)
	r := h.run(t, "apply", "-f", filepath.Join(dir, "v2.yaml"), "--applyset", "prod", "--prune", "--token-dir", tokens, "--dry-run=server")
	if r.code != 1 || !strings.Contains(r.stderr, "error: 4 of 29 objects would be refused by the server (above); nothing was changed") {
		t.Fatalf("server dry run with a refusal: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{
		"Cluster/eu-1 configured (server dry run)\n  would have labels applyset.fleetstream.io/part-of=prod, region=eu, tier=gold, claims none, taints fleetstream.io/unreachable=:NO_SELECT\n",
		"Cluster/eu-2 unchanged (dry run)\n",
		"Cluster/us-1 created (server dry run)\n  the registry would register it with taints fleetstream.io/unreachable=:NO_SELECT (its agent token is handed out by the real apply only)\n",
		// The ClusterRoles change on every registered cluster: reader's own, and those of the
		// templates inheriting it (none yet: writer is new).
		"RoleTemplate/reader configured (server dry run)\n  valid; effective rules would be: get,list:pods\n" +
			"  update eu-1 ClusterRole fleetstream:reader\n  update eu-2 ClusterRole fleetstream:reader\n  update old-1 ClusterRole fleetstream:reader\n",
		"RoleTemplate/writer created (server dry run)\n  valid; effective rules: delete:pods; get:pods\n" +
			"  create eu-1 ClusterRole fleetstream:writer\n  create eu-2 ClusterRole fleetstream:writer\n  create old-1 ClusterRole fleetstream:writer\n",
		"RoleTemplate/boss created (dry run; role template writer: created by this apply first, so the server cannot be asked yet)\n",
		"ClusterSet/europe configured (server dry run)\n  would hold clusters: none\n",
		"ClusterSet/everything created (server dry run)\n  would hold clusters: eu-1, eu-2, old-1\n",
		"Subscriber/audit created (server dry run)\n  would read FLEET_NS through consumer ",
		"ImportPolicy/capi created (server dry run)\n  valid, and no other policy imports from cluster eu-1 machinedeployments.cluster.x-k8s.io/v1beta1\n",
		"ImportPolicy/legacy unchanged (dry run)\n",
		"ImportPolicy/dup created (server dry run: refused)\n  error: already_exists: ",
		"Project/team-a configured (server dry run)\n  budget on eu-2: cpu=2; its namespaces there hold cpu=0, within it\n",
		"Project/team-b created (server dry run)\n  valid, and the name is free\n  budget on eu-2: cpu=1 (set once the project exists)\n",
		"Project/team-d created (server dry run: refused)\n  error: not_found: ",
		"Project/team-e created (server dry run: refused)\n  error: invalid_argument: ",
		"ClusterSetBinding/team-a/europe unchanged (dry run)\n",
		"ClusterSetBinding/team-b/europe created (dry run; project team-b: created by this apply first, so the server cannot be asked yet)\n",
		"Placement/team-a/best-eu configured (server dry run)\n  would decide clusters now: eu-1, eu-2\n",
		"NamespaceBinding/team-a/cluster=eu-1/web configured (server dry run)\n  on eu-1: quota cpu=2\n  within the project's budget on eu-1: cpu=2 of cpu=4\n",
		"NamespaceBinding/team-a/cluster=eu-1/api created (server dry run: refused)\n  error: failed_precondition: project team-a budget on cluster eu-1: cpu asks 4, 3 left of 4\n",
		"NamespaceBinding/team-a/placement=best-eu/shop created (server dry run)\n  on eu-1: quota cpu=1\n",
		"ProjectRoleBinding/team-a/reader/group:devs created (server dry run)\n  create eu-1 web/fleetstream:reader\n",
		"NamespaceBinding/team-a/cluster=old-1/old pruned (server dry run)\n  would release it on old-1 (unbind policy KEEP)\n",
		"Cluster/old-1 pruned (server dry run)\n",
		"Placement/team-c/two pruned (server dry run)\n",
		"ClusterSetBinding/team-c/europe pruned (server dry run)\n",
		"Project/team-c pruned (dry run; 2 object(s) of the project are pruned before it, so the server cannot be asked yet)\n",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("server dry run lacks %q:\n%s", want, r.stdout)
		}
	}
	assertUnchanged(t, h, before, tokens)

	// Authorization is the write's: bob, a viewer of team-a, is refused each change as the write
	// would refuse him.
	writeFile(t, filepath.Join(dir, "bob.yaml"), doc("NamespaceBinding", "{name: web, project: team-a}", "{cluster: eu-1, hard: {cpu: \"3\"}}")+
		doc("Placement", "{name: best-eu, project: team-a}", "{clusterSets: [europe], numberOfClusters: 3}"))
	r = h.runAs(t, bobToken, "apply", "-f", filepath.Join(dir, "bob.yaml"), "--dry-run=server")
	if r.code != 1 || strings.Count(r.stdout, "error: permission_denied: ") != 2 || !strings.Contains(r.stderr, "2 of 2 objects would be refused by the server") {
		t.Fatalf("bob's server dry run: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	assertUnchanged(t, h, before, tokens)

	// The refusal is the real write's: apply gives the same message for the same object.
	writeFile(t, filepath.Join(dir, "api.yaml"), doc("NamespaceBinding", "{name: api, project: team-a}", "{cluster: eu-1, hard: {cpu: \"4\"}}"))
	r = h.run(t, "apply", "-f", filepath.Join(dir, "api.yaml"))
	if r.code != 1 || !strings.Contains(r.stderr, "NamespaceBinding/team-a/cluster=eu-1/api: error: failed_precondition: project team-a budget on cluster eu-1: cpu asks 4, 3 left of 4\n") {
		t.Fatalf("apply of the binding the dry run refused: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// rawFleet answers the List calls of every kind the dry run touches as they are, revisions
// and times included: a dry run that wrote anything changes at least a revision.
func rawFleet(t *testing.T, h *hubEnv) []proto.Message {
	t.Helper()
	ctx := context.Background()
	opt := connect.WithInterceptors(bearerAuth{token: e2eToken})
	clusters := clusterv1connect.NewClusterServiceClient(http.DefaultClient, h.url, opt)
	projects := projectv1connect.NewProjectServiceClient(http.DefaultClient, h.url, opt)
	rbac := rbacv1connect.NewRBACServiceClient(http.DefaultClient, h.url, opt)
	sets := placementv1connect.NewClusterSetServiceClient(http.DefaultClient, h.url, opt)
	placements := placementv1connect.NewPlacementServiceClient(http.DefaultClient, h.url, opt)
	subscribers := clusterv1connect.NewSubscriberServiceClient(http.DefaultClient, h.url, opt)
	policies := clusterv1connect.NewImportPolicyServiceClient(http.DefaultClient, h.url, opt)
	var out []proto.Message
	add := func(m proto.Message, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	add(msg(clusters.ListClusters(ctx, connect.NewRequest(&clusterv1.ListClustersRequest{}))))
	add(msg(projects.ListProjects(ctx, connect.NewRequest(&projectv1.ListProjectsRequest{}))))
	add(msg(projects.ListNamespaceBindings(ctx, connect.NewRequest(&projectv1.ListNamespaceBindingsRequest{}))))
	add(msg(rbac.ListRoleTemplates(ctx, connect.NewRequest(&rbacv1.ListRoleTemplatesRequest{}))))
	add(msg(rbac.ListProjectRoleBindings(ctx, connect.NewRequest(&rbacv1.ListProjectRoleBindingsRequest{}))))
	add(msg(sets.ListClusterSets(ctx, connect.NewRequest(&placementv1.ListClusterSetsRequest{}))))
	add(msg(sets.ListClusterSetBindings(ctx, connect.NewRequest(&placementv1.ListClusterSetBindingsRequest{}))))
	add(msg(placements.ListPlacements(ctx, connect.NewRequest(&placementv1.ListPlacementsRequest{}))))
	add(msg(subscribers.ListSubscribers(ctx, connect.NewRequest(&clusterv1.ListSubscribersRequest{}))))
	add(msg(policies.ListImportPolicies(ctx, connect.NewRequest(&clusterv1.ListImportPoliciesRequest{}))))
	return out
}

// assertUnchanged fails unless every List answers as before and no token was written.
func assertUnchanged(t *testing.T, h *hubEnv, before []proto.Message, tokens string) {
	t.Helper()
	for i, m := range rawFleet(t, h) {
		if !proto.Equal(before[i], m) {
			t.Errorf("a dry run changed %T:\n%s\nwas:\n%s", m, prototext.Format(m), prototext.Format(before[i]))
		}
	}
	for _, name := range []string{"us-1.token", "subscriber-audit.token"} {
		if _, err := os.Stat(filepath.Join(tokens, name)); err == nil {
			t.Errorf("a dry run wrote %s", name)
		}
	}
}
