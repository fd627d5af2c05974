package namespacebinding_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fleetstream/fleetstream/pkg/events"
	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/protectedns"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
)

// natsDefaultMaxPayload is nats-server's own default max_payload.
const natsDefaultMaxPayload = 1 << 20

// largeInventoryCount is how many namespaces TestIntegrationLargeInventory creates
// (FLEETSTREAM_LARGE_INVENTORY overrides it).
func largeInventoryCount(t *testing.T) int {
	if v := os.Getenv("FLEETSTREAM_LARGE_INVENTORY"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("FLEETSTREAM_LARGE_INVENTORY=%q: %v", v, err)
		}
		return n
	}
	return 30_000
}

// forEach runs do for 0…n-1 on 32 workers and returns the first error.
func forEach(n int, do func(i int) error) error {
	const workers = 32
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	next := make(chan int)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := do(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

func largeName(i int) string { return fmt.Sprintf("tenant-%05d", i) }

// TestIntegrationLargeInventory is issue 14: a member cluster with 30,000 namespaces, whose
// inventory is far over nats-server's default max payload of 1 MB, reports them all in chunks,
// and cluster-import (GetCluster, the namespace count of ListClusters) and namespace-binding
// (ListIdleNamespaces) both see every one of them; deleted namespaces then leave both views.
func TestIntegrationLargeInventory(t *testing.T) {
	if testing.Short() {
		t.Skip("creates 30,000 namespaces")
	}
	count := largeInventoryCount(t)
	ctx := testkit.Context(t, 8*time.Minute)
	j := testkit.StartJetStreamMaxPayload(t, natsDefaultMaxPayload)
	if got := j.Conn.MaxPayload(); got != natsDefaultMaxPayload {
		t.Fatalf("max payload %d", got)
	}
	e := startHub(t, j, namespacebinding.Config{}, clusterimport.Config{})
	m := &member{name: "big", kube: testkit.StartKube(t)}
	e.register(t, m.name)

	// Create the namespaces before the agent starts, on a client without client-side rate
	// limiting, 32 at a time.
	cfg := rest.CopyConfig(m.kube.Config)
	cfg.QPS, cfg.Burst = 10_000, 10_000
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := forEach(count, func(i int) error {
		_, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: largeName(i),
			Labels: map[string]string{"team": fmt.Sprintf("team-%03d", i%500)}}}, metav1.CreateOptions{})
		return err
	}); err != nil {
		t.Fatalf("create namespaces: %v", err)
	}
	t.Logf("created %d namespaces in %s (%.0f/s)", count, time.Since(start).Round(time.Millisecond), float64(count)/time.Since(start).Seconds())

	list, err := kc.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	whole := &agentv1.NamespaceInventory{ClusterName: m.name}
	for _, ns := range list.Items {
		want[ns.Name] = true
		whole.Namespaces = append(whole.Namespaces, &agentv1.Namespace{Name: ns.Name, Labels: ns.Labels, Phase: string(ns.Status.Phase)})
	}
	if len(want) < count {
		t.Fatalf("%d namespaces listed", len(want))
	}
	// Idle: all but the protected ones (default, kube-*), which no project may claim.
	wantIdle := map[string]bool{}
	var protected protectedns.List
	for ns := range want {
		if _, ok := protected.Match(ns); !ok {
			wantIdle[ns] = true
		}
	}
	if size := proto.Size(whole); size <= natsDefaultMaxPayload {
		t.Fatalf("the whole inventory is %d bytes: it would fit in one message; raise the count", size)
	} else {
		t.Logf("the whole inventory would be one %d-byte message", size)
	}

	start = time.Now()
	m.startAgent(t, j)

	// views checks that cluster-import and namespace-binding both show exactly want.
	views := func() error {
		got, err := e.clusters.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: m.name, IncludeInventory: true}))
		if err != nil {
			return err
		}
		if err := sameNames("cluster-import GetCluster", got.Msg.GetInventory().GetNamespaces(), (*clusterv1.InventoryNamespace).GetName, want); err != nil {
			return err
		}
		if n := got.Msg.GetCluster().GetStatus().GetNamespaceCount(); int(n) != len(want) {
			return fmt.Errorf("cluster-import namespace count %d, want %d", n, len(want))
		}
		idle, err := e.client.ListIdleNamespaces(ctx, connect.NewRequest(&projectv1.ListIdleNamespacesRequest{Cluster: m.name}))
		if err != nil {
			return err
		}
		return sameNames("namespace-binding ListIdleNamespaces", idle.Msg.GetNamespaces(), (*projectv1.IdleNamespace).GetName, wantIdle)
	}
	testkit.Eventually(t, 3*time.Minute, views)
	t.Logf("agent start to every namespace in both views: %s", time.Since(start).Round(time.Millisecond))

	chunk0, stored0 := lastInventoryChunk(ctx, t, j, m.name, 0)
	n := chunk0.GetChunks()
	if n < 2 {
		t.Fatalf("inventory of %d namespaces published as %d chunk(s)", len(want), n)
	}
	var (
		largest int
		first   time.Time
	)
	for i := range n {
		c, stored := lastInventoryChunk(ctx, t, j, m.name, i)
		if i == n-1 && c.GetGeneration() == chunk0.GetGeneration() {
			first = stored // the agent publishes the highest index first, chunk 0 last
		}
		if c.GetChunks() != n || c.GetChunk() != i {
			t.Errorf("chunk %d: index %d of %d chunks, chunk 0 of %d", i, c.GetChunk(), c.GetChunks(), n)
		}
		largest = max(largest, proto.Size(c))
	}
	t.Logf("published as %d chunks, the largest %d bytes", n, largest)
	if !first.IsZero() {
		t.Logf("the stream stored the %d chunks of one publish within %s", n, stored0.Sub(first).Round(time.Millisecond))
	}

	// Delete a tenth (finalized at once, as the namespace controller would once they are
	// empty): both views follow.
	start = time.Now()
	deleted := count / 10
	if err := forEach(deleted, func(i int) error {
		name := largeName(i * 10)
		if err := kc.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			return err
		}
		ns, err := kc.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ns.Spec.Finalizers = nil
		_, err = kc.CoreV1().Namespaces().Finalize(ctx, ns, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatalf("delete namespaces: %v", err)
	}
	for i := range deleted {
		delete(want, largeName(i*10))
		delete(wantIdle, largeName(i*10))
	}
	t.Logf("deleted %d namespaces in %s", deleted, time.Since(start).Round(time.Millisecond))
	start = time.Now()
	testkit.Eventually(t, 2*time.Minute, views)
	t.Logf("deletions to both views: %s", time.Since(start).Round(time.Millisecond))
}

// sameNames compares the names of got with want.
func sameNames[T any](what string, got []T, name func(T) string, want map[string]bool) error {
	seen := make(map[string]bool, len(got))
	for _, x := range got {
		n := name(x)
		if seen[n] {
			return fmt.Errorf("%s: %s twice", what, n)
		}
		seen[n] = true
		if !want[n] {
			return fmt.Errorf("%s: %s, not expected (%d of %d)", what, n, len(got), len(want))
		}
	}
	if len(seen) != len(want) {
		return fmt.Errorf("%s: %d namespaces, want %d", what, len(seen), len(want))
	}
	return nil
}

// lastInventoryChunk returns the latest message of chunk i of cluster's inventory.
// It also returns when the stream stored it.
func lastInventoryChunk(ctx context.Context, t *testing.T, j *testkit.JetStream, cluster string, i uint32) (*agentv1.NamespaceInventory, time.Time) {
	t.Helper()
	s, err := j.JS.Stream(ctx, subjects.AgentStreamName)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, subjects.AgentInventoryChunk(cluster, i))
	if err != nil {
		t.Fatalf("chunk %d: %v", i, err)
	}
	if len(m.Data) > natsDefaultMaxPayload {
		t.Errorf("chunk %d: %d bytes", i, len(m.Data))
	}
	ev, err := events.Decode(m.Data)
	if err != nil {
		t.Fatal(err)
	}
	inv, ok := ev.Payload.(*agentv1.NamespaceInventory)
	if !ok {
		t.Fatalf("chunk %d: %T", i, ev.Payload)
	}
	return inv, m.Time
}
