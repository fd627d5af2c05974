package placement

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fakeTime is OCM's fakeTime in the taint-toleration and add-on tests.
var fakeTime = time.Date(2022, time.January, 1, 0, 0, 0, 0, time.UTC)

type clusterOpt func(*Cluster)

func cluster(name string, opts ...clusterOpt) Cluster {
	c := Cluster{Name: name}
	for _, o := range opts {
		o(&c)
	}
	return c
}

func lbl(k, v string) clusterOpt {
	return func(c *Cluster) {
		if c.Labels == nil {
			c.Labels = map[string]string{}
		}
		c.Labels[k] = v
	}
}

func claim(k, v string) clusterOpt {
	return func(c *Cluster) {
		if c.Claims == nil {
			c.Claims = map[string]string{}
		}
		c.Claims[k] = v
	}
}

func taint(k, v string, e TaintEffect, added time.Time) clusterOpt {
	return func(c *Cluster) { c.Taints = append(c.Taints, Taint{Key: k, Value: v, Effect: e, TimeAdded: added}) }
}

func res(r ResourceName, alloc, capacity string) clusterOpt {
	return func(c *Cluster) {
		if c.Allocatable == nil {
			c.Allocatable = map[ResourceName]resource.Quantity{}
			c.Capacity = map[ResourceName]resource.Quantity{}
		}
		c.Allocatable[r] = resource.MustParse(alloc)
		c.Capacity[r] = resource.MustParse(capacity)
	}
}

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i+1)
	}
	return out
}

func plainClusters(n int) []Cluster {
	var out []Cluster
	for _, n := range names("cluster", n) {
		out = append(out, cluster(n))
	}
	return out
}

func i32(v int32) *int32 { return &v }
func i64(v int64) *int64 { return &v }

func matchLabels(kv ...string) metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return metav1.LabelSelector{MatchLabels: m}
}

func labelPredicate(kv ...string) Predicate {
	return Predicate{RequiredClusterSelector: ClusterSelector{LabelSelector: matchLabels(kv...)}}
}

func claimIn(key string, values ...string) ClaimSelector {
	return ClaimSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: metav1.LabelSelectorOpIn, Values: values}}}
}

func builtIn(name string, w int32) PrioritizerConfig {
	return PrioritizerConfig{ScoreCoordinate: &ScoreCoordinate{Type: ScoreCoordinateTypeBuiltIn, BuiltIn: name}, Weight: w}
}

func addOn(resourceName, scoreName string, w int32) PrioritizerConfig {
	return PrioritizerConfig{ScoreCoordinate: &ScoreCoordinate{Type: ScoreCoordinateTypeAddOn,
		AddOn: &AddOnScoreCoordinate{ResourceName: resourceName, ScoreName: scoreName}}, Weight: w}
}

// defaultSets is the fleet's two built-in sets.
func defaultSets() []ClusterSet {
	return []ClusterSet{
		{Name: DefaultClusterSet, Selector: ClusterSetSelector{Type: SelectorExclusiveLabel}},
		{Name: GlobalClusterSet, Selector: ClusterSetSelector{Type: SelectorLabelSelector, LabelSelector: &metav1.LabelSelector{}}},
	}
}

// run schedules p over clusters in the default set bound to the project.
func run(t *testing.T, clusters []Cluster, sets []ClusterSet, scores []AddOnScore, p Placement, st PlacementState) *Decision {
	t.Helper()
	if sets == nil {
		sets = defaultSets()
	}
	f, err := NewFleet(clusters, sets, scores)
	if err != nil {
		t.Fatalf("NewFleet: %v", err)
	}
	if st.Now.IsZero() {
		st.Now = fakeTime
	}
	d, err := f.Schedule(context.Background(), &p, st)
	if err != nil {
		t.Fatalf("Schedule: %v", err)
	}
	return d
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	sort.Strings(out)
	return out
}

func groupNames(d *Decision) [][]string {
	var out [][]string
	for _, g := range d.DecisionGroups {
		var n []string
		for _, p := range g.Pages {
			for _, c := range p.Clusters {
				n = append(n, c.ClusterName)
			}
		}
		out = append(out, n)
	}
	return out
}

func scoreOf(d *Decision, prioritizer, clusterName string) (int64, bool) {
	k := -1
	for i, p := range d.Prioritizers {
		if p.Name == prioritizer {
			k = i
		}
	}
	if k < 0 {
		return 0, false
	}
	for _, c := range d.Clusters {
		if c.ClusterName == clusterName {
			return c.Scores[k], true
		}
	}
	return 0, false
}
