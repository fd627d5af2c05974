package fleetd_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/zap"

	"github.com/fleetstream/fleetstream/pkg/authz"
	"github.com/fleetstream/fleetstream/pkg/events"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
)

// allowAll is the authorization layer taken out: the baseline of BenchmarkAuthorizationCost.
type allowAll struct{}

func (allowAll) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc { return next }
func (allowAll) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}
func (allowAll) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// BenchmarkAuthorizationCost: GetServiceEndpoints requests/s of a project viewer (the
// namespace-scoped check: owners of the namespace, the caller's rules there) through fleetd's
// server, against the same collector mounted on a second server whose authorization layer
// lets everything through. Same token authentication, client and concurrency, windows
// interleaved in one run. The bar: ratio ≥ 0.95.
func BenchmarkAuthorizationCost(b *testing.B) {
	const (
		conc   = 16
		dur    = 400 * time.Millisecond
		rounds = 20
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inst, tokens := startBenchFleet(ctx, b, "token-admin,admin\ntoken-viewer,viewer\n", testkit.Logger(b))
	setup := func(proc, body string) {
		r, err := post("http://"+inst.Addr+proc, "token-admin", body)
		if err != nil || r.StatusCode != 200 {
			b.Fatalf("%s: %v %v", proc, r, err)
		}
		r.Body.Close()
	}
	// The viewer's project owns bench on both clusters that report it: the collector merges an
	// owned namespace's endpoints only from the clusters where the project owns it.
	setup("/fleetstream.project.v1.ProjectService/CreateProject", `{"name":"team-a"}`)
	for _, cl := range []string{"east", "west"} {
		setup("/fleetstream.cluster.v1.ClusterService/RegisterCluster", `{"name":"`+cl+`"}`)
		setup("/fleetstream.project.v1.ProjectService/BindNamespace", `{"project":"team-a","cluster":"`+cl+`","namespace":"bench"}`)
	}
	setup("/fleetstream.rbac.v1.RBACService/BindProjectRole", grantBody("team-a", "SUBJECT_KIND_USER", "viewer", "project-viewer"))
	// The same service in a namespace no project owns, for the baseline: without an
	// authorized caller the collector serves an owned namespace to nobody (whose project's view
	// would it be?), so the layer is taken out where it has nothing to decide. Same collector,
	// same ownership lookup, a response of the same size ("plain" is as long as "bench").
	reportCart(ctx, b, inst, "bench")
	reportCart(ctx, b, inst, "plain")
	// The baseline: the same collector and authentication, no authorization.
	bare, err := server.New(server.Config{TokenFile: tokens}, testkit.Logger(b))
	if err != nil {
		b.Fatal(err)
	}
	bare.Authorize(allowAll{})
	inst.Endpoints.Mount(bare)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = bare.ServeListener(ctx, ln) }()

	const proc = "/fleetstream.endpoint.v1.EndpointService/GetServiceEndpoints"
	ours, base := "http://"+inst.Addr+proc, "http://"+ln.Addr().String()+proc
	bodies := map[string]string{ours: `{"namespace":"bench","name":"cart"}`, base: `{"namespace":"plain","name":"cart"}`}
	for _, u := range []string{ours, base} {
		testkit.Eventually(b, 10*time.Second, func() error {
			r, err := post(u, "token-viewer", bodies[u])
			if err != nil {
				return err
			}
			defer r.Body.Close()
			data, _ := io.ReadAll(r.Body)
			if r.StatusCode != 200 || !strings.Contains(string(data), `"west"`) {
				return fmt.Errorf("%d %s", r.StatusCode, data)
			}
			return nil
		})
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc, DisableCompression: true}}
	run := func(url string) float64 {
		var n atomic.Int64
		stop := time.Now().Add(dur)
		var wg sync.WaitGroup
		for range conc {
			wg.Go(func() {
				for time.Now().Before(stop) {
					req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(bodies[url]))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Authorization", "Bearer token-viewer")
					r, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, r.Body)
					r.Body.Close()
					if r.StatusCode != 200 {
						b.Errorf("status %d", r.StatusCode)
						return
					}
					n.Add(1)
				}
			})
		}
		wg.Wait()
		return float64(n.Load()) / dur.Seconds()
	}
	for range b.N {
		// Each round measures both back to back (alternating which goes first) and yields one
		// ratio; the median of the rounds' ratios shrugs off a round a neighbour disturbed.
		var with, without float64
		ratios := make([]float64, 0, rounds)
		for i := range rounds {
			var w, wo float64
			if i%2 == 0 {
				wo = run(base)
				w = run(ours)
			} else {
				w = run(ours)
				wo = run(base)
			}
			with, without = with+w, without+wo
			ratios = append(ratios, w/wo)
		}
		slices.Sort(ratios)
		b.ReportMetric(with/rounds, "req/s")
		b.ReportMetric(without/rounds, "noauthz-req/s")
		b.ReportMetric((ratios[rounds/2-1]+ratios[rounds/2])/2, "median-ratio")
		b.ReportMetric(with/without, "ratio")
	}
}

func post(url, token, body string) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader([]byte(body)))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	return http.DefaultClient.Do(req)
}

// startBenchFleet starts fleetd for a benchmark with the given token file content (admin is
// the platform admin) and waits until it is ready.
func startBenchFleet(ctx context.Context, b *testing.B, tokenLines string, log *zap.Logger) (*fleetd.Instance, string) {
	b.Helper()
	dir := b.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte(tokenLines), 0o600); err != nil {
		b.Fatal(err)
	}
	inst, err := fleetd.Start(ctx, fleetd.Config{
		DataDir: filepath.Join(dir, "data"), NATSListen: "127.0.0.1:0",
		Server:        server.Config{Listen: "127.0.0.1:0", TokenFile: tokens},
		Authz:         authz.Config{PlatformAdmins: []string{"admin"}},
		ClusterImport: clusterimport.Config{PlaintextCredentials: true},
	}, log)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(inst.Stop)
	<-inst.Ready()
	return inst, tokens
}

// reportCart reports service ns/cart on clusters east and west, ten endpoints each, as their
// agents would.
func reportCart(ctx context.Context, b *testing.B, inst *fleetd.Instance, ns string) {
	b.Helper()
	for _, cl := range []string{"east", "west"} {
		rep := &endpointv1.EndpointSliceReport{ClusterName: cl, Namespace: ns, Service: "cart", Slice: "cart-" + cl, AddressType: "IPv4",
			SessionId: "bench", Generation: 1, Ports: []*endpointv1.EndpointPort{{Name: "http", Port: 8080, Protocol: "TCP"}}}
		for i := range 10 {
			rep.Endpoints = append(rep.Endpoints, &endpointv1.Endpoint{Addresses: []string{fmt.Sprintf("10.0.%d.%d", len(cl), i)}, Ready: true, Serving: true})
		}
		if _, err := events.NewStore(inst.JS, "bench").Append(ctx, subjects.AgentEndpointSlice(cl, ns, rep.Slice), cl, events.Any, rep); err != nil {
			b.Fatal(err)
		}
	}
}
