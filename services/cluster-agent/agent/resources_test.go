package agent_test

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-agent/agent"
)

// nodeSpec is a node as a test wants it: Ready or not, cordoned or not, cpu and memory.
type nodeSpec struct {
	ready, cordoned        bool
	cpuCap, cpuAlloc       string
	memoryCap, memoryAlloc string
	// heartbeatAgo dates the Ready condition's last heartbeat back.
	heartbeatAgo time.Duration
}

func (s nodeSpec) status() corev1.NodeStatus {
	ready := corev1.ConditionFalse
	if s.ready {
		ready = corev1.ConditionTrue
	}
	beat := metav1.NewTime(time.Now().Add(-s.heartbeatAgo).Truncate(time.Second))
	return corev1.NodeStatus{
		Capacity: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse(s.cpuCap), corev1.ResourceMemory: resource.MustParse(s.memoryCap),
			corev1.ResourcePods: resource.MustParse("110"),
		},
		Allocatable: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse(s.cpuAlloc), corev1.ResourceMemory: resource.MustParse(s.memoryAlloc),
			corev1.ResourcePods: resource.MustParse("110"),
		},
		Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: ready, Reason: "KubeletReady", LastHeartbeatTime: beat, LastTransitionTime: beat,
		}},
	}
}

// putNode creates or updates node name to look like s, the status through the status
// subresource as a kubelet writes it.
func putNode(ctx context.Context, kube kubernetes.Interface, name string, s nodeSpec) error {
	nodes := kube.CoreV1().Nodes()
	n, err := nodes.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		n, err = nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create node %s: %w", name, err)
		}
	}
	if n.Spec.Unschedulable != s.cordoned {
		n.Spec.Unschedulable = s.cordoned
		if n, err = nodes.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("cordon node %s: %w", name, err)
		}
	}
	n.Status = s.status()
	if _, err := nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update status of node %s: %w", name, err)
	}
	return nil
}

func wantResources(want *agentv1.ClusterResources, hb *agentv1.Heartbeat) error {
	got := hb.GetResources()
	if got == nil {
		return fmt.Errorf("heartbeat without resources")
	}
	if !maps.Equal(got.Allocatable, want.Allocatable) || !maps.Equal(got.Capacity, want.Capacity) || got.NodeCount != want.NodeCount {
		return fmt.Errorf("resources %v, want %v", got, want)
	}
	return nil
}

func resources(count int32, allocCPU, allocMem, capCPU, capMem string) *agentv1.ClusterResources {
	return &agentv1.ClusterResources{
		Allocatable: map[string]string{"cpu": allocCPU, "memory": allocMem},
		Capacity:    map[string]string{"cpu": capCPU, "memory": capMem},
		NodeCount:   count,
	}
}

// TestResourcesFollowReadyNodes changes nodes on a real apiserver and expects each change in a
// heartbeat. The heartbeat interval is an hour, so every report seen after the first beat was
// sent because the sums changed, not by the ticker.
func TestResourcesFollowReadyNodes(t *testing.T) {
	t.Parallel()
	j, k := testkit.StartJetStream(t), testkit.StartKube(t)
	ctx := testkit.Context(t, 2*time.Minute)
	ensureStream(t, ctx, j.JS)

	ag := startAgent(t, agent.Config{HeartbeatInterval: time.Hour, ResourcesDebounce: 50 * time.Millisecond}, j.JS, k)

	a := nodeSpec{ready: true, cpuCap: "4", cpuAlloc: "3800m", memoryCap: "16Gi", memoryAlloc: "15Gi"}
	b := nodeSpec{ready: true, cpuCap: "2", cpuAlloc: "1500m", memoryCap: "8Gi", memoryAlloc: "7340032Ki"}
	// Node c writes its memory in bytes and decimal units: the sums still print canonically.
	c := nodeSpec{ready: false, cpuCap: "8", cpuAlloc: "7", memoryCap: "34359738368", memoryAlloc: "30G"}
	steps := []struct {
		name string
		do   func() error
		want *agentv1.ClusterResources
	}{
		{name: "no nodes yet", want: resources(0, "0", "0", "0", "0")},
		{name: "a ready node", do: func() error { return putNode(ctx, k.Client, "node-a", a) },
			want: resources(1, "3800m", "15Gi", "4", "16Gi")},
		{name: "a second ready node", do: func() error { return putNode(ctx, k.Client, "node-b", b) },
			want: resources(2, "5300m", "22Gi", "6", "24Gi")},
		{name: "a node that is not ready is not counted", do: func() error { return putNode(ctx, k.Client, "node-c", c) },
			want: resources(2, "5300m", "22Gi", "6", "24Gi")},
		{name: "node b goes NotReady", do: func() error {
			nb := b
			nb.ready = false
			return putNode(ctx, k.Client, "node-b", nb)
		}, want: resources(1, "3800m", "15Gi", "4", "16Gi")},
		{name: "node c becomes Ready", do: func() error {
			nc := c
			nc.ready = true
			return putNode(ctx, k.Client, "node-c", nc)
		}, want: resources(2, "10800m", "45025515Ki", "12", "48Gi")},
		{name: "node a cordoned: its allocatable leaves, capacity and count stay", do: func() error {
			na := a
			na.cordoned = true
			return putNode(ctx, k.Client, "node-a", na)
		}, want: resources(2, "7", "29296875Ki", "12", "48Gi")},
		{name: "node c deleted", do: func() error {
			return k.Client.CoreV1().Nodes().Delete(ctx, "node-c", metav1.DeleteOptions{})
		}, want: resources(1, "0", "0", "4", "16Gi")},
	}
	for _, step := range steps {
		if step.do != nil {
			if err := step.do(); err != nil {
				t.Fatalf("%s: %v", step.name, err)
			}
		}
		testkit.Eventually(t, 15*time.Second, func() error {
			hb, err := latestHeartbeat(ctx, j.JS)
			if err != nil {
				return err
			}
			if err := wantResources(step.want, hb.payload); err != nil {
				return fmt.Errorf("%s: %w", step.name, err)
			}
			return nil
		})
	}

	// A kubelet's routine status write (a new heartbeat time, the same resources) changes no
	// sum, so it sends no heartbeat. The agent counts the node events it has finished with and
	// the sum changes that wake its heartbeater: once the write's event is finished with, no
	// change may have come of it, and no heartbeat.
	var base, changes uint64
	testkit.Eventually(t, 15*time.Second, func() error {
		seen, settled, ch := ag.NodeEvents()
		if settled != seen {
			return fmt.Errorf("%d node events seen, %d finished with", seen, settled)
		}
		base, changes = seen, ch
		return nil
	})
	before, err := latestHeartbeat(ctx, j.JS)
	if err != nil {
		t.Fatal(err)
	}
	na := a
	na.cordoned, na.heartbeatAgo = true, 3*time.Minute
	if err := putNode(ctx, k.Client, "node-a", na); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 15*time.Second, func() error {
		if _, settled, _ := ag.NodeEvents(); settled <= base {
			return fmt.Errorf("node events finished with: %d, want more than %d", settled, base)
		}
		return nil
	})
	if _, _, ch := ag.NodeEvents(); ch != changes {
		t.Fatalf("a status write that changed no sum changed the sums %d time(s)", ch-changes)
	}
	after, err := latestHeartbeat(ctx, j.JS)
	if err != nil {
		t.Fatal(err)
	}
	if after.seq != before.seq {
		t.Fatalf("a status write that changed no sum sent heartbeat %d (resources %v)", after.seq, after.payload.GetResources())
	}
}

// TestNoNodeAccessStillHeartbeatsAndReconciles runs the agent as an identity that may list
// namespaces but not nodes: heartbeats go on without resources (unknown, not zero), and the
// reconcilers that wait for the shared informers still run.
func TestNoNodeAccessStillHeartbeatsAndReconciles(t *testing.T) {
	t.Parallel()
	j, k := testkit.StartJetStream(t), testkit.StartKube(t)
	ctx := testkit.Context(t, 2*time.Minute)
	ensureStream(t, ctx, j.JS)
	const user = "agent-without-nodes"
	if _, err := k.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get", "list", "watch"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := putNode(ctx, k.Client, "node-a", nodeSpec{ready: true, cpuCap: "4", cpuAlloc: "4", memoryCap: "1Gi", memoryAlloc: "1Gi"}); err != nil {
		t.Fatal(err)
	}

	a, err := agent.New(agent.Config{ClusterName: cluster, HeartbeatInterval: 100 * time.Millisecond, ResourcesDebounce: 10 * time.Millisecond},
		j.JS, k.ClientAs(t, user, "system:authenticated"), testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent run: %v", err)
		}
	})

	// The inventory reporter runs only after the shared informers synced.
	testkit.Eventually(t, 15*time.Second, func() error {
		inv, err := latestInventory(ctx, j.JS)
		if err != nil {
			return err
		}
		if namespaces(inv.payload)["default"] == nil {
			return fmt.Errorf("inventory without default: %v", inv.payload)
		}
		return nil
	})
	first, err := latestHeartbeat(ctx, j.JS)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		hb, err := latestHeartbeat(ctx, j.JS)
		if err != nil {
			return err
		}
		if hb.seq < first.seq+3 {
			return fmt.Errorf("heartbeat %d, want a few after %d", hb.seq, first.seq)
		}
		if hb.payload.GetResources() != nil {
			return fmt.Errorf("resources %v from an agent that may not list nodes", hb.payload.GetResources())
		}
		return nil
	})
}
