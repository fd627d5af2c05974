package collector

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/authz"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1/endpointv1connect"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// harness runs a collector against a real JetStream server and serves its API over HTTP.
type harness struct {
	t      testing.TB
	js     jetstream.JetStream
	c      *Collector
	http   *httptest.Server
	client endpointv1connect.EndpointServiceClient
	cancel context.CancelFunc
	done   chan error
}

func startCollector(t testing.TB, js jetstream.JetStream, cfg Config) *harness {
	t.Helper()
	return startCollectorWith(t, js, cfg, nil)
}

// startCollectorWith is startCollector with prep, when not nil, applied before it runs.
func startCollectorWith(t testing.TB, js jetstream.JetStream, cfg Config, prep func(*Collector)) *harness {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c, err := New(ctx, js, cfg, testkit.Logger(t))
	if err != nil {
		cancel()
		t.Fatalf("new collector: %v", err)
	}
	if prep != nil {
		prep(c)
	}
	srv, err := server.New(server.Config{InsecureDev: true}, testkit.Logger(t))
	if err != nil {
		cancel()
		t.Fatalf("server: %v", err)
	}
	testkit.Authorize(t, js, srv, authz.Config{}.ForInsecureDev())
	c.Mount(srv)
	h := &harness{t: t, js: js, c: c, http: httptest.NewServer(srv.Handler()), cancel: cancel, done: make(chan error, 1)}
	h.client = endpointv1connect.NewEndpointServiceClient(http.DefaultClient, h.http.URL)
	go func() { h.done <- c.Run(ctx) }()
	select {
	case <-c.Ready():
	case err := <-h.done:
		t.Fatalf("collector stopped before ready: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("collector not ready")
	}
	t.Cleanup(h.stop)
	return h
}

func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	h.cancel = nil
	if err := <-h.done; err != nil {
		h.t.Errorf("collector run: %v", err)
	}
	h.http.Close()
}

func (h *harness) get(ns, name string, filter endpointv1.EndpointFilter) (*endpointv1.GetServiceEndpointsResponse, error) {
	res, err := h.client.GetServiceEndpoints(context.Background(), connect.NewRequest(&endpointv1.GetServiceEndpointsRequest{
		Namespace: ns, Name: name, Filter: filter}))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

// eventually waits until the service's served state, reduced by summarize, equals want.
func (h *harness) eventually(ns, name string, filter endpointv1.EndpointFilter, want string) {
	h.t.Helper()
	testkit.Eventually(h.t, 10*time.Second, func() error {
		r, err := h.get(ns, name, filter)
		got := ""
		switch {
		case connect.CodeOf(err) == connect.CodeNotFound:
			got = "<none>"
		case err != nil:
			return err
		default:
			got = summarize(r.Clusters)
		}
		if got != want {
			return fmt.Errorf("%s/%s:\n got %s\nwant %s", ns, name, got, want)
		}
		return nil
	})
}

// summarize renders clusters compactly: "A[10.0.0.1:80 w100 R, ...] B!stale[...]".
func summarize(cs []*endpointv1.ClusterEndpoints) string {
	out := ""
	for i, c := range cs {
		if i > 0 {
			out += " "
		}
		out += c.ClusterName
		if c.Stale {
			out += "!stale"
		}
		if c.Weight != DefaultWeight {
			out += fmt.Sprintf("@%d", c.Weight)
		}
		out += "["
		for j, a := range c.Addresses {
			if j > 0 {
				out += " "
			}
			out += fmt.Sprintf("%s:%d", a.Ip, a.Port)
			if a.Weight != DefaultWeight {
				out += fmt.Sprintf("w%d", a.Weight)
			}
			switch {
			case a.Ready:
			case a.Serving && a.Terminating:
				out += "~T"
			case a.Terminating:
				out += "~t"
			default:
				out += "~N"
			}
		}
		out += "]"
	}
	if out == "" {
		return "<empty>"
	}
	return out
}

// fakeAgent publishes agent-format reports as the cluster agent does.
type fakeAgent struct {
	*testkit.AgentReporter
	t       testing.TB
	cluster string
	id      string
	session string
	gen     uint64

	mu     sync.Mutex
	slices map[string]bool // ns/slice reported in this session
}

func newFakeAgent(t testing.TB, js jetstream.JetStream, cluster, id string) *fakeAgent {
	return &fakeAgent{AgentReporter: testkit.NewAgentReporter(t, js, cluster), t: t, cluster: cluster, id: id,
		session: uuid.NewString(), gen: 1, slices: map[string]bool{}}
}

// ep describes an endpoint: ip, flags "R" ready, "S" serving, "T" terminating, uid.
type ep struct {
	ip    string
	conds string
	uid   string
	zone  string
	node  string
	name  string
}

func (a *fakeAgent) report(ns, svc, slice string, ports []uint32, eps ...ep) {
	a.t.Helper()
	r := &endpointv1.EndpointSliceReport{ClusterName: a.cluster, ClusterId: a.id, Namespace: ns, Service: svc, Slice: slice,
		AddressType: "IPv4", SessionId: a.session, Generation: a.gen, Time: timestamppb.Now()}
	for _, p := range ports {
		r.Ports = append(r.Ports, &endpointv1.EndpointPort{Name: fmt.Sprintf("p%d", p), Port: p, Protocol: "TCP"})
	}
	for _, e := range eps {
		x := &endpointv1.Endpoint{Addresses: []string{e.ip}, Zone: e.zone, Node: e.node}
		for _, c := range e.conds {
			switch c {
			case 'R':
				x.Ready = true
			case 'S':
				x.Serving = true
			case 'T':
				x.Terminating = true
			}
		}
		if e.uid != "" || e.name != "" {
			x.Target = &endpointv1.TargetRef{Kind: "Pod", Namespace: ns, Name: e.name, Uid: e.uid}
		}
		if len(e.ip) > 0 && containsColon(e.ip) {
			r.AddressType = "IPv6"
		}
		r.Endpoints = append(r.Endpoints, x)
	}
	a.Publish(subjects.AgentEndpointSlice(a.cluster, ns, slice), r)
	a.mu.Lock()
	a.slices[ns+"/"+slice] = true
	a.mu.Unlock()
}

func containsColon(s string) bool {
	for i := range s {
		if s[i] == ':' {
			return true
		}
	}
	return false
}

func (a *fakeAgent) remove(ns, svc, slice string) {
	a.t.Helper()
	a.Publish(subjects.AgentEndpointSlice(a.cluster, ns, slice), &endpointv1.EndpointSliceReport{ClusterName: a.cluster,
		Namespace: ns, Service: svc, Slice: slice, Deleted: true, SessionId: a.session, Generation: a.gen})
}

func (a *fakeAgent) sync() {
	a.t.Helper()
	a.Publish(subjects.AgentEndpointSync(a.cluster), &endpointv1.EndpointSliceSync{ClusterName: a.cluster,
		SessionId: a.session, Generation: a.gen})
}

// restart starts a new agent session, as a restarted agent process does.
func (a *fakeAgent) restart() { a.session, a.gen = uuid.NewString(), 1 }

// heartbeats publishes a heartbeat every d until the returned stop is called.
func (a *fakeAgent) heartbeats(d time.Duration) (stop func()) {
	return a.Heartbeats(d, func() string { return a.session })
}
