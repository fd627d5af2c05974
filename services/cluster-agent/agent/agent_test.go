package agent_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetstream/fleetstream/pkg/events"
	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	"github.com/fleetstream/fleetstream/pkg/natsembed"
	"github.com/fleetstream/fleetstream/pkg/nsinventory"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/topology"
	"github.com/fleetstream/fleetstream/services/cluster-agent/agent"
)

const cluster = "member-1"

// ensureStream creates FLEET_AGENT the way cluster-import will.
func ensureStream(t *testing.T, ctx context.Context, js jetstream.JetStream) {
	t.Helper()
	if err := topology.Ensure(ctx, js, 1, topology.Topology{Streams: []jetstream.StreamConfig{subjects.AgentStream()}}); err != nil {
		t.Fatalf("ensure agent stream: %v", err)
	}
}

// startAgent runs an agent until the test ends and fails the test if Run returns an error.
func startAgent(t *testing.T, cfg agent.Config, js jetstream.JetStream, k *testkit.Kube) *agent.Agent {
	t.Helper()
	return startAgentLogging(t, cfg, js, k, testkit.Logger(t))
}

// startAgentLogging is startAgent with the agent logging to log.
func startAgentLogging(t *testing.T, cfg agent.Config, js jetstream.JetStream, k *testkit.Kube, log *zap.Logger) *agent.Agent {
	t.Helper()
	cfg.ClusterName = cluster
	a, err := agent.New(cfg, js, k.Client, log)
	if err != nil {
		t.Fatalf("new agent: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("agent run: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("agent did not stop")
		}
	})
	return a
}

// report is the latest message on one agent subject, decoded.
type report[T any] struct {
	seq     uint64
	env     *events.Event
	payload T
}

func latest[T any](ctx context.Context, js jetstream.JetStream, subject string) (report[T], error) {
	var r report[T]
	s, err := js.Stream(ctx, subjects.AgentStreamName)
	if err != nil {
		return r, err
	}
	m, err := s.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		return r, fmt.Errorf("last on %s: %w", subject, err)
	}
	ev, err := events.Decode(m.Data)
	if err != nil {
		return r, err
	}
	p, ok := ev.Payload.(T)
	if !ok {
		return r, fmt.Errorf("payload is %T", ev.Payload)
	}
	return report[T]{seq: m.Sequence, env: ev, payload: p}, nil
}

// heartbeatWatches hold, per test connection, the heartbeats received on core NATS: they are
// not stored (subjects.LivePrefix), so the latest is what a subscription last saw, and its seq
// counts them.
var heartbeatWatches sync.Map // *nats.Conn -> *heartbeatWatch

type heartbeatWatch struct {
	mu    sync.Mutex
	n     uint64
	last  *agentv1.Heartbeat
	first chan struct{}
}

// latestHeartbeat returns the last heartbeat of the agent of cluster received on js's
// connection, subscribing on the first call and waiting (up to 10 s) for one.
func latestHeartbeat(ctx context.Context, js jetstream.JetStream) (report[*agentv1.Heartbeat], error) {
	nc := js.Conn()
	v, loaded := heartbeatWatches.LoadOrStore(nc, &heartbeatWatch{first: make(chan struct{})})
	w := v.(*heartbeatWatch)
	if !loaded {
		if _, err := nc.Subscribe(subjects.AgentLiveHeartbeat(cluster), func(m *nats.Msg) {
			hb := &agentv1.Heartbeat{}
			if proto.Unmarshal(m.Data, hb) != nil {
				return
			}
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.n++; w.n == 1 {
				close(w.first)
			}
			w.last = hb
		}); err != nil {
			return report[*agentv1.Heartbeat]{}, err
		}
	}
	select {
	case <-w.first:
	case <-ctx.Done():
		return report[*agentv1.Heartbeat]{}, ctx.Err()
	case <-time.After(10 * time.Second):
		return report[*agentv1.Heartbeat]{}, errors.New("no heartbeat received")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return report[*agentv1.Heartbeat]{seq: w.n, payload: w.last}, nil
}

func latestInventory(ctx context.Context, js jetstream.JetStream) (report[*agentv1.NamespaceInventory], error) {
	return latest[*agentv1.NamespaceInventory](ctx, js, subjects.AgentInventory(cluster))
}

func namespaces(inv *agentv1.NamespaceInventory) map[string]*agentv1.Namespace {
	m := make(map[string]*agentv1.Namespace, len(inv.GetNamespaces()))
	for _, ns := range inv.GetNamespaces() {
		m[ns.GetName()] = ns
	}
	return m
}

func TestHeartbeat(t *testing.T) {
	t.Parallel()
	j, k := testkit.StartJetStream(t), testkit.StartKube(t)
	ctx := testkit.Context(t, 2*time.Minute)
	ensureStream(t, ctx, j.JS)
	want, err := k.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("server version: %v", err)
	}

	a := startAgent(t, agent.Config{HeartbeatInterval: 100 * time.Millisecond, AgentVersion: "v9.9.9-test"}, j.JS, k)

	var first report[*agentv1.Heartbeat]
	testkit.Eventually(t, 10*time.Second, func() error {
		first, err = latestHeartbeat(ctx, j.JS)
		return err
	})
	hb := first.payload
	checks := []struct{ name, got, want string }{
		{"cluster name", hb.GetClusterName(), cluster},
		{"agent version", hb.GetAgentVersion(), "v9.9.9-test"},
		{"kubernetes version", hb.GetKubernetesVersion(), want.GitVersion},
		{"session id", hb.GetSessionId(), a.SessionID()},
	}
	for _, c := range checks {
		if c.got != c.want || c.want == "" {
			t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
		}
	}
	if age := time.Since(hb.GetTime().AsTime()); age < 0 || age > time.Minute {
		t.Errorf("heartbeat time is %s old", age)
	}

	// It keeps beating, in the same session.
	testkit.Eventually(t, 10*time.Second, func() error {
		next, err := latestHeartbeat(ctx, j.JS)
		if err != nil {
			return err
		}
		if next.seq <= first.seq {
			return fmt.Errorf("no heartbeat after sequence %d", first.seq)
		}
		if next.payload.GetSessionId() != hb.GetSessionId() {
			return fmt.Errorf("session changed from %s to %s", hb.GetSessionId(), next.payload.GetSessionId())
		}
		return nil
	})
}

func TestInventory(t *testing.T) {
	t.Parallel()
	j, k := testkit.StartJetStream(t), testkit.StartKube(t)
	ctx := testkit.Context(t, 2*time.Minute)
	ensureStream(t, ctx, j.JS)
	nsClient := k.Client.CoreV1().Namespaces()

	startAgent(t, agent.Config{InventoryDebounce: 50 * time.Millisecond}, j.JS, k)

	steps := []struct {
		name string
		do   func() error
		// want checks the namespaces of the latest inventory.
		want func(map[string]*agentv1.Namespace) error
	}{
		{
			name: "pre-existing namespaces",
			want: func(got map[string]*agentv1.Namespace) error {
				for _, name := range []string{"default", "kube-system", "kube-public", "kube-node-lease"} {
					if got[name].GetPhase() != string(corev1.NamespaceActive) {
						return fmt.Errorf("%s: %v, want Active", name, got[name])
					}
				}
				return nil
			},
		},
		{
			name: "created",
			do: func() error {
				_, err := nsClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Labels: map[string]string{"team": "a"}}}, metav1.CreateOptions{})
				return err
			},
			want: wantNamespace("team-a", corev1.NamespaceActive, map[string]string{"team": "a", corev1.LabelMetadataName: "team-a"}),
		},
		{
			name: "relabelled",
			do: func() error {
				ns, err := nsClient.Get(ctx, "team-a", metav1.GetOptions{})
				if err != nil {
					return err
				}
				ns.Labels["team"] = "b"
				_, err = nsClient.Update(ctx, ns, metav1.UpdateOptions{})
				return err
			},
			want: wantNamespace("team-a", corev1.NamespaceActive, map[string]string{"team": "b", corev1.LabelMetadataName: "team-a"}),
		},
		{
			// Without a controller manager a deleted namespace stays Terminating until its
			// finalizer is removed, as in a real cluster whose namespace still holds objects.
			name: "terminating",
			do:   func() error { return nsClient.Delete(ctx, "team-a", metav1.DeleteOptions{}) },
			want: wantNamespace("team-a", corev1.NamespaceTerminating, map[string]string{"team": "b", corev1.LabelMetadataName: "team-a"}),
		},
		{
			name: "deleted",
			do: func() error {
				ns, err := nsClient.Get(ctx, "team-a", metav1.GetOptions{})
				if err != nil {
					return err
				}
				ns.Spec.Finalizers = nil
				_, err = nsClient.Finalize(ctx, ns, metav1.UpdateOptions{})
				return err
			},
			want: func(got map[string]*agentv1.Namespace) error {
				if ns, ok := got["team-a"]; ok {
					return fmt.Errorf("team-a still reported: %v", ns)
				}
				if _, ok := got["default"]; !ok {
					return errors.New("default missing")
				}
				return nil
			},
		},
	}
	for _, step := range steps {
		if step.do != nil {
			if err := step.do(); err != nil {
				t.Fatalf("%s: %v", step.name, err)
			}
		}
		testkit.Eventually(t, 15*time.Second, func() error {
			r, err := latestInventory(ctx, j.JS)
			if err != nil {
				return err
			}
			if r.payload.GetClusterName() != cluster {
				return fmt.Errorf("cluster name %q", r.payload.GetClusterName())
			}
			if err := step.want(namespaces(r.payload)); err != nil {
				return fmt.Errorf("%s: %w", step.name, err)
			}
			return nil
		})
	}
}

func wantNamespace(name string, phase corev1.NamespacePhase, labels map[string]string) func(map[string]*agentv1.Namespace) error {
	return func(got map[string]*agentv1.Namespace) error {
		ns, ok := got[name]
		if !ok {
			return fmt.Errorf("%s not reported", name)
		}
		if ns.GetPhase() != string(phase) || !maps.Equal(ns.GetLabels(), labels) {
			return fmt.Errorf("%s: phase %s labels %v, want %s %v", name, ns.GetPhase(), ns.GetLabels(), phase, labels)
		}
		return nil
	}
}

// TestInventoryDebounce checks that a burst of namespace changes becomes a few reports, not one
// per change.
func TestInventoryDebounce(t *testing.T) {
	t.Parallel()
	j, k := testkit.StartJetStream(t), testkit.StartKube(t)
	ctx := testkit.Context(t, 2*time.Minute)
	ensureStream(t, ctx, j.JS)
	const burst = 30
	debounce := time.Second

	startAgent(t, agent.Config{InventoryDebounce: debounce}, j.JS, k)
	testkit.Eventually(t, 15*time.Second, func() error {
		_, err := latestInventory(ctx, j.JS)
		return err
	})

	var reports atomic.Int64
	sub, err := j.Conn.Subscribe(subjects.AgentInventory(cluster), func(*nats.Msg) { reports.Add(1) })
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := j.Conn.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}

	start := time.Now()
	for i := range burst {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("burst-%02d", i)}}
		if _, err := k.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %s: %v", ns.Name, err)
		}
	}
	elapsed := time.Since(start)
	testkit.Eventually(t, 15*time.Second, func() error {
		r, err := latestInventory(ctx, j.JS)
		if err != nil {
			return err
		}
		if n := len(namespaces(r.payload)); n < burst+4 {
			return fmt.Errorf("%d namespaces reported", n)
		}
		return nil
	})
	// Time is what is tested here: a report may trail the last change by one debounce window,
	// so the count is taken once one has passed.
	time.Sleep(2 * debounce)

	// At most one report per debounce window the burst spanned, plus one trailing.
	limit := int64(elapsed/debounce) + 2
	t.Logf("%d namespaces created in %s gave %d inventory reports", burst, elapsed, reports.Load())
	if got := reports.Load(); got > limit || got == 0 {
		t.Errorf("%d namespaces created in %s gave %d reports, want 1..%d", burst, elapsed, got, limit)
	}
}

// TestInventoryResync checks that the inventory is republished without changes.
func TestInventoryResync(t *testing.T) {
	t.Parallel()
	j, k := testkit.StartJetStream(t), testkit.StartKube(t)
	ctx := testkit.Context(t, 2*time.Minute)
	ensureStream(t, ctx, j.JS)

	startAgent(t, agent.Config{InventoryResync: 200 * time.Millisecond}, j.JS, k)
	var first report[*agentv1.NamespaceInventory]
	testkit.Eventually(t, 15*time.Second, func() (err error) {
		first, err = latestInventory(ctx, j.JS)
		return err
	})
	testkit.Eventually(t, 10*time.Second, func() error {
		r, err := latestInventory(ctx, j.JS)
		if err != nil {
			return err
		}
		if r.seq <= first.seq {
			return errors.New("not republished")
		}
		return nil
	})
}

// TestWaitsForStream starts the agent before cluster-import has created FLEET_AGENT: the agent
// must keep trying and report once the stream exists.
func TestWaitsForStream(t *testing.T) {
	t.Parallel()
	j, k := testkit.StartJetStream(t), testkit.StartKube(t)
	ctx := testkit.Context(t, 2*time.Minute)

	log, logs := testkit.ObservedLogger(t)
	startAgentLogging(t, agent.Config{HeartbeatInterval: 100 * time.Millisecond}, j.JS, k, log)
	// Reports really fail first, and are tried again. Heartbeats, on core NATS, need no
	// stream: the hub hears the agent meanwhile.
	testkit.Eventually(t, 30*time.Second, logs.Count("namespace inventory not published", 2))
	if _, err := latestHeartbeat(ctx, j.JS); err != nil {
		t.Fatalf("no heartbeat before the stream exists: %v", err)
	}
	if logs.Count("heartbeat not published", 1)() == nil {
		t.Fatal("heartbeats failed for want of the stream")
	}
	ensureStream(t, ctx, j.JS)

	testkit.Eventually(t, 30*time.Second, func() error {
		if _, err := latestHeartbeat(ctx, j.JS); err != nil {
			return err
		}
		_, err := latestInventory(ctx, j.JS)
		return err
	})
}

// TestSurvivesNATSOutage stops the NATS server under a running agent, changes the cluster
// meanwhile and starts the server again on the same port and store: the agent reconnects and
// reports the change.
func TestSurvivesNATSOutage(t *testing.T) {
	t.Parallel()
	j, k := testkit.StartJetStream(t), testkit.StartKube(t)
	ctx := testkit.Context(t, 2*time.Minute)
	ensureStream(t, ctx, j.JS)

	_, agentJS := j.Connect(t)
	log, logs := testkit.ObservedLogger(t)
	startAgentLogging(t, agent.Config{HeartbeatInterval: 100 * time.Millisecond}, agentJS, k, log)
	var before report[*agentv1.Heartbeat]
	testkit.Eventually(t, 15*time.Second, func() (err error) {
		before, err = latestHeartbeat(ctx, j.JS)
		return err
	})

	cfg := j.Server.Config()
	j.Server.Stop()
	if _, err := k.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "during-outage"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	// Heartbeats and the inventory with the new namespace fail meanwhile.
	testkit.Eventually(t, 30*time.Second, logs.Count("heartbeat not published", 1))
	testkit.Eventually(t, 30*time.Second, logs.Count("namespace inventory not published", 1))

	s, err := natsembed.Start(cfg)
	if err != nil {
		t.Fatalf("restart nats: %v", err)
	}
	t.Cleanup(s.Stop)

	testkit.Eventually(t, 60*time.Second, func() error {
		hb, err := latestHeartbeat(ctx, j.JS)
		if err != nil {
			return err
		}
		if hb.seq <= before.seq {
			return errors.New("no heartbeat after the outage")
		}
		if hb.payload.GetSessionId() != before.payload.GetSessionId() {
			return errors.New("agent restarted instead of reconnecting")
		}
		inv, err := latestInventory(ctx, j.JS)
		if err != nil {
			return err
		}
		if _, ok := namespaces(inv.payload)["during-outage"]; !ok {
			return errors.New("namespace created during the outage not reported")
		}
		return nil
	})
}

// An agent heartbeats as soon as its NATS connection is back, not an interval later: after an
// outage long enough for the hub to mark the cluster lost, that heartbeat is what marks it
// connected again.
func TestHeartbeatsOnReconnect(t *testing.T) {
	t.Parallel()
	j, k := testkit.StartJetStream(t), testkit.StartKube(t)
	ctx := testkit.Context(t, 2*time.Minute)
	ensureStream(t, ctx, j.JS)
	// Heartbeats are core NATS: a subscriber of the test would race the agent to resubscribe
	// after the restart and could miss the one heartbeat it waits for. A stream keeps them on
	// the server, which has it back before it takes connections.
	kept, err := j.JS.CreateStream(ctx, jetstream.StreamConfig{
		Name: "TEST_HEARTBEATS", Subjects: []string{subjects.AgentLiveHeartbeat(cluster)}, Storage: jetstream.FileStorage,
	})
	if err != nil {
		t.Fatal(err)
	}
	lastSeq := func() (uint64, error) {
		m, err := kept.GetLastMsgForSubject(ctx, subjects.AgentLiveHeartbeat(cluster))
		if err != nil {
			return 0, err
		}
		return m.Sequence, nil
	}

	agentNC, agentJS := j.Connect(t)
	// An interval no test waits out: every heartbeat after the first comes from the reconnect.
	startAgent(t, agent.Config{HeartbeatInterval: time.Hour}, agentJS, k)
	var before uint64
	testkit.Eventually(t, 15*time.Second, func() (err error) {
		before, err = lastSeq()
		return err
	})

	cfg := j.Server.Config()
	j.Server.Stop()
	testkit.Eventually(t, 30*time.Second, func() error {
		if agentNC.IsConnected() {
			return errors.New("agent still connected")
		}
		return nil
	})
	s, err := natsembed.Start(cfg)
	if err != nil {
		t.Fatalf("restart nats: %v", err)
	}
	t.Cleanup(s.Stop)

	testkit.Eventually(t, 30*time.Second, func() error {
		seq, err := lastSeq()
		if err != nil {
			return err
		}
		if seq <= before {
			return fmt.Errorf("no heartbeat since the reconnect (agent connection %s)", agentNC.Status())
		}
		return nil
	})
}

// An agent whose Kubernetes identity may not list what it watches still heartbeats: the hub
// must not see a live agent as dead because of its RBAC on the member cluster. The inventory
// waits for its cache instead of reporting an empty list.
func TestHeartbeatsWithoutInformerPermissions(t *testing.T) {
	t.Parallel()
	j, k := testkit.StartJetStream(t), testkit.StartKube(t)
	ctx := testkit.Context(t, 2*time.Minute)
	ensureStream(t, ctx, j.JS)
	a, err := agent.New(agent.Config{ClusterName: cluster, HeartbeatInterval: 100 * time.Millisecond}, j.JS, k.ClientAs(t, "nobody"), testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	testkit.Eventually(t, 10*time.Second, func() error {
		_, err := latestHeartbeat(ctx, j.JS)
		return err
	})
	if _, err := latestInventory(ctx, j.JS); err == nil {
		t.Fatal("an inventory was reported without a synced namespace cache")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("agent run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("agent did not stop")
	}
}

// TestInventoryChunks checks that an inventory over the chunk budget is published in chunks
// that each fit and hold every namespace once, that a change republishes only the chunk it
// touched, and that when the inventory shrinks to one message the chunks it no longer uses are
// emptied.
func TestInventoryChunks(t *testing.T) {
	t.Parallel()
	j, k := testkit.StartJetStream(t), testkit.StartKube(t)
	ctx := testkit.Context(t, 2*time.Minute)
	ensureStream(t, ctx, j.JS)
	const budget = 2000
	startAgent(t, agent.Config{InventoryDebounce: 50 * time.Millisecond, InventoryChunkBytes: budget}, j.JS, k)

	const count = 150
	nsClient := k.Client.CoreV1().Namespaces()
	for i := range count {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("chunky-%03d", i)}}
		if _, err := nsClient.Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %s: %v", ns.Name, err)
		}
	}

	// chunks returns the latest chunk 0 and every chunk of its generation's count.
	chunks := func() ([]*agentv1.NamespaceInventory, error) {
		r, err := latestInventory(ctx, j.JS)
		if err != nil {
			return nil, err
		}
		out := []*agentv1.NamespaceInventory{r.payload}
		for i := uint32(1); i < r.payload.GetChunks(); i++ {
			c, err := latest[*agentv1.NamespaceInventory](ctx, j.JS, subjects.AgentInventoryChunk(cluster, i))
			if err != nil {
				return nil, err
			}
			out = append(out, c.payload)
		}
		return out, nil
	}
	// want checks that cs hold exactly the namespaces the apiserver lists, each once.
	want := func(cs []*agentv1.NamespaceInventory) error {
		list, err := nsClient.List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		seen := map[string]int{}
		for _, c := range cs {
			for _, ns := range c.GetNamespaces() {
				seen[ns.GetName()]++
			}
		}
		for _, ns := range list.Items {
			if seen[ns.Name] != 1 {
				return fmt.Errorf("%s reported %d times", ns.Name, seen[ns.Name])
			}
		}
		if len(seen) != len(list.Items) {
			return fmt.Errorf("%d namespaces reported, %d exist", len(seen), len(list.Items))
		}
		return nil
	}

	var grown []*agentv1.NamespaceInventory
	testkit.Eventually(t, 30*time.Second, func() error {
		cs, err := chunks()
		if err != nil {
			return err
		}
		if len(cs) < 4 {
			return fmt.Errorf("%d chunks", len(cs))
		}
		// Chunks a change did not touch are not republished: generations may differ, the
		// count may not.
		for i, c := range cs {
			if c.GetChunk() != uint32(i) || c.GetChunks() != cs[0].GetChunks() || c.GetGeneration() == 0 {
				return fmt.Errorf("chunk %d: index %d of %d, generation %d; chunk 0 of %d", i, c.GetChunk(), c.GetChunks(), c.GetGeneration(), cs[0].GetChunks())
			}
		}
		if err := want(cs); err != nil {
			return err
		}
		grown = cs
		return nil
	})
	for _, c := range grown {
		if size := proto.Size(c); size > budget {
			t.Errorf("chunk %d: %d bytes, budget %d", c.GetChunk(), size, budget)
		}
	}
	t.Logf("%d namespaces in %d chunks", count+4, len(grown))

	// A relabelled namespace republishes its chunk only; the others keep their generation.
	const relabelled = "chunky-042"
	ns, err := nsClient.Get(ctx, relabelled, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Labels["team"] = "x"
	if _, err := nsClient.Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	home := nsinventory.Chunk(relabelled, uint32(len(grown)))
	testkit.Eventually(t, 30*time.Second, func() error {
		cs, err := chunks()
		if err != nil {
			return err
		}
		if len(cs) != len(grown) {
			return fmt.Errorf("%d chunks", len(cs))
		}
		for i, c := range cs {
			if uint32(i) == home {
				if namespaces(c)[relabelled].GetLabels()["team"] != "x" || c.GetGeneration() <= grown[i].GetGeneration() {
					return fmt.Errorf("chunk %d: %s %v, generation %d", i, relabelled, namespaces(c)[relabelled], c.GetGeneration())
				}
			} else if c.GetGeneration() != grown[i].GetGeneration() {
				return fmt.Errorf("chunk %d republished without a change", i)
			}
		}
		return want(cs)
	})

	// Down to 14 of them: one message again, and the other indices emptied.
	for i := range count - 14 {
		name := fmt.Sprintf("chunky-%03d", i)
		if err := nsClient.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete %s: %v", name, err)
		}
		ns, err := nsClient.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get %s: %v", name, err)
		}
		ns.Spec.Finalizers = nil
		if _, err := nsClient.Finalize(ctx, ns, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("finalize %s: %v", name, err)
		}
	}
	testkit.Eventually(t, 30*time.Second, func() error {
		cs, err := chunks()
		if err != nil {
			return err
		}
		if len(cs) != 1 {
			return fmt.Errorf("%d chunks", len(cs))
		}
		if err := want(cs); err != nil {
			return err
		}
		// This agent published more chunks before: each index it no longer uses was emptied,
		// with a count that leaves it out, as the inventory shrank (one step or several).
		for i := uint32(1); i < uint32(len(grown)); i++ {
			c, err := latest[*agentv1.NamespaceInventory](ctx, j.JS, subjects.AgentInventoryChunk(cluster, i))
			if err != nil {
				return err
			}
			if len(c.payload.GetNamespaces()) != 0 || c.payload.GetChunks() > i || c.payload.GetGeneration() <= grown[0].GetGeneration() {
				return fmt.Errorf("left-over chunk %d: %d namespaces, %d chunks, generation %d", i,
					len(c.payload.GetNamespaces()), c.payload.GetChunks(), c.payload.GetGeneration())
			}
		}
		return nil
	})
}
