package fleetd_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	inventoryv1alpha1 "github.com/fleetstream/fleetstream/services/kube-bridge/inventory/v1alpha1"
	"github.com/fleetstream/fleetstream/services/kube-bridge/kubebridge"
)

// runningBridge is a kube bridge the test runs (and stops) itself.
type runningBridge struct {
	*kubebridge.Bridge
	stop func()
	done chan error
}

// Two bridges on one hub: only the holder of the hub's lease writes; the other mirrors the same
// state, applies nothing, and takes over as soon as the first stops, converging the hub on what
// changed meanwhile.
func TestKubeBridgeLeaseOneWriterPerHub(t *testing.T) {
	hub := testkit.StartKube(t)
	kubeconfig := leastPrivilegeKubeconfig(t, hub)
	inst, client := startFleetd(t)
	ctx := testkit.Context(t, 3*time.Minute)
	dyn, err := dynamic.NewForConfig(hub.Config)
	if err != nil {
		t.Fatal(err)
	}
	profiles := dyn.Resource(inventoryv1alpha1.GroupVersionResource).Namespace(bridgeNamespace)
	start := func(name string) *runningBridge {
		t.Helper()
		rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		b, err := kubebridge.New(kubebridge.Config{Kubeconfig: kubeconfig, Namespace: bridgeNamespace, Resync: time.Minute}, inst.JS, rc, testkit.Logger(t).Named(name))
		if err != nil {
			t.Fatal(err)
		}
		bctx, cancel := context.WithCancel(ctx)
		rb := &runningBridge{Bridge: b, stop: cancel, done: make(chan error, 1)}
		go func() { rb.done <- b.Run(bctx) }()
		t.Cleanup(func() { cancel(); <-rb.done })
		select {
		case <-b.Ready():
		case <-time.After(60 * time.Second):
			t.Fatalf("bridge %s not ready", name)
		}
		return rb
	}
	profileExists := func(name string, want bool) func() error {
		return func() error {
			_, err := profiles.Get(ctx, name, metav1.GetOptions{})
			switch {
			case want && err != nil:
				return err
			case !want && err == nil:
				return fmt.Errorf("profile %s still there", name)
			case !want && !apierrors.IsNotFound(err):
				return err
			}
			return nil
		}
	}

	a := start("a")
	testkit.Eventually(t, 30*time.Second, func() error {
		if !a.Leading() {
			return fmt.Errorf("the first bridge does not hold the hub's lease")
		}
		return nil
	})
	b := start("b")

	// a writes; b, ready on the same views and hub, stands by and applies nothing, through a
	// registration and a profile deleted by hand (which a puts back).
	if _, err := client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c1"})); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, profileExists("c1", true))
	if err := profiles.Delete(ctx, "c1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, profileExists("c1", true))
	time.Sleep(time.Second) // b had every chance to act on the same events
	if b.Leading() || b.Applies() != 0 {
		t.Fatalf("the standby bridge leads (%v) or applied %d times while the first held the lease", b.Leading(), b.Applies())
	}
	if !a.Leading() || a.Applies() == 0 {
		t.Fatalf("the first bridge leads %v, applied %d times", a.Leading(), a.Applies())
	}

	// a stops (releasing the lease); b takes over and converges what changed meanwhile.
	a.stop()
	if err := <-a.done; err != nil {
		t.Fatalf("first bridge: %v", err)
	}
	a.done <- nil // for the cleanup
	if _, err := client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c2"})); err != nil {
		t.Fatal(err)
	}
	if _, err := client.DeregisterCluster(ctx, connect.NewRequest(&clusterv1.DeregisterClusterRequest{Name: "c1"})); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, func() error {
		if !b.Leading() {
			return fmt.Errorf("the standby bridge has not taken the lease over")
		}
		return nil
	})
	testkit.Eventually(t, 30*time.Second, profileExists("c2", true))
	testkit.Eventually(t, 30*time.Second, profileExists("c1", false))
	if b.Applies() == 0 {
		t.Fatal("the bridge that took over applied nothing")
	}
}
