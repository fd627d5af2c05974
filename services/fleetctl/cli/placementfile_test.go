package cli

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
)

func i32(v int32) *int32 { return &v }
func i64(v int64) *int64 { return &v }

const (
	builtIn = placementv1.ScoreCoordinateType_SCORE_COORDINATE_TYPE_BUILT_IN
	addOn   = placementv1.ScoreCoordinateType_SCORE_COORDINATE_TYPE_ADD_ON
)

func TestParsePlacements(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		project string // --project
		want    []*placementv1.Placement
		wantErr string // the whole message starts with "placement.yaml: " and then this
	}{
		{
			// OCM docs, "Placement" concept page: predicates with a label and a claim
			// selector, a toleration, numberOfClusters.
			name: "OCM predicates and tolerations",
			file: `apiVersion: cluster.open-cluster-management.io/v1beta1
kind: Placement
metadata:
  name: placement1
  namespace: ns1
spec:
  numberOfClusters: 3
  clusterSets:
    - prod
  predicates:
    - requiredClusterSelector:
        labelSelector:
          matchLabels:
            vendor: OpenShift
        claimSelector:
          matchExpressions:
            - key: region.open-cluster-management.io
              operator: In
              values:
                - us-west-1
  tolerations:
    - key: gpu
      value: "true"
      operator: Equal
    - key: cluster.open-cluster-management.io/unreachable
      operator: Exists
      tolerationSeconds: 300
`,
			want: []*placementv1.Placement{{
				Project: "ns1", Name: "placement1", ClusterSets: []string{"prod"}, NumberOfClusters: i32(3),
				Predicates: []*placementv1.Predicate{{RequiredClusterSelector: &placementv1.ClusterSelector{
					LabelSelector: &placementv1.LabelSelector{MatchLabels: map[string]string{"vendor": "OpenShift"}},
					ClaimSelector: &placementv1.ClaimSelector{MatchExpressions: []*placementv1.LabelSelectorRequirement{
						{Key: "region.open-cluster-management.io", Operator: "In", Values: []string{"us-west-1"}}}},
				}}},
				Tolerations: []*placementv1.Toleration{
					{Key: "gpu", Value: "true", Operator: "Equal"},
					{Key: "cluster.open-cluster-management.io/unreachable", Operator: "Exists", TolerationSeconds: i64(300)},
				},
			}},
		},
		{
			// OCM's CEL selector enhancement (136-placement-cel-selector) examples, ANDed with a
			// label selector in the same predicate.
			name: "OCM celSelector",
			file: `apiVersion: cluster.open-cluster-management.io/v1beta1
kind: Placement
metadata:
  name: placement1
  namespace: default
spec:
  predicates:
    - requiredClusterSelector:
        labelSelector:
          matchLabels:
            env: prod
        celSelector:
          celExpressions:
            - managedCluster.metadata.labels["version"].matches('^1\\.(30|31)\\.\\d+$')
            - managedCluster.scores("default").filter(s, s.name == 'cpuAvailable').all(e, e.value > 4)
`,
			want: []*placementv1.Placement{{
				Project: "default", Name: "placement1",
				Predicates: []*placementv1.Predicate{{RequiredClusterSelector: &placementv1.ClusterSelector{
					LabelSelector: &placementv1.LabelSelector{MatchLabels: map[string]string{"env": "prod"}},
					CelSelector: &placementv1.CelSelector{CelExpressions: []string{
						`managedCluster.metadata.labels["version"].matches('^1\\.(30|31)\\.\\d+$')`,
						`managedCluster.scores("default").filter(s, s.name == 'cpuAvailable').all(e, e.value > 4)`,
					}},
				}}},
			}},
		},
		{
			// OCM docs, "Placement" prioritizers: an unset type is BuiltIn on the server, an
			// unset weight is 1 there; weight 0 is kept as given (it disables).
			name: "OCM prioritizer policy",
			file: `apiVersion: cluster.open-cluster-management.io/v1beta1
kind: Placement
metadata: {name: p, namespace: team-a}
spec:
  numberOfClusters: 2
  prioritizerPolicy:
    mode: Exact
    configurations:
      - scoreCoordinate:
          builtIn: ResourceAllocatableMemory
      - scoreCoordinate:
          type: BuiltIn
          builtIn: Steady
        weight: 3
      - scoreCoordinate:
          type: BuiltIn
          builtIn: Balance
        weight: 0
      - scoreCoordinate:
          type: AddOn
          addOn:
            resourceName: default
            scoreName: cpuratio
        weight: -2
`,
			want: []*placementv1.Placement{{
				Project: "team-a", Name: "p", NumberOfClusters: i32(2),
				PrioritizerPolicy: &placementv1.PrioritizerPolicy{Mode: "Exact", Configurations: []*placementv1.PrioritizerConfig{
					{ScoreCoordinate: &placementv1.ScoreCoordinate{BuiltIn: "ResourceAllocatableMemory"}},
					{ScoreCoordinate: &placementv1.ScoreCoordinate{Type: builtIn, BuiltIn: "Steady"}, Weight: i32(3)},
					{ScoreCoordinate: &placementv1.ScoreCoordinate{Type: builtIn, BuiltIn: "Balance"}, Weight: i32(0)},
					{ScoreCoordinate: &placementv1.ScoreCoordinate{Type: addOn, AddOn: &placementv1.AddOnScoreCoordinate{ResourceName: "default", ScoreName: "cpuratio"}}, Weight: i32(-2)},
				}},
			}},
		},
		{
			// OCM docs, "Placement" decision strategy: a percentage and two named groups.
			name: "OCM decision strategy",
			file: `metadata: {name: rollout, namespace: team-a}
spec:
  decisionStrategy:
    groupStrategy:
      clustersPerDecisionGroup: 25%
      decisionGroups:
      - groupName: prod-canary-west
        groupClusterSelector:
          labelSelector:
            matchExpressions:
              - key: prod-canary-west
                operator: Exists
      - groupName: prod-canary-east
        groupClusterSelector:
          claimSelector:
            matchExpressions: [{key: region, operator: In, values: [us-east-1]}]
`,
			want: []*placementv1.Placement{{
				Project: "team-a", Name: "rollout",
				DecisionStrategy: &placementv1.DecisionStrategy{ClustersPerDecisionGroup: "25%", Groups: []*placementv1.DecisionGroup{
					{GroupName: "prod-canary-west", GroupClusterSelector: &placementv1.GroupClusterSelector{
						LabelSelector: &placementv1.LabelSelector{MatchExpressions: []*placementv1.LabelSelectorRequirement{{Key: "prod-canary-west", Operator: "Exists"}}}}},
					{GroupName: "prod-canary-east", GroupClusterSelector: &placementv1.GroupClusterSelector{
						ClaimSelector: &placementv1.ClaimSelector{MatchExpressions: []*placementv1.LabelSelectorRequirement{{Key: "region", Operator: "In", Values: []string{"us-east-1"}}}}}},
				}},
			}},
		},
		{
			name: "clustersPerDecisionGroup as a count",
			file: "project: team-a\nname: p\nspec: {decisionStrategy: {groupStrategy: {clustersPerDecisionGroup: 3}}}\n",
			want: []*placementv1.Placement{{Project: "team-a", Name: "p", DecisionStrategy: &placementv1.DecisionStrategy{ClustersPerDecisionGroup: "3"}}},
		},
		{
			// An empty label selector selects every cluster; it must not vanish.
			name: "empty selector kept",
			file: "project: team-a\nname: p\nspec: {predicates: [{requiredClusterSelector: {labelSelector: {}}}]}\n",
			want: []*placementv1.Placement{{Project: "team-a", Name: "p", Predicates: []*placementv1.Predicate{
				{RequiredClusterSelector: &placementv1.ClusterSelector{LabelSelector: &placementv1.LabelSelector{}}}}}},
		},
		{
			name:    "no spec, project from --project",
			file:    "name: everything\n",
			project: "team-a",
			want:    []*placementv1.Placement{{Project: "team-a", Name: "everything"}},
		},
		{
			name: "JSON",
			file: `{"project": "team-a", "name": "p", "spec": {"clusterSets": ["eu", "us"], "numberOfClusters": 0}}`,
			want: []*placementv1.Placement{{Project: "team-a", Name: "p", ClusterSets: []string{"eu", "us"}, NumberOfClusters: i32(0)}},
		},
		{
			name:    "several documents",
			file:    "# two placements\nproject: team-a\nname: one\n---\n# only a comment\n---\nmetadata: {name: two}\n",
			project: "team-a",
			want:    []*placementv1.Placement{{Project: "team-a", Name: "one"}, {Project: "team-a", Name: "two"}},
		},
		{
			name: "same project twice is fine",
			file: "project: team-a\nname: p\nmetadata: {namespace: team-a}\n", project: "team-a",
			want: []*placementv1.Placement{{Project: "team-a", Name: "p"}},
		},

		{name: "unknown spec field", file: "project: a\nname: p\nspec: {numberOfCluster: 3}\n",
			wantErr: `unknown field "spec.numberOfCluster"`},
		{name: "field in the wrong case", file: "project: a\nname: p\nspec: {NumberOfClusters: 3}\n",
			wantErr: `unknown field "spec.NumberOfClusters"`},
		{name: "unknown nested field", file: "project: a\nname: p\nspec:\n  predicates:\n  - requiredClusterSelector:\n      celSelector: {celExpresions: [x]}\n",
			wantErr: `unknown field "spec.predicates[0].requiredClusterSelector.celSelector.celExpresions"`},
		{name: "decision groups have no CEL selector, as in OCM", file: "project: a\nname: p\nspec:\n  decisionStrategy:\n    groupStrategy:\n      decisionGroups:\n      - groupName: g\n        groupClusterSelector:\n          celSelector: {celExpressions: [\"true\"]}\n",
			wantErr: `unknown field "spec.decisionStrategy.groupStrategy.decisionGroups[0].groupClusterSelector.celSelector"`},
		{name: "unknown metadata field", file: "metadata: {name: p, namespace: a, labels: {x: y}}\n",
			wantErr: `unknown field "metadata.labels"`},
		{name: "status is not input", file: "project: a\nname: p\nstatus: {numberOfSelectedClusters: 1}\n",
			wantErr: `unknown field "status"`},
		{name: "OCM's v1alpha1 prioritizer name field", file: "project: a\nname: p\nspec: {prioritizerPolicy: {configurations: [{name: Steady}]}}\n",
			wantErr: `unknown field "spec.prioritizerPolicy.configurations[0].name"`},
		{name: "two unknown fields", file: "project: a\nname: p\nspec: {a: 1, tolerations: [{key: k, efect: NoSelect}]}\n",
			wantErr: `unknown field "spec.a"; unknown field "spec.tolerations[0].efect"`},
		{name: "bad score coordinate type", file: "project: a\nname: p\nspec: {prioritizerPolicy: {configurations: [{scoreCoordinate: {builtIn: Steady}}, {scoreCoordinate: {type: Builtin, builtIn: Balance}}]}}\n",
			wantErr: `spec.prioritizerPolicy.configurations[1].scoreCoordinate.type: unknown type "Builtin", want BuiltIn or AddOn`},
		{name: "proto enum spelling is not OCM's", file: "project: a\nname: p\nspec: {prioritizerPolicy: {configurations: [{scoreCoordinate: {type: SCORE_COORDINATE_TYPE_ADD_ON}}]}}\n",
			wantErr: `spec.prioritizerPolicy.configurations[0].scoreCoordinate.type: unknown type "SCORE_COORDINATE_TYPE_ADD_ON", want BuiltIn or AddOn`},
		{name: "wrong type", file: "project: a\nname: p\nspec: {numberOfClusters: three}\n",
			wantErr: `spec.numberOfClusters: got string, want int32`},
		// The decoder's type errors name the field by its path without list indexes.
		{name: "unquoted boolean value", file: "project: a\nname: p\nspec: {tolerations: [{key: gpu, value: true}]}\n",
			wantErr: `spec.tolerations.value: got bool, want string (quote it)`},
		{name: "weight out of int32", file: "project: a\nname: p\nspec: {prioritizerPolicy: {configurations: [{weight: 1.5}]}}\n",
			wantErr: `spec.prioritizerPolicy.configurations.weight: got number 1.5, want int32`},
		{name: "duplicate key", file: "project: a\nname: p\nname: q\n",
			wantErr: `key "name" already set in map`},
		{name: "no name", file: "project: a\nspec: {}\n",
			wantErr: "name: required (name or metadata.name)"},
		{name: "no project", file: "name: p\n",
			wantErr: "project: required (project, metadata.namespace or --project)"},
		{name: "names disagree", file: "name: p\nmetadata: {name: q, namespace: a}\n",
			wantErr: `name "p" and metadata.name "q" disagree; give one`},
		{name: "--project disagrees", file: "metadata: {name: p, namespace: a}\n", project: "b",
			wantErr: `project: the file says "a", --project says "b"`},
		{name: "another kind", file: "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: p, namespace: a}\n",
			wantErr: `apiVersion: "v1" is not supported, want cluster.open-cluster-management.io/v1beta1 or none`},
		{name: "another kind, right group", file: "apiVersion: cluster.open-cluster-management.io/v1beta1\nkind: PlacementDecision\nmetadata: {name: p, namespace: a}\n",
			wantErr: `kind: "PlacementDecision" is not a placement, want Placement or none`},
		{name: "empty", file: "# nothing\n",
			wantErr: "no placement in the file"},
		{name: "error in the second document", file: "project: a\nname: one\n---\nproject: a\nname: two\nspec: {clustersets: [x]}\n",
			wantErr: `unknown field "spec.clustersets"`},
		{name: "not YAML", file: "project: [a\n",
			wantErr: "yaml: line 1: did not find expected"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parsePlacements("placement.yaml", []byte(tt.file), tt.project)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("no error, got %v", got)
				}
				if !strings.HasPrefix(err.Error(), "placement.yaml") || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %q, want placement.yaml: ...%s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %d placements, want %d", len(got), len(tt.want))
			}
			for i := range got {
				if !proto.Equal(got[i], tt.want[i]) {
					t.Errorf("placement %d:\n got %s\nwant %s", i, protojson.Format(got[i]), protojson.Format(tt.want[i]))
				}
			}
		})
	}
}

func TestParsePlacementsNamesTheDocument(t *testing.T) {
	_, err := parsePlacements("p.yaml", []byte("project: a\nname: one\n---\nproject: a\nname: two\nspec: {clustersets: [x]}\n"), "")
	if want := `p.yaml (document 2): unknown field "spec.clustersets"`; err == nil || err.Error() != want {
		t.Fatalf("error %v, want %q", err, want)
	}
}

func TestPlacementRef(t *testing.T) {
	tests := []struct {
		arg, project       string
		wantProj, wantName string
		wantErr            string
	}{
		{arg: "team-a/eu-3", wantProj: "team-a", wantName: "eu-3"},
		{arg: "eu-3", project: "team-a", wantProj: "team-a", wantName: "eu-3"},
		{arg: "team-a/eu-3", project: "team-a", wantProj: "team-a", wantName: "eu-3"},
		{arg: "eu-3", wantErr: `placement "eu-3": give its project, as PROJECT/NAME or with --project`},
		{arg: "team-a/eu-3", project: "team-b", wantErr: `--project "team-b" names another project`},
		{arg: "team-a/", wantErr: "want PROJECT/NAME"},
		{arg: "/eu-3", project: "team-a", wantErr: "want PROJECT/NAME"},
		{arg: "a/b/c", wantErr: "want PROJECT/NAME"},
	}
	for _, tt := range tests {
		proj, name, err := placementRef(tt.arg, tt.project)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("placementRef(%q, %q) error %v, want %q", tt.arg, tt.project, err, tt.wantErr)
			}
			continue
		}
		if err != nil || proj != tt.wantProj || name != tt.wantName {
			t.Errorf("placementRef(%q, %q) = %q, %q, %v", tt.arg, tt.project, proj, name, err)
		}
	}
}
