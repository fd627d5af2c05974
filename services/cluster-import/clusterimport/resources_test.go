package clusterimport_test

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/events"
	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

// heartbeatWith publishes a heartbeat carrying res and returns its stream sequence.
func heartbeatWith(t *testing.T, js jetstream.JetStream, cluster, version string, res *agentv1.ClusterResources) uint64 {
	t.Helper()
	ctx := testkit.Context(t, 10*time.Second)
	seq, err := events.NewStore(js, "agent").Append(ctx, subjects.AgentHeartbeat(cluster), cluster, events.Any,
		&agentv1.Heartbeat{ClusterName: cluster, KubernetesVersion: version, Time: timestamppb.Now(), Resources: res})
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

// waitHandled waits until cluster-import's heartbeat consumer has handled (acked) everything up
// to stream sequence seq, retries included: whatever those heartbeats were going to append is
// appended then.
func waitHandled(t *testing.T, js jetstream.JetStream, seq uint64) {
	t.Helper()
	ctx := testkit.Context(t, 20*time.Second)
	testkit.Eventually(t, 15*time.Second, func() error {
		c, err := js.Consumer(ctx, subjects.AgentStreamName, "cluster-import-heartbeats")
		if err != nil {
			return err
		}
		info, err := c.Info(ctx)
		if err != nil {
			return err
		}
		// The ack floor, not what is pending: a message whose handler failed and is to be
		// retried (a NAK with a delay) is neither pending nor acked, and holds the floor.
		if info.AckFloor.Stream < seq || info.NumPending > 0 || info.NumAckPending > 0 {
			return fmt.Errorf("heartbeats not handled up to %d: acked up to %d, pending %d, unacked %d",
				seq, info.AckFloor.Stream, info.NumPending, info.NumAckPending)
		}
		return nil
	})
}

// viewEntry reads cluster name straight from bucket `clusters`, as other services' mirrors do.
func viewEntry(ctx context.Context, js jetstream.JetStream, name string) (*clusterv1.Cluster, error) {
	kv, err := js.KeyValue(ctx, subjects.ClustersBucket)
	if err != nil {
		return nil, err
	}
	e, err := kv.Get(ctx, keys.Encode(name))
	if err != nil {
		return nil, fmt.Errorf("view entry %s: %w", name, err)
	}
	c := &clusterv1.Cluster{}
	if err := proto.Unmarshal(e.Value(), c); err != nil {
		return nil, err
	}
	return c, nil
}

// clusterEvents counts the events of cluster name in FLEET_CLUSTER.
func clusterEvents(ctx context.Context, js jetstream.JetStream, name string) (uint64, error) {
	s, err := js.Stream(ctx, subjects.ClusterStream)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subjects.Cluster(name)))
	if err != nil {
		return 0, err
	}
	return info.State.Subjects[subjects.Cluster(name)], nil
}

func agentResources(nodes int32, allocCPU, allocMem, capCPU, capMem string) *agentv1.ClusterResources {
	return &agentv1.ClusterResources{
		Allocatable: map[string]string{"cpu": allocCPU, "memory": allocMem},
		Capacity:    map[string]string{"cpu": capCPU, "memory": capMem},
		NodeCount:   nodes,
	}
}

// wantFacts checks the view entry: resources as the placement scheduler reads them, and the
// claims (reported ones and the admin's).
func wantFacts(c *clusterv1.Cluster, alloc, capacity map[string]string, claims map[string]string) error {
	r := c.GetStatus().GetResources()
	if !maps.Equal(r.GetAllocatable(), alloc) || !maps.Equal(r.GetCapacity(), capacity) {
		return fmt.Errorf("resources %v, want allocatable %v capacity %v", r, alloc, capacity)
	}
	if r.GetReportTime() == nil {
		return fmt.Errorf("resources without report time")
	}
	if !maps.Equal(c.Claims, claims) {
		return fmt.Errorf("claims %v, want %v", c.Claims, claims)
	}
	return nil
}

func TestReportedFactsLandInViewOnlyWhenTheyChange(t *testing.T) {
	e := start(t, nil, clusterimport.Config{})
	ctx := testkit.Context(t, 60*time.Second)
	js := e.js.JS
	if _, err := e.client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{
		Name: "c1", Claims: map[string]string{"region": "eu"},
	})); err != nil {
		t.Fatal(err)
	}

	r1 := agentResources(3, "7800m", "30Gi", "8", "32Gi")
	steps := []struct {
		name       string
		beats      []*agentv1.ClusterResources // each sent as one heartbeat, in order
		version    string
		alloc, cap map[string]string
		claims     map[string]string
		// newEvents is how many events the step appends to the cluster.
		newEvents uint64
	}{
		{
			name: "first report", beats: []*agentv1.ClusterResources{r1}, version: "v1.34.4",
			alloc: map[string]string{"cpu": "7800m", "memory": "30Gi"}, cap: map[string]string{"cpu": "8", "memory": "32Gi"},
			claims:    map[string]string{"region": "eu", clusterimport.ClaimKubeVersion: "v1.34.4", clusterimport.ClaimNodes: "3"},
			newEvents: 2, // connected, resources
		},
		{
			name:  "the same facts again, in other notations: nothing appended",
			beats: []*agentv1.ClusterResources{r1, r1, agentResources(3, "7.8", "32212254720", "8000m", "32Gi"), r1}, version: "v1.34.4",
			alloc: map[string]string{"cpu": "7800m", "memory": "30Gi"}, cap: map[string]string{"cpu": "8", "memory": "32Gi"},
			claims: map[string]string{"region": "eu", clusterimport.ClaimKubeVersion: "v1.34.4", clusterimport.ClaimNodes: "3"},
		},
		{
			name: "heartbeats without resources (informer not synced) keep the last ones", beats: []*agentv1.ClusterResources{nil, nil}, version: "v1.34.4",
			alloc: map[string]string{"cpu": "7800m", "memory": "30Gi"}, cap: map[string]string{"cpu": "8", "memory": "32Gi"},
			claims: map[string]string{"region": "eu", clusterimport.ClaimKubeVersion: "v1.34.4", clusterimport.ClaimNodes: "3"},
		},
		{
			name: "a node goes NotReady", beats: []*agentv1.ClusterResources{agentResources(2, "5800m", "22Gi", "6", "24Gi")}, version: "v1.34.4",
			alloc: map[string]string{"cpu": "5800m", "memory": "22Gi"}, cap: map[string]string{"cpu": "6", "memory": "24Gi"},
			claims:    map[string]string{"region": "eu", clusterimport.ClaimKubeVersion: "v1.34.4", clusterimport.ClaimNodes: "2"},
			newEvents: 1,
		},
		{
			name: "garbage resources are ignored, the heartbeat still counts", version: "v1.34.4",
			beats: []*agentv1.ClusterResources{
				agentResources(2, "lots", "22Gi", "6", "24Gi"),
				{Allocatable: map[string]string{"nvidia.com/gpu": "8"}, NodeCount: 2},
				agentResources(-1, "1", "1Gi", "1", "1Gi"),
			},
			alloc: map[string]string{"cpu": "5800m", "memory": "22Gi"}, cap: map[string]string{"cpu": "6", "memory": "24Gi"},
			claims: map[string]string{"region": "eu", clusterimport.ClaimKubeVersion: "v1.34.4", clusterimport.ClaimNodes: "2"},
		},
		{
			name: "upgraded cluster", beats: []*agentv1.ClusterResources{agentResources(2, "5800m", "22Gi", "6", "24Gi")}, version: "v1.35.0",
			alloc: map[string]string{"cpu": "5800m", "memory": "22Gi"}, cap: map[string]string{"cpu": "6", "memory": "24Gi"},
			claims:    map[string]string{"region": "eu", clusterimport.ClaimKubeVersion: "v1.35.0", clusterimport.ClaimNodes: "2"},
			newEvents: 1, // connected with the new version
		},
	}
	before := uint64(1) // the registration
	for _, step := range steps {
		var last uint64
		for _, res := range step.beats {
			last = heartbeatWith(t, js, "c1", step.version, res)
		}
		waitHandled(t, js, last)
		n, err := clusterEvents(ctx, js, "c1")
		if err != nil {
			t.Fatal(err)
		}
		if n-before != step.newEvents {
			t.Fatalf("%s: %d events appended, want %d", step.name, n-before, step.newEvents)
		}
		before = n
		testkit.Eventually(t, 10*time.Second, func() error {
			c, err := viewEntry(ctx, js, "c1")
			if err != nil {
				return err
			}
			if err := wantFacts(c, step.alloc, step.cap, step.claims); err != nil {
				return fmt.Errorf("%s: %w", step.name, err)
			}
			return nil
		})
	}

	// The API shows the same facts as the view.
	res, err := e.client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "c1"}))
	if err != nil {
		t.Fatal(err)
	}
	if err := wantFacts(res.Msg.Cluster, map[string]string{"cpu": "5800m", "memory": "22Gi"}, map[string]string{"cpu": "6", "memory": "24Gi"},
		map[string]string{"region": "eu", clusterimport.ClaimKubeVersion: "v1.35.0", clusterimport.ClaimNodes: "2"}); err != nil {
		t.Fatal(err)
	}
	if got := res.Msg.Cluster.Status.Resources.NodeCount; got != 2 {
		t.Fatalf("node count %d", got)
	}
}

func TestReservedClaimsAreRefusedAndKept(t *testing.T) {
	e := start(t, nil, clusterimport.Config{})
	ctx := testkit.Context(t, 60*time.Second)
	register(t, e, "c1", nil)
	heartbeatWith(t, e.js.JS, "c1", "v1.34.4", agentResources(3, "3", "3Gi", "3", "3Gi"))
	reported := map[string]string{clusterimport.ClaimKubeVersion: "v1.34.4", clusterimport.ClaimNodes: "3"}
	testkit.Eventually(t, 10*time.Second, func() error {
		c, err := viewEntry(ctx, e.js.JS, "c1")
		if err != nil {
			return err
		}
		if !maps.Equal(c.Claims, reported) {
			return fmt.Errorf("claims %v", c.Claims)
		}
		return nil
	})

	update := func(claims map[string]string) (*clusterv1.Cluster, error) {
		res, err := e.client.UpdateCluster(ctx, connect.NewRequest(&clusterv1.UpdateClusterRequest{
			Name: "c1", Claims: claims, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"claims"}},
		}))
		if err != nil {
			return nil, err
		}
		return res.Msg.Cluster, nil
	}
	refused := []struct {
		name   string
		claims map[string]string
		field  string
	}{
		{"kube version", map[string]string{clusterimport.ClaimKubeVersion: "v0.0.1"}, `claims["kubeversion.fleetstream.io"]`},
		{"node count, beside a fine claim", map[string]string{"zone": "a", clusterimport.ClaimNodes: "100"}, `claims["nodes.fleetstream.io"]`},
		{"any name under the reserved suffix", map[string]string{"gpu.fleetstream.io": "yes"}, `claims["gpu.fleetstream.io"]`},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			_, err := update(tc.claims)
			if code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.field+":") {
				t.Fatalf("got %v, want InvalidArgument naming %s", err, tc.field)
			}
			// Registering with one is refused too.
			_, err = e.client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c2", Claims: tc.claims}))
			if code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.field+":") {
				t.Fatalf("register: got %v, want InvalidArgument naming %s", err, tc.field)
			}
		})
	}

	// Admins set, replace and clear their own claims; the reported ones stay throughout.
	for _, claims := range []map[string]string{
		{"region": "eu", "zone": "a"},
		{"region": "us", "fleetstream.io-team": "x"}, // only the suffix is reserved
		nil,
	} {
		c, err := update(claims)
		if err != nil {
			t.Fatalf("update claims to %v: %v", claims, err)
		}
		want := maps.Clone(reported)
		maps.Copy(want, claims)
		if !maps.Equal(c.Claims, want) {
			t.Fatalf("after update to %v: claims %v, want %v", claims, c.Claims, want)
		}
	}
	// A later report still lands beside the admin's claims.
	if _, err := update(map[string]string{"region": "eu"}); err != nil {
		t.Fatal(err)
	}
	heartbeatWith(t, e.js.JS, "c1", "v1.34.4", agentResources(4, "4", "4Gi", "4", "4Gi"))
	testkit.Eventually(t, 10*time.Second, func() error {
		c, err := viewEntry(ctx, e.js.JS, "c1")
		if err != nil {
			return err
		}
		want := map[string]string{"region": "eu", clusterimport.ClaimKubeVersion: "v1.34.4", clusterimport.ClaimNodes: "4"}
		if !maps.Equal(c.Claims, want) {
			return fmt.Errorf("claims %v, want %v", c.Claims, want)
		}
		return nil
	})
}
