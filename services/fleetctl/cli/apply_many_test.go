package cli

import (
	"bytes"
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
)

// countingProjects is a ProjectService that binds every namespace after a short pause and
// records how many binds were in flight at once.
type countingProjects struct {
	projectv1connect.UnimplementedProjectServiceHandler
	inFlight, maxInFlight, binds atomic.Int64
	mu                           sync.Mutex
	seen                         map[string]bool
}

func (c *countingProjects) ListProjects(context.Context, *connect.Request[projectv1.ListProjectsRequest]) (*connect.Response[projectv1.ListProjectsResponse], error) {
	return connect.NewResponse(&projectv1.ListProjectsResponse{Projects: []*projectv1.Project{{Name: "big"}}}), nil
}

func (c *countingProjects) ListNamespaceBindings(context.Context, *connect.Request[projectv1.ListNamespaceBindingsRequest]) (*connect.Response[projectv1.ListNamespaceBindingsResponse], error) {
	return connect.NewResponse(&projectv1.ListNamespaceBindingsResponse{}), nil
}

func (c *countingProjects) BindNamespace(_ context.Context, req *connect.Request[projectv1.BindNamespaceRequest]) (*connect.Response[projectv1.BindNamespaceResponse], error) {
	n := c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
	for {
		m := c.maxInFlight.Load()
		if n <= m || c.maxInFlight.CompareAndSwap(m, n) {
			break
		}
	}
	time.Sleep(100 * time.Microsecond)
	c.binds.Add(1)
	c.mu.Lock()
	c.seen[req.Msg.Cluster+"/"+req.Msg.Namespace] = true
	c.mu.Unlock()
	return connect.NewResponse(&projectv1.BindNamespaceResponse{}), nil
}

// TestApplyTenThousandDocuments: a file of 10,000 documents is applied with bounded
// concurrency (never more binds in flight than --concurrency), every object once, with a
// progress line.
func TestApplyTenThousandDocuments(t *testing.T) {
	const n = 10000
	svc := &countingProjects{seen: map[string]bool{}}
	_, h := projectv1connect.NewProjectServiceHandler(svc)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	var m strings.Builder
	for i := range n {
		fmt.Fprintf(&m, "---\napiVersion: fleetstream.io/v1alpha1\nkind: NamespaceBinding\nmetadata: {name: ns-%d, project: big}\nspec: {cluster: c%d}\n", i/100, i%100)
	}
	file := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(file, []byte(m.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	start := time.Now()
	code := Run(context.Background(), IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut},
		[]string{"--server", srv.URL, "apply", "-f", file, "--concurrency", "8"})
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, errOut.String())
	}
	t.Logf("%d documents applied in %v", n, time.Since(start))
	if got := strings.Count(out.String(), " created\n"); got != n {
		t.Errorf("%d objects reported created, want %d", got, n)
	}
	if svc.binds.Load() != n || len(svc.seen) != n {
		t.Errorf("%d binds of %d namespaces, want %d of %d", svc.binds.Load(), len(svc.seen), n, n)
	}
	if max := svc.maxInFlight.Load(); max > 8 || max < 2 {
		t.Errorf("at most %d binds in flight, want 2 to 8", max)
	}
	if !strings.Contains(errOut.String(), fmt.Sprintf("applied %d of %d objects\n", n, n)) {
		t.Errorf("no final progress line:\n%s", errOut.String())
	}
}
