package manifest

import (
	"maps"
	"strings"
	"testing"
)

// TestFields: the field paths apply owns and names in its conflicts.
func TestFields(t *testing.T) {
	const head = "apiVersion: fleetstream.io/v1alpha1\n"
	tests := map[string]struct {
		doc  string
		want map[string]string
	}{
		"project: labels, budgets keyed by cluster": {
			doc: "kind: Project\nmetadata: {name: team-a, labels: {org: web, applyset.fleetstream.io/part-of: prod}}\n" +
				"spec: {displayName: A, budgets: [{cluster: eu-1, hard: {cpu: \"8\", memory: 4Gi}}, {cluster: us-1}]}\n",
			want: map[string]string{
				"metadata.labels.org":                              `"web"`,
				"metadata.labels[applyset.fleetstream.io/part-of]": `"prod"`,
				"spec.displayName":                                 `"A"`,
				"spec.budgets[cluster=eu-1].cluster":               `"eu-1"`,
				"spec.budgets[cluster=eu-1].hard.cpu":              `"8"`,
				"spec.budgets[cluster=eu-1].hard.memory":           `"4Gi"`,
				"spec.budgets[cluster=us-1].cluster":               `"us-1"`,
			},
		},
		"namespace binding: quota": {
			doc:  "kind: NamespaceBinding\nmetadata: {name: web, project: team-a, annotations: {owner: x}}\nspec: {cluster: eu-1, hard: {cpu: \"2\"}}\n",
			want: map[string]string{"spec.cluster": `"eu-1"`, "spec.hard.cpu": `"2"`},
		},
		"cluster: taints keyed by key, a claim with dots": {
			doc: "kind: Cluster\nmetadata: {name: eu-1}\nspec: {claims: {cloud.example.com/zone: a}, taints: [{key: gpu, value: \"true\", effect: TAINT_EFFECT_NO_SELECT}]}\n",
			want: map[string]string{
				"spec.claims[cloud.example.com/zone]": `"a"`,
				"spec.taints[key=gpu].key":            `"gpu"`,
				"spec.taints[key=gpu].value":          `"true"`,
				"spec.taints[key=gpu].effect":         `"TAINT_EFFECT_NO_SELECT"`,
			},
		},
		"role template: rules have no key, so the list is one field": {
			doc: "kind: RoleTemplate\nmetadata: {name: reader}\nspec: {rules: [{verbs: [get], apiGroups: [\"\"], resources: [pods]}], inherits: [a, b], locked: true}\n",
			want: map[string]string{
				"spec.rules":    `[{"apiGroups":[""],"resources":["pods"],"verbs":["get"]}]`,
				"spec.inherits": `["a","b"]`,
				"spec.locked":   `true`,
			},
		},
		"placement: a number, and elements whose key repeats are one field": {
			doc: "kind: Placement\nmetadata: {name: p, project: team-a}\nspec: {numberOfClusters: 2, tolerations: [{key: a, operator: Exists}, {key: a, value: x}]}\n",
			want: map[string]string{
				"spec.numberOfClusters": `2`,
				"spec.tolerations":      `[{"key":"a","operator":"Exists"},{"key":"a","value":"x"}]`,
			},
		},
		"nothing set": {
			doc:  "kind: ClusterSetBinding\nmetadata: {project: team-a}\nspec: {clusterSet: global}\n",
			want: map[string]string{"spec.clusterSet": `"global"`},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			objs, err := Decode("f.yaml", strings.NewReader(head+tt.doc))
			if err != nil {
				t.Fatal(err)
			}
			got, err := Fields(objs[0])
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, tt.want) {
				t.Errorf("Fields:\n got %v\nwant %v", got, tt.want)
			}
		})
	}
}
