package cli

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/events"
	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1/endpointv1connect"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/collector"
)

// staleAfter is the collector's stale delay in these tests: a cluster whose agent is silent
// that long is shown stale.
const staleAfter = 2 * time.Second

// startEndpointHub runs the real endpoint-collector on the hub, so cluster ids come from the
// real cluster registry.
func startEndpointHub(t *testing.T) *hubEnv {
	t.Helper()
	return startHub(t, endpointCollector(t))
}

// endpointCollector is the real endpoint-collector as a hub service.
func endpointCollector(t *testing.T) newHubService {
	return func(ctx context.Context, js *testkit.JetStream) (hubService, error) {
		c, err := collector.New(ctx, js.JS, collector.Config{StaleAfter: staleAfter, EvictAfter: time.Hour}, testkit.Logger(t))
		if err != nil {
			return nil, err
		}
		return c, nil
	}
}

// agentReports publishes what a cluster's agent reports to stream FLEET_AGENT, in the agent's
// format: EndpointSlice snapshots and heartbeats.
type agentReports struct {
	store   *events.Store
	cluster string
	id      string
}

func (h *hubEnv) agent(cluster, id string) *agentReports {
	return &agentReports{store: events.NewStore(h.js.JS, "system:cluster-agent:"+cluster), cluster: cluster, id: id}
}

func (a *agentReports) publish(ctx context.Context, subject string, m proto.Message) error {
	_, err := a.store.Append(ctx, subject, a.cluster, events.Any, m)
	return err
}

// slice reports EndpointSlice name of service ns/svc with one port.
func (a *agentReports) slice(t *testing.T, ns, svc, name string, port *endpointv1.EndpointPort, eps ...*endpointv1.Endpoint) {
	t.Helper()
	r := &endpointv1.EndpointSliceReport{ClusterName: a.cluster, ClusterId: a.id, Namespace: ns, Service: svc, Slice: name,
		AddressType: "IPv4", SessionId: "session-" + a.cluster, Generation: 1, Time: timestamppb.Now(),
		Ports: []*endpointv1.EndpointPort{port}, Endpoints: eps}
	if err := a.publish(testkit.Context(t, 10*time.Second), subjects.AgentEndpointSlice(a.cluster, ns, name), r); err != nil {
		t.Fatal(err)
	}
}

// heartbeats keeps the cluster live until the test ends.
func (a *agentReports) heartbeats(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			err := a.publish(ctx, subjects.AgentHeartbeat(a.cluster), &agentv1.Heartbeat{ClusterName: a.cluster, SessionId: "session-" + a.cluster, Time: timestamppb.Now()})
			if err != nil && ctx.Err() == nil && !errors.Is(err, context.Canceled) {
				t.Errorf("heartbeat of %s: %v", a.cluster, err)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
}

type endpointsJSON struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Clusters  []struct {
		ClusterID   string `json:"clusterId"`
		ClusterName string `json:"clusterName"`
		Weight      uint32 `json:"weight"`
		Stale       bool   `json:"stale"`
		Addresses   []struct {
			IP     string `json:"ip"`
			Port   uint32 `json:"port"`
			Weight uint32 `json:"weight"`
		} `json:"addresses"`
	} `json:"clusters"`
}

// weights renders every cluster's weight and its addresses' weights: "east=100 east/10.0.0.7=20 ...".
func (e endpointsJSON) weights() string {
	var out []string
	for _, c := range e.Clusters {
		out = append(out, fmt.Sprintf("%s=%d", c.ClusterName, c.Weight))
		for _, a := range c.Addresses {
			out = append(out, fmt.Sprintf("%s/%s=%d", c.ClusterName, a.IP, a.Weight))
		}
	}
	return strings.Join(out, " ")
}

func TestEndpointsCommands(t *testing.T) {
	h := startEndpointHub(t)
	h.run(t, "cluster", "register", "east").ok(t)
	h.run(t, "cluster", "register", "west").ok(t)
	ids := map[string]string{}
	for _, c := range jsonOf[[]clusterJSON](t, h.run(t, "-o", "json", "cluster", "list").ok(t)) {
		ids[c.Name] = c.ID
	}

	// East's agent stays connected; west's reports once and falls silent, so it turns stale.
	east, west := h.agent("east", ids["east"]), h.agent("west", ids["west"])
	east.heartbeats(t)
	east.slice(t, "shop", "cart", "cart-abc", &endpointv1.EndpointPort{Name: "http", Port: 8080, Protocol: "TCP"},
		&endpointv1.Endpoint{Addresses: []string{"10.0.0.7"}, Ready: true, Serving: true, Zone: "a", Node: "n1",
			Target: &endpointv1.TargetRef{Kind: "Pod", Namespace: "shop", Name: "cart-1", Uid: "0b6f3d0c-5d2b-4c57-9d7e-3f1a2b4c5d6e"}})
	west.slice(t, "shop", "cart", "cart-def", &endpointv1.EndpointPort{Port: 8080, Protocol: "TCP"},
		&endpointv1.Endpoint{Addresses: []string{"10.1.0.1"}, Serving: true, Terminating: true})

	// Weight the east endpoint; the table shows it, west stale, and every state.
	testkit.Eventually(t, 10*time.Second, func() error {
		return errOf(h.run(t, "endpoints", "weight", "shop/cart", "--ip", "10.0.0.7", "--weight", "20"))
	})
	var out string
	testkit.Eventually(t, 10*time.Second, func() error {
		out = h.run(t, "endpoints", "get", "shop/cart", "--filter", "all").ok(t).stdout
		for _, want := range []string{"CLUSTER", "east", "10.0.0.7", "8080/http", "20", "Ready", "Pod/cart-1", "west (stale)", "10.1.0.1", "Terminating(serving)"} {
			if !strings.Contains(out, want) {
				return fmt.Errorf("get output lacks %q:\n%s", want, out)
			}
		}
		return nil
	})
	// The default filter shows only ready endpoints.
	if out := h.run(t, "endpoints", "get", "shop/cart").ok(t).stdout; !strings.Contains(out, "10.0.0.7") || strings.Contains(out, "10.1.0.1") {
		t.Errorf("get (ready):\n%s", out)
	}
	got := jsonOf[endpointsJSON](t, h.run(t, "-o", "json", "endpoints", "get", "shop/cart", "--filter", "all").ok(t))
	if got.Namespace != "shop" || got.Name != "cart" || len(got.Clusters) != 2 || got.Clusters[0].ClusterID != ids["east"] || !got.Clusters[1].Stale {
		t.Errorf("get -o json = %+v", got)
	}

	// Each weight change is what the service then serves.
	weights := func() string {
		t.Helper()
		return jsonOf[endpointsJSON](t, h.run(t, "-o", "json", "endpoints", "get", "shop/cart", "--filter", "all").ok(t)).weights()
	}
	out = h.run(t, "endpoints", "weight", "shop/cart", "--ip", "10.0.0.7", "--weight", "0").ok(t).stdout
	if !strings.Contains(out, "east") || !strings.Contains(out, "10.0.0.7") || !strings.Contains(out, "0b6f3d0c-5d2b-4c57-9d7e-3f1a2b4c5d6e") {
		t.Errorf("endpoint weight output:\n%s", out)
	}
	if w := weights(); w != "east=100 east/10.0.0.7=0 west=100 west/10.1.0.1=100" {
		t.Errorf("after --weight 0: %s", w)
	}
	h.run(t, "endpoints", "weight", "shop/cart", "--ip", "10.0.0.7", "--clear").ok(t)
	if w := weights(); w != "east=100 east/10.0.0.7=100 west=100 west/10.1.0.1=100" {
		t.Errorf("after --clear: %s", w)
	}
	out = h.run(t, "endpoints", "weight", "shop/cart", "--cluster", "west", "--weight", "50").ok(t).stdout
	if !strings.Contains(out, "west") || !strings.Contains(out, "50") || !strings.Contains(out, "*") {
		t.Errorf("cluster weight output:\n%s", out)
	}
	if w := weights(); w != "east=100 east/10.0.0.7=100 west=50 west/10.1.0.1=50" {
		t.Errorf("after --cluster west --weight 50: %s", w)
	}

	// The server's own checks.
	h.run(t, "endpoints", "get", "shop/nope").fails(t, "error: not_found: ")
	h.run(t, "endpoints", "weight", "shop/cart", "--ip", "10.9.9.9", "--weight", "5").fails(t, "error: not_found: ")
	h.runAs(t, "wrong-token", "endpoints", "get", "shop/cart").fails(t, "error: unauthenticated: ")

	// Flag errors never reach the server.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"endpoints", "get", "cart"}, `error: service "cart": want NAMESPACE/NAME`},
		{[]string{"endpoints", "get", "shop/cart", "--filter", "some"}, `error: --filter "some"`},
		{[]string{"endpoints", "weight", "shop/cart", "--ip", "10.0.0.7"}, "error: give exactly one of --weight and --clear"},
		{[]string{"endpoints", "weight", "shop/cart", "--weight", "5"}, "error: give --ip, or --cluster"},
		{[]string{"endpoints", "weight", "shop/cart", "--ip", "10.0.0.7", "--weight", "70000"}, "error: --weight 70000"},
	} {
		h.run(t, tc.args...).fails(t, tc.want)
	}
}

// errOf turns a failed run into an error, for Eventually.
func errOf(r result) error {
	if r.code != 0 {
		return fmt.Errorf("exit %d: %s", r.code, r.stderr)
	}
	return nil
}

// Service weights as code: a ServiceWeights manifest applied against the real endpoint
// collector sets the weights it declares, an unchanged rerun does nothing, a change resets what
// the manifest no longer declares, export prints what apply reads back, and a weight for an IP
// the service does not serve is refused before anything is written.
func TestApplyServiceWeights(t *testing.T) {
	// A hub with clusters east and west, east's agent serving shop/cart at two IPs.
	start := func() *hubEnv {
		// rbac-sync too: prune reads every kind.
		h := startHub(t, endpointCollector(t), rbacSync(t))
		h.run(t, "cluster", "register", "east").ok(t)
		h.run(t, "cluster", "register", "west").ok(t)
		ids := map[string]string{}
		for _, c := range jsonOf[[]clusterJSON](t, h.run(t, "-o", "json", "cluster", "list").ok(t)) {
			ids[c.Name] = c.ID
		}
		east := h.agent("east", ids["east"])
		east.heartbeats(t)
		east.slice(t, "shop", "cart", "cart-abc", &endpointv1.EndpointPort{Name: "http", Port: 8080, Protocol: "TCP"},
			&endpointv1.Endpoint{Addresses: []string{"10.0.0.7"}, Ready: true, Serving: true},
			&endpointv1.Endpoint{Addresses: []string{"10.0.0.8"}, Ready: true, Serving: true})
		testkit.Eventually(t, 10*time.Second, func() error {
			return errOf(h.run(t, "endpoints", "get", "shop/cart"))
		})
		return h
	}
	h := start()

	dir := t.TempDir()
	manifest := func(spec string) string {
		path := filepath.Join(dir, "weights.yaml")
		writeFile(t, path, "apiVersion: fleetstream.io/v1alpha1\nkind: ServiceWeights\nmetadata: {name: cart}\nspec:\n  namespace: shop\n"+spec)
		return path
	}
	weights := func() string {
		return jsonOf[endpointsJSON](t, h.run(t, "-o", "json", "endpoints", "get", "shop/cart").ok(t)).weights()
	}

	// West drained before it serves anything (a canary's start), one east endpoint at 5.
	first := manifest("  clusterWeights: {west: 0, east: 100}\n  endpointWeights:\n  - {ip: 10.0.0.7, clusterName: east, weight: 5}\n")
	if r := h.run(t, "diff", "-f", first); r.code != 1 || !strings.Contains(r.stdout, "+++ declared/ServiceWeights/shop/cart\n") {
		t.Fatalf("diff of new weights: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// The server dry run checks each weight call the apply would make, cuts after raises, and
	// sets nothing.
	before := weights()
	if r := h.run(t, "apply", "-f", first, "--dry-run=server").ok(t); r.stdout != "ServiceWeights/shop/cart created (server dry run)\n"+
		"  cluster west: weight 100 → 0\n  endpoint 10.0.0.7 in cluster east: weight 100 → 5\n" {
		t.Fatalf("server dry run: %q", r.stdout)
	}
	if got := weights(); got != before {
		t.Fatalf("the dry run set weights: %s, was %s", got, before)
	}
	if r := h.run(t, "apply", "-f", first).ok(t); r.stdout != "ServiceWeights/shop/cart created\n" {
		t.Fatalf("first apply: %q", r.stdout)
	}
	if got, want := weights(), "east=100 east/10.0.0.7=5 east/10.0.0.8=100"; got != want {
		t.Fatalf("after apply: %s, want %s", got, want)
	}
	if r := h.run(t, "apply", "-f", first).ok(t); r.stdout != "ServiceWeights/shop/cart unchanged\n" {
		t.Fatalf("second apply: %q", r.stdout)
	}
	if r := h.run(t, "diff", "-f", first); r.code != 0 {
		t.Fatalf("diff after apply: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// Export prints the manifest apply compares with; a platform admin's export holds it whole.
	out := h.run(t, "export", "--kind", "ServiceWeights").ok(t).stdout
	for _, want := range []string{"kind: ServiceWeights", "name: cart", "namespace: shop", "west: 0", "clusterName: east", "ip: 10.0.0.7", "weight: 5"} {
		if !strings.Contains(out, want) {
			t.Errorf("export lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "targetUid") || strings.Contains(out, "setTime") || strings.Contains(out, "east: 100") {
		t.Errorf("export shows what no manifest declares:\n%s", out)
	}
	// Round trip: the export applied to another hub whose agents serve the same endpoints sets
	// the same weights, and both answer ListServiceWeights the same (but for ids and times).
	h2 := start()
	exportFile := filepath.Join(dir, "export.yaml")
	writeFile(t, exportFile, out)
	if r := h2.run(t, "apply", "-f", exportFile).ok(t); r.stdout != "ServiceWeights/shop/cart created\n" {
		t.Fatalf("apply of the export to another hub: %q", r.stdout)
	}
	if again := h2.run(t, "export", "--kind", "ServiceWeights").ok(t).stdout; again != out {
		t.Errorf("export of the rebuilt hub:\n%s\nwant:\n%s", again, out)
	}
	listWeights := func(h *hubEnv) *endpointv1.ListServiceWeightsResponse {
		t.Helper()
		res, err := endpointv1connect.NewEndpointServiceClient(http.DefaultClient, h.url, connect.WithInterceptors(bearerAuth{token: e2eToken})).
			ListServiceWeights(context.Background(), connect.NewRequest(&endpointv1.ListServiceWeightsRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		clearVolatile(res.Msg.ProtoReflect())
		return res.Msg
	}
	if a, b := listWeights(h), listWeights(h2); !proto.Equal(a, b) {
		t.Errorf("the rebuilt hub answers ListServiceWeights differently:\n%s\nwant:\n%s", prototext.Format(b), prototext.Format(a))
	}

	// The next manifest weights east and leaves out west and the endpoint: both reset.
	second := manifest("  clusterWeights: {east: 300}\n")
	if r := h.run(t, "apply", "-f", second).ok(t); r.stdout != "ServiceWeights/shop/cart configured\n" {
		t.Fatalf("apply of a change: %q", r.stdout)
	}
	if got, want := weights(), "east=300 east/10.0.0.7=300 east/10.0.0.8=300"; got != want { // an address shows its effective weight
		t.Fatalf("after the change: %s, want %s", got, want)
	}
	if out := h.run(t, "export", "--kind", "ServiceWeights").ok(t).stdout; strings.Contains(out, "west") || strings.Contains(out, "endpointWeights") {
		t.Errorf("export after the reset:\n%s", out)
	}

	// An IP the service does not serve in that cluster: the API refuses, and says where; its
	// dry run refuses alike.
	unknown := manifest("  clusterWeights: {east: 300}\n  endpointWeights:\n  - {ip: 10.9.9.9, clusterName: east, weight: 1}\n")
	r := h.run(t, "apply", "-f", unknown, "--dry-run=server")
	if r.code != 1 || !strings.Contains(r.stdout, "ServiceWeights/shop/cart configured (server dry run: refused)\n  error: not_found: service shop/cart has no endpoint 10.9.9.9 in cluster east\n") {
		t.Fatalf("server dry run of a weight of an unknown endpoint: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = h.run(t, "apply", "-f", unknown)
	if r.code == 0 || !strings.Contains(r.stderr, "error: not_found: service shop/cart has no endpoint 10.9.9.9 in cluster east") {
		t.Fatalf("weight of an unknown endpoint: exit %d\n%s", r.code, r.stderr)
	}

	// Field ownership: an apply set's weight changed with fleetctl since, and an endpoint weight
	// the set never declared, are conflicts.
	owned := manifest("  clusterWeights: {east: 300}\n")
	records := filepath.Join(dir, "records")
	run := func(cmd string, extra ...string) result {
		t.Helper()
		return h.run(t, append([]string{cmd, "-f", owned, "--applyset", "weights", "--applyset-records", records}, extra...)...)
	}
	if r := run("apply").ok(t); r.stdout != "ServiceWeights/shop/cart unchanged\n" || r.stderr != "" {
		t.Fatalf("the set's first apply: %q %q", r.stdout, r.stderr)
	}
	const source = "weights.yaml:1: document 1: ServiceWeights/shop/cart: "
	conflictCase{
		kind: "ServiceWeights",
		write: func(t *testing.T) {
			h.run(t, "endpoints", "weight", "shop/cart", "--cluster", "east", "--weight", "200").ok(t)
			h.run(t, "endpoints", "weight", "shop/cart", "--ip", "10.0.0.8", "--cluster", "east", "--weight", "7").ok(t)
		},
		written: []string{"east: 200", "weight: 7"},
		want: []string{
			source + "spec.clusterWeights.east: changed by " + otherWriter + " since this apply set last applied it; live 200, manifest 300",
			source + "spec.endpointWeights[ip=10.0.0.8].weight: set by " + otherWriter + ", not by this apply set; live 7, manifest does not set it (apply would remove it)",
		},
		forced: func(t *testing.T) {
			if got, want := weights(), "east=300 east/10.0.0.7=300 east/10.0.0.8=300"; got != want {
				t.Errorf("after --force-conflicts: %s, want %s", got, want)
			}
		},
	}.check(t, h, run)

	// Service weights carry no labels: no set records them, and prune never deletes them. The
	// set's manifests now declare a cluster instead of the weights.
	clusters := filepath.Join(dir, "clusters.yaml")
	writeFile(t, clusters, "apiVersion: fleetstream.io/v1alpha1\nkind: Cluster\nmetadata: {name: east}\n")
	if r := h.run(t, "apply", "-f", clusters, "--applyset", "weights", "--applyset-records", records, "--prune").ok(t); strings.Contains(r.stdout, "pruned") {
		t.Fatalf("prune of an apply set that declared weights:\n%s", r.stdout)
	}
	if got, want := weights(), "east=300 east/10.0.0.7=300 east/10.0.0.8=300"; got != want {
		t.Errorf("after the prune: %s, want %s", got, want)
	}
}
