package placement

import (
	"fmt"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/util/intstr"
)

type wantGroup struct {
	name     string
	clusters []string
}

func TestDecisionGroups(t *testing.T) {
	amazonAzure := []Cluster{
		cluster("cluster1", lbl("cloud", "Amazon")),
		cluster("cluster2", lbl("cloud", "Amazon")),
		cluster("cluster3", lbl("cloud", "Azure")),
		cluster("cluster4", lbl("cloud", "Azure")),
	}
	canary := []DecisionGroup{{GroupName: "canary", GroupClusterSelector: GroupClusterSelector{LabelSelector: matchLabels("cloud", "Azure")}}}
	twoGroups := []DecisionGroup{
		{GroupName: "group1", GroupClusterSelector: GroupClusterSelector{LabelSelector: matchLabels("cloud", "Amazon")}},
		{GroupName: "group2", GroupClusterSelector: GroupClusterSelector{LabelSelector: matchLabels("cloud", "Azure")}},
	}
	cases := []struct {
		src      string
		clusters []Cluster
		strategy DecisionStrategy
		want     []wantGroup
	}{
		{
			src:      ct + "TestSchedulingController_sync/placement satisfied",
			clusters: plainClusters(3),
			want:     []wantGroup{{"", names("cluster", 3)}},
		},
		{
			src:      ct + "TestSchedulingController_sync/placement with canary group strategy",
			clusters: amazonAzure,
			strategy: DecisionStrategy{Groups: canary, ClustersPerDecisionGroup: intstr.FromInt32(1)},
			want:     []wantGroup{{"canary", []string{"cluster3"}}, {"canary", []string{"cluster4"}}, {"", []string{"cluster1"}}, {"", []string{"cluster2"}}},
		},
		{
			src:      ct + "TestSchedulingController_sync/placement with multiple group strategy",
			clusters: amazonAzure[:3],
			strategy: DecisionStrategy{Groups: twoGroups},
			want:     []wantGroup{{"group1", []string{"cluster1", "cluster2"}}, {"group2", []string{"cluster3"}}},
		},
		{
			src:      ct + "TestSchedulingController_sync/placement with only cluster per decision group",
			clusters: amazonAzure[:3],
			strategy: DecisionStrategy{ClustersPerDecisionGroup: intstr.FromString("25%")},
			want:     []wantGroup{{"", []string{"cluster1"}}, {"", []string{"cluster2"}}, {"", []string{"cluster3"}}},
		},
		{
			src:      ct + "TestBind/create single placementdecision",
			clusters: plainClusters(10),
			want:     []wantGroup{{"", sortedCopy(names("cluster", 10))}},
		},
		{
			src:      ct + "TestBind/create empty placementdecision",
			clusters: nil,
			want:     []wantGroup{{"", nil}},
		},
		{
			src:      ct + "TestBind/create placementdecision with canary group strategy",
			clusters: amazonAzure,
			strategy: DecisionStrategy{Groups: canary, ClustersPerDecisionGroup: intstr.FromString("25%")},
			want:     []wantGroup{{"canary", []string{"cluster3"}}, {"canary", []string{"cluster4"}}, {"", []string{"cluster1"}}, {"", []string{"cluster2"}}},
		},
		{
			src:      ct + "TestBind/create placementdecision when no cluster selected by canary group strategy",
			clusters: []Cluster{cluster("cluster1", lbl("cloud", "Amazon")), cluster("cluster2", lbl("cloud", "Amazon")), cluster("cluster3", lbl("cloud", "Amazon"))},
			strategy: DecisionStrategy{Groups: canary},
			want:     []wantGroup{{"", names("cluster", 3)}},
		},
		{
			src:      ct + "TestBind/create placementdecision with multiple group strategy",
			clusters: amazonAzure[:3],
			strategy: DecisionStrategy{Groups: twoGroups},
			want:     []wantGroup{{"group1", []string{"cluster1", "cluster2"}}, {"group2", []string{"cluster3"}}},
		},
		{
			src:      ct + "TestBind/create placementdecision with only cluster per decision group",
			clusters: amazonAzure[:3],
			strategy: DecisionStrategy{ClustersPerDecisionGroup: intstr.FromString("25%")},
			want:     []wantGroup{{"", []string{"cluster1"}}, {"", []string{"cluster2"}}, {"", []string{"cluster3"}}},
		},
		{
			// Not from OCM: a cluster matching two group selectors goes to the first.
			src:      "first matching group wins",
			clusters: amazonAzure,
			strategy: DecisionStrategy{Groups: append(slices.Clone(canary), DecisionGroup{GroupName: "all"})},
			want:     []wantGroup{{"canary", []string{"cluster3", "cluster4"}}, {"all", []string{"cluster1", "cluster2"}}},
		},
		{
			// Not from OCM: inside a group, clusters are in name order even when scores rank them otherwise.
			src: "groups are sorted by name, not by score",
			clusters: []Cluster{
				cluster("a", res(ResourceCPU, "1", "1")),
				cluster("b", res(ResourceCPU, "3", "3")),
				cluster("c", res(ResourceCPU, "2", "2")),
			},
			want: []wantGroup{{"", []string{"a", "b", "c"}}},
		},
	}
	for _, c := range cases {
		t.Run(c.src, func(t *testing.T) {
			p := Placement{DecisionStrategy: c.strategy}
			if c.src == "groups are sorted by name, not by score" {
				p.PrioritizerPolicy = PrioritizerPolicy{Configurations: []PrioritizerConfig{builtIn(PrioritizerResourceAllocatableCPU, 1)}}
			}
			d := run(t, c.clusters, nil, nil, p, PlacementState{BoundClusterSets: []string{DefaultClusterSet}})
			if len(d.DecisionGroups) != len(c.want) {
				t.Fatalf("got %d groups %v, want %d", len(d.DecisionGroups), groupNames(d), len(c.want))
			}
			for i, g := range d.DecisionGroups {
				got := groupNames(d)[i]
				if g.DecisionGroupIndex != int32(i) || g.DecisionGroupName != c.want[i].name || !slices.Equal(got, c.want[i].clusters) ||
					int(g.ClustersCount) != len(c.want[i].clusters) || len(g.Pages) == 0 {
					t.Errorf("group %d = {%d %q %d pages=%d %v}, want {%q %v}", i, g.DecisionGroupIndex, g.DecisionGroupName,
						g.ClustersCount, len(g.Pages), got, c.want[i].name, c.want[i].clusters)
				}
			}
		})
	}
}

// TestPagesOf100 follows OCM's TestBind/create multiple placementdecisions
// (101 clusters → pages of 100 and 1) and checks pages inside groups.
func TestPagesOf100(t *testing.T) {
	cases := []struct {
		name      string
		n         int
		perGroup  intstr.IntOrString
		wantPages [][]int // per group, page sizes
	}{
		{ct + "TestBind/create multiple placementdecisions", 101, intstr.IntOrString{}, [][]int{{100, 1}}},
		{"exactly 100 is one page", 100, intstr.IntOrString{}, [][]int{{100}}},
		{"250 clusters", 250, intstr.IntOrString{}, [][]int{{100, 100, 50}}},
		{"groups of 120 each paged", 250, intstr.FromInt32(120), [][]int{{100, 20}, {100, 20}, {10}}},
		{"percentage rounds up: 34% of 250 = 85", 250, intstr.FromString("34%"), [][]int{{85}, {85}, {80}}},
		{"nothing selected keeps one empty page", 0, intstr.IntOrString{}, [][]int{{0}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var clusters []Cluster
			for i := 0; i < c.n; i++ {
				clusters = append(clusters, cluster(fmt.Sprintf("c%04d", i)))
			}
			d := run(t, clusters, nil, nil, Placement{DecisionStrategy: DecisionStrategy{ClustersPerDecisionGroup: c.perGroup}},
				PlacementState{BoundClusterSets: []string{DefaultClusterSet}})
			var got [][]int
			seen := map[string]bool{}
			for _, g := range d.DecisionGroups {
				var sizes []int
				for _, p := range g.Pages {
					sizes = append(sizes, len(p.Clusters))
					for _, cd := range p.Clusters {
						if seen[cd.ClusterName] {
							t.Errorf("%s in two pages", cd.ClusterName)
						}
						seen[cd.ClusterName] = true
					}
				}
				got = append(got, sizes)
			}
			if fmt.Sprint(got) != fmt.Sprint(c.wantPages) {
				t.Errorf("pages %v, want %v", got, c.wantPages)
			}
			if len(seen) != c.n {
				t.Errorf("%d clusters paged, want %d", len(seen), c.n)
			}
		})
	}
}
