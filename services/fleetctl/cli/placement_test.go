package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
)

func testDecisions() *placementv1.PlacementDecisions {
	return &placementv1.PlacementDecisions{
		Project: "team-a", Name: "eu-3",
		Prioritizers: []*placementv1.PrioritizerWeight{
			{Name: "Balance", Weight: 1}, {Name: "Steady", Weight: 1},
			{Name: "ResourceAllocatableMemory", Weight: 2}, {Name: "AddOn/default/cpuratio", Weight: -1},
		},
		Groups: []*placementv1.DecisionGroupDecisions{
			{DecisionGroupIndex: 0, DecisionGroupName: "canary", ClustersCount: 1, Pages: []*placementv1.DecisionPage{
				{Clusters: []*placementv1.ClusterDecision{{ClusterName: "eu-1", Scores: []int64{100, 0, 100, -50}, Total: 350}}},
			}},
			// Two pages of one group: the rows follow each other.
			{DecisionGroupIndex: 1, ClustersCount: 2, Pages: []*placementv1.DecisionPage{
				{Clusters: []*placementv1.ClusterDecision{{ClusterName: "eu-2", Scores: []int64{0, 100, -100, 0}, Total: -100}}},
				{Clusters: []*placementv1.ClusterDecision{{ClusterName: "eu-10", Scores: []int64{-100, 0, 0, 100}, Total: -200}}},
			}},
		},
		Status: &placementv1.PlacementStatus{NumberOfSelectedClusters: 3, Conditions: []*placementv1.PlacementCondition{
			{Type: "PlacementSatisfied", Status: "False", Reason: "NotAllDecisionsScheduled", Message: "1 cluster(s) missing", Unscheduled: 1},
			{Type: "PlacementMisconfigured", Status: "False"},
		}},
	}
}

func TestPrintDecisions(t *testing.T) {
	tests := []struct {
		name   string
		format string
		d      *placementv1.PlacementDecisions
		want   string
	}{
		{name: "scores", format: formatTable, d: testDecisions(), want: "" +
			"GROUP    CLUSTER   Balance(w=1)   Steady(w=1)   ResourceAllocatableMemory(w=2)   AddOn/default/cpuratio(w=-1)   TOTAL\n" +
			"canary   eu-1      100            0             100                              -50                            350\n" +
			"#1       eu-2      0              100           -100                             0                              -100\n" +
			"#1       eu-10     -100           0             0                                100                            -200\n" +
			"\n" +
			"PlacementSatisfied=False NotAllDecisionsScheduled: 1 cluster(s) missing\n" +
			"PlacementMisconfigured=False\n"},
		{name: "evaluation and its timer", format: formatTable, d: &placementv1.PlacementDecisions{Project: "a", Name: "p",
			DecideTime: timestamppb.New(time.Date(2026, 11, 26, 22, 0, 0, 0, time.UTC)), NextEvaluation: timestamppb.New(time.Date(2026, 11, 26, 22, 10, 0, 0, time.UTC)),
			Groups: []*placementv1.DecisionGroupDecisions{{Pages: []*placementv1.DecisionPage{{Clusters: []*placementv1.ClusterDecision{{ClusterName: "c1"}}}}}}},
			want: "GROUP   CLUSTER   TOTAL\n#0      c1        0\n\n" +
				"evaluated 2026-11-26T22:00:00Z, next evaluation 2026-11-26T22:10:00Z (a toleration or an add-on score runs out)\n"},
		{name: "evaluation without a timer", format: formatTable, d: &placementv1.PlacementDecisions{Project: "a", Name: "p",
			DecideTime: timestamppb.New(time.Date(2026, 11, 26, 22, 0, 0, 0, time.UTC)),
			Groups:     []*placementv1.DecisionGroupDecisions{{Pages: []*placementv1.DecisionPage{{Clusters: []*placementv1.ClusterDecision{{ClusterName: "c1"}}}}}}},
			want: "GROUP   CLUSTER   TOTAL\n#0      c1        0\n\n" +
				"evaluated 2026-11-26T22:00:00Z, next evaluation none (until an input changes)\n"},
		{name: "no prioritizer", format: formatTable, d: &placementv1.PlacementDecisions{Project: "a", Name: "p",
			Groups: []*placementv1.DecisionGroupDecisions{{Pages: []*placementv1.DecisionPage{{Clusters: []*placementv1.ClusterDecision{{ClusterName: "c1"}}}}}}},
			want: "GROUP   CLUSTER   TOTAL\n#0      c1        0\n"},
		// A server sending fewer scores than prioritizers leaves cells empty rather than
		// shifting the columns.
		{name: "short scores", format: formatTable, d: &placementv1.PlacementDecisions{Project: "a", Name: "p",
			Prioritizers: []*placementv1.PrioritizerWeight{{Name: "Steady", Weight: 1}, {Name: "Balance", Weight: 1}},
			Groups:       []*placementv1.DecisionGroupDecisions{{Pages: []*placementv1.DecisionPage{{Clusters: []*placementv1.ClusterDecision{{ClusterName: "c1", Scores: []int64{7}, Total: 7}}}}}}},
			want: "GROUP   CLUSTER   Steady(w=1)   Balance(w=1)   TOTAL\n#0      c1        7             -              7\n"},
		{name: "nothing selected", format: formatTable, d: &placementv1.PlacementDecisions{Project: "a", Name: "p",
			Groups: []*placementv1.DecisionGroupDecisions{{Pages: []*placementv1.DecisionPage{{}}}},
			Status: &placementv1.PlacementStatus{Conditions: []*placementv1.PlacementCondition{
				{Type: "PlacementSatisfied", Status: "False", Reason: "NoManagedClusterSetBindings", Message: "no cluster set is bound"},
				{Type: "PlacementMisconfigured", Status: "True", Reason: "Misconfigured", Field: "prioritizer_policy.configurations[0]", Message: "unknown prioritizer Stedy"},
			}}},
			want: "placement a/p selects no cluster\n\n" +
				"PlacementSatisfied=False NoManagedClusterSetBindings: no cluster set is bound\n" +
				"PlacementMisconfigured=True Misconfigured (field prioritizer_policy.configurations[0]): unknown prioritizer Stedy\n"},
		{name: "json is the whole message", format: formatJSON, d: &placementv1.PlacementDecisions{Project: "a", Name: "p",
			Prioritizers: []*placementv1.PrioritizerWeight{{Name: "Steady", Weight: 1}},
			Groups:       []*placementv1.DecisionGroupDecisions{{Pages: []*placementv1.DecisionPage{{Clusters: []*placementv1.ClusterDecision{{ClusterName: "c1", Scores: []int64{7}, Total: 7}}}}}}},
			want: `{
  "project": "a",
  "name": "p",
  "groups": [
    {
      "pages": [
        {
          "clusters": [
            {
              "clusterName": "c1",
              "scores": [
                "7"
              ],
              "total": "7"
            }
          ]
        }
      ]
    }
  ],
  "prioritizers": [
    {
      "name": "Steady",
      "weight": 1
    }
  ]
}
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			if err := printDecisions(&Printer{Format: tt.format, Out: &out, ErrOut: &errOut}, tt.d); err != nil {
				t.Fatal(err)
			}
			if out.String() != tt.want {
				t.Errorf("stdout:\n%s\nwant:\n%s", out.String(), tt.want)
			}
			if errOut.Len() != 0 {
				t.Errorf("stderr: %q", errOut.String())
			}
		})
	}
}

func TestPlacementColumns(t *testing.T) {
	created := timestamppb.New(testNow.Add(-2 * time.Hour))
	items := Messages([]*placementv1.Placement{
		{Project: "team-a", Name: "eu-3", ClusterSets: []string{"eu", "eu-east"}, NumberOfClusters: i32(3), CreateTime: created,
			Status: &placementv1.PlacementStatus{NumberOfSelectedClusters: 3, Conditions: []*placementv1.PlacementCondition{
				{Type: "PlacementMisconfigured", Status: "False"}, {Type: "PlacementSatisfied", Status: "True", Reason: "AllDecisionsScheduled"}}}},
		{Project: "team-a", Name: "all", CreateTime: created, Status: &placementv1.PlacementStatus{Conditions: []*placementv1.PlacementCondition{
			{Type: "PlacementSatisfied", Status: "False", Reason: "NoIntersection"}}}},
		{Project: "team-b", Name: "bad", NumberOfClusters: i32(0), Status: &placementv1.PlacementStatus{Conditions: []*placementv1.PlacementCondition{
			{Type: "PlacementSatisfied", Status: "False", Reason: "NoManagedClusterMatched"}, {Type: "PlacementMisconfigured", Status: "True"}}}},
		{Project: "team-b", Name: "new"},
	})
	var out bytes.Buffer
	if err := writeTable(&out, items, placementColumns(func() time.Time { return testNow })); err != nil {
		t.Fatal(err)
	}
	want := "" +
		"PROJECT   NAME   CLUSTER SETS   WANT   SELECTED   SATISFIED               AGE\n" +
		"team-a    eu-3   eu,eu-east     3      3          True                    2h\n" +
		"team-a    all    <all bound>    all    0          False(NoIntersection)   2h\n" +
		"team-b    bad    <all bound>    0      0          Misconfigured           -\n" +
		"team-b    new    <all bound>    all    0          -                       -\n"
	if out.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", out.String(), want)
	}
}

func TestWatchDecisionColumns(t *testing.T) {
	var out bytes.Buffer
	s := (&Printer{Format: formatTable, Out: &out}).Stream(watchDecisionColumns(func() time.Time { return testNow })...)
	msgs := []*placementv1.WatchPlacementDecisionsResponse{
		{Decisions: &placementv1.PlacementDecisions{Status: &placementv1.PlacementStatus{NumberOfSelectedClusters: 2,
			Conditions: []*placementv1.PlacementCondition{{Type: "PlacementSatisfied", Status: "True"}}}}, Added: []string{"c1", "c2"}},
		{Decisions: &placementv1.PlacementDecisions{Status: &placementv1.PlacementStatus{NumberOfSelectedClusters: 2}}, Added: []string{"c3"}, Removed: []string{"c1"}},
		{Removed: []string{"c2", "c3"}},
	}
	for _, m := range msgs {
		if err := s.Print(m); err != nil {
			t.Fatal(err)
		}
	}
	want := "" +
		"TIME        SELECTED    ADDED       REMOVED     SATISFIED\n" +
		"12:00:00    2           c1,c2       -           True\n" +
		"12:00:00    2           c3          c1          -\n" +
		"12:00:00    <deleted>   -           c2,c3       -\n"
	if out.String() != want {
		t.Errorf("watch:\n%s\nwant:\n%s", out.String(), want)
	}
}

// TestPlacementCommandErrors covers what fleetctl refuses before sending anything: the
// server URL points nowhere, so a request reaching it would fail differently.
func TestPlacementCommandErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	two := filepath.Join(dir, "two.yaml")
	writeFile(t, two, "project: a\nname: one\n---\nproject: a\nname: two\n")
	writeFile(t, bad, "metadata: {name: p, namespace: a}\nspec: {numberOfClusters: 1, tolerations: [{key: k, operater: Exists}]}\n")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{name: "unknown field names file and field", args: []string{"placement", "create", "-f", bad},
			want: `error: ` + bad + `: unknown field "spec.tolerations[0].operater"` + "\n"},
		{name: "update reads the same format", args: []string{"placement", "update", "-f", bad},
			want: `error: ` + bad + `: unknown field "spec.tolerations[0].operater"` + "\n"},
		{name: "missing file", args: []string{"placement", "create", "-f", filepath.Join(dir, "nope.yaml")},
			want: "error: read " + filepath.Join(dir, "nope.yaml") + ": open " + filepath.Join(dir, "nope.yaml") + ": no such file or directory\n"},
		{name: "one revision, two placements", args: []string{"placement", "update", "-f", two, "--expected-revision", "3"},
			want: "error: " + two + " holds 2 placements; --expected-revision applies to one\n"},
		{name: "stdin is named so", args: []string{"placement", "create", "-f", "-"},
			want: "error: <stdin>: no placement in the file\n"},
		{name: "create needs -f", args: []string{"placement", "create"},
			want: "error: required flag(s) \"filename\" not set\n"},
		{name: "get needs a project", args: []string{"placement", "get", "eu-3"},
			want: "error: placement \"eu-3\": give its project, as PROJECT/NAME or with --project\n"},
		{name: "bind needs cluster or placement", args: []string{"namespace", "bind", "web", "-p", "team-a"},
			want: "error: at least one of the flags in the group [cluster placement] is required\n"},
		{name: "bind takes one of cluster and placement", args: []string{"namespace", "bind", "web", "-p", "team-a", "-c", "c1", "--placement", "eu-3"},
			want: "error: if any flags in the group [cluster placement] are set none of the others can be; [cluster placement] were all set\n"},
		{name: "unbind takes one of cluster and placement", args: []string{"namespace", "unbind", "web", "-p", "team-a", "-c", "c1", "--placement", "eu-3"},
			want: "error: if any flags in the group [cluster placement] are set none of the others can be; [cluster placement] were all set\n"},
		{name: "unbind policy only with placement", args: []string{"namespace", "bind", "web", "-p", "team-a", "-c", "c1", "--unbind-policy", "delete"},
			want: "error: --unbind-policy applies only with --placement; unbind a cluster's namespace with namespace unbind --policy\n"},
		{name: "bad unbind policy", args: []string{"namespace", "bind", "web", "-p", "team-a", "--placement", "eu-3", "--unbind-policy", "drop"},
			want: "error: --unbind-policy: unbind policy \"drop\": want keep or delete\n"},
		{name: "negative score needs --", args: []string{"addonscore", "set", "c1", "res", "cpu", "-20"},
			want: "error: unknown shorthand flag: '2' in -20 (a negative SCORE needs -- before the arguments: fleetctl addonscore set -- CLUSTER RESOURCE SCORE_NAME -20)\n"},
		{name: "score not a number", args: []string{"addonscore", "set", "c1", "res", "cpu", "high"},
			want: "error: score \"high\": want an integer in [-100, 100]\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := Run(context.Background(), IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut},
				append([]string{"--server", "http://127.0.0.1:1", "--token", "x"}, tt.args...))
			if code != 1 || errOut.String() != tt.want {
				t.Fatalf("exit %d, stderr %q\nwant 1, %q", code, errOut.String(), tt.want)
			}
		})
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// testExplanation has a cluster of each reason, as ExplainPlacement answers.
func testExplanation() *placementv1.ExplainPlacementResponse {
	return &placementv1.ExplainPlacementResponse{Project: "team-a", Name: "eu-3", EvaluatedAt: goldenTime,
		Prioritizers: []*placementv1.PrioritizerWeight{{Name: "Balance", Weight: 1}, {Name: "Steady", Weight: 1}},
		Clusters: []*placementv1.ClusterExplanation{
			{ClusterName: "eu-1", Selected: true, Scores: []int64{100, 100}, Total: 200, Rank: 1},
			{ClusterName: "eu-2", Scores: []int64{100, 0}, Total: 100, Rank: 2, Reason: &placementv1.NotSelectedReason{
				Kind: placementv1.NotSelectedReasonKind_NOT_SELECTED_REASON_KIND_CUT_BY_NUMBER_OF_CLUSTERS, NumberOfClusters: 1, LastSelectedTotal: 200,
				Message: "ranked 2 of 2 feasible clusters with total 100; numberOfClusters is 1 (the last selected has total 200)"}},
			{ClusterName: "eu-3", Reason: &placementv1.NotSelectedReason{
				Kind:    placementv1.NotSelectedReasonKind_NOT_SELECTED_REASON_KIND_TAINT_NOT_TOLERATED,
				Taint:   &clusterv1.Taint{Key: "fleetstream.io/unreachable", Effect: clusterv1.TaintEffect_TAINT_EFFECT_NO_SELECT},
				Message: "taint fleetstream.io/unreachable:NoSelect is not tolerated (the cluster's agent is not connected)"}},
			{ClusterName: "us-1", Reason: &placementv1.NotSelectedReason{
				Kind:       placementv1.NotSelectedReasonKind_NOT_SELECTED_REASON_KIND_PREDICATE_NOT_MATCHED,
				Predicates: []*placementv1.PredicateMismatch{{Predicate: 0, Selector: "label_selector", Requirement: "region=eu"}},
				Message:    "matches no predicate: predicates[0].label_selector requires region=eu"}},
			{ClusterName: "lab-1", Reason: &placementv1.NotSelectedReason{
				Kind: placementv1.NotSelectedReasonKind_NOT_SELECTED_REASON_KIND_NOT_IN_CLUSTER_SETS, EligibleClusterSets: []string{"eu"},
				Message: "not in a cluster set bound to the project [eu]"}},
		}}
}
