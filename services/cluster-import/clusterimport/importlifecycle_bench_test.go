package clusterimport_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

// BenchmarkImport1000 imports 1,000 source objects (each with a referenced kubeconfig Secret)
// into 1,000 clusters, and compares with registering the same 1,000 clusters through
// RegisterCluster from 16 concurrent callers (what a script registering a fleet would do: the
// import is concurrent too), in the same run; then times a template change
// until all 1,000 lifecycles are rendered again. One full run per iteration: use
// -benchtime=1x.
func BenchmarkImport1000(b *testing.B) {
	const n = 1000
	for range b.N {
		b.StopTimer()
		j := testkit.StartJetStream(b)
		e := startLogged(b, j, clusterimport.Config{}, zap.NewNop())
		ctx := testkit.Context(b, 10*time.Minute)
		pc := clusterv1connect.NewImportPolicyServiceClient(testkit.BearerClient(http.DefaultClient, testToken), e.url)
		register(b, e, "mgmt", nil)
		kubeconfig := func(name string) string {
			return kubeconfigFor("https://"+name+".example:6443", "token-of-"+name+"-0123456789abcdef")
		}

		// Baseline: the same clusters (labels, kubeconfig) registered directly, concurrently.
		start := time.Now()
		var g errgroup.Group
		g.SetLimit(16)
		for i := range n {
			g.Go(func() error {
				name := fmt.Sprintf("direct-%04d", i)
				_, err := e.client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: name,
					Labels: map[string]string{"provider": "capi", "env": "prod"}, Credentials: &clusterv1.ConnectionCredentials{Kubeconfig: []byte(kubeconfig(name))}}))
				return err
			})
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
		direct := time.Since(start)

		pol := lifecyclePolicy()
		pol.NameTemplate = "imp-{{ .source.metadata.name }}"
		if _, err := pc.CreateImportPolicy(ctx, connect.NewRequest(&clusterv1.CreateImportPolicyRequest{Policy: pol})); err != nil {
			b.Fatal(err)
		}
		inv := &fakeInventory{t: b, j: j, store: events.NewStore(j.JS, "system:cluster-agent:mgmt"), cluster: "mgmt"}
		lifecycles := func() []*clusterv1.ImportLifecycle {
			res, err := pc.ListImportLifecycles(ctx, connect.NewRequest(&clusterv1.ListImportLifecyclesRequest{Policy: "capi"}))
			if err != nil {
				b.Fatal(err)
			}
			return res.Msg.Lifecycles
		}
		b.StartTimer()
		start = time.Now()
		for i := range n {
			name := fmt.Sprintf("c%04d", i)
			inv.secret(name+"-kubeconfig", kubeconfig(name))
			inv.source(name, true, map[string]string{"env": "prod"}, nil)
		}
		for {
			created := 0
			for _, lc := range lifecycles() {
				if lc.Mode == clusterv1.ImportMode_IMPORT_MODE_CREATED {
					created++
				}
			}
			if created == n {
				break
			}
			time.Sleep(20 * time.Millisecond) // paces the poll (the figure may be this much late)
		}
		imported := time.Since(start)

		// A template change reaches every lifecycle.
		pol.Template += "claims:\n  source: \"{{ .source.metadata.name }}\"\n"
		changed := time.Now()
		if _, err := pc.UpdateImportPolicy(ctx, connect.NewRequest(&clusterv1.UpdateImportPolicyRequest{Policy: pol})); err != nil {
			b.Fatal(err)
		}
		for {
			fresh := 0
			for _, lc := range lifecycles() {
				if !lc.LastRenderTime.AsTime().Before(changed) {
					fresh++
				}
			}
			if fresh == n {
				break
			}
			time.Sleep(10 * time.Millisecond) // paces the poll (the figure may be this much late)
		}
		rerender := time.Since(changed)
		b.StopTimer()
		b.ReportMetric(imported.Seconds(), "import-s")
		b.ReportMetric(direct.Seconds(), "register-s")
		b.ReportMetric(direct.Seconds()/imported.Seconds(), "ratio")
		b.ReportMetric(float64(rerender.Milliseconds()), "rerender-ms")
		e.stop()
	}
}
