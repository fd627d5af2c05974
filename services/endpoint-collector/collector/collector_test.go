package collector

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

const (
	all   = endpointv1.EndpointFilter_ENDPOINT_FILTER_ALL
	ready = endpointv1.EndpointFilter_ENDPOINT_FILTER_UNSPECIFIED
)

var http8080 = []uint32{8080}

// The seed's examples: an add creates a cluster's entry, an update replaces it, a delete
// removes it, and other clusters' entries are untouched; the JSON is the seed's shape.
func TestSeedAddUpdateDelete(t *testing.T) {
	js := testkit.StartJetStream(t)
	h := startCollector(t, js.JS, Config{})
	a := newFakeAgent(t, js.JS, "KubernetesClusterA", "c_25626371485k")
	b := newFakeAgent(t, js.JS, "KubernetesClusterB", "c_27169024643I")

	a.report("shop", "cart", "cart-a", http8080, ep{ip: "10.210.10.164", conds: "RS"})
	h.eventually("shop", "cart", ready, "KubernetesClusterA[10.210.10.164:8080]")

	b.report("shop", "cart", "cart-b", http8080, ep{ip: "10.210.170.100", conds: "RS"})
	h.eventually("shop", "cart", ready, "KubernetesClusterA[10.210.10.164:8080] KubernetesClusterB[10.210.170.100:8080]")

	// Update (seed [0040]): A's pod IP changes from .164 to .163; B is untouched.
	a.report("shop", "cart", "cart-a", http8080, ep{ip: "10.210.10.163", conds: "RS"})
	h.eventually("shop", "cart", ready, "KubernetesClusterA[10.210.10.163:8080] KubernetesClusterB[10.210.170.100:8080]")

	a.report("shop", "cart", "cart-a", http8080, ep{ip: "10.210.10.163", conds: "RS"}, ep{ip: "10.210.10.164", conds: "RS"})
	h.eventually("shop", "cart", ready,
		"KubernetesClusterA[10.210.10.163:8080 10.210.10.164:8080] KubernetesClusterB[10.210.170.100:8080]")

	// The seed's JSON ([0045]) over plain HTTP, as a proxy would poll it.
	body := postJSON(t, h.http.URL+"/fleetstream.endpoint.v1.EndpointService/GetServiceEndpoints", `{"namespace":"shop","name":"cart"}`)
	var got struct {
		Clusters []struct {
			ClusterID   string `json:"clusterId"`
			ClusterName string `json:"clusterName"`
			Addresses   []struct {
				IP     string `json:"ip"`
				Port   int    `json:"port"`
				Weight int    `json:"weight"`
			} `json:"addresses"`
		} `json:"clusters"`
	}
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
	seed := `[{"clusterId":"c_25626371485k","clusterName":"KubernetesClusterA","addresses":[{"ip":"10.210.10.163","port":8080,"weight":100},{"ip":"10.210.10.164","port":8080,"weight":100}]},{"clusterId":"c_27169024643I","clusterName":"KubernetesClusterB","addresses":[{"ip":"10.210.170.100","port":8080,"weight":100}]}]`
	if g, _ := json.Marshal(got.Clusters); string(g) != seed {
		t.Fatalf("JSON shape:\n got %s\nwant %s", g, seed)
	}

	// Delete (seed [0042]): B's entry goes, A's stays.
	b.remove("shop", "cart", "cart-b")
	h.eventually("shop", "cart", ready, "KubernetesClusterA[10.210.10.163:8080 10.210.10.164:8080]")
	a.remove("shop", "cart", "cart-a")
	h.eventually("shop", "cart", ready, "<none>")
}

func postJSON(t testing.TB, url, body string) []byte {
	t.Helper()
	res, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %s: %s", url, res.Status, data)
	}
	return data
}

// Several slices per service, the same endpoint in two slices at once, not-ready and
// terminating endpoints, and the filters.
func TestMergeSlicesAndConditions(t *testing.T) {
	js := testkit.StartJetStream(t)
	h := startCollector(t, js.JS, Config{})
	a := newFakeAgent(t, js.JS, "east", "id-east")
	b := newFakeAgent(t, js.JS, "west", "id-west")

	a.report("shop", "cart", "cart-1", http8080, ep{ip: "10.0.0.1", conds: "RS"}, ep{ip: "10.0.0.2", conds: "RS"})
	a.report("shop", "cart", "cart-2", http8080, ep{ip: "10.0.0.3", conds: "RS"}, ep{ip: "10.0.0.4", conds: ""})
	b.report("shop", "cart", "cart-x", http8080, ep{ip: "10.1.0.1", conds: "RS"})
	h.eventually("shop", "cart", ready, "east[10.0.0.1:8080 10.0.0.2:8080 10.0.0.3:8080] west[10.1.0.1:8080]")
	h.eventually("shop", "cart", all, "east[10.0.0.1:8080 10.0.0.2:8080 10.0.0.3:8080 10.0.0.4:8080~N] west[10.1.0.1:8080]")

	// 10.0.0.2 moves from cart-1 to cart-2: for a moment it is in both, the new copy ready, the
	// old one not; it is listed once, ready.
	a.report("shop", "cart", "cart-2", http8080, ep{ip: "10.0.0.3", conds: "RS"}, ep{ip: "10.0.0.4", conds: ""}, ep{ip: "10.0.0.2", conds: "RS"})
	a.report("shop", "cart", "cart-1", http8080, ep{ip: "10.0.0.1", conds: "RS"}, ep{ip: "10.0.0.2", conds: ""})
	h.eventually("shop", "cart", all, "east[10.0.0.1:8080 10.0.0.2:8080 10.0.0.3:8080 10.0.0.4:8080~N] west[10.1.0.1:8080]")
	a.report("shop", "cart", "cart-1", http8080, ep{ip: "10.0.0.1", conds: "RS"})
	h.eventually("shop", "cart", all, "east[10.0.0.1:8080 10.0.0.2:8080 10.0.0.3:8080 10.0.0.4:8080~N] west[10.1.0.1:8080]")

	// Terminating: a serving-terminating endpoint is not ready, so not served by default...
	a.report("shop", "cart", "cart-1", http8080, ep{ip: "10.0.0.1", conds: "ST"})
	h.eventually("shop", "cart", ready, "east[10.0.0.2:8080 10.0.0.3:8080] west[10.1.0.1:8080]")
	h.eventually("shop", "cart", all, "east[10.0.0.1:8080~T 10.0.0.2:8080 10.0.0.3:8080 10.0.0.4:8080~N] west[10.1.0.1:8080]")
	// ...and READY_OR_TERMINATING falls back to it only when nothing anywhere is ready.
	fallback := endpointv1.EndpointFilter_ENDPOINT_FILTER_READY_OR_TERMINATING
	h.eventually("shop", "cart", fallback, "east[10.0.0.2:8080 10.0.0.3:8080] west[10.1.0.1:8080]")
	a.report("shop", "cart", "cart-2", http8080, ep{ip: "10.0.0.2", conds: "T"}, ep{ip: "10.0.0.3", conds: ""})
	b.report("shop", "cart", "cart-x", http8080, ep{ip: "10.1.0.1", conds: "ST"})
	h.eventually("shop", "cart", ready, "east[] west[]")
	h.eventually("shop", "cart", fallback, "east[10.0.0.1:8080~T] west[10.1.0.1:8080~T]")

	// Ports: a slice with two ports gives two addresses per endpoint; port_name selects one.
	// IPv6 endpoints sort after IPv4 ones.
	a.report("shop", "web", "web-1", []uint32{80, 9090}, ep{ip: "10.0.0.9", conds: "RS"}, ep{ip: "fd00::9", conds: "RS"})
	h.eventually("shop", "web", ready, "east[10.0.0.9:80 10.0.0.9:9090 fd00::9:80 fd00::9:9090]")
	res, err := h.client.GetServiceEndpoints(context.Background(), connect.NewRequest(&endpointv1.GetServiceEndpointsRequest{
		Namespace: "shop", Name: "web", PortName: "p9090"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := summarize(res.Msg.Clusters); got != "east[10.0.0.9:9090 fd00::9:9090]" {
		t.Fatalf("port_name filter: %s", got)
	}

	list, err := h.client.ListServices(context.Background(), connect.NewRequest(&endpointv1.ListServicesRequest{Namespace: "shop"}))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range list.Msg.Services {
		names = append(names, fmt.Sprintf("%s/%s%v %d/%d", s.Namespace, s.Name, s.Clusters, s.ReadyEndpoints, s.TotalEndpoints))
	}
	if got := strings.Join(names, ", "); got != "shop/cart[east west] 0/4, shop/web[east] 4/4" {
		t.Fatalf("ListServices: %s", got)
	}
}

// Weights: set per IP and per cluster, kept across churn and restarts, not passed to another pod
// reusing the IP, cleaned up after the IP is gone.
func TestWeights(t *testing.T) {
	js := testkit.StartJetStream(t)
	cfg := Config{WeightCleanupAfter: 400 * time.Millisecond}
	h := startCollector(t, js.JS, cfg)
	a := newFakeAgent(t, js.JS, "east", "id-east")
	b := newFakeAgent(t, js.JS, "west", "id-west")
	stopA, stopB := a.heartbeats(50*time.Millisecond), b.heartbeats(50*time.Millisecond)
	defer stopA()
	defer stopB()

	pod7 := ep{ip: "10.0.0.7", conds: "RS", uid: "7f000000-0000-0000-0000-000000000007", name: "cart-7"}
	pod8 := ep{ip: "10.0.0.8", conds: "RS", uid: "7f000000-0000-0000-0000-000000000008", name: "cart-8"}
	a.report("shop", "cart", "cart-1", http8080, pod7, pod8)
	a.sync()
	b.report("shop", "cart", "cart-w", http8080, ep{ip: "10.0.0.7", conds: "RS", uid: "7f000000-0000-0000-0000-0000000000ff"})
	b.sync()
	h.eventually("shop", "cart", ready, "east[10.0.0.7:8080 10.0.0.8:8080] west[10.0.0.7:8080]")

	ctx := context.Background()
	// The seed's request, in one cluster only.
	res, err := h.client.SetEndpointWeight(ctx, connect.NewRequest(&endpointv1.SetEndpointWeightRequest{
		Namespace: "shop", Name: "cart", Ip: "10.0.0.7", Weight: 20, Cluster: "east"}))
	if err != nil {
		t.Fatal(err)
	}
	if ew := res.Msg.Weights.EndpointWeights; len(ew) != 1 || ew[0].TargetUid != pod7.uid || ew[0].Weight != 20 {
		t.Fatalf("weights after set: %v", res.Msg.Weights)
	}
	// Read-your-writes: visible as soon as the call returns.
	r, err := h.get("shop", "cart", ready)
	if err != nil {
		t.Fatal(err)
	}
	if got := summarize(r.Clusters); got != "east[10.0.0.7:8080w20 10.0.0.8:8080] west[10.0.0.7:8080]" {
		t.Fatalf("after SetEndpointWeight: %s", got)
	}
	if _, err := h.client.SetClusterWeight(ctx, connect.NewRequest(&endpointv1.SetClusterWeightRequest{
		Namespace: "shop", Name: "cart", Cluster: "west", Weight: 0})); err != nil {
		t.Fatal(err)
	}
	h.eventually("shop", "cart", ready, "east[10.0.0.7:8080w20 10.0.0.8:8080] west@0[10.0.0.7:8080w0]")
	// Drain one endpoint: weight 0.
	if _, err := h.client.SetEndpointWeight(ctx, connect.NewRequest(&endpointv1.SetEndpointWeightRequest{
		Namespace: "shop", Name: "cart", Ip: "10.0.0.8", Weight: 0})); err != nil {
		t.Fatal(err)
	}
	h.eventually("shop", "cart", ready, "east[10.0.0.7:8080w20 10.0.0.8:8080w0] west@0[10.0.0.7:8080w0]")

	// Churn: other endpoints come and go, the pod moves to another slice and is briefly not
	// ready: its weight stays.
	a.report("shop", "cart", "cart-1", http8080, pod8, ep{ip: "10.0.0.9", conds: "RS"})
	a.report("shop", "cart", "cart-2", http8080, ep{ip: "10.0.0.7", conds: "", uid: pod7.uid})
	h.eventually("shop", "cart", all, "east[10.0.0.7:8080w20~N 10.0.0.8:8080w0 10.0.0.9:8080] west@0[10.0.0.7:8080w0]")
	a.report("shop", "cart", "cart-2", http8080, pod7)
	h.eventually("shop", "cart", ready, "east[10.0.0.7:8080w20 10.0.0.8:8080w0 10.0.0.9:8080] west@0[10.0.0.7:8080w0]")

	// A restart of the collector: weights and endpoints come back from the streams.
	h.stop()
	h = startCollector(t, js.JS, cfg)
	h.eventually("shop", "cart", ready, "east[10.0.0.7:8080w20 10.0.0.8:8080w0 10.0.0.9:8080] west@0[10.0.0.7:8080w0]")

	// The pod behind 10.0.0.7 is replaced by another pod that gets the same IP: it starts at 100.
	a.report("shop", "cart", "cart-2", http8080, ep{ip: "10.0.0.7", conds: "RS", uid: "7f000000-0000-0000-0000-000000000077"})
	h.eventually("shop", "cart", ready, "east[10.0.0.7:8080 10.0.0.8:8080w0 10.0.0.9:8080] west@0[10.0.0.7:8080w0]")

	// The stale override (its pod is gone) is cleaned up after WeightCleanupAfter; the live one
	// for 10.0.0.8 stays.
	testkit.Eventually(t, 10*time.Second, func() error {
		w, _ := h.c.weights.Get(viewKey("shop", "cart"))
		if w == nil || len(w.EndpointWeights) != 1 || w.EndpointWeights[0].Ip != "10.0.0.8" {
			return fmt.Errorf("weights: %v", w)
		}
		return nil
	})

	// Clearing an override and setting a cluster back to 100 return to defaults.
	if _, err := h.client.SetEndpointWeight(ctx, connect.NewRequest(&endpointv1.SetEndpointWeightRequest{
		Namespace: "shop", Name: "cart", Ip: "10.0.0.8", Clear: true})); err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.SetClusterWeight(ctx, connect.NewRequest(&endpointv1.SetClusterWeightRequest{
		Namespace: "shop", Name: "cart", Cluster: "west", Weight: 100})); err != nil {
		t.Fatal(err)
	}
	r, err = h.get("shop", "cart", ready)
	if err != nil {
		t.Fatal(err)
	}
	if got := summarize(r.Clusters); got != "east[10.0.0.7:8080 10.0.0.8:8080 10.0.0.9:8080] west[10.0.0.7:8080]" {
		t.Fatalf("after clearing: %s", got)
	}

	// An IP the service does not have is NotFound.
	_, err = h.client.SetEndpointWeight(ctx, connect.NewRequest(&endpointv1.SetEndpointWeightRequest{
		Namespace: "shop", Name: "cart", Ip: "10.9.9.9", Weight: 5}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("unknown IP: %v", err)
	}
}

// A silent cluster is flagged stale, then evicted; when its agent returns it is back at once
// (stale until its relist completes), nothing lost.
func TestLivenessStaleEvictReturn(t *testing.T) {
	js := testkit.StartJetStream(t)
	h := startCollector(t, js.JS, Config{StaleAfter: 400 * time.Millisecond, EvictAfter: 1200 * time.Millisecond})
	a := newFakeAgent(t, js.JS, "east", "id-east")
	b := newFakeAgent(t, js.JS, "west", "id-west")
	stopA := a.heartbeats(50 * time.Millisecond)
	stopB := b.heartbeats(50 * time.Millisecond)
	defer stopB()
	a.report("shop", "cart", "cart-e", http8080, ep{ip: "10.0.0.1", conds: "RS"})
	a.sync()
	b.report("shop", "cart", "cart-w", http8080, ep{ip: "10.1.0.1", conds: "RS"})
	b.sync()
	h.eventually("shop", "cart", ready, "east[10.0.0.1:8080] west[10.1.0.1:8080]")

	stopA()
	h.eventually("shop", "cart", ready, "east!stale[10.0.0.1:8080] west[10.1.0.1:8080]")
	h.eventually("shop", "cart", ready, "west[10.1.0.1:8080]")

	// Back: served at once, stale until the relist marker arrives.
	stopA = a.heartbeats(50 * time.Millisecond)
	defer stopA()
	h.eventually("shop", "cart", ready, "east!stale[10.0.0.1:8080] west[10.1.0.1:8080]")
	a.report("shop", "cart", "cart-e", http8080, ep{ip: "10.0.0.1", conds: "RS"})
	a.sync()
	h.eventually("shop", "cart", ready, "east[10.0.0.1:8080] west[10.1.0.1:8080]")
}

// After an agent restart (a new session), nothing is deleted until its relist completes; then
// exactly the slices it no longer has go.
func TestRelistPrunesOnlyWhatIsGone(t *testing.T) {
	js := testkit.StartJetStream(t)
	h := startCollector(t, js.JS, Config{})
	a := newFakeAgent(t, js.JS, "east", "id-east")
	a.report("shop", "cart", "cart-1", http8080, ep{ip: "10.0.0.1", conds: "RS"})
	a.report("shop", "cart", "cart-2", http8080, ep{ip: "10.0.0.2", conds: "RS"})
	a.report("shop", "web", "web-1", http8080, ep{ip: "10.0.0.3", conds: "RS"})
	a.sync()
	h.eventually("shop", "cart", ready, "east[10.0.0.1:8080 10.0.0.2:8080]")

	// The agent restarts; while it was away cart-2 and web-1 were deleted and cart-1 changed.
	a.restart()
	a.report("shop", "cart", "cart-1", http8080, ep{ip: "10.0.0.1", conds: "RS"}, ep{ip: "10.0.0.4", conds: "RS"})
	h.eventually("shop", "cart", ready, "east[10.0.0.1:8080 10.0.0.2:8080 10.0.0.4:8080]")
	h.eventually("shop", "web", ready, "east[10.0.0.3:8080]")
	a.sync()
	h.eventually("shop", "cart", ready, "east[10.0.0.1:8080 10.0.0.4:8080]")
	h.eventually("shop", "web", ready, "<none>")

	// A restarted collector replays to the same state.
	h.stop()
	h = startCollector(t, js.JS, Config{})
	h.eventually("shop", "cart", ready, "east[10.0.0.1:8080 10.0.0.4:8080]")
	h.eventually("shop", "web", ready, "<none>")

	// A second relist in the same session (after a reconnect) prunes the same way.
	a.gen++
	a.report("shop", "cart", "cart-1", http8080, ep{ip: "10.0.0.4", conds: "RS"})
	a.sync()
	h.eventually("shop", "cart", ready, "east[10.0.0.4:8080]")
}

func TestInvalidArgumentNamesTheField(t *testing.T) {
	js := testkit.StartJetStream(t)
	h := startCollector(t, js.JS, Config{})
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		call  func() error
		field string
	}{
		{"get without namespace", func() error {
			_, err := h.client.GetServiceEndpoints(ctx, connect.NewRequest(&endpointv1.GetServiceEndpointsRequest{Name: "cart"}))
			return err
		}, "namespace"},
		{"get with bad name", func() error {
			_, err := h.client.GetServiceEndpoints(ctx, connect.NewRequest(&endpointv1.GetServiceEndpointsRequest{Namespace: "shop", Name: "Cart_1"}))
			return err
		}, "name"},
		{"get with unknown filter", func() error {
			_, err := h.client.GetServiceEndpoints(ctx, connect.NewRequest(&endpointv1.GetServiceEndpointsRequest{Namespace: "shop", Name: "cart", Filter: 9}))
			return err
		}, "filter"},
		{"weight with bad ip", func() error {
			_, err := h.client.SetEndpointWeight(ctx, connect.NewRequest(&endpointv1.SetEndpointWeightRequest{Namespace: "shop", Name: "cart", Ip: "10.0.0.300", Weight: 1}))
			return err
		}, "ip"},
		{"weight without ip", func() error {
			_, err := h.client.SetEndpointWeight(ctx, connect.NewRequest(&endpointv1.SetEndpointWeightRequest{Namespace: "shop", Name: "cart", Weight: 1}))
			return err
		}, "ip"},
		{"weight out of range", func() error {
			_, err := h.client.SetEndpointWeight(ctx, connect.NewRequest(&endpointv1.SetEndpointWeightRequest{Namespace: "shop", Name: "cart", Ip: "10.0.0.1", Weight: 70000}))
			return err
		}, "weight"},
		{"cluster weight without cluster", func() error {
			_, err := h.client.SetClusterWeight(ctx, connect.NewRequest(&endpointv1.SetClusterWeightRequest{Namespace: "shop", Name: "cart", Weight: 5}))
			return err
		}, "cluster"},
		{"watch with bad namespace", func() error {
			s, err := h.client.WatchServiceEndpoints(ctx, connect.NewRequest(&endpointv1.WatchServiceEndpointsRequest{Namespace: "-x", Name: "cart"}))
			if err != nil {
				return err
			}
			defer s.Close()
			s.Receive()
			return s.Err()
		}, "namespace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("want InvalidArgument, got %v", err)
			}
			var ce *connect.Error
			if !errors.As(err, &ce) {
				t.Fatalf("not a Connect error: %v", err)
			}
			// A value refused while decoding (an undeclared filter number) carries Connect's prefix.
			msg := strings.TrimPrefix(ce.Message(), "unmarshal message: ")
			if !(strings.HasPrefix(msg, tc.field+":") || strings.Contains(msg, "; "+tc.field+":")) {
				t.Fatalf("error does not name field %q: %v", tc.field, err)
			}
		})
	}
}

// The watch sends the state now, then after every change, and says when the service is gone.
func TestWatchServiceEndpoints(t *testing.T) {
	js := testkit.StartJetStream(t)
	h := startCollector(t, js.JS, Config{})
	a := newFakeAgent(t, js.JS, "east", "id-east")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := h.client.WatchServiceEndpoints(ctx, connect.NewRequest(&endpointv1.WatchServiceEndpointsRequest{Namespace: "shop", Name: "cart"}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	next := func(want string) {
		t.Helper()
		for {
			if !s.Receive() {
				t.Fatalf("watch ended: %v", s.Err())
			}
			m := s.Msg()
			got := summarize(m.Clusters)
			if !m.Exists {
				got = "<none>"
			}
			if got == want {
				return
			}
			t.Logf("watch: %s (waiting for %s)", got, want)
		}
	}
	next("<none>")
	a.report("shop", "cart", "cart-1", http8080, ep{ip: "10.0.0.1", conds: "RS"})
	next("east[10.0.0.1:8080]")
	a.report("shop", "cart", "cart-1", http8080, ep{ip: "10.0.0.1", conds: "RS"}, ep{ip: "10.0.0.2", conds: "RS"})
	next("east[10.0.0.1:8080 10.0.0.2:8080]")
	a.remove("shop", "cart", "cart-1")
	next("<none>")
}

// Bucket `endpoints` carries the merged view (every endpoint) for other services.
func TestEndpointsBucket(t *testing.T) {
	js := testkit.StartJetStream(t)
	h := startCollector(t, js.JS, Config{ViewFlushInterval: 20 * time.Millisecond})
	a := newFakeAgent(t, js.JS, "east", "id-east")
	a.report("shop", "cart", "cart-1", http8080, ep{ip: "10.0.0.1", conds: "RS"}, ep{ip: "10.0.0.2"})
	kv, err := js.JS.KeyValue(context.Background(), subjects.EndpointsBucket)
	if err != nil {
		t.Fatal(err)
	}
	read := func() (string, error) {
		e, err := kv.Get(context.Background(), viewKey("shop", "cart"))
		if err != nil {
			return "", err
		}
		var se endpointv1.ServiceEndpoints
		if err := proto.Unmarshal(e.Value(), &se); err != nil {
			return "", err
		}
		return summarize(se.Clusters), nil
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		got, err := read()
		if err != nil {
			return err
		}
		if got != "east[10.0.0.1:8080 10.0.0.2:8080~N]" {
			return fmt.Errorf("bucket: %s", got)
		}
		return nil
	})
	a.remove("shop", "cart", "cart-1")
	testkit.Eventually(t, 10*time.Second, func() error {
		if _, err := read(); err == nil {
			return fmt.Errorf("still in the bucket")
		} else if err != jetstream.ErrKeyNotFound {
			return err
		}
		return nil
	})

	// An entry of a service that vanished while no collector ran is removed on start.
	if _, err := kv.Put(context.Background(), viewKey("shop", "ghost"), []byte{}); err != nil {
		t.Fatal(err)
	}
	h.stop()
	startCollector(t, js.JS, Config{ViewFlushInterval: 20 * time.Millisecond})
	testkit.Eventually(t, 10*time.Second, func() error {
		if _, err := kv.Get(context.Background(), viewKey("shop", "ghost")); err != jetstream.ErrKeyNotFound {
			return fmt.Errorf("ghost entry: %v", err)
		}
		return nil
	})
}

// A malformed report is dead-lettered; the collector goes on.
func TestMalformedReportIsDeadLettered(t *testing.T) {
	js := testkit.StartJetStream(t)
	h := startCollector(t, js.JS, Config{})
	if _, err := js.JS.Publish(context.Background(), subjects.AgentEndpointSlice("east", "shop", "bad"), []byte("not a protobuf \xff")); err != nil {
		t.Fatal(err)
	}
	a := newFakeAgent(t, js.JS, "east", "id-east")
	a.report("shop", "cart", "cart-1", http8080, ep{ip: "10.0.0.1", conds: "RS"})
	h.eventually("shop", "cart", ready, "east[10.0.0.1:8080]")
	testkit.Eventually(t, 5*time.Second, func() error {
		s, err := js.JS.Stream(context.Background(), "FLEET_DLQ")
		if err != nil {
			return err
		}
		m, err := s.GetLastMsgForSubject(context.Background(), "fleet.dlq.FLEET_AGENT.endpoint-collector")
		if err != nil {
			return err
		}
		if !bytes.Contains(m.Data, []byte("not a protobuf")) {
			return fmt.Errorf("dead letter %q", m.Data)
		}
		return nil
	})
}
