// Package e2e runs endpoint collection end to end: two real kube-apiservers (member clusters),
// a cluster agent with the EndpointSlice reporter for each, real JetStream and the collector's
// API. EndpointSlices are created through the clusters' APIs, as the EndpointSlice controller
// would.
package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fleetstream/fleetstream/pkg/authz"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1/endpointv1connect"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-agent/agent"
	"github.com/fleetstream/fleetstream/services/cluster-agent/endpointslices"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/collector"
)

type collectorProc struct {
	c      *collector.Collector
	http   *httptest.Server
	client endpointv1connect.EndpointServiceClient
	cancel context.CancelFunc
	done   chan error
}

func startCollector(t *testing.T, js jetstream.JetStream, cfg collector.Config) *collectorProc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c, err := collector.New(ctx, js, cfg, testkit.Logger(t))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{InsecureDev: true}, testkit.Logger(t))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	testkit.Authorize(t, js, srv, authz.Config{}.ForInsecureDev())
	c.Mount(srv)
	p := &collectorProc{c: c, http: httptest.NewServer(srv.Handler()), cancel: cancel, done: make(chan error, 1)}
	p.client = endpointv1connect.NewEndpointServiceClient(http.DefaultClient, p.http.URL)
	go func() { p.done <- c.Run(ctx) }()
	select {
	case <-c.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("collector not ready")
	}
	t.Cleanup(p.stop)
	return p
}

func (p *collectorProc) stop() {
	if p.cancel == nil {
		return
	}
	p.cancel()
	p.cancel = nil
	<-p.done
	p.http.Close()
}

// member is one member cluster: a kube-apiserver and, while running, its agent.
type member struct {
	t    *testing.T
	name string
	kube *testkit.Kube
	js   jetstream.JetStream

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan error
}

func (m *member) startAgent() {
	m.t.Helper()
	a, err := agent.New(agent.Config{ClusterName: m.name, HeartbeatInterval: 100 * time.Millisecond}, m.js, m.kube.Client, testkit.Logger(m.t))
	if err != nil {
		m.t.Fatal(err)
	}
	r, err := endpointslices.New(endpointslices.Config{ClusterName: m.name, ClusterID: "id-" + m.name, SessionID: a.SessionID()},
		a.Informers(), a.Store(), testkit.Logger(m.t))
	if err != nil {
		m.t.Fatal(err)
	}
	a.Add(r)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	m.mu.Lock()
	m.cancel, m.done = cancel, done
	m.mu.Unlock()
	m.t.Cleanup(m.stopAgent)
}

func (m *member) stopAgent() {
	m.mu.Lock()
	cancel, done := m.cancel, m.done
	m.cancel = nil
	m.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	if err := <-done; err != nil {
		m.t.Errorf("agent %s: %v", m.name, err)
	}
}

func ptr[T any](v T) *T { return &v }

// pod is an endpoint: ip, conditions ("R" ready, "T" terminating; serving = R or T), pod uid.
type pod struct{ ip, conds, uid string }

func (m *member) apply(ns, name, svc string, pods ...pod) {
	m.t.Helper()
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	for _, p := range pods {
		ready, term := strings.Contains(p.conds, "R"), strings.Contains(p.conds, "T")
		uid := p.uid
		if uid == "" {
			uid = "uid-" + p.ip
		}
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{p.ip},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready), Serving: ptr(ready || term), Terminating: ptr(term)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: "pod-" + p.ip, UID: types.UID(uid)},
			NodeName:   ptr(m.name + "-node-1"), Zone: ptr(m.name + "-a")})
	}
	ctx := context.Background()
	api := m.kube.Client.DiscoveryV1().EndpointSlices(ns)
	cur, err := api.Get(ctx, name, metav1.GetOptions{})
	if err == nil {
		s.ResourceVersion = cur.ResourceVersion
		_, err = api.Update(ctx, s, metav1.UpdateOptions{})
	} else {
		_, err = api.Create(ctx, s, metav1.CreateOptions{})
	}
	if err != nil {
		m.t.Fatalf("%s: apply endpointslice %s/%s: %v", m.name, ns, name, err)
	}
}

func (m *member) delete(ns, name string) {
	m.t.Helper()
	if err := m.kube.Client.DiscoveryV1().EndpointSlices(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		m.t.Fatalf("%s: delete endpointslice %s/%s: %v", m.name, ns, name, err)
	}
}

func (m *member) namespace(ns string) {
	m.t.Helper()
	if _, err := m.kube.Client.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		m.t.Fatal(err)
	}
}

func render(cs []*endpointv1.ClusterEndpoints) string {
	var parts []string
	for _, c := range cs {
		s := c.ClusterName
		if c.ClusterId != "id-"+c.ClusterName {
			s += "(id " + c.ClusterId + ")"
		}
		if c.Stale {
			s += "!stale"
		}
		var as []string
		for _, a := range c.Addresses {
			x := fmt.Sprintf("%s:%d", a.Ip, a.Port)
			if a.Weight != collector.DefaultWeight {
				x += fmt.Sprintf("w%d", a.Weight)
			}
			if !a.Ready {
				x += "~"
				if a.Terminating {
					x += "T"
				} else {
					x += "N"
				}
			}
			as = append(as, x)
		}
		parts = append(parts, s+"["+strings.Join(as, " ")+"]")
	}
	if len(parts) == 0 {
		return "<empty>"
	}
	return strings.Join(parts, " ")
}

func (p *collectorProc) eventually(t *testing.T, ns, name string, filter endpointv1.EndpointFilter, want string) {
	t.Helper()
	p.eventuallyNorm(t, ns, name, filter, want, func(s string) string { return s })
}

// eventuallyNorm compares after norm, e.g. to ignore the stale flag in a race with liveness.
func (p *collectorProc) eventuallyNorm(t *testing.T, ns, name string, filter endpointv1.EndpointFilter, want string, norm func(string) string) {
	t.Helper()
	testkit.Eventually(t, 20*time.Second, func() error {
		res, err := p.client.GetServiceEndpoints(context.Background(), connect.NewRequest(&endpointv1.GetServiceEndpointsRequest{
			Namespace: ns, Name: name, Filter: filter}))
		got := ""
		switch {
		case connect.CodeOf(err) == connect.CodeNotFound:
			got = "<none>"
		case err != nil:
			return err
		default:
			got = render(res.Msg.Clusters)
		}
		if norm(got) != want {
			return fmt.Errorf("%s/%s:\n got %s\nwant %s", ns, name, got, want)
		}
		return nil
	})
}

const (
	ready = endpointv1.EndpointFilter_ENDPOINT_FILTER_UNSPECIFIED
	all   = endpointv1.EndpointFilter_ENDPOINT_FILTER_ALL
)

func TestEndpointsAcrossTwoClusters(t *testing.T) {
	js := testkit.StartJetStream(t)
	var east, west *member
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); east = &member{t: t, name: "east", js: js.JS, kube: testkit.StartKube(t)} }()
	go func() { defer wg.Done(); west = &member{t: t, name: "west", js: js.JS, kube: testkit.StartKube(t)} }()
	wg.Wait()
	if t.Failed() {
		return
	}
	cfg := collector.Config{StaleAfter: time.Second, EvictAfter: 3 * time.Second, WeightCleanupAfter: time.Hour}
	col := startCollector(t, js.JS, cfg)
	for _, m := range []*member{east, west} {
		m.namespace("shop")
		m.startAgent()
	}
	ctx := context.Background()
	parent := t // what outlives a subtest (the restarted collector) is cleaned up with the test

	t.Run("seed add, update, delete", func(t *testing.T) {
		east.apply("shop", "cart-e1", "cart", pod{ip: "10.210.10.164", conds: "R"})
		col.eventually(t, "shop", "cart", ready, "east[10.210.10.164:8080]")
		west.apply("shop", "cart-w1", "cart", pod{ip: "10.210.170.100", conds: "R"})
		col.eventually(t, "shop", "cart", ready, "east[10.210.10.164:8080] west[10.210.170.100:8080]")
		east.apply("shop", "cart-e1", "cart", pod{ip: "10.210.10.163", conds: "R"})
		col.eventually(t, "shop", "cart", ready, "east[10.210.10.163:8080] west[10.210.170.100:8080]")
		west.delete("shop", "cart-w1")
		col.eventually(t, "shop", "cart", ready, "east[10.210.10.163:8080]")
	})

	t.Run("slices, duplicates, readiness", func(t *testing.T) {
		east.apply("shop", "cart-e1", "cart", pod{ip: "10.0.1.1", conds: "R"}, pod{ip: "10.0.1.2", conds: "R"})
		east.apply("shop", "cart-e2", "cart", pod{ip: "10.0.1.2", conds: ""}, pod{ip: "10.0.1.3", conds: "T"}, pod{ip: "10.0.1.4"})
		west.apply("shop", "cart-w1", "cart", pod{ip: "10.0.2.1", conds: "R"})
		west.apply("shop", "cart-w2", "cart", pod{ip: "10.0.2.1", conds: "R"}, pod{ip: "10.0.2.2", conds: "R"})
		col.eventually(t, "shop", "cart", ready, "east[10.0.1.1:8080 10.0.1.2:8080] west[10.0.2.1:8080 10.0.2.2:8080]")
		col.eventually(t, "shop", "cart", all, "east[10.0.1.1:8080 10.0.1.2:8080 10.0.1.3:8080~T 10.0.1.4:8080~N] west[10.0.2.1:8080 10.0.2.2:8080]")
	})

	t.Run("weights across churn and a collector restart", func(t *testing.T) {
		if _, err := col.client.SetEndpointWeight(ctx, connect.NewRequest(&endpointv1.SetEndpointWeightRequest{
			Namespace: "shop", Name: "cart", Ip: "10.0.1.1", Weight: 20})); err != nil {
			t.Fatal(err)
		}
		if _, err := col.client.SetClusterWeight(ctx, connect.NewRequest(&endpointv1.SetClusterWeightRequest{
			Namespace: "shop", Name: "cart", Cluster: "west", Weight: 50})); err != nil {
			t.Fatal(err)
		}
		col.eventually(t, "shop", "cart", ready, "east[10.0.1.1:8080w20 10.0.1.2:8080] west[10.0.2.1:8080w50 10.0.2.2:8080w50]")
		// Churn: the pod moves to another slice, another pod comes, one goes.
		east.apply("shop", "cart-e1", "cart", pod{ip: "10.0.1.2", conds: "R"}, pod{ip: "10.0.1.5", conds: "R"})
		east.apply("shop", "cart-e2", "cart", pod{ip: "10.0.1.1", conds: "R"})
		col.eventually(t, "shop", "cart", ready, "east[10.0.1.1:8080w20 10.0.1.2:8080 10.0.1.5:8080] west[10.0.2.1:8080w50 10.0.2.2:8080w50]")
		col.stop()
		col = startCollector(parent, js.JS, cfg)
		col.eventually(t, "shop", "cart", ready, "east[10.0.1.1:8080w20 10.0.1.2:8080 10.0.1.5:8080] west[10.0.2.1:8080w50 10.0.2.2:8080w50]")
		// Another pod gets the IP: it does not inherit the weight.
		east.apply("shop", "cart-e2", "cart", pod{ip: "10.0.1.1", conds: "R", uid: "new-pod"})
		col.eventually(t, "shop", "cart", ready, "east[10.0.1.1:8080 10.0.1.2:8080 10.0.1.5:8080] west[10.0.2.1:8080w50 10.0.2.2:8080w50]")
	})

	t.Run("stale, evicted, back without loss", func(t *testing.T) {
		west.stopAgent()
		col.eventually(t, "shop", "cart", ready, "east[10.0.1.1:8080 10.0.1.2:8080 10.0.1.5:8080] west!stale[10.0.2.1:8080w50 10.0.2.2:8080w50]")
		col.eventually(t, "shop", "cart", ready, "east[10.0.1.1:8080 10.0.1.2:8080 10.0.1.5:8080]")
		west.startAgent()
		col.eventually(t, "shop", "cart", ready, "east[10.0.1.1:8080 10.0.1.2:8080 10.0.1.5:8080] west[10.0.2.1:8080w50 10.0.2.2:8080w50]")
	})

	t.Run("relist after reconnect prunes only what is gone", func(t *testing.T) {
		east.stopAgent()
		// While the agent is away: one slice deleted, one changed, one added.
		east.delete("shop", "cart-e2")
		east.apply("shop", "cart-e1", "cart", pod{ip: "10.0.1.2", conds: "R"}, pod{ip: "10.0.1.6", conds: "R"})
		east.apply("shop", "cart-e3", "cart", pod{ip: "10.0.1.7", conds: "R"})
		// Nothing changes until the agent is back (the cluster may turn stale meanwhile): its
		// agent has exited (stopAgent waited for it), so no report of the changes exists yet.
		col.eventuallyNorm(t, "shop", "cart", ready, "east[10.0.1.1:8080 10.0.1.2:8080 10.0.1.5:8080] west[10.0.2.1:8080w50 10.0.2.2:8080w50]",
			func(s string) string { return strings.ReplaceAll(s, "!stale", "") })
		east.startAgent()
		col.eventually(t, "shop", "cart", ready, "east[10.0.1.2:8080 10.0.1.6:8080 10.0.1.7:8080] west[10.0.2.1:8080w50 10.0.2.2:8080w50]")
	})
}
