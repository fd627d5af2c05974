package namespacebinding_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-agent/agent"
	"github.com/fleetstream/fleetstream/services/cluster-agent/desired"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
)

const converge = 60 * time.Second

// member is one member cluster: a real kube-apiserver and, while running, its agent with the
// desired-state applier, connected to the hub's JetStream on its own connection.
type member struct {
	name string
	kube *testkit.Kube
	stop func()
}

// startAgent runs the member's agent until stop or the end of t.
func (m *member) startAgent(t *testing.T, j *testkit.JetStream) {
	t.Helper()
	_, js := j.Connect(t)
	a, err := agent.New(agent.Config{ClusterName: m.name, HeartbeatInterval: 200 * time.Millisecond, InventoryDebounce: 100 * time.Millisecond},
		js, m.kube.Client, testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(m.kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	ap, err := desired.New(desired.Config{ClusterName: m.name, ResyncPeriod: 10 * time.Second}, js, dyn, m.kube.Client.Discovery(), testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	a.Add(ap)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stopped := false
	m.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent %s: %v", m.name, err)
		}
	}
	t.Cleanup(m.stop)
}

func (m *member) namespace(t *testing.T, name string) (*corev1.Namespace, bool) {
	t.Helper()
	ns, err := m.kube.Client.CoreV1().Namespaces().Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		t.Fatalf("get namespace %s on %s: %v", name, m.name, err)
	}
	return ns, true
}

func (m *member) createNamespace(t *testing.T, name string, labels map[string]string) {
	t.Helper()
	if _, err := m.kube.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s on %s: %v", name, m.name, err)
	}
}

// finalize completes a namespace's deletion as the namespace controller would: these
// apiservers run without a controller-manager.
// It returns once that namespace is gone (an agent may already have created a new one).
func (m *member) finalize(t *testing.T, name string) {
	t.Helper()
	var uid string
	testkit.Eventually(t, converge, func() error {
		ns, ok := m.namespace(t, name)
		if !ok || (uid != "" && string(ns.UID) != uid) {
			return nil
		}
		uid = string(ns.UID)
		if ns.DeletionTimestamp == nil {
			return fmt.Errorf("namespace %s on %s is not being deleted", name, m.name)
		}
		ns.Spec.Finalizers = nil
		_, err := m.kube.Client.CoreV1().Namespaces().Finalize(context.Background(), ns, metav1.UpdateOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		return errors.New("finalized; waiting for it to go")
	})
}

// setQuotaStatus writes a ResourceQuota's status as the quota controller would.
func (m *member) setQuotaStatus(t *testing.T, namespace string, used map[string]string) {
	t.Helper()
	testkit.Eventually(t, converge, func() error {
		rq, err := m.kube.Client.CoreV1().ResourceQuotas(namespace).Get(context.Background(), namespacebinding.QuotaName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		rq.Status.Hard = rq.Spec.Hard
		rq.Status.Used = corev1.ResourceList{}
		for k, v := range used {
			rq.Status.Used[corev1.ResourceName(k)] = resource.MustParse(v)
		}
		_, err = m.kube.Client.CoreV1().ResourceQuotas(namespace).UpdateStatus(context.Background(), rq, metav1.UpdateOptions{})
		return err
	})
}

func (e *env) waitBinding(t *testing.T, project, cluster, namespace string, cond func(b *projectv1.NamespaceBinding, ok bool) error) {
	t.Helper()
	testkit.Eventually(t, converge, func() error {
		b, ok := e.binding(t, project, cluster, namespace)
		return cond(b, ok)
	})
}

func phase(want projectv1.BindingPhase, reason string) func(*projectv1.NamespaceBinding, bool) error {
	return func(b *projectv1.NamespaceBinding, ok bool) error {
		if !ok {
			return errors.New("no binding")
		}
		if b.Phase != want || (reason != "" && b.Reason != reason) {
			return fmt.Errorf("binding %s/%s is %s %s (%s), want %s %s", b.Cluster, b.Namespace, b.Phase, b.Reason, b.Message, want, reason)
		}
		return nil
	}
}

func gone(b *projectv1.NamespaceBinding, ok bool) error {
	if ok {
		return fmt.Errorf("binding %s/%s still %s %s (%s)", b.Cluster, b.Namespace, b.Phase, b.Reason, b.Message)
	}
	return nil
}

// TestIntegrationTwoMemberClusters runs the hub against two real kube-apiservers with real
// agents applying the desired state.
func TestIntegrationTwoMemberClusters(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two kube-apiservers")
	}
	j := testkit.StartJetStream(t)
	e := startHub(t, j, namespacebinding.Config{ReleaseInterval: 200 * time.Millisecond}, clusterimport.Config{UnreachableAfter: 2 * time.Second})
	c1 := &member{name: "c1", kube: testkit.StartKube(t)}
	c2 := &member{name: "c2", kube: testkit.StartKube(t)}
	e.register(t, "c1", "c2")
	e.createProject(t, "team-a", "team-b")
	ctx := testkit.Context(t, 10*time.Minute)
	// Agents live as long as the whole test, not the step that starts them.
	top := t

	// c1 is in use before it is imported: one namespace labelled for a project the hub does
	// not know, one plain.
	c1.createNamespace(t, "legacy", map[string]string{namespacebinding.ProjectLabel: "team-x"})
	c1.createNamespace(t, "adopt-me", map[string]string{"app": "old"})
	c1.startAgent(t, j)

	t.Run("importing an in-use cluster assigns nothing", func(t *testing.T) {
		testkit.Eventually(t, converge, func() error {
			res, err := e.client.ListIdleNamespaces(ctx, connect.NewRequest(&projectv1.ListIdleNamespacesRequest{Cluster: "c1"}))
			if err != nil {
				return err
			}
			var names []string
			for _, n := range res.Msg.Namespaces {
				names = append(names, n.Name)
			}
			got := strings.Join(names, ",")
			if !strings.Contains(got, "adopt-me") || !strings.Contains(got, "legacy") {
				return fmt.Errorf("idle on c1: %s", got)
			}
			// The cluster's own namespaces are never idle: no project may claim them.
			if strings.Contains(got, "default") || strings.Contains(got, "kube-") {
				t.Fatalf("idle on c1 lists protected namespaces: %s", got)
			}
			return nil
		})
		for _, p := range []string{"team-a", "team-b"} {
			if n := e.project(t, p).Status.NamespaceCount; n != 0 {
				t.Fatalf("%s owns %d namespaces after the import", p, n)
			}
		}
	})

	t.Run("same namespace name bound to different projects on two clusters", func(t *testing.T) {
		e.mustBind(t, "team-a", "c1", "web", map[string]string{"cpu": "2", "memory": "4Gi"})
		// c2's agent has not run yet: the binding waits for it.
		e.mustBind(t, "team-b", "c2", "web", nil)
		e.waitBinding(t, "team-a", "c1", "web", phase(projectv1.BindingPhase_BINDING_PHASE_AVAILABLE, ""))
		e.waitBinding(t, "team-b", "c2", "web", phase(projectv1.BindingPhase_BINDING_PHASE_PENDING, namespacebinding.ReasonClusterUnreachable))
		c2.startAgent(top, j)
		e.waitBinding(t, "team-b", "c2", "web", phase(projectv1.BindingPhase_BINDING_PHASE_AVAILABLE, ""))
		for _, tc := range []struct {
			m       *member
			project string
		}{{c1, "team-a"}, {c2, "team-b"}} {
			ns, ok := tc.m.namespace(t, "web")
			if !ok || ns.Labels[namespacebinding.ProjectLabel] != tc.project {
				t.Fatalf("namespace web on %s: %v", tc.m.name, ns)
			}
		}
		rq, err := c1.kube.Client.CoreV1().ResourceQuotas("web").Get(ctx, namespacebinding.QuotaName, metav1.GetOptions{})
		if err != nil || rq.Spec.Hard.Cpu().String() != "2" || rq.Spec.Hard.Memory().String() != "4Gi" {
			t.Fatalf("quota on c1: %v %v", rq, err)
		}
	})

	t.Run("conflicting claim is refused", func(t *testing.T) {
		_, err := e.bind("team-b", "c1", "web", nil)
		if code(err) != connect.CodeAlreadyExists || !strings.Contains(err.Error(), `project "team-a"`) {
			t.Fatalf("claim of c1/web by team-b: %v", err)
		}
	})

	t.Run("namespace labelled for another project fails the binding; an unlabelled one is adopted", func(t *testing.T) {
		e.mustBind(t, "team-a", "c1", "legacy", nil)
		e.mustBind(t, "team-a", "c1", "adopt-me", nil)
		e.waitBinding(t, "team-a", "c1", "legacy", phase(projectv1.BindingPhase_BINDING_PHASE_FAILED, "OwnedByOther"))
		e.waitBinding(t, "team-a", "c1", "adopt-me", phase(projectv1.BindingPhase_BINDING_PHASE_AVAILABLE, ""))
		if ns, _ := c1.namespace(t, "legacy"); ns.Labels[namespacebinding.ProjectLabel] != "team-x" {
			t.Fatalf("legacy relabelled: %v", ns.Labels)
		}
		if ns, _ := c1.namespace(t, "adopt-me"); ns.Labels[namespacebinding.ProjectLabel] != "team-a" || ns.Labels["app"] != "old" {
			t.Fatalf("adopted namespace labels: %v", ns.Labels)
		}
		// Unbinding the failed one does not touch the other project's namespace, and the
		// binding does not linger.
		if _, err := e.client.UnbindNamespace(ctx, connect.NewRequest(&projectv1.UnbindNamespaceRequest{Project: "team-a", Cluster: "c1", Namespace: "legacy",
			Policy: projectv1.UnbindPolicy_UNBIND_POLICY_DELETE})); err != nil {
			t.Fatal(err)
		}
		e.waitBinding(t, "team-a", "c1", "legacy", gone)
		if ns, ok := c1.namespace(t, "legacy"); !ok || ns.DeletionTimestamp != nil || ns.Labels[namespacebinding.ProjectLabel] != "team-x" {
			t.Fatalf("legacy after unbind: %v", ns)
		}
	})

	t.Run("quota applied and changed; sums follow", func(t *testing.T) {
		c1.setQuotaStatus(t, "web", map[string]string{"cpu": "500m", "memory": "1Gi"})
		wantSums := func(hard, used string) {
			t.Helper()
			testkit.Eventually(t, converge, func() error {
				for _, c := range e.project(t, "team-a").Status.Clusters {
					if c.Cluster == "c1" && fmt.Sprint(c.Hard) == hard && fmt.Sprint(c.Used) == used {
						return nil
					}
				}
				return fmt.Errorf("team-a sums %v, want hard %s used %s", e.project(t, "team-a").Status.Clusters, hard, used)
			})
		}
		wantSums("map[cpu:2 memory:4Gi]", "map[cpu:500m memory:1Gi]")
		if _, err := e.client.UpdateQuota(ctx, connect.NewRequest(&projectv1.UpdateQuotaRequest{Project: "team-a", Cluster: "c1", Namespace: "web",
			Hard: map[string]string{"cpu": "4", "memory": "4Gi", "pods": "20"}})); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, converge, func() error {
			rq, err := c1.kube.Client.CoreV1().ResourceQuotas("web").Get(ctx, namespacebinding.QuotaName, metav1.GetOptions{})
			if err != nil || rq.Spec.Hard.Cpu().String() != "4" || rq.Spec.Hard.Pods().String() != "20" {
				return fmt.Errorf("quota on c1: %v %v", rq.Spec.Hard, err)
			}
			return nil
		})
		c1.setQuotaStatus(t, "web", map[string]string{"cpu": "1", "memory": "1Gi", "pods": "3"})
		wantSums("map[cpu:4 memory:4Gi pods:20]", "map[cpu:1 memory:1Gi pods:3]")
		e.waitBinding(t, "team-a", "c1", "web", phase(projectv1.BindingPhase_BINDING_PHASE_AVAILABLE, ""))
		// A quota edited by hand is put back.
		rq, err := c1.kube.Client.CoreV1().ResourceQuotas("web").Get(ctx, namespacebinding.QuotaName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rq.Spec.Hard[corev1.ResourceCPU] = resource.MustParse("100")
		if _, err := c1.kube.Client.CoreV1().ResourceQuotas("web").Update(ctx, rq, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, converge, func() error {
			rq, err := c1.kube.Client.CoreV1().ResourceQuotas("web").Get(ctx, namespacebinding.QuotaName, metav1.GetOptions{})
			if err != nil || rq.Spec.Hard.Cpu().String() != "4" {
				return fmt.Errorf("quota on c1 after a hand edit: %v %v", rq.Spec.Hard, err)
			}
			return nil
		})
	})

	t.Run("namespace deleted by hand comes back", func(t *testing.T) {
		if err := c2.kube.Client.CoreV1().Namespaces().Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		c2.finalize(t, "web")
		testkit.Eventually(t, converge, func() error {
			ns, ok := c2.namespace(t, "web")
			if !ok || ns.DeletionTimestamp != nil || ns.Labels[namespacebinding.ProjectLabel] != "team-b" {
				return fmt.Errorf("namespace web on c2: %v", ns)
			}
			return nil
		})
		e.waitBinding(t, "team-b", "c2", "web", phase(projectv1.BindingPhase_BINDING_PHASE_AVAILABLE, ""))
	})

	t.Run("unbind keeps the namespace by default", func(t *testing.T) {
		if _, err := e.client.UnbindNamespace(ctx, connect.NewRequest(&projectv1.UnbindNamespaceRequest{Project: "team-a", Cluster: "c1", Namespace: "web"})); err != nil {
			t.Fatal(err)
		}
		e.waitBinding(t, "team-a", "c1", "web", gone)
		ns, ok := c1.namespace(t, "web")
		if !ok || ns.DeletionTimestamp != nil {
			t.Fatalf("namespace web on c1 after unbind: %v", ns)
		}
		if _, labelled := ns.Labels[namespacebinding.ProjectLabel]; labelled {
			t.Fatalf("namespace web on c1 still labelled: %v", ns.Labels)
		}
		if _, err := c1.kube.Client.CoreV1().ResourceQuotas("web").Get(ctx, namespacebinding.QuotaName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("quota after unbind: %v", err)
		}
		if st := e.project(t, "team-a").Status; len(st.Clusters) != 1 || len(st.Clusters[0].Hard) != 0 {
			t.Fatalf("team-a sums after unbind: %v", st.Clusters)
		}
	})

	t.Run("unbind with the delete policy deletes the namespace", func(t *testing.T) {
		if _, err := e.client.UnbindNamespace(ctx, connect.NewRequest(&projectv1.UnbindNamespaceRequest{Project: "team-b", Cluster: "c2", Namespace: "web",
			Policy: projectv1.UnbindPolicy_UNBIND_POLICY_DELETE})); err != nil {
			t.Fatal(err)
		}
		c2.finalize(t, "web")
		e.waitBinding(t, "team-b", "c2", "web", gone)
	})

	t.Run("agent offline while a binding is removed cleans up when it returns", func(t *testing.T) {
		e.mustBind(t, "team-b", "c2", "offline", nil)
		e.waitBinding(t, "team-b", "c2", "offline", phase(projectv1.BindingPhase_BINDING_PHASE_AVAILABLE, ""))
		c2.stop()
		if _, err := e.client.UnbindNamespace(ctx, connect.NewRequest(&projectv1.UnbindNamespaceRequest{Project: "team-b", Cluster: "c2", Namespace: "offline",
			Policy: projectv1.UnbindPolicy_UNBIND_POLICY_DELETE})); err != nil {
			t.Fatal(err)
		}
		e.waitBinding(t, "team-b", "c2", "offline", phase(projectv1.BindingPhase_BINDING_PHASE_TERMINATING, namespacebinding.ReasonClusterUnreachable))
		if ns, ok := c2.namespace(t, "offline"); !ok || ns.DeletionTimestamp != nil {
			t.Fatalf("namespace touched while the agent was away: %v", ns)
		}
		c2.startAgent(top, j)
		c2.finalize(t, "offline")
		e.waitBinding(t, "team-b", "c2", "offline", gone)
	})
}
