package fleetd_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetstream/fleetstream/pkg/authz"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-agent/agent"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
)

const apiToken = "fleetd-test-token"

func startFleetd(t *testing.T, opts ...func(*fleetd.Config)) (*fleetd.Instance, clusterv1connect.ClusterServiceClient) {
	t.Helper()
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte(apiToken+",admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cfg := fleetd.Config{
		DataDir:       filepath.Join(dir, "data"),
		Server:        server.Config{Listen: "127.0.0.1:0", TokenFile: tokens},
		NATSListen:    "127.0.0.1:0",
		ClusterImport: clusterimport.Config{UnreachableAfter: 3 * time.Second},
		Authz:         authz.Config{PlatformAdmins: []string{"admin"}},
	}
	for _, o := range opts {
		o(&cfg)
	}
	inst, err := fleetd.Start(ctx, cfg, testkit.Logger(t))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); inst.Stop() })
	select {
	case <-inst.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("fleetd not ready")
	}
	client := clusterv1connect.NewClusterServiceClient(http.DefaultClient, "http://"+inst.Addr,
		connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("Authorization", "Bearer "+apiToken)
				return next(ctx, req)
			}
		})))
	return inst, client
}

func connectAgent(inst *fleetd.Instance, cluster, token string, errs chan<- error) (*nats.Conn, error) {
	return nats.Connect(inst.NATS.ClientURL(), nats.Token(token), nats.CustomInboxPrefix(natsauth.AgentInboxPrefix(cluster)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errs <- err:
			default:
			}
		}))
}

// agentRunner is an agent as startAgent runs it: agent.New's, or member.New's.
type agentRunner interface {
	Run(ctx context.Context) error
}

// runningAgent is an agent startAgent runs against fleetd.
type runningAgent struct {
	// JS is the agent's JetStream, on its own restricted NATS connection; NATSErrors holds the
	// first asynchronous error of that connection (a permission the agent lacks), if any.
	JS         jetstream.JetStream
	NATSErrors <-chan error
	nc         *nats.Conn
	stop       context.CancelFunc
	done       chan error
	once       sync.Once
	err        error
}

// startAgent connects cluster's agent to inst's NATS with its token, builds it with build on
// that connection's JetStream and runs it until Stop, or the test's end.
func startAgent(t *testing.T, ctx context.Context, inst *fleetd.Instance, cluster, token string, build func(js jetstream.JetStream) (agentRunner, error)) *runningAgent {
	t.Helper()
	errs := make(chan error, 1)
	nc, err := connectAgent(inst, cluster, token, errs)
	if err != nil {
		t.Fatalf("connect %s's agent: %v", cluster, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		t.Fatalf("%s's agent jetstream: %v", cluster, err)
	}
	a, err := build(js)
	if err != nil {
		nc.Close()
		t.Fatalf("%s's agent: %v", cluster, err)
	}
	actx, stop := context.WithCancel(ctx)
	r := &runningAgent{JS: js, NATSErrors: errs, nc: nc, stop: stop, done: make(chan error, 1)}
	go func() { r.done <- a.Run(actx) }()
	t.Cleanup(func() { _ = r.Stop() })
	return r
}

// Stop stops the agent, waits until it has stopped and closes its connection; it returns what
// the agent's Run returned.
func (r *runningAgent) Stop() error {
	r.once.Do(func() {
		r.stop()
		r.err = <-r.done
		r.nc.Close()
	})
	return r.err
}

// The first slice end to end: a cluster registered through the API, its agent connected to
// fleetd's NATS with the token it got, against a real kube-apiserver; the namespace inventory
// and the Kubernetes version arrive in the registry, and changes follow.
func TestAgentInventoryArrivesInRegistry(t *testing.T) {
	inst, client := startFleetd(t)
	kube := testkit.StartKube(t)
	ctx := testkit.Context(t, 120*time.Second)
	reg, err := client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c1", Labels: map[string]string{"env": "prod"}}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kube.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "web"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ag := startAgent(t, ctx, inst, "c1", reg.Msg.AgentToken, func(js jetstream.JetStream) (agentRunner, error) {
		return agent.New(agent.Config{ClusterName: "c1", HeartbeatInterval: 500 * time.Millisecond, InventoryDebounce: 100 * time.Millisecond}, js, kube.Client, testkit.Logger(t))
	})

	namespaces := func(want ...string) func() error {
		return func() error {
			res, err := client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "c1", IncludeInventory: true}))
			if err != nil {
				return err
			}
			c := res.Msg.Cluster
			if cond := clusterimport.Condition(c, clusterimport.ConditionAgentConnected); cond == nil || cond.Status != clusterv1.ConditionStatus_CONDITION_STATUS_TRUE {
				return fmt.Errorf("agent not connected: %v", c.Status)
			}
			if !strings.HasPrefix(c.Status.KubernetesVersion, "v1.34") {
				return fmt.Errorf("kubernetes version %q", c.Status.KubernetesVersion)
			}
			var got []string
			for _, ns := range res.Msg.GetInventory().GetNamespaces() {
				got = append(got, ns.Name)
			}
			for _, w := range want {
				if !slices.Contains(got, w) {
					return fmt.Errorf("inventory %v lacks %s", got, w)
				}
			}
			return nil
		}
	}
	testkit.Eventually(t, 60*time.Second, namespaces("default", "kube-system", "web"))
	if _, err := kube.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, namespaces("web", "shop"))

	// A Ready node reaches the registry through the agent's heartbeat, under the agent's own
	// NATS permissions: as resources and as reported claims.
	node, err := kube.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status = corev1.NodeStatus{
		Capacity:    corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("16Gi")},
		Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3500m"), corev1.ResourceMemory: resource.MustParse("15Gi")},
		Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"}},
	}
	if _, err := kube.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, func() error {
		res, err := client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "c1"}))
		if err != nil {
			return err
		}
		c := res.Msg.Cluster
		r := c.GetStatus().GetResources()
		if r.GetAllocatable()["cpu"] != "3500m" || r.GetAllocatable()["memory"] != "15Gi" || r.GetCapacity()["cpu"] != "4" || r.GetNodeCount() != 1 {
			return fmt.Errorf("resources %v", r)
		}
		if c.Claims[clusterimport.ClaimNodes] != "1" || !strings.HasPrefix(c.Claims[clusterimport.ClaimKubeVersion], "v1.34") {
			return fmt.Errorf("claims %v", c.Claims)
		}
		return nil
	})

	// The agent goes away: the cluster is tainted unreachable.
	_ = ag.Stop()
	testkit.Eventually(t, 30*time.Second, func() error {
		res, err := client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "c1"}))
		if err != nil {
			return err
		}
		for _, tn := range res.Msg.Cluster.Taints {
			if tn.Key == clusterimport.TaintUnreachable {
				return nil
			}
		}
		return errors.New("not tainted unreachable")
	})
}

// An agent token admits only its own cluster's subjects; anything else is refused.
func TestAgentsReachOnlyTheirOwnSubjects(t *testing.T) {
	inst, client := startFleetd(t)
	ctx := testkit.Context(t, 60*time.Second)
	reg1, err := client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c1"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c2"})); err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]string{"no token": "", "forged": "fsa_forged", "api token": apiToken} {
		if nc, err := nats.Connect(inst.NATS.ClientURL(), nats.Token(tok)); err == nil {
			nc.Close()
			t.Errorf("%s: connected", name)
		}
	}
	errs := make(chan error, 16)
	nc, err := connectAgent(inst, "c1", reg1.Msg.AgentToken, errs)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// Watch what reaches the agent subjects, with fleetd's own connection.
	seen := make(chan string, 16)
	sub, err := inst.Conn.Subscribe(subjects.AgentPrefix+".>", func(m *nats.Msg) { seen <- m.Subject })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	_ = inst.Conn.Flush()
	if err := nc.Publish(subjects.AgentHeartbeat("c2"), []byte("impersonation")); err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(subjects.ClusterPrefix+".c2", []byte("forged event")); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Subscribe(subjects.AgentPrefix+".>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(subjects.AgentHeartbeat("c1"), []byte("own")); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	select {
	case s := <-seen:
		if s != subjects.AgentHeartbeat("c1") {
			t.Fatalf("message on %s got through", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("own heartbeat did not arrive")
	}
	violations := 0
	deadline := time.After(5 * time.Second)
	for violations < 3 {
		select {
		case err := <-errs:
			if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				t.Fatalf("unexpected error %v", err)
			}
			violations++
		case <-deadline:
			t.Fatalf("%d permission violations reported, want 3", violations)
		}
	}
	select {
	case s := <-seen:
		t.Fatalf("message on %s got through", s)
	case <-time.After(200 * time.Millisecond):
	}
}
