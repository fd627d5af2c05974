package agent

import (
	"maps"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func testNode(name string, ready corev1.ConditionStatus, cordoned bool, capacity, alloc map[corev1.ResourceName]string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{Unschedulable: cordoned}}
	if ready != "" {
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready}}
	}
	n.Status.Capacity, n.Status.Allocatable = corev1.ResourceList{}, corev1.ResourceList{}
	for k, v := range capacity {
		n.Status.Capacity[k] = resource.MustParse(v)
	}
	for k, v := range alloc {
		n.Status.Allocatable[k] = resource.MustParse(v)
	}
	return n
}

func TestSumNodes(t *testing.T) {
	res := func(cpu, mem string) map[corev1.ResourceName]string {
		return map[corev1.ResourceName]string{corev1.ResourceCPU: cpu, corev1.ResourceMemory: mem}
	}
	cases := []struct {
		name       string
		nodes      []*corev1.Node
		alloc, cap map[string]string
		count      int32
	}{
		{
			name:  "no nodes: zeros, not absent",
			alloc: map[string]string{"cpu": "0", "memory": "0"}, cap: map[string]string{"cpu": "0", "memory": "0"},
		},
		{
			name: "ready nodes add up in canonical notation whatever the nodes used",
			nodes: []*corev1.Node{
				testNode("a", corev1.ConditionTrue, false, res("4", "16Gi"), res("3800m", "15Gi")),
				testNode("b", corev1.ConditionTrue, false, res("2000m", "8589934592"), res("1.5", "7340032Ki")),
			},
			alloc: map[string]string{"cpu": "5300m", "memory": "22Gi"}, cap: map[string]string{"cpu": "6", "memory": "24Gi"},
			count: 2,
		},
		{
			name: "not ready, unknown and conditionless nodes do not count",
			nodes: []*corev1.Node{
				testNode("a", corev1.ConditionTrue, false, res("4", "16Gi"), res("4", "16Gi")),
				testNode("b", corev1.ConditionFalse, false, res("4", "16Gi"), res("4", "16Gi")),
				testNode("c", corev1.ConditionUnknown, false, res("4", "16Gi"), res("4", "16Gi")),
				testNode("d", "", false, res("4", "16Gi"), res("4", "16Gi")),
			},
			alloc: map[string]string{"cpu": "4", "memory": "16Gi"}, cap: map[string]string{"cpu": "4", "memory": "16Gi"},
			count: 1,
		},
		{
			name: "a cordoned node counts in capacity and node count, not in allocatable",
			nodes: []*corev1.Node{
				testNode("a", corev1.ConditionTrue, true, res("4", "16Gi"), res("3", "15Gi")),
				testNode("b", corev1.ConditionTrue, false, res("1", "1Gi"), res("500m", "512Mi")),
			},
			alloc: map[string]string{"cpu": "500m", "memory": "512Mi"}, cap: map[string]string{"cpu": "5", "memory": "17Gi"},
			count: 2,
		},
		{
			name: "a node without memory adds only its cpu",
			nodes: []*corev1.Node{
				testNode("a", corev1.ConditionTrue, false, map[corev1.ResourceName]string{corev1.ResourceCPU: "2"}, map[corev1.ResourceName]string{corev1.ResourceCPU: "2"}),
				testNode("b", corev1.ConditionTrue, false, res("1", "1000M"), res("1", "1000M")),
			},
			alloc: map[string]string{"cpu": "3", "memory": "1000000000"}, cap: map[string]string{"cpu": "3", "memory": "1000000000"},
			count: 2,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := sumNodes(tc.nodes)
			if !maps.Equal(got.Allocatable, tc.alloc) || !maps.Equal(got.Capacity, tc.cap) || got.NodeCount != tc.count {
				t.Fatalf("got allocatable %v capacity %v count %d, want %v %v %d", got.Allocatable, got.Capacity, got.NodeCount, tc.alloc, tc.cap, tc.count)
			}
			// The lister's order is random: the result must not depend on it.
			rev := make([]*corev1.Node, len(tc.nodes))
			for i, n := range tc.nodes {
				rev[len(tc.nodes)-1-i] = n
			}
			if again := sumNodes(rev); !maps.Equal(again.Allocatable, got.Allocatable) || !maps.Equal(again.Capacity, got.Capacity) {
				t.Fatalf("order changed the sums: %v %v vs %v %v", again.Allocatable, again.Capacity, got.Allocatable, got.Capacity)
			}
		})
	}
}

func TestNodeResourcesChanged(t *testing.T) {
	base := func() *corev1.Node {
		return testNode("a", corev1.ConditionTrue, false,
			map[corev1.ResourceName]string{corev1.ResourceCPU: "4", corev1.ResourceMemory: "16Gi", corev1.ResourcePods: "110"},
			map[corev1.ResourceName]string{corev1.ResourceCPU: "4", corev1.ResourceMemory: "16Gi"})
	}
	cases := []struct {
		name   string
		edit   func(n *corev1.Node)
		change bool
	}{
		{"condition heartbeat only", func(n *corev1.Node) { n.Status.Conditions[0].LastHeartbeatTime = metav1.Now() }, false},
		{"same cpu in other notation", func(n *corev1.Node) { n.Status.Capacity[corev1.ResourceCPU] = resource.MustParse("4000m") }, false},
		{"pods capacity (not summed)", func(n *corev1.Node) { n.Status.Capacity[corev1.ResourcePods] = resource.MustParse("250") }, false},
		{"label", func(n *corev1.Node) { n.Labels = map[string]string{"x": "y"} }, false},
		{"not ready", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionFalse }, true},
		{"cordoned", func(n *corev1.Node) { n.Spec.Unschedulable = true }, true},
		{"allocatable memory", func(n *corev1.Node) { n.Status.Allocatable[corev1.ResourceMemory] = resource.MustParse("15Gi") }, true},
		{"capacity cpu gone", func(n *corev1.Node) { delete(n.Status.Capacity, corev1.ResourceCPU) }, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := base()
			tc.edit(n)
			if got := nodeResourcesChanged(base(), n); got != tc.change {
				t.Fatalf("changed = %v, want %v", got, tc.change)
			}
		})
	}
}
