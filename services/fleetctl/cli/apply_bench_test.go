package cli

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
)

// BenchmarkApplyNamespaceBindings compares `fleetctl apply` of 1,000 namespace bindings over
// 100 clusters with the same binds made straight through the API by 16 concurrent callers (the
// concurrency apply uses by default; FLEETCTL_BENCH_WORKERS changes both), on one hub in the
// same run. Each round binds fresh
// namespaces in two fresh projects; the sides alternate which runs first. Reported: both
// times and apply's ratio to the API (issue 30 asks for at most 1.5).
func BenchmarkApplyNamespaceBindings(b *testing.B) {
	const (
		clusters   = 100
		namespaces = 10 // per cluster: 1,000 bindings
	)
	// Both sides' concurrency: 16, apply's default, unless FLEETCTL_BENCH_WORKERS says.
	workers := 16
	if v, err := strconv.Atoi(os.Getenv("FLEETCTL_BENCH_WORKERS")); err == nil && v > 0 {
		workers = v
	}
	h := startHub(b)
	ctx := context.Background()
	opt := connect.WithInterceptors(bearerAuth{token: e2eToken})
	cl := clusterv1connect.NewClusterServiceClient(http.DefaultClient, h.url, opt)
	pr := projectv1connect.NewProjectServiceClient(http.DefaultClient, h.url, opt)
	parallel := func(n int, fn func(i int) error) error {
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			firstErr error
		)
		next := make(chan int)
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					if err := fn(i); err != nil {
						mu.Lock()
						firstErr = err
						mu.Unlock()
					}
				}
			}()
		}
		for i := range n {
			next <- i
		}
		close(next)
		wg.Wait()
		return firstErr
	}
	if err := parallel(clusters, func(i int) error {
		_, err := cl.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: fmt.Sprintf("c%03d", i)}))
		return err
	}); err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	var apiTotal, applyTotal time.Duration
	for round := 0; round < b.N; round++ {
		apiProject, applyProject := fmt.Sprintf("api-%d", round), fmt.Sprintf("apply-%d", round)
		for _, p := range []string{apiProject, applyProject} {
			if _, err := pr.CreateProject(ctx, connect.NewRequest(&projectv1.CreateProjectRequest{Name: p})); err != nil {
				b.Fatal(err)
			}
		}
		var m strings.Builder
		for i := range clusters * namespaces {
			fmt.Fprintf(&m, "---\napiVersion: fleetstream.io/v1alpha1\nkind: NamespaceBinding\nmetadata: {name: %s-%d, project: %s}\nspec: {cluster: c%03d}\n", applyProject, i/clusters, applyProject, i%clusters)
		}
		file := filepath.Join(dir, fmt.Sprintf("round-%d.yaml", round))
		if err := os.WriteFile(file, []byte(m.String()), 0o600); err != nil {
			b.Fatal(err)
		}
		// apply's own overhead: decoding, the plan's List calls, the plan.
		{
			start := time.Now()
			var out, errOut bytes.Buffer
			if code := Run(ctx, IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut},
				[]string{"--server", h.url, "--token", e2eToken, "apply", "-f", file, "--dry-run"}); code != 0 {
				b.Fatalf("apply --dry-run: exit %d\n%s", code, errOut.String())
			}
			b.Logf("round %d: apply --dry-run of %d manifests took %v", round, clusters*namespaces, time.Since(start))
		}
		viaAPI := func() time.Duration {
			start := time.Now()
			if err := parallel(clusters*namespaces, func(i int) error {
				_, err := pr.BindNamespace(ctx, connect.NewRequest(&projectv1.BindNamespaceRequest{
					Project: apiProject, Cluster: fmt.Sprintf("c%03d", i%clusters), Namespace: fmt.Sprintf("%s-%d", apiProject, i/clusters)}))
				return err
			}); err != nil {
				b.Fatal(err)
			}
			return time.Since(start)
		}
		viaApply := func() time.Duration {
			start := time.Now()
			var out, errOut bytes.Buffer
			code := Run(ctx, IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut},
				[]string{"--server", h.url, "--token", e2eToken, "apply", "-f", file, "--concurrency", fmt.Sprint(workers)})
			d := time.Since(start)
			if code != 0 || strings.Count(out.String(), " created\n") != clusters*namespaces {
				b.Fatalf("apply: exit %d, %d created\n%s", code, strings.Count(out.String(), " created\n"), errOut.String())
			}
			return d
		}
		if round%2 == 0 {
			apiTotal += viaAPI()
			applyTotal += viaApply()
		} else {
			applyTotal += viaApply()
			apiTotal += viaAPI()
		}
	}
	b.ReportMetric(apiTotal.Seconds()/float64(b.N), "api-s/op")
	b.ReportMetric(applyTotal.Seconds()/float64(b.N), "apply-s/op")
	b.ReportMetric(applyTotal.Seconds()/apiTotal.Seconds(), "apply/api")
}
