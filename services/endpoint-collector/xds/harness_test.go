package xds

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/authz"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1/endpointv1connect"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/collector"
)

// Tokens of the harness: a platform admin, an xds-reader, and a user with neither role.
const (
	tokenAdmin  = "token-admin"
	tokenReader = "token-envoy"
	tokenNobody = "token-nobody"
)

// harness runs the collector and its xDS server against a real JetStream, with token
// authentication and the authorizer on, and its Connect API for setting weights.
type harness struct {
	t      testing.TB
	js     jetstream.JetStream
	col    *collector.Collector
	xds    *Server
	addr   string // the xDS listener
	api    endpointv1connect.EndpointServiceClient
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startHarness(t testing.TB, cfg collector.Config, log *zap.Logger) *harness {
	t.Helper()
	js := testkit.StartJetStream(t)
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, js: js.JS, cancel: cancel}
	t.Cleanup(h.stop)
	col, err := collector.New(ctx, js.JS, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	h.col = col
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(tokenAdmin+",admin\n"+tokenReader+",envoy\n"+tokenNobody+",nobody\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{TokenFile: tokens}, log)
	if err != nil {
		t.Fatal(err)
	}
	az := testkit.Authorize(t, js.JS, srv, authz.Config{PlatformAdmins: []string{"admin"}, XDSReaders: []string{"envoy"}})
	col.UseOwnership(az) // no namespace is owned until a test binds one (ownership_test.go)
	col.Mount(srv)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	h.api = endpointv1connect.NewEndpointServiceClient(&http.Client{Transport: bearer{tokenAdmin}}, hs.URL)
	h.xds = New(col, srv.Authenticator(), az, log)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.addr = ln.Addr().String()
	h.wg.Go(func() {
		if err := col.Run(ctx); err != nil {
			t.Errorf("collector: %v", err)
		}
	})
	h.wg.Go(func() {
		if err := h.xds.Run(ctx); err != nil {
			t.Errorf("xds: %v", err)
		}
	})
	h.wg.Go(func() {
		if err := h.xds.Serve(ctx, ln); err != nil {
			t.Errorf("xds serve: %v", err)
		}
	})
	select {
	case <-h.xds.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("xds server not ready")
	}
	return h
}

func (h *harness) stop() {
	h.cancel()
	h.wg.Wait()
}

func (h *harness) setClusterWeight(ns, name, cluster string, w uint32) {
	h.t.Helper()
	if _, err := h.api.SetClusterWeight(context.Background(), connect.NewRequest(&endpointv1.SetClusterWeightRequest{
		Namespace: ns, Name: name, Cluster: cluster, Weight: w})); err != nil {
		h.t.Fatalf("set cluster weight %s=%d: %v", cluster, w, err)
	}
}

func (h *harness) setEndpointWeight(ns, name, ip string, w uint32) {
	h.t.Helper()
	if _, err := h.api.SetEndpointWeight(context.Background(), connect.NewRequest(&endpointv1.SetEndpointWeightRequest{
		Namespace: ns, Name: name, Ip: ip, Weight: w})); err != nil {
		h.t.Fatalf("set endpoint weight %s=%d: %v", ip, w, err)
	}
}

type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// agent publishes what a cluster agent's EndpointSlice reporter publishes (the same messages
// on the same subjects of FLEET_AGENT: whole-slice reports, heartbeats).
type agent struct {
	*testkit.AgentReporter
	t       testing.TB
	cluster string
	session string
	gen     uint64
	slices  map[string]*endpointv1.EndpointSliceReport // by subject: what a relist republishes

	mu   sync.Mutex
	beat func() // stops the heartbeats
}

func newAgent(t testing.TB, js jetstream.JetStream, cluster string) *agent {
	return &agent{AgentReporter: testkit.NewAgentReporter(t, js, cluster), t: t, cluster: cluster, session: uuid.NewString(),
		gen: 1, slices: map[string]*endpointv1.EndpointSliceReport{}}
}

// pod is one endpoint: conds "R" ready, "T" terminating (serving = R or T).
type pod struct{ ip, conds, zone string }

func (a *agent) report(ns, svc, slice string, port uint32, pods ...pod) {
	a.t.Helper()
	r := &endpointv1.EndpointSliceReport{ClusterName: a.cluster, ClusterId: "id-" + a.cluster, Namespace: ns, Service: svc,
		Slice: slice, AddressType: "IPv4", SessionId: a.session, Generation: 1, Time: timestamppb.Now(),
		Ports: []*endpointv1.EndpointPort{{Name: "grpc", Port: port, Protocol: "TCP"}}}
	for _, p := range pods {
		ready, term := strings.Contains(p.conds, "R"), strings.Contains(p.conds, "T")
		r.Endpoints = append(r.Endpoints, &endpointv1.Endpoint{Addresses: []string{p.ip}, Ready: ready, Serving: ready || term,
			Terminating: term, Zone: p.zone, Node: a.cluster + "-node",
			Target: &endpointv1.TargetRef{Kind: "Pod", Namespace: ns, Name: "pod-" + p.ip, Uid: uuid.NewString()}})
	}
	a.mu.Lock()
	r.Generation = a.gen
	a.slices[subjects.AgentEndpointSlice(a.cluster, ns, slice)] = r
	a.mu.Unlock()
	a.Publish(subjects.AgentEndpointSlice(a.cluster, ns, slice), r)
}

// relist republishes every slice under a new generation and then the relist marker, as the
// agent does when it reconnects.
func (a *agent) relist() {
	a.t.Helper()
	a.mu.Lock()
	a.gen++
	gen := a.gen
	reps := map[string]*endpointv1.EndpointSliceReport{}
	for subj, r := range a.slices {
		r = proto.Clone(r).(*endpointv1.EndpointSliceReport)
		r.Generation, r.Time = gen, timestamppb.Now()
		reps[subj] = r
	}
	a.mu.Unlock()
	for subj, r := range reps {
		a.Publish(subj, r)
	}
	a.Publish(subjects.AgentEndpointSync(a.cluster), &endpointv1.EndpointSliceSync{ClusterName: a.cluster, SessionId: a.session, Generation: gen})
}

func (a *agent) remove(ns, svc, slice string) {
	a.t.Helper()
	a.mu.Lock()
	delete(a.slices, subjects.AgentEndpointSlice(a.cluster, ns, slice))
	gen := a.gen
	a.mu.Unlock()
	a.Publish(subjects.AgentEndpointSlice(a.cluster, ns, slice), &endpointv1.EndpointSliceReport{ClusterName: a.cluster,
		Namespace: ns, Service: svc, Slice: slice, Deleted: true, SessionId: a.session, Generation: gen})
}

// startHeartbeats publishes a heartbeat every d until stopHeartbeats, as a live agent does.
func (a *agent) startHeartbeats(d time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.beat == nil {
		a.beat = a.Heartbeats(d, func() string { return a.session })
	}
}

func (a *agent) stopHeartbeats() {
	a.mu.Lock()
	stop := a.beat
	a.beat = nil
	a.mu.Unlock()
	if stop != nil {
		stop()
	}
}

func eventually(t testing.TB, d time.Duration, cond func() error) {
	t.Helper()
	testkit.Eventually(t, d, cond)
}
