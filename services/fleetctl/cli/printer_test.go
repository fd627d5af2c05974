package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
)

var testNow = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func testCluster() *clusterv1.Cluster {
	return &clusterv1.Cluster{
		Id:     "c-123",
		Name:   "prod-eu-1",
		Labels: map[string]string{"tier": "gold", "env": "prod"},
		Claims: map[string]string{"region": "eu-west-1"},
		Taints: []*clusterv1.Taint{{Key: "maintenance", Value: "true", Effect: clusterv1.TaintEffect_TAINT_EFFECT_NO_SELECT}},
		Status: &clusterv1.ClusterStatus{
			KubernetesVersion: "v1.34.1",
			LastSeen:          timestamppb.New(testNow.Add(-3 * time.Minute)),
			Conditions: []*clusterv1.Condition{
				{Type: "Available", Status: clusterv1.ConditionStatus_CONDITION_STATUS_FALSE},
				{Type: "AgentConnected", Status: clusterv1.ConditionStatus_CONDITION_STATUS_TRUE},
			},
		},
		CreateTime: timestamppb.New(time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)),
		Revision:   7,
	}
}

func TestPrintCluster(t *testing.T) {
	tests := []struct {
		format string
		want   string
	}{
		{format: formatTable, want: "" +
			"NAME        ID      LABELS               CONNECTED   AGENT        K8S       LAST SEEN   TAINTS\n" +
			"prod-eu-1   c-123   env=prod,tier=gold   True        in-cluster   v1.34.1   3m          maintenance\n"},
		{format: formatJSON, want: `{
  "id": "c-123",
  "name": "prod-eu-1",
  "labels": {
    "env": "prod",
    "tier": "gold"
  },
  "claims": {
    "region": "eu-west-1"
  },
  "taints": [
    {
      "key": "maintenance",
      "value": "true",
      "effect": "TAINT_EFFECT_NO_SELECT"
    }
  ],
  "status": {
    "conditions": [
      {
        "type": "Available",
        "status": "CONDITION_STATUS_FALSE"
      },
      {
        "type": "AgentConnected",
        "status": "CONDITION_STATUS_TRUE"
      }
    ],
    "kubernetesVersion": "v1.34.1",
    "lastSeen": "2026-05-01T11:57:00Z"
  },
  "createTime": "2026-04-01T00:00:00Z",
  "revision": "7"
}
`},
		{format: formatYAML, want: `claims:
  region: eu-west-1
createTime: "2026-04-01T00:00:00Z"
id: c-123
labels:
  env: prod
  tier: gold
name: prod-eu-1
revision: "7"
status:
  conditions:
  - status: CONDITION_STATUS_FALSE
    type: Available
  - status: CONDITION_STATUS_TRUE
    type: AgentConnected
  kubernetesVersion: v1.34.1
  lastSeen: "2026-05-01T11:57:00Z"
taints:
- effect: TAINT_EFFECT_NO_SELECT
  key: maintenance
  value: "true"
`},
	}
	for _, tt := range tests {
		t.Run(tt.format, func(t *testing.T) {
			var out, errOut bytes.Buffer
			p := &Printer{Format: tt.format, Out: &out, ErrOut: &errOut}
			if err := p.Print(testCluster(), clusterColumns(func() time.Time { return testNow })...); err != nil {
				t.Fatal(err)
			}
			if out.String() != tt.want {
				t.Errorf("got:\n%s\nwant:\n%s", out.String(), tt.want)
			}
			if errOut.Len() != 0 {
				t.Errorf("stderr: %q", errOut.String())
			}
		})
	}
}

func TestPrintClusterList(t *testing.T) {
	other := &clusterv1.Cluster{Id: "c-456", Name: "edge-1"}
	items := Messages([]*clusterv1.Cluster{testCluster(), other})
	tests := []struct {
		format string
		items  []*clusterv1.Cluster
		want   string
		stderr string
	}{
		{format: formatTable, want: "" +
			"NAME        ID      LABELS               CONNECTED   AGENT        K8S       LAST SEEN   TAINTS\n" +
			"prod-eu-1   c-123   env=prod,tier=gold   True        in-cluster   v1.34.1   3m          maintenance\n" +
			"edge-1      c-456   <none>               Unknown     -            -         never       <none>\n"},
		{format: formatJSON, want: "[\n  {\n    \"id\": \"c-456\",\n    \"name\": \"edge-1\"\n  }\n]\n"},
		{format: formatYAML, want: "- id: c-456\n  name: edge-1\n"},
	}
	for _, tt := range tests {
		t.Run(tt.format, func(t *testing.T) {
			var out bytes.Buffer
			p := &Printer{Format: tt.format, Out: &out, ErrOut: &bytes.Buffer{}}
			list := items
			if tt.format != formatTable {
				list = items[1:]
			}
			if err := p.PrintList(list, clusterColumns(func() time.Time { return testNow })...); err != nil {
				t.Fatal(err)
			}
			if out.String() != tt.want {
				t.Errorf("got:\n%s\nwant:\n%s", out.String(), tt.want)
			}
		})
	}
}

func TestPrintEmptyList(t *testing.T) {
	for format, want := range map[string]string{formatTable: "", formatJSON: "[]\n", formatYAML: "[]\n"} {
		var out, errOut bytes.Buffer
		p := &Printer{Format: format, Out: &out, ErrOut: &errOut}
		if err := p.PrintList(nil, clusterColumns(func() time.Time { return testNow })...); err != nil {
			t.Fatal(err)
		}
		if out.String() != want {
			t.Errorf("%s: stdout %q, want %q", format, out.String(), want)
		}
		if format == formatTable && !strings.Contains(errOut.String(), "No resources found") {
			t.Errorf("table: stderr %q", errOut.String())
		}
	}
}

func TestStreamPrinter(t *testing.T) {
	ev := func(typ clusterv1.WatchClustersResponse_EventType, name string) *clusterv1.WatchClustersResponse {
		return &clusterv1.WatchClustersResponse{Type: typ, Cluster: &clusterv1.Cluster{Name: name}}
	}
	events := []*clusterv1.WatchClustersResponse{
		ev(clusterv1.WatchClustersResponse_EVENT_TYPE_ADDED, "a"),
		ev(clusterv1.WatchClustersResponse_EVENT_TYPE_DELETED, "b"),
	}
	cols := append([]Column{Col("EVENT", func(e *clusterv1.WatchClustersResponse) string {
		return strings.TrimPrefix(e.GetType().String(), "EVENT_TYPE_")
	})}, ColumnsOf(func(e *clusterv1.WatchClustersResponse) *clusterv1.Cluster { return e.GetCluster() },
		Col("NAME", (*clusterv1.Cluster).GetName))...)
	tests := []struct {
		format string
		want   string
	}{
		{format: formatTable, want: "EVENT       NAME\nADDED       a\nDELETED     b\n"},
		{format: formatJSON, want: `{"type":"EVENT_TYPE_ADDED","cluster":{"name":"a"}}` + "\n" + `{"type":"EVENT_TYPE_DELETED","cluster":{"name":"b"}}` + "\n"},
		{format: formatYAML, want: "cluster:\n  name: a\ntype: EVENT_TYPE_ADDED\n---\ncluster:\n  name: b\ntype: EVENT_TYPE_DELETED\n"},
	}
	for _, tt := range tests {
		t.Run(tt.format, func(t *testing.T) {
			var out bytes.Buffer
			s := (&Printer{Format: tt.format, Out: &out}).Stream(cols...)
			for _, e := range events {
				if err := s.Print(e); err != nil {
					t.Fatal(err)
				}
			}
			if out.String() != tt.want {
				t.Errorf("got:\n%q\nwant:\n%q", out.String(), tt.want)
			}
		})
	}
}

func TestClusterCells(t *testing.T) {
	many := &clusterv1.Cluster{Taints: []*clusterv1.Taint{{Key: "a"}, {Key: "b"}, {Key: "c"}, {Key: "d"}}}
	if got := clusterTaints(many); got != "4 taints" {
		t.Errorf("taints = %q", got)
	}
	lost := &clusterv1.Cluster{Status: &clusterv1.ClusterStatus{Conditions: []*clusterv1.Condition{{Type: "AgentConnected", Status: clusterv1.ConditionStatus_CONDITION_STATUS_FALSE}}}}
	if got := clusterConnected(lost); got != "False" {
		t.Errorf("connected = %q", got)
	}
}

func TestAge(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0s"}, {5 * time.Second, "5s"}, {3*time.Minute + 59*time.Second, "3m"},
		{2 * time.Hour, "2h"}, {47 * time.Hour, "47h"}, {72 * time.Hour, "3d"},
	}
	for _, tt := range tests {
		if got := age(testNow, testNow.Add(-tt.d)); got != tt.want {
			t.Errorf("age(%s) = %q, want %q", tt.d, got, tt.want)
		}
	}
}

func TestListCell(t *testing.T) {
	for _, tt := range []struct {
		items []string
		want  string
	}{
		{nil, ""},
		{[]string{"east"}, "east"},
		{[]string{"a", "b", "c"}, "a,b,c"},
		{[]string{"a", "b", "c", "d"}, "a,b,c + 1 more..."},
		{make([]string, 10_000), ",, + 9997 more..."},
	} {
		if got := listCell(tt.items); got != tt.want {
			t.Errorf("listCell(%d items) = %q, want %q", len(tt.items), got, tt.want)
		}
	}
}
