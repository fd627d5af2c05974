package clusterimport_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/authz"
	"github.com/fleetstream/fleetstream/pkg/events"
	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	"github.com/fleetstream/fleetstream/pkg/nsinventory"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/topology"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

const testToken = "s3cret-test-token"

// viewerToken signs in bob, who is no platform admin.
const viewerToken = "s3cret-viewer-token"

type env struct {
	js     *testkit.JetStream
	svc    *clusterimport.Registry
	url    string
	client clusterv1connect.ClusterServiceClient
	stop   func()
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func start(t testing.TB, j *testkit.JetStream, cfg clusterimport.Config) *env {
	t.Helper()
	return startLogged(t, j, cfg, testkit.Logger(t))
}

// startLogged starts the service logging to log; without a keyring in cfg it gets a fresh one.
func startLogged(t testing.TB, j *testkit.JetStream, cfg clusterimport.Config, log *zap.Logger) *env {
	t.Helper()
	if j == nil {
		j = testkit.StartJetStream(t)
	}
	if cfg.Keyring == nil && !cfg.PlaintextCredentials {
		cfg.Keyring = newRing(t, "test-key")
	}
	srv, _ := testkit.TokenServer(t, j.JS, []string{"# test", testToken + ",alice", viewerToken + ",bob"}, authz.Config{PlatformAdmins: []string{"alice"}}, log)
	svc, err := clusterimport.New(context.Background(), j.JS, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	stopSvc := testkit.RunComponents(t, srv, svc)
	hs := testkit.Serve(t, srv)
	e := &env{js: j, svc: svc, url: hs.URL, client: clusterv1connect.NewClusterServiceClient(testkit.BearerClient(hs.Client(), testToken), hs.URL)}
	e.stop = func() { hs.Close(); stopSvc() }
	return e
}

func code(err error) connect.Code { return connect.CodeOf(err) }

func register(t testing.TB, e *env, name string, labels map[string]string) *clusterv1.RegisterClusterResponse {
	t.Helper()
	res, err := e.client.RegisterCluster(context.Background(), connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: name, Labels: labels}))
	if err != nil {
		t.Fatalf("register %s: %v", name, err)
	}
	return res.Msg
}

func TestRegisterGetListDeregister(t *testing.T) {
	e := start(t, nil, clusterimport.Config{})
	ctx := testkit.Context(t, 30*time.Second)
	reg := register(t, e, "c1", map[string]string{"env": "prod"})
	if reg.Cluster.Id == "" || reg.Cluster.Name != "c1" || reg.Cluster.Labels["env"] != "prod" || reg.AgentToken == "" {
		t.Fatalf("registered %v", reg)
	}
	// Not yet heard from: unreachable, so placements skip it.
	if !hasTaint(reg.Cluster, clusterimport.TaintUnreachable) {
		t.Fatalf("new cluster lacks the unreachable taint: %v", reg.Cluster.Taints)
	}
	register(t, e, "c2", map[string]string{"env": "dev"})
	got, err := e.client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "c1"}))
	if err != nil || got.Msg.Cluster.Id != reg.Cluster.Id {
		t.Fatalf("get: %v %v", got, err)
	}
	list, err := e.client.ListClusters(ctx, connect.NewRequest(&clusterv1.ListClustersRequest{LabelSelector: "env=prod"}))
	if err != nil || len(list.Msg.Clusters) != 1 || list.Msg.Clusters[0].Name != "c1" {
		t.Fatalf("list env=prod: %v %v", list, err)
	}
	if _, err := e.client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c1"})); code(err) != connect.CodeAlreadyExists {
		t.Fatalf("second register: %v", err)
	}
	if _, err := e.client.DeregisterCluster(ctx, connect.NewRequest(&clusterv1.DeregisterClusterRequest{Name: "c1"})); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "c1"})); code(err) != connect.CodeNotFound {
		t.Fatalf("get after deregister: %v", err)
	}
	// The name is free again, with a new id.
	again := register(t, e, "c1", nil)
	if again.Cluster.Id == reg.Cluster.Id {
		t.Fatal("re-registered cluster kept the old id")
	}
}

func TestConcurrentRegistrationsOfOneNameExactlyOneWins(t *testing.T) {
	e := start(t, nil, clusterimport.Config{})
	testkit.OneWins(t, 8, connect.CodeAlreadyExists, func(int) error {
		_, err := e.client.RegisterCluster(context.Background(), connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "race"}))
		return err
	})
}

func TestInvalidInputNamesTheField(t *testing.T) {
	e := start(t, nil, clusterimport.Config{})
	ctx := testkit.Context(t, 30*time.Second)
	cases := []struct {
		name  string
		req   *clusterv1.RegisterClusterRequest
		field string
	}{
		{"empty name", &clusterv1.RegisterClusterRequest{}, "name"},
		{"upper case name", &clusterv1.RegisterClusterRequest{Name: "Prod"}, "name"},
		{"dotted name", &clusterv1.RegisterClusterRequest{Name: "a.b"}, "name"},
		{"long name", &clusterv1.RegisterClusterRequest{Name: strings.Repeat("a", 64)}, "name"},
		{"bad label key", &clusterv1.RegisterClusterRequest{Name: "ok", Labels: map[string]string{"-bad": "x"}}, `labels["-bad"]`},
		{"bad label value", &clusterv1.RegisterClusterRequest{Name: "ok", Labels: map[string]string{"env": "has space"}}, `labels["env"]`},
		{"bad claim key", &clusterv1.RegisterClusterRequest{Name: "ok", Claims: map[string]string{"a b": "x"}}, `claims["a b"]`},
		{"taint without effect", &clusterv1.RegisterClusterRequest{Name: "ok", Taints: []*clusterv1.Taint{{Key: "gpu"}}}, "taints[0].effect"},
		{"reserved taint", &clusterv1.RegisterClusterRequest{Name: "ok", Taints: []*clusterv1.Taint{{Key: "fleetstream.io/unreachable", Effect: clusterv1.TaintEffect_TAINT_EFFECT_NO_SELECT}}}, "taints[0].key"},
		{"http server", &clusterv1.RegisterClusterRequest{Name: "ok", Credentials: &clusterv1.ConnectionCredentials{Server: "http://x", Token: "t"}}, "credentials.server"},
		{"garbage kubeconfig", &clusterv1.RegisterClusterRequest{Name: "ok", Credentials: &clusterv1.ConnectionCredentials{Kubeconfig: []byte("{{{")}}, "credentials.kubeconfig"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.client.RegisterCluster(ctx, connect.NewRequest(tc.req))
			if code(err) != connect.CodeInvalidArgument {
				t.Fatalf("got %v, want InvalidArgument", err)
			}
			if !strings.Contains(err.Error(), tc.field+":") {
				t.Fatalf("error %q does not name field %s", err, tc.field)
			}
		})
	}
	// Nothing half-written: none of the bad requests created anything.
	list, err := e.client.ListClusters(ctx, connect.NewRequest(&clusterv1.ListClustersRequest{}))
	if err != nil || len(list.Msg.Clusters) != 0 {
		t.Fatalf("after invalid requests: %v %v", list, err)
	}
	if _, err := e.client.ListClusters(ctx, connect.NewRequest(&clusterv1.ListClustersRequest{LabelSelector: "env in (("})); code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "label_selector") {
		t.Fatalf("bad selector: %v", err)
	}
	if _, err := e.client.UpdateCluster(ctx, connect.NewRequest(&clusterv1.UpdateClusterRequest{Name: "nope", UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels"}}})); code(err) != connect.CodeNotFound {
		t.Fatalf("update of unknown cluster: %v", err)
	}
}

func TestCallsWithoutValidTokenAreUnauthenticated(t *testing.T) {
	e := start(t, nil, clusterimport.Config{})
	ctx := testkit.Context(t, 30*time.Second)
	for name, tok := range map[string]string{"no token": "", "wrong token": "guess", "user name as token": "alice"} {
		c := clusterv1connect.NewClusterServiceClient(testkit.BearerClient(http.DefaultClient, tok), e.url)
		if _, err := c.ListClusters(ctx, connect.NewRequest(&clusterv1.ListClustersRequest{})); code(err) != connect.CodeUnauthenticated {
			t.Errorf("%s: list got %v", name, err)
		}
		if _, err := c.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "sneaky"})); code(err) != connect.CodeUnauthenticated {
			t.Errorf("%s: register got %v", name, err)
		}
		stream, err := c.WatchClusters(ctx, connect.NewRequest(&clusterv1.WatchClustersRequest{}))
		if err == nil {
			stream.Receive()
			err = stream.Err()
		}
		if code(err) != connect.CodeUnauthenticated {
			t.Errorf("%s: watch got %v", name, err)
		}
	}
	if _, err := e.client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "sneaky"})); code(err) != connect.CodeNotFound {
		t.Fatalf("unauthenticated register left something: %v", err)
	}
	// Health and metrics stay reachable for probes.
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		res, err := http.Get(e.url + p)
		if err != nil || res.StatusCode != 200 {
			t.Fatalf("%s: %v %v", p, res, err)
		}
		res.Body.Close()
	}
}

func TestUpdateWithStaleRevisionIsAbortedAndTaintsKeepTheirTime(t *testing.T) {
	e := start(t, nil, clusterimport.Config{})
	ctx := testkit.Context(t, 30*time.Second)
	reg := register(t, e, "c1", nil)
	upd := func(rev uint64, labels map[string]string, taints []*clusterv1.Taint) (*clusterv1.Cluster, error) {
		res, err := e.client.UpdateCluster(ctx, connect.NewRequest(&clusterv1.UpdateClusterRequest{
			Name: "c1", Labels: labels, Taints: taints, ExpectedRevision: rev,
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels", "taints"}},
		}))
		if err != nil {
			return nil, err
		}
		return res.Msg.Cluster, nil
	}
	gpu := func() []*clusterv1.Taint {
		return []*clusterv1.Taint{{Key: "gpu", Value: "none", Effect: clusterv1.TaintEffect_TAINT_EFFECT_PREFER_NO_SELECT}}
	}
	c, err := upd(reg.Cluster.Revision, map[string]string{"env": "prod"}, gpu())
	if err != nil {
		t.Fatal(err)
	}
	if c.Labels["env"] != "prod" || !hasTaint(c, "gpu") || !hasTaint(c, clusterimport.TaintUnreachable) {
		t.Fatalf("after update: %v", c)
	}
	if _, err := upd(reg.Cluster.Revision, map[string]string{"env": "dev"}, nil); code(err) != connect.CodeAborted {
		t.Fatalf("stale update: %v", err)
	}
	time.Sleep(10 * time.Millisecond) // a clock tick, so a new time added would differ
	c2, err := upd(0, map[string]string{"env": "dev"}, gpu())
	if err != nil {
		t.Fatal(err)
	}
	if taint(c2, "gpu").TimeAdded.AsTime() != taint(c, "gpu").TimeAdded.AsTime() {
		t.Fatal("re-sent taint got a new time added")
	}
}

func TestCredentialsAreNeverReturned(t *testing.T) {
	e := start(t, nil, clusterimport.Config{})
	ctx := testkit.Context(t, 30*time.Second)
	const secret = "very-secret-bearer"
	res, err := e.client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{
		Name: "c1", Credentials: &clusterv1.ConnectionCredentials{Server: "https://10.0.0.1:6443", Token: secret},
	}))
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "c1", IncludeInventory: true}))
	if err != nil {
		t.Fatal(err)
	}
	list, err := e.client.ListClusters(ctx, connect.NewRequest(&clusterv1.ListClustersRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []interface{ String() string }{res.Msg.Cluster, got.Msg, list.Msg} {
		if strings.Contains(m.String(), secret) {
			t.Fatalf("secret leaked: %s", m)
		}
	}
	if !got.Msg.Cluster.Status.CredentialsSet || !strings.HasPrefix(got.Msg.Cluster.Status.CredentialsFingerprint, "sha256:") {
		t.Fatalf("status %v", got.Msg.Cluster.Status)
	}
	// The event stream never carries them either.
	stream, err := e.js.JS.Stream(ctx, subjects.ClusterStream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := stream.GetLastMsgForSubject(ctx, subjects.Cluster("c1"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(m.Data), secret) {
		t.Fatal("secret in the event stream")
	}
	id, ok := e.svc.AgentIdentity(ctx, res.Msg.AgentToken)
	if !ok || id.ClusterName != "c1" {
		t.Fatalf("agent token not accepted: %v", id)
	}
	if _, ok := e.svc.AgentIdentity(ctx, "fsa_forged"); ok {
		t.Fatal("forged agent token accepted")
	}
	if _, err := e.client.DeregisterCluster(ctx, connect.NewRequest(&clusterv1.DeregisterClusterRequest{Name: "c1"})); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.svc.AgentIdentity(ctx, res.Msg.AgentToken); ok {
		t.Fatal("token of a deregistered cluster still accepted")
	}
}

func heartbeat(t *testing.T, js jetstream.JetStream, cluster, version string) {
	t.Helper()
	ctx := testkit.Context(t, 10*time.Second)
	if _, err := events.NewStore(js, "agent").Append(ctx, subjects.AgentHeartbeat(cluster), cluster, events.Any,
		&agentv1.Heartbeat{ClusterName: cluster, KubernetesVersion: version, Time: timestamppb.Now()}); err != nil {
		t.Fatal(err)
	}
}

// liveHeartbeat sends a heartbeat as agents do now: on core NATS, not stored.
func liveHeartbeat(t *testing.T, js jetstream.JetStream, cluster, version string) {
	t.Helper()
	data, err := proto.Marshal(&agentv1.Heartbeat{ClusterName: cluster, KubernetesVersion: version, Time: timestamppb.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if err := js.Conn().Publish(subjects.AgentLiveHeartbeat(cluster), data); err != nil {
		t.Fatal(err)
	}
}

// Liveness is the same whether heartbeats come on core NATS (agents now) or stored on
// FLEET_AGENT (agents before, during an upgrade).
func TestAgentLivenessTaintsAndUntaints(t *testing.T) {
	for _, tc := range []struct {
		name string
		beat func(t *testing.T, js jetstream.JetStream, cluster, version string)
	}{{"live", liveHeartbeat}, {"stored", heartbeat}} {
		t.Run(tc.name, func(t *testing.T) { testAgentLivenessTaintsAndUntaints(t, tc.beat) })
	}
}

func testAgentLivenessTaintsAndUntaints(t *testing.T, heartbeat func(t *testing.T, js jetstream.JetStream, cluster, version string)) {
	e := start(t, nil, clusterimport.Config{UnreachableAfter: 1500 * time.Millisecond, CheckInterval: 100 * time.Millisecond})
	ctx := testkit.Context(t, 60*time.Second)
	register(t, e, "c1", nil)
	get := func() *clusterv1.Cluster {
		res, err := e.client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "c1"}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg.Cluster
	}
	connected := func(want clusterv1.ConditionStatus, taint bool) func() error {
		return func() error {
			c := get()
			cond := clusterimport.Condition(c, clusterimport.ConditionAgentConnected)
			if cond == nil || cond.Status != want || hasTaint(c, clusterimport.TaintUnreachable) != taint {
				return fmt.Errorf("cluster %v", c)
			}
			return nil
		}
	}
	heartbeat(t, e.js.JS, "c1", "v1.34.4")
	testkit.Eventually(t, 10*time.Second, connected(clusterv1.ConditionStatus_CONDITION_STATUS_TRUE, false))
	if c := get(); c.Status.KubernetesVersion != "v1.34.4" || c.Status.LastSeen == nil {
		t.Fatalf("status %v", c.Status)
	}
	// Keep beating: stays connected past the timeout.
	for i := 0; i < 6; i++ {
		heartbeat(t, e.js.JS, "c1", "v1.34.4")
		time.Sleep(400 * time.Millisecond) // beats spread over more than the timeout: time is what is tested
	}
	if err := connected(clusterv1.ConditionStatus_CONDITION_STATUS_TRUE, false)(); err != nil {
		t.Fatalf("lost while beating: %v", err)
	}
	// Silence: tainted unreachable.
	testkit.Eventually(t, 10*time.Second, connected(clusterv1.ConditionStatus_CONDITION_STATUS_FALSE, true))
	// Back: untainted.
	heartbeat(t, e.js.JS, "c1", "v1.34.4")
	testkit.Eventually(t, 10*time.Second, connected(clusterv1.ConditionStatus_CONDITION_STATUS_TRUE, false))
}

func TestMalformedReportIsDeadLetteredAndServiceKeepsServing(t *testing.T) {
	e := start(t, nil, clusterimport.Config{})
	ctx := testkit.Context(t, 30*time.Second)
	register(t, e, "c1", nil)
	if err := e.js.JS.Conn().Publish(subjects.AgentLiveHeartbeat("c1"), []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.JS.Publish(ctx, subjects.AgentHeartbeat("c1"), []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.JS.Publish(ctx, subjects.AgentInventory("c1"), []byte("more garbage")); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		s, err := e.js.JS.Stream(ctx, topology.DeadLetterStreamName)
		if err != nil {
			return err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs != 2 {
			return fmt.Errorf("%d dead letters", info.State.Msgs)
		}
		return nil
	})
	register(t, e, "c2", nil)
	heartbeat(t, e.js.JS, "c1", "v1")
	testkit.Eventually(t, 10*time.Second, func() error {
		res, err := e.client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "c1"}))
		if err != nil {
			return err
		}
		if c := clusterimport.Condition(res.Msg.Cluster, clusterimport.ConditionAgentConnected); c.Status != clusterv1.ConditionStatus_CONDITION_STATUS_TRUE {
			return errors.New("not connected after good heartbeat")
		}
		return nil
	})
}

func TestInventoryArrivesAndRestartKeepsState(t *testing.T) {
	j := testkit.StartJetStream(t)
	e := start(t, j, clusterimport.Config{})
	ctx := testkit.Context(t, 30*time.Second)
	register(t, e, "c1", map[string]string{"a": "b"})
	if _, err := events.NewStore(j.JS, "agent").Append(ctx, subjects.AgentInventory("c1"), "c1", events.Any, &agentv1.NamespaceInventory{
		ClusterName: "c1", Namespaces: []*agentv1.Namespace{{Name: "default", Phase: "Active"}, {Name: "web", Phase: "Active"}},
	}); err != nil {
		t.Fatal(err)
	}
	var before *clusterv1.GetClusterResponse
	testkit.Eventually(t, 10*time.Second, func() error {
		res, err := e.client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "c1", IncludeInventory: true}))
		if err != nil {
			return err
		}
		if len(res.Msg.GetInventory().GetNamespaces()) != 2 || res.Msg.Cluster.Status.NamespaceCount != 2 {
			return fmt.Errorf("inventory %v", res.Msg.Inventory)
		}
		before = res.Msg
		return nil
	})
	e.stop()
	e2 := start(t, j, clusterimport.Config{})
	res, err := e2.client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "c1", IncludeInventory: true}))
	if err != nil {
		t.Fatal(err)
	}
	if protojson.Format(res.Msg) != protojson.Format(before) {
		t.Fatalf("after restart:\n%s\nbefore:\n%s", protojson.Format(res.Msg), protojson.Format(before))
	}
}

func TestWatchSeesAddModifyDelete(t *testing.T) {
	e := start(t, nil, clusterimport.Config{})
	ctx := testkit.Context(t, 30*time.Second)
	register(t, e, "c0", map[string]string{"env": "prod"})
	stream, err := e.client.WatchClusters(ctx, connect.NewRequest(&clusterv1.WatchClustersRequest{LabelSelector: "env=prod"}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	next := func() *clusterv1.WatchClustersResponse {
		if !stream.Receive() {
			t.Fatalf("watch ended: %v", stream.Err())
		}
		return stream.Msg()
	}
	const (
		added    = clusterv1.WatchClustersResponse_EVENT_TYPE_ADDED
		modified = clusterv1.WatchClustersResponse_EVENT_TYPE_MODIFIED
		deleted  = clusterv1.WatchClustersResponse_EVENT_TYPE_DELETED
	)
	if m := next(); m.Type != added || m.Cluster.Name != "c0" {
		t.Fatalf("snapshot: %v", m)
	}
	register(t, e, "c1", map[string]string{"env": "dev"}) // not selected: not sent
	register(t, e, "c2", map[string]string{"env": "prod"})
	if m := next(); m.Type != added || m.Cluster.Name != "c2" {
		t.Fatalf("add: %v", m)
	}
	if _, err := e.client.UpdateCluster(ctx, connect.NewRequest(&clusterv1.UpdateClusterRequest{Name: "c2", Labels: map[string]string{"env": "prod", "x": "y"}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels"}}})); err != nil {
		t.Fatal(err)
	}
	if m := next(); m.Type != modified || m.Cluster.Labels["x"] != "y" {
		t.Fatalf("modify: %v", m)
	}
	// Leaving the selector is a delete for this watcher.
	if _, err := e.client.UpdateCluster(ctx, connect.NewRequest(&clusterv1.UpdateClusterRequest{Name: "c2", Labels: map[string]string{"env": "dev"}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels"}}})); err != nil {
		t.Fatal(err)
	}
	if m := next(); m.Type != deleted || m.Cluster.Name != "c2" {
		t.Fatalf("leave selector: %v", m)
	}
	if _, err := e.client.DeregisterCluster(ctx, connect.NewRequest(&clusterv1.DeregisterClusterRequest{Name: "c0"})); err != nil {
		t.Fatal(err)
	}
	if m := next(); m.Type != deleted || m.Cluster.Name != "c0" {
		t.Fatalf("deregister: %v", m)
	}
}

func hasTaint(c *clusterv1.Cluster, key string) bool { return taint(c, key) != nil }

func taint(c *clusterv1.Cluster, key string) *clusterv1.Taint {
	for _, t := range c.Taints {
		if t.Key == key {
			return t
		}
	}
	return nil
}

// TestChunkedInventory checks that an inventory reported in chunks is one list in GetCluster
// and the namespace count, that a later unchunked report (an agent restarted with fewer
// namespaces, which does not know the chunks it left) replaces it all, that later chunks win
// though their generation is older, and that a restart keeps the result. A chunk on a subject that is not canonical is dead-lettered.
func TestChunkedInventory(t *testing.T) {
	j := testkit.StartJetStream(t)
	e := start(t, j, clusterimport.Config{})
	ctx := testkit.Context(t, 30*time.Second)
	register(t, e, "c1", nil)
	store := events.NewStore(j.JS, "agent")
	snapshot := func(count int, at time.Time) *agentv1.NamespaceInventory {
		inv := &agentv1.NamespaceInventory{ClusterName: "c1", Time: timestamppb.New(at)}
		for i := range count {
			inv.Namespaces = append(inv.Namespaces, &agentv1.Namespace{Name: fmt.Sprintf("ns-%03d", i), Phase: "Active"})
		}
		return inv
	}
	publish := func(subject string, c *agentv1.NamespaceInventory) {
		t.Helper()
		if _, err := store.Append(ctx, subject, "c1", events.Any, c); err != nil {
			t.Fatal(err)
		}
	}
	inventory := func(want int) func() error {
		return func() error {
			res, err := e.client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "c1", IncludeInventory: true}))
			if err != nil {
				return err
			}
			inv := res.Msg.GetInventory()
			if len(inv.GetNamespaces()) != want || res.Msg.Cluster.Status.NamespaceCount != int32(want) {
				return fmt.Errorf("%d namespaces, count %d, want %d", len(inv.GetNamespaces()), res.Msg.Cluster.Status.NamespaceCount, want)
			}
			if inv.GetChunks() != 0 || inv.GetChunk() != 0 || inv.GetClusterName() != "c1" || inv.GetClusterId() == "" {
				return fmt.Errorf("inventory chunk %d of %d, cluster %q (%q)", inv.GetChunk(), inv.GetChunks(), inv.GetClusterName(), inv.GetClusterId())
			}
			for i, ns := range inv.GetNamespaces() {
				if ns.GetName() != fmt.Sprintf("ns-%03d", i) {
					return fmt.Errorf("namespace %d is %s", i, ns.GetName())
				}
			}
			return nil
		}
	}

	t0 := time.Now()
	chunks := nsinventory.Split(snapshot(200, t0), 1000, uint64(t0.UnixNano()))
	if len(chunks) < 4 {
		t.Fatalf("setup: %d chunks", len(chunks))
	}
	for i := len(chunks) - 1; i >= 0; i-- {
		publish(subjects.AgentInventoryChunk("c1", uint32(i)), chunks[i])
	}
	testkit.Eventually(t, 10*time.Second, inventory(200))

	publish(subjects.AgentInventory("c1"), snapshot(20, t0.Add(time.Second)))
	testkit.Eventually(t, 10*time.Second, inventory(20))

	// An agent restarted on a node whose clock is an hour behind: its chunks are older by
	// generation than what the stream holds, newer by stream sequence, and they win.
	behind := t0.Add(-time.Hour)
	chunks = nsinventory.Split(snapshot(100, behind), 1000, uint64(behind.UnixNano()))
	if len(chunks) < 2 {
		t.Fatalf("setup: %d chunks", len(chunks))
	}
	for i := len(chunks) - 1; i >= 0; i-- {
		publish(subjects.AgentInventoryChunk("c1", uint32(i)), chunks[i])
	}
	testkit.Eventually(t, 10*time.Second, inventory(100))

	// Not canonical: chunk 1 must be ".1".
	publish(subjects.AgentInventory("c1")+".01", &agentv1.NamespaceInventory{ClusterName: "c1", Chunk: 1, Chunks: 2,
		Generation: uint64(t0.Add(2 * time.Second).UnixNano()), Namespaces: []*agentv1.Namespace{{Name: "bogus"}}})
	testkit.Eventually(t, 10*time.Second, func() error {
		s, err := j.JS.Stream(ctx, topology.DeadLetterStreamName)
		if err != nil {
			return err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs != 1 {
			return fmt.Errorf("%d dead letters", info.State.Msgs)
		}
		return nil
	})

	e.stop()
	e = start(t, j, clusterimport.Config{})
	if err := inventory(100)(); err != nil {
		t.Fatalf("after restart: %v", err)
	}
}
