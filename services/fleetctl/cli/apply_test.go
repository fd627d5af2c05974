package cli

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1/placementv1connect"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1/rbacv1connect"
)

const fleetManifests = `apiVersion: fleetstream.io/v1alpha1
kind: Cluster
metadata:
  name: eu-1
  labels: {region: eu, tier: gold}
spec:
  claims: {cloud: aws}
  taints:
  - {key: maintenance, value: "true", effect: TAINT_EFFECT_NO_SELECT_IF_NEW}
---
apiVersion: fleetstream.io/v1alpha1
kind: Cluster
metadata: {name: us-1, labels: {region: us}}
---
apiVersion: fleetstream.io/v1alpha1
kind: RoleTemplate
metadata: {name: reader}
spec:
  displayName: Reader
  rules:
  - {verbs: [get, list], apiGroups: [""], resources: [pods]}
---
apiVersion: fleetstream.io/v1alpha1
kind: RoleTemplate
metadata: {name: operator, annotations: {owner: platform}}
spec:
  inherits: [reader]
  rules:
  - {verbs: [delete], apiGroups: [""], resources: [pods]}
---
apiVersion: fleetstream.io/v1alpha1
kind: ClusterSet
metadata: {name: europe}
spec:
  selector:
    type: SELECTOR_TYPE_LABEL_SELECTOR
    labelSelector: {matchLabels: {region: eu}}
---
apiVersion: fleetstream.io/v1alpha1
kind: Project
metadata: {name: team-a, labels: {org: web}}
spec:
  displayName: Team A
  budgets:
  - cluster: eu-1
    hard: {cpu: "8"}
---
apiVersion: fleetstream.io/v1alpha1
kind: ClusterSetBinding
metadata: {project: team-a}
spec: {clusterSet: europe}
---
apiVersion: fleetstream.io/v1alpha1
kind: NamespaceBinding
metadata: {name: web, project: team-a}
spec:
  cluster: eu-1
  hard: {cpu: "2"}
---
apiVersion: fleetstream.io/v1alpha1
kind: NamespaceBinding
metadata: {name: web, project: team-a}
spec: {cluster: us-1}
---
apiVersion: fleetstream.io/v1alpha1
kind: ProjectRoleBinding
metadata: {project: team-a}
spec:
  subject: {kind: SUBJECT_KIND_GROUP, name: web-devs}
  roleTemplate: operator
---
apiVersion: fleetstream.io/v1alpha1
kind: Placement
metadata: {name: best-eu, project: team-a}
spec:
  clusterSets: [europe]
  numberOfClusters: 1
  predicates:
  - requiredClusterSelector: {labelSelector: {matchLabels: {region: eu}}}
  tolerations:
  - {operator: Exists}
---
apiVersion: fleetstream.io/v1alpha1
kind: NamespaceBinding
metadata: {name: shop, project: team-a}
spec: {placement: best-eu, hard: {cpu: "1"}}
---
apiVersion: fleetstream.io/v1alpha1
kind: Subscriber
metadata: {name: audit}
spec: {streams: [FLEET_RBAC, FLEET_NS]}
---
apiVersion: fleetstream.io/v1alpha1
kind: ImportPolicy
metadata: {name: capi}
spec:
  source: {cluster: eu-1, group: cluster.x-k8s.io, version: v1beta1, resource: clusters}
  references:
  - {key: kubeconfig, version: v1, resource: secrets, namespaceTemplate: "{{ .source.metadata.namespace }}", nameTemplate: "{{ .source.metadata.name }}-kubeconfig"}
  nameTemplate: "{{ .source.metadata.name }}"
  template: |
    labels: {provider: capi}
    credentials:
      kubeconfig: "{{ .references.kubeconfig.data.value }}"
  creationCondition: "true"
`

// TestApplyEndToEnd runs apply, diff and export against the real cluster-import,
// namespace-binding and rbac-sync: every kind created, an unchanged rerun, an update, diff's
// exit codes, the refusals that change nothing, and an export that rebuilds the fleet on an
// empty hub.
func TestApplyEndToEnd(t *testing.T) {
	h := startRBACHub(t)
	dir := t.TempDir()
	fleetDir := filepath.Join(dir, "fleet")
	if err := os.MkdirAll(filepath.Join(fleetDir, "team-a"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Fleet-wide objects in one file, the project's in its folder: a directory is read whole.
	parts := strings.SplitN(fleetManifests, "kind: Project\n", 2)
	writeFile(t, filepath.Join(fleetDir, "fleet.yaml"), strings.TrimSuffix(parts[0], "apiVersion: fleetstream.io/v1alpha1\n"))
	writeFile(t, filepath.Join(fleetDir, "team-a", "project.yaml"), "apiVersion: fleetstream.io/v1alpha1\nkind: Project\n"+parts[1])
	tokens := filepath.Join(dir, "tokens")

	// Registering clusters without somewhere to put their tokens: refused, nothing written.
	r := h.run(t, "apply", "-f", fleetDir)
	if r.code != 1 || !strings.Contains(r.stderr, "Cluster/eu-1: registering a cluster hands out its agent token once: give --token-dir to receive it") ||
		!strings.Contains(r.stderr, "error: 3 of 14 objects cannot be applied; nothing was changed") {
		t.Fatalf("apply without --token-dir: exit %d\n%s", r.code, r.stderr)
	}
	if out := h.run(t, "cluster", "list").ok(t).stdout; strings.Contains(out, "eu-1") {
		t.Fatalf("a refused apply registered a cluster:\n%s", out)
	}

	// diff before anything exists: every object is new, exit 1.
	r = h.run(t, "diff", "-f", fleetDir)
	if r.code != 1 {
		t.Fatalf("diff of a new fleet: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, key := range []string{"Cluster/eu-1", "Cluster/us-1", "RoleTemplate/reader", "RoleTemplate/operator", "ClusterSet/europe", "Subscriber/audit",
		"Project/team-a", "ImportPolicy/capi", "ClusterSetBinding/team-a/europe", "Placement/team-a/best-eu", "NamespaceBinding/team-a/cluster=eu-1/web",
		"NamespaceBinding/team-a/cluster=us-1/web", "ProjectRoleBinding/team-a/operator/group:web-devs", "NamespaceBinding/team-a/placement=best-eu/shop"} {
		if !strings.Contains(r.stdout, "--- /dev/null\n+++ declared/"+key+"\n") {
			t.Errorf("diff of a new fleet lacks %s:\n%s", key, r.stdout)
		}
	}

	r = h.run(t, "apply", "-f", fleetDir, "--token-dir", tokens).ok(t)
	want := `Cluster/eu-1 created
Cluster/us-1 created
RoleTemplate/reader created
ClusterSet/europe created
Subscriber/audit created
RoleTemplate/operator created
Project/team-a created
ImportPolicy/capi created
ClusterSetBinding/team-a/europe created
Placement/team-a/best-eu created
NamespaceBinding/team-a/cluster=eu-1/web created
NamespaceBinding/team-a/cluster=us-1/web created
ProjectRoleBinding/team-a/operator/group:web-devs created
NamespaceBinding/team-a/placement=best-eu/shop created
`
	if r.stdout != want {
		t.Fatalf("first apply:\n%s\nwant:\n%s", r.stdout, want)
	}
	for _, c := range []string{"eu-1", "us-1", "subscriber-audit"} {
		info, err := os.Stat(filepath.Join(tokens, c+".token"))
		if err != nil {
			t.Fatal(err)
		}
		if info.Mode().Perm() != 0o600 {
			t.Errorf("%s.token has mode %v, want 0600", c, info.Mode().Perm())
		}
		token, _ := os.ReadFile(filepath.Join(tokens, c+".token"))
		if len(strings.TrimSpace(string(token))) < 16 || strings.Contains(r.stdout+r.stderr, strings.TrimSpace(string(token))) {
			t.Errorf("%s's agent token is missing or was printed", c)
		}
	}

	// A namespace that follows a placement is listed through its bindings, which the scheduler
	// makes once it has decided.
	waitFor(t, 30*time.Second, "shop bound on the placement's cluster", func() bool {
		return strings.Contains(h.run(t, "namespace", "list", "--project", "team-a").ok(t).stdout, "shop")
	})

	// The same manifests again: nothing to do, and diff agrees.
	r = h.run(t, "apply", "-f", fleetDir, "--token-dir", tokens).ok(t)
	if got := strings.Count(r.stdout, " unchanged\n"); got != 14 {
		t.Fatalf("second apply: %d unchanged, want 14:\n%s", got, r.stdout)
	}
	if r := h.run(t, "diff", "-f", fleetDir); r.code != 0 || r.stdout != "" {
		t.Fatalf("diff of an applied fleet: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// Change a label, a quota, a budget, a template's rules, a cluster set's selector (eu-1,
	// now silver, stays its one member) and an import policy's name template.
	changed := strings.NewReplacer(
		"labels: {region: eu, tier: gold}", "labels: {region: eu, tier: silver}",
		"cluster: eu-1\n  hard: {cpu: \"2\"}", "cluster: eu-1\n  hard: {cpu: \"4\"}",
		"hard: {cpu: \"8\"}", "hard: {cpu: \"16\"}",
		"verbs: [get, list]", "verbs: [get, list, watch]",
		"numberOfClusters: 1", "numberOfClusters: 2",
		"placement: best-eu, hard: {cpu: \"1\"}", "placement: best-eu, hard: {cpu: \"3\"}",
		"type: SELECTOR_TYPE_LABEL_SELECTOR\n    labelSelector: {matchLabels: {region: eu}}", "type: SELECTOR_TYPE_LABEL_SELECTOR\n    labelSelector: {matchLabels: {region: eu, tier: silver}}",
		`nameTemplate: "{{ .source.metadata.name }}"`, `nameTemplate: "capi-{{ .source.metadata.name }}"`,
	).Replace(fleetManifests)
	if strings.Count(changed, "tier: silver") != 2 || !strings.Contains(changed, "capi-{{") {
		t.Fatalf("the change does not change the cluster set and the import policy:\n%s", changed)
	}
	changedFile := filepath.Join(dir, "changed.yaml")
	writeFile(t, changedFile, changed)
	r = h.run(t, "diff", "-f", changedFile)
	if r.code != 1 {
		t.Fatalf("diff of a change: exit %d\n%s", r.code, r.stderr)
	}
	for _, line := range []string{"--- live/Cluster/eu-1\n+++ declared/Cluster/eu-1\n", "-    tier: gold\n+    tier: silver\n", "-      cpu: \"8\"\n+      cpu: \"16\"\n", "+    - watch\n",
		"+++ declared/ClusterSet/europe\n", "+        tier: silver\n", "+++ declared/ImportPolicy/capi\n", "+  nameTemplate: capi-{{ .source.metadata.name }}\n"} {
		if !strings.Contains(r.stdout, line) {
			t.Errorf("diff lacks %q:\n%s", line, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "us-1") {
		t.Errorf("diff shows an unchanged object:\n%s", r.stdout)
	}
	r = h.run(t, "apply", "-f", changedFile).ok(t)
	for _, line := range []string{"Cluster/eu-1 configured", "Cluster/us-1 unchanged", "RoleTemplate/reader configured", "RoleTemplate/operator unchanged",
		"ClusterSet/europe configured", "ImportPolicy/capi configured", "Subscriber/audit unchanged",
		"Project/team-a configured", "Placement/team-a/best-eu configured", "NamespaceBinding/team-a/cluster=eu-1/web configured", "NamespaceBinding/team-a/cluster=us-1/web unchanged", "NamespaceBinding/team-a/placement=best-eu/shop configured"} {
		if !strings.Contains(r.stdout, line+"\n") {
			t.Errorf("apply of a change lacks %q:\n%s", line, r.stdout)
		}
	}
	// The placement's bindings follow the new quota as the follower gets to them.
	waitFor(t, 30*time.Second, "diff after applying the change to come back clean", func() bool {
		return h.run(t, "diff", "-f", changedFile).code == 0
	})
	// The API holds the changes.
	type labelSelectorJSON struct {
		MatchLabels map[string]string `json:"matchLabels"`
	}
	set := jsonOf[struct {
		Selector struct {
			LabelSelector labelSelectorJSON `json:"labelSelector"`
		} `json:"selector"`
	}](t, h.run(t, "-o", "json", "clusterset", "get", "europe").ok(t))
	if m := set.Selector.LabelSelector.MatchLabels; len(m) != 2 || m["region"] != "eu" || m["tier"] != "silver" {
		t.Errorf("cluster set europe after the update: %+v", set)
	}
	policy := jsonOf[struct {
		NameTemplate string `json:"nameTemplate"`
	}](t, h.run(t, "-o", "json", "import", "policy", "get", "capi").ok(t))
	if policy.NameTemplate != "capi-{{ .source.metadata.name }}" {
		t.Errorf("import policy capi after the update: %+v", policy)
	}
	// The same changed manifests again: nothing to do.
	r = h.run(t, "apply", "-f", changedFile).ok(t)
	if got := strings.Count(r.stdout, " unchanged\n"); got != 14 {
		t.Fatalf("apply of the change again: %d unchanged, want 14:\n%s", got, r.stdout)
	}

	// A server dry run asks rbac-sync which RoleBindings a new project role binding makes.
	writeFile(t, filepath.Join(dir, "bob.yaml"), changed+"---\napiVersion: fleetstream.io/v1alpha1\nkind: ProjectRoleBinding\nmetadata: {project: team-a}\nspec: {subject: {kind: SUBJECT_KIND_USER, name: bob}, roleTemplate: reader}\n")
	r = h.run(t, "apply", "-f", filepath.Join(dir, "bob.yaml"), "--dry-run=server").ok(t)
	if !strings.Contains(r.stdout, "ProjectRoleBinding/team-a/reader/user:bob created (server dry run)\n") || !strings.Contains(r.stdout, "\n  create eu-1 web/fleetstream:reader\n") ||
		!strings.Contains(r.stdout, "Cluster/eu-1 unchanged (dry run)\n") {
		t.Errorf("server dry run:\n%s", r.stdout)
	}
	if r := h.run(t, "member", "list", "team-a"); strings.Contains(r.stdout, "bob") {
		t.Errorf("the server dry run bound bob:\n%s", r.stdout)
	}

	// What the API cannot do is refused before anything is written.
	writeFile(t, filepath.Join(dir, "bad.yaml"), strings.Replace(changed, "displayName: Team A", "displayName: Team B", 1)+
		"---\napiVersion: fleetstream.io/v1alpha1\nkind: NamespaceBinding\nmetadata: {name: api, project: team-x}\nspec: {cluster: eu-1}\n")
	r = h.run(t, "apply", "-f", filepath.Join(dir, "bad.yaml"))
	if r.code != 1 || !strings.Contains(r.stderr, "Project/team-a: spec.displayName: a project's display name cannot be changed") ||
		!strings.Contains(r.stderr, "NamespaceBinding/team-x/cluster=eu-1/api: project team-x is neither declared nor in the fleet") {
		t.Fatalf("apply of impossible changes: exit %d\n%s", r.code, r.stderr)
	}
	// diff says 2 for them too, after the diff: apply would change nothing.
	r = h.run(t, "diff", "-f", filepath.Join(dir, "bad.yaml"))
	if r.code != 2 || !strings.Contains(r.stderr, "Project/team-a: spec.displayName: a project's display name cannot be changed") ||
		!strings.Contains(r.stderr, "NamespaceBinding/team-x/cluster=eu-1/api: project team-x is neither declared nor in the fleet") ||
		!strings.Contains(r.stderr, "error: 2 of 15 objects cannot be applied as declared (above); apply would change nothing") || !strings.Contains(r.stdout, "+  displayName: Team B\n") {
		t.Fatalf("diff of impossible changes: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// diff says 2 for an error.
	if r := h.run(t, "diff", "-f", filepath.Join(dir, "missing.yaml")); r.code != 2 {
		t.Fatalf("diff of a missing file: exit %d, want 2", r.code)
	}

	// Export, apply the export to an empty hub: every List answers the same. This hub runs no
	// endpoint collector: the whole fleet's export has no service weights, while asking for
	// them by kind is an error.
	export := h.run(t, "export").ok(t).stdout
	h.run(t, "export", "--kind", "ServiceWeights").fails(t, "error: unimplemented: ")
	exportFile := filepath.Join(dir, "export.yaml")
	writeFile(t, exportFile, export)
	if r := h.run(t, "diff", "-f", exportFile); r.code != 0 {
		t.Fatalf("the export differs from the fleet it came from: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	h2 := startRBACHub(t)
	h2.run(t, "apply", "-f", exportFile, "--token-dir", filepath.Join(dir, "tokens2")).ok(t)
	// The rebuilt fleet's scheduler decides the placement, and binds the namespace that follows
	// it, in its own time.
	var again string
	var original, rebuilt []proto.Message
	same := func() bool {
		again = h2.run(t, "export").ok(t).stdout
		if again != export {
			return false
		}
		original, rebuilt = listFleet(t, h), listFleet(t, h2)
		for i := range original {
			if !proto.Equal(original[i], rebuilt[i]) {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(30 * time.Second)
	for !same() && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	if again != export {
		t.Errorf("export of the rebuilt fleet differs:\n%s\nwant:\n%s", again, export)
	}
	for i := range original {
		if !proto.Equal(original[i], rebuilt[i]) {
			t.Errorf("the rebuilt fleet answers %T differently:\n%s\nwant:\n%s", original[i], prototext.Format(rebuilt[i]), prototext.Format(original[i]))
		}
	}

	// Exporting one project.
	r = h.run(t, "export", "--project", "team-a").ok(t)
	if strings.Contains(r.stdout, "kind: Cluster\n") || !strings.Contains(r.stdout, "kind: ProjectRoleBinding\n") {
		t.Errorf("export --project team-a:\n%s", r.stdout)
	}
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// listFleet answers every List call of the kinds manifests declare, with what differs between
// two fleets built alike (ids, revisions and times) cleared.
func listFleet(t *testing.T, h *hubEnv) []proto.Message {
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
		clearVolatile(m.ProtoReflect())
		// The registry keeps its own taints and the user's in the order they came, which
		// differs between a fleet built over time and one built at once.
		if l, ok := m.(*clusterv1.ListClustersResponse); ok {
			for _, c := range l.Clusters {
				slices.SortFunc(c.Taints, func(a, b *clusterv1.Taint) int { return strings.Compare(a.Key, b.Key) })
			}
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

func msg[T any](res *connect.Response[T], err error) (proto.Message, error) {
	if err != nil {
		return nil, err
	}
	return any(res.Msg).(proto.Message), nil
}

// clearVolatile clears, everywhere in m, ids, revisions and times: what two fleets built from
// the same manifests do not share.
func clearVolatile(m protoreflect.Message) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		name := string(fd.Name())
		if name == "id" || name == "revision" || strings.HasSuffix(name, "_id") || strings.HasSuffix(name, "_time") || name == "time_added" ||
			(fd.Kind() == protoreflect.MessageKind && fd.Message().FullName() == "google.protobuf.Timestamp") {
			m.Clear(fd)
			return true
		}
		switch {
		case fd.IsMap():
			if fd.MapValue().Kind() == protoreflect.MessageKind {
				v.Map().Range(func(_ protoreflect.MapKey, e protoreflect.Value) bool { clearVolatile(e.Message()); return true })
			}
		case fd.IsList():
			if fd.Kind() == protoreflect.MessageKind {
				for i := 0; i < v.List().Len(); i++ {
					clearVolatile(v.List().Get(i).Message())
				}
			}
		case fd.Kind() == protoreflect.MessageKind:
			clearVolatile(v.Message())
		}
		return true
	})
}

// TestApplyPrune: an apply set's objects that the manifests no longer declare are listed by
// --dry-run and deleted by --prune, bindings first; a project still holding namespaces only
// with --cascade; objects outside the set stay, and so do those of the kinds without labels
// (role templates, cluster sets, subscribers, import policies) that the set applied.
func TestApplyPrune(t *testing.T) {
	h := startRBACHub(t)
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	doc := func(kind, meta, spec string) string {
		return "---\napiVersion: fleetstream.io/v1alpha1\nkind: " + kind + "\nmetadata: " + meta + "\nspec: " + spec + "\n"
	}
	v2 := doc("Cluster", "{name: eu-1}", "{}") +
		doc("Project", "{name: team-a}", "{displayName: A}") +
		doc("NamespaceBinding", "{name: web, project: team-a}", "{cluster: eu-1}") +
		doc("ClusterSetBinding", "{project: team-a}", "{clusterSet: global}") +
		doc("Placement", "{name: one, project: team-a}", "{numberOfClusters: 1, tolerations: [{operator: Exists}]}")
	v1 := v2 + doc("Cluster", "{name: eu-2}", "{}") +
		doc("NamespaceBinding", "{name: shop, project: team-a}", "{placement: one}") +
		doc("NamespaceBinding", "{name: api, project: team-a}", "{cluster: eu-2}") +
		doc("Project", "{name: team-b}", "{displayName: B}") +
		doc("NamespaceBinding", "{name: db, project: team-b}", "{cluster: eu-1}") +
		doc("ClusterSetBinding", "{project: team-b}", "{clusterSet: global}") +
		doc("Placement", "{name: any, project: team-b}", "{numberOfClusters: 1}") +
		doc("ProjectRoleBinding", "{project: team-b}", "{subject: {kind: SUBJECT_KIND_USER, name: bob}, roleTemplate: project-viewer}") +
		// Kinds without labels: no object of them records the set, so prune never deletes one.
		doc("RoleTemplate", "{name: reader}", "{rules: [{verbs: [get], apiGroups: [\"\"], resources: [pods]}]}") +
		doc("ClusterSet", "{name: europe}", "{selector: {type: SELECTOR_TYPE_LABEL_SELECTOR, labelSelector: {matchLabels: {region: eu}}}}") +
		doc("Subscriber", "{name: audit}", "{streams: [FLEET_NS]}") +
		doc("ImportPolicy", "{name: capi}", "{source: {cluster: eu-1, group: cluster.x-k8s.io, version: v1beta1, resource: clusters}, nameTemplate: \"{{ .source.metadata.name }}\", template: \"labels: {provider: capi}\", creationCondition: \"true\"}")
	writeFile(t, filepath.Join(dir, "v1.yaml"), v1)
	writeFile(t, filepath.Join(dir, "v2.yaml"), v2)
	h.run(t, "apply", "-f", filepath.Join(dir, "v1.yaml"), "--applyset", "prod", "--token-dir", tokens).ok(t)
	// shop, which follows a placement, is listed (and so pruned) once the scheduler has decided.
	waitFor(t, 30*time.Second, "shop bound on the placement's cluster", func() bool {
		return strings.Contains(h.run(t, "namespace", "list", "--project", "team-a").ok(t).stdout, "shop")
	})
	// Another set cannot take the objects of this one over (nothing is written).
	if r := h.run(t, "apply", "-f", filepath.Join(dir, "v2.yaml"), "--applyset", "staging"); r.code != 1 ||
		!strings.Contains(r.stderr, "Cluster/eu-1: metadata.labels[applyset.fleetstream.io/part-of]: eu-1 belongs to apply set prod, not staging") ||
		!strings.Contains(r.stderr, "nothing was changed") {
		t.Fatalf("apply of another set's objects: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// Outside the set: made by hand.
	h.run(t, "cluster", "register", "manual").ok(t)
	h.run(t, "project", "create", "other").ok(t)
	h.run(t, "namespace", "bind", "tools", "--project", "other", "--cluster", "eu-1").ok(t)

	if r := h.run(t, "apply", "-f", filepath.Join(dir, "v2.yaml"), "--prune"); r.code != 1 || !strings.Contains(r.stderr, "--prune needs --applyset") {
		t.Fatalf("--prune without --applyset: exit %d %s", r.code, r.stderr)
	}
	r := h.run(t, "apply", "-f", filepath.Join(dir, "v2.yaml"), "--applyset", "prod", "--prune", "--dry-run")
	if r.code != 1 || !strings.Contains(r.stderr, "Project/team-b: prune would delete the project with its 1 namespace binding(s); give --cascade to unbind them with it") {
		t.Fatalf("prune of a project holding namespaces: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = h.run(t, "apply", "-f", filepath.Join(dir, "v2.yaml"), "--applyset", "prod", "--prune", "--cascade", "--dry-run").ok(t)
	want := `Cluster/eu-1 unchanged (dry run)
Project/team-a unchanged (dry run)
ClusterSetBinding/team-a/global unchanged (dry run)
Placement/team-a/one unchanged (dry run)
NamespaceBinding/team-a/cluster=eu-1/web unchanged (dry run)
NamespaceBinding/team-b/cluster=eu-1/db pruned (dry run)
NamespaceBinding/team-a/placement=one/shop pruned (dry run)
NamespaceBinding/team-a/cluster=eu-2/api pruned (dry run)
ProjectRoleBinding/team-b/project-viewer/user:bob pruned (dry run)
Placement/team-b/any pruned (dry run)
ClusterSetBinding/team-b/global pruned (dry run)
Project/team-b pruned (dry run)
Cluster/eu-2 pruned (dry run)
`
	if r.stdout != want {
		t.Fatalf("prune dry run:\n%s\nwant:\n%s", r.stdout, want)
	}
	r = h.run(t, "diff", "-f", filepath.Join(dir, "v2.yaml"), "--applyset", "prod", "--prune")
	if r.code != 1 || !strings.Contains(r.stdout, "--- live/Project/team-b\n+++ /dev/null\n") || strings.Contains(r.stdout, "other") {
		t.Fatalf("diff --prune: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	before := h.run(t, "export").ok(t).stdout
	if !strings.Contains(before, "name: team-b") {
		t.Fatalf("the dry run changed the fleet:\n%s", before)
	}
	r = h.run(t, "apply", "-f", filepath.Join(dir, "v2.yaml"), "--applyset", "prod", "--prune", "--cascade").ok(t)
	if !strings.Contains(r.stdout, "Project/team-b pruned\nCluster/eu-2 pruned\n") {
		t.Fatalf("prune:\n%s", r.stdout)
	}
	if r := h.run(t, "diff", "-f", filepath.Join(dir, "v2.yaml"), "--applyset", "prod", "--prune"); r.code != 0 {
		t.Fatalf("diff --prune after the prune: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	after := h.run(t, "export").ok(t).stdout
	for _, gone := range []string{"name: team-b", "project: team-b", "name: eu-2", "name: api", "name: db", "name: any", "name: shop"} {
		if strings.Contains(after, gone) {
			t.Errorf("pruned object still there (%s):\n%s", gone, after)
		}
	}
	for _, kept := range []string{"name: manual", "name: other", "name: tools", "name: web", "name: reader", "name: europe", "name: audit", "name: capi"} {
		if !strings.Contains(after, kept) {
			t.Errorf("object outside the set or still declared was pruned (%s):\n%s", kept, after)
		}
	}
}

// TestApplyFailsHalfway: an object the API refuses fails alone, the others are applied, and a
// rerun of the corrected manifests finishes without redoing them.
func TestApplyFailsHalfway(t *testing.T) {
	h := startHub(t)
	dir := t.TempDir()
	doc := func(kind, meta, spec string) string {
		return "---\napiVersion: fleetstream.io/v1alpha1\nkind: " + kind + "\nmetadata: " + meta + "\nspec: " + spec + "\n"
	}
	good := doc("Cluster", "{name: c1}", "{}") + doc("Project", "{name: p}", "{}") +
		doc("NamespaceBinding", "{name: a, project: p}", "{cluster: c1}") +
		doc("NamespaceBinding", "{name: b, project: p}", "{cluster: c1, hard: {cpu: \"1\"}}")
	// kube-system is protected: namespace-binding refuses to bind it.
	writeFile(t, filepath.Join(dir, "bad.yaml"), good+doc("NamespaceBinding", "{name: kube-system, project: p}", "{cluster: c1}"))
	writeFile(t, filepath.Join(dir, "good.yaml"), good)
	r := h.run(t, "apply", "-f", filepath.Join(dir, "bad.yaml"), "--token-dir", filepath.Join(dir, "tokens"))
	if r.code != 1 || !strings.Contains(r.stderr, "NamespaceBinding/p/cluster=c1/kube-system: error: invalid_argument: ") ||
		!strings.Contains(r.stderr, "error: 1 of 5 objects failed; apply again to finish") ||
		!strings.Contains(r.stdout, "NamespaceBinding/p/cluster=c1/a created\n") || !strings.Contains(r.stdout, "NamespaceBinding/p/cluster=c1/b created\n") {
		t.Fatalf("apply with one refused object: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = h.run(t, "apply", "-f", filepath.Join(dir, "good.yaml")).ok(t)
	if got := strings.Count(r.stdout, " unchanged\n"); got != 4 {
		t.Fatalf("rerun: %d unchanged, want 4:\n%s", got, r.stdout)
	}
}

// A token is handed out once: apply never writes it over another token's file (cluster
// "subscriber-audit" and subscriber "audit" would share one) and refuses before creating the
// object whose token would have nowhere to go.
func TestApplyNeverOverwritesATokenFile(t *testing.T) {
	h := startHub(t)
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	doc := func(kind, meta, spec string) string {
		return "---\napiVersion: fleetstream.io/v1alpha1\nkind: " + kind + "\nmetadata: " + meta + "\nspec: " + spec + "\n"
	}
	writeFile(t, filepath.Join(dir, "fleet.yaml"), doc("Cluster", "{name: subscriber-audit}", "{}")+doc("Subscriber", "{name: audit}", "{streams: [FLEET_RBAC]}"))
	// Both are applied at once: whichever writes the file first keeps it, the other fails.
	r := h.run(t, "apply", "-f", filepath.Join(dir, "fleet.yaml"), "--token-dir", tokens)
	first, err := os.ReadFile(filepath.Join(tokens, "subscriber-audit.token"))
	if err != nil {
		t.Fatal(err)
	}
	if r.code != 1 || !strings.Contains(r.stderr, "error: 1 of 2 objects failed") ||
		!strings.Contains(r.stderr, "subscriber-audit.token: file exists") && !strings.Contains(r.stderr, "subscriber-audit.token, which already exists") {
		t.Fatalf("apply of a cluster and a subscriber sharing a token file: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// The rerun creates nothing whose token would go to that file.
	r = h.run(t, "apply", "-f", filepath.Join(dir, "fleet.yaml"), "--token-dir", tokens)
	if after, _ := os.ReadFile(filepath.Join(tokens, "subscriber-audit.token")); string(after) != string(first) {
		t.Fatalf("a token file was overwritten (rerun exit %d)\n%s%s", r.code, r.stdout, r.stderr)
	}
	if fi, err := os.Stat(filepath.Join(tokens, "subscriber-audit.token")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file mode: %v %v", fi, err)
	}
}
