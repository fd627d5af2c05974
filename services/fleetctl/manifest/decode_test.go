package manifest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
)

const goodCluster = `apiVersion: fleetstream.io/v1alpha1
kind: Cluster
metadata:
  name: eu-1
  labels: {region: eu}
spec:
  claims: {cloud: aws}
  taints:
  - key: maintenance
    effect: TAINT_EFFECT_NO_SELECT
`

func TestDecode(t *testing.T) {
	objs, err := Decode("fleet.yaml", strings.NewReader(goodCluster+"---\n---\n"+`apiVersion: fleetstream.io/v1alpha1
kind: Project
metadata: {name: team-a, labels: {tier: gold}}
spec:
  displayName: Team A
  budgets:
  - cluster: eu-1
    hard: {cpu: "10"}
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 2 {
		t.Fatalf("got %d objects, want 2 (the empty document skipped)", len(objs))
	}
	c := objs[0]
	want := &clusterv1.Cluster{Claims: map[string]string{"cloud": "aws"}, Taints: []*clusterv1.Taint{{Key: "maintenance", Effect: clusterv1.TaintEffect_TAINT_EFFECT_NO_SELECT}}}
	if c.Name != "eu-1" || c.Labels["region"] != "eu" || !proto.Equal(c.Spec, want) {
		t.Errorf("cluster = %s %v %v", c.Name, c.Labels, c.Spec)
	}
	if c.Source.Line != 1 || objs[1].Source.Doc != 3 || objs[1].Source.Line != 13 {
		t.Errorf("sources = %+v, %+v", c.Source, objs[1].Source)
	}
	p := objs[1].Spec.(*projectv1.Project)
	if p.DisplayName != "Team A" || p.Budgets[0].Hard["cpu"] != "10" {
		t.Errorf("project = %v", p)
	}

	// What Encode writes, Decode reads back as the same objects.
	var b bytes.Buffer
	if err := Encode(&b, objs); err != nil {
		t.Fatal(err)
	}
	again, err := Decode("again.yaml", &b)
	if err != nil {
		t.Fatalf("decode of encoded: %v\n%s", err, b.String())
	}
	for i := range objs {
		if !proto.Equal(objs[i].Spec, again[i].Spec) || objs[i].Key() != again[i].Key() {
			t.Errorf("round trip of %s: %v != %v", objs[i].Key(), objs[i].Spec, again[i].Spec)
		}
	}
}

// TestDecodeErrors: every bad manifest is refused with its file, document, line and field path,
// and never with a value it may be a secret.
func TestDecodeErrors(t *testing.T) {
	const head = "apiVersion: fleetstream.io/v1alpha1\n"
	for _, tc := range []struct {
		name, in, want string
	}{
		{"not YAML", "kind: [Cluster\n", `f.yaml:0: document 1: not YAML: line 1: did not find expected ',' or ']'`},
		{"not a mapping", "- a\n", "f.yaml:1: document 1: want a mapping with apiVersion, kind, metadata and spec, got a list"},
		{"unknown version", "apiVersion: fleetstream.io/v2\nkind: Cluster\nmetadata: {name: a}\n", `f.yaml:1: document 1: apiVersion: unknown version "fleetstream.io/v2", want fleetstream.io/v1alpha1`},
		{"no version", "kind: Cluster\nmetadata: {name: a}\n", "f.yaml:1: document 1: apiVersion: required"},
		{"unknown kind", head + "kind: Widget\nmetadata: {name: a}\n", `f.yaml:2: document 1: kind: unknown kind "Widget", want one of Cluster, RoleTemplate, ClusterSet, Subscriber, ImportPolicy, Project, ClusterSetBinding, Placement, NamespaceBinding, ProjectRoleBinding, ServiceWeights`},
		{"unknown top field", head + "kind: Cluster\nmetadata: {name: a}\nstatus: {}\n", "f.yaml:4: document 1: status: unknown field (want apiVersion, kind, metadata and spec)"},
		{"unknown metadata field", head + "kind: Cluster\nmetadata:\n  name: a\n  namespace: b\n", "f.yaml:5: document 1: metadata.namespace: unknown field (want name, project, labels and annotations)"},
		{"no name", head + "kind: Cluster\nmetadata: {}\n", "f.yaml:3: document 1: metadata.name: required"},
		{"bad name", head + "kind: Cluster\nmetadata: {name: Eu_1}\n", `f.yaml:3: document 1: metadata.name: "Eu_1" is not a DNS label (lower-case letters, digits and '-', at most 63)`},
		{"project on fleet-wide kind", head + "kind: Cluster\nmetadata: {name: a, project: p}\n", "f.yaml:3: document 1: metadata.project: a Cluster is fleet-wide, it belongs to no project"},
		{"no project", head + "kind: NamespaceBinding\nmetadata: {name: web}\nspec: {cluster: a}\n", "f.yaml:3: document 1: metadata.project: required: a NamespaceBinding belongs to a project"},
		{"labels the API cannot keep", head + "kind: RoleTemplate\nmetadata: {name: a, labels: {x: y}}\n", "f.yaml:3: document 1: metadata.labels: a RoleTemplate has no labels in the API, so apply could not keep them"},
		{"label not a string", head + "kind: Cluster\nmetadata:\n  name: a\n  labels: {tier: 1}\n", "f.yaml:5: document 1: metadata.labels.tier: want a string, got an integer (quote it)"},
		{"unknown spec field", head + "kind: Cluster\nmetadata: {name: a}\nspec:\n  taints:\n  - key: k\n    efect: TAINT_EFFECT_NO_SELECT\n", "f.yaml:7: document 1: spec.taints[0].efect: unknown field (want key, value, effect)"},
		{"output-only field", head + "kind: Cluster\nmetadata: {name: a}\nspec:\n  status: {}\n", "f.yaml:5: document 1: spec.status: unknown field (want claims, taints)"},
		{"output-only nested field", head + "kind: Project\nmetadata: {name: a}\nspec:\n  budgets:\n  - cluster: c\n    allocated: {cpu: \"1\"}\n", "f.yaml:7: document 1: spec.budgets[0].allocated: unknown field (want cluster, hard)"},
		{"mistyped scalar", head + "kind: RoleTemplate\nmetadata: {name: a}\nspec:\n  locked: yes please\n", "f.yaml:5: document 1: spec.locked: want true or false, got a string"},
		{"mistyped list", head + "kind: RoleTemplate\nmetadata: {name: a}\nspec:\n  inherits: view\n", "f.yaml:5: document 1: spec.inherits: want a list, got a string"},
		{"unknown enum", head + "kind: Cluster\nmetadata: {name: a}\nspec:\n  taints: [{key: k, effect: NoSchedule}]\n", `f.yaml:5: document 1: spec.taints[0].effect: unknown value "NoSchedule", want one of TAINT_EFFECT_NO_SELECT, TAINT_EFFECT_NO_SELECT_IF_NEW, TAINT_EFFECT_PREFER_NO_SELECT`},
		{"duplicate key", head + "kind: Cluster\nmetadata: {name: a}\nspec:\n  claims: {a: b}\n  claims: {c: d}\n", "f.yaml:6: document 1: spec.claims: given twice"},
		{"binding with cluster and placement", head + "kind: NamespaceBinding\nmetadata: {name: web, project: p}\nspec: {cluster: a, placement: b}\n", "f.yaml:1: document 1: spec: want exactly one of cluster and placement"},
		{"secret where a reference is expected", head + "kind: ImportPolicy\nmetadata: {name: p}\nspec:\n  template: |\n    credentials:\n      token: s3cr3t-t0ken\n", "f.yaml:1: document 1: spec.template: credentials.token holds a literal value where a reference is expected ({{ .references.<key>... }}): a secret does not belong in a manifest (the value is not shown)"},
		{"weights without a namespace", head + "kind: ServiceWeights\nmetadata: {name: api}\nspec: {clusterWeights: {eu-1: 0}}\n", "f.yaml:1: document 1: spec.namespace: required"},
		{"weight too large", head + "kind: ServiceWeights\nmetadata: {name: api}\nspec: {namespace: web, clusterWeights: {eu-1: 70000}}\n", "f.yaml:1: document 1: spec.clusterWeights[eu-1]: 70000 is more than 65535"},
		{"weight of a bad cluster name", head + "kind: ServiceWeights\nmetadata: {name: api}\nspec: {namespace: web, clusterWeights: {EU: 1}}\n", `f.yaml:1: document 1: spec.clusterWeights[EU]: "EU" is not a cluster name (a DNS label)`},
		{"endpoint weight without a cluster", head + "kind: ServiceWeights\nmetadata: {name: api}\nspec: {namespace: web, endpointWeights: [{ip: 10.0.0.1, weight: 0}]}\n", "f.yaml:1: document 1: spec.endpointWeights[0].clusterName: required: an endpoint weight binds to the endpoint serving the IP in one cluster"},
		{"endpoint weight of no IP", head + "kind: ServiceWeights\nmetadata: {name: api}\nspec: {namespace: web, endpointWeights: [{ip: 10.0.0.300, clusterName: eu-1}]}\n", `f.yaml:1: document 1: spec.endpointWeights[0].ip: "10.0.0.300" is not an IP address`},
		{"endpoint weight twice", head + "kind: ServiceWeights\nmetadata: {name: api}\nspec: {namespace: web, endpointWeights: [{ip: \"2001:DB8::1\", clusterName: eu-1}, {ip: \"2001:db8::1\", clusterName: eu-1, weight: 5}]}\n", "f.yaml:1: document 1: spec.endpointWeights[1]: a second weight for 2001:db8::1 in cluster eu-1"},
		{"computed endpoint field", head + "kind: ServiceWeights\nmetadata: {name: api}\nspec: {namespace: web, endpointWeights: [{ip: 10.0.0.1, clusterName: eu-1, targetUid: x}]}\n", "f.yaml:4: document 1: spec.endpointWeights[0].targetUid: unknown field (want ip, clusterName, weight)"},
		{"second document bad", head + "kind: Cluster\nmetadata: {name: a}\n---\n" + head + "kind: Cluster\nmetadata: {name: b}\nspec: {claims: []}\n", "f.yaml:8: document 2: spec.claims: want a mapping, got a list"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode("f.yaml", strings.NewReader(tc.in))
			if err == nil || err.Error() != tc.want {
				t.Errorf("error\n got: %v\nwant: %s", err, tc.want)
			}
		})
	}
}

func TestReadSet(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("clusters.yaml", goodCluster)
	write("team-a/ns.yml", "apiVersion: fleetstream.io/v1alpha1\nkind: NamespaceBinding\nmetadata: {name: web, project: team-a}\nspec: {cluster: eu-1}\n")
	write("README.md", "not a manifest")
	write(".git/config.yaml", "not: [yaml")
	objs, err := Read([]string{dir, "-"}, strings.NewReader("apiVersion: fleetstream.io/v1alpha1\nkind: Project\nmetadata: {name: team-a}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, o := range objs {
		keys = append(keys, o.Key())
	}
	if got := strings.Join(keys, " "); got != "Cluster/eu-1 NamespaceBinding/team-a/cluster=eu-1/web Project/team-a" {
		t.Errorf("keys = %s", got)
	}

	// The same object twice, in two files.
	write("more/again.yaml", goodCluster)
	if _, err := Read([]string{dir}, nil); err == nil || !strings.Contains(err.Error(), "more/again.yaml:1: document 1: Cluster/eu-1 is declared twice (first at "+filepath.Join(dir, "clusters.yaml")+":1: document 1)") {
		t.Errorf("duplicate: %v", err)
	}

	// Role templates inheriting in a cycle.
	rt := func(name, inherits string) string {
		return "apiVersion: fleetstream.io/v1alpha1\nkind: RoleTemplate\nmetadata: {name: " + name + "}\nspec: {inherits: [" + inherits + "]}\n"
	}
	_, err = Decode("x", strings.NewReader(""))
	if err != nil {
		t.Fatal(err)
	}
	cyc := filepath.Join(t.TempDir(), "roles.yaml")
	if err := os.WriteFile(cyc, []byte(rt("a", "b")+"---\n"+rt("b", "c")+"---\n"+rt("c", "a")+"---\n"+rt("d", "a")), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Read([]string{cyc}, nil); err == nil || !strings.Contains(err.Error(), "role templates inherit in a cycle: a → b → c → a") {
		t.Errorf("cycle: %v", err)
	}
}

func TestSchema(t *testing.T) {
	s := KindNamed("Cluster").Schema()
	spec := s["properties"].(map[string]any)["spec"].(map[string]any)
	props := spec["properties"].(map[string]any)
	if _, ok := props["status"]; ok {
		t.Error("schema lets a manifest set the computed status")
	}
	taint := props["taints"].(map[string]any)["items"].(map[string]any)["properties"].(map[string]any)
	if _, ok := taint["timeAdded"]; ok {
		t.Error("schema lets a manifest set a taint's computed timeAdded")
	}
	if effect := taint["effect"].(map[string]any)["enum"].([]string); len(effect) != 3 {
		t.Errorf("taint effect enum = %v", effect)
	}
	if spec["additionalProperties"] != false {
		t.Error("schema accepts unknown spec fields")
	}
}

// A ServiceWeights manifest is written in the API's form, so that one the fleet already holds
// compares unchanged: the default cluster weight (100, which the API keeps no entry for) left
// out, IPs spelled as the API spells them, endpoint weights in its order.
func TestServiceWeightsAreNormalized(t *testing.T) {
	objs, err := Decode("w.yaml", strings.NewReader(`apiVersion: fleetstream.io/v1alpha1
kind: ServiceWeights
metadata: {name: api}
spec:
  namespace: web
  clusterWeights: {eu-1: 100, us-1: 0}
  endpointWeights:
  - {ip: "::ffff:10.0.0.2", clusterName: us-1, weight: 7}
  - {ip: "2001:DB8::1", clusterName: eu-1}
  - {ip: 10.0.0.9, clusterName: eu-1, weight: 100}
`))
	if err != nil {
		t.Fatal(err)
	}
	o := objs[0]
	if o.Key() != "ServiceWeights/web/api" {
		t.Errorf("key %s", o.Key())
	}
	w := o.Spec.(*endpointv1.ServiceWeights)
	var got []string
	for _, e := range w.EndpointWeights {
		got = append(got, fmt.Sprintf("%s/%s=%d", e.ClusterName, e.Ip, e.Weight))
	}
	if fmt.Sprint(w.ClusterWeights) != "map[us-1:0]" || strings.Join(got, " ") != "eu-1/10.0.0.9=100 eu-1/2001:db8::1=0 us-1/10.0.0.2=7" {
		t.Errorf("normalized to %v %v", w.ClusterWeights, got)
	}
}
