package clusterimport_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sync/errgroup"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/paging"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

// TestFirstPageOfManyClusters measures issue 32's scale goal for the Fleet page's list: with
// 1,000 clusters (the figure; registering them takes ~1 s, so it runs by default;
// FLEETSTREAM_PAGING_CLUSTERS sets another count), the first page of ListClusters, as fleetctl
// asks for it (the default 500, protobuf) and as the console does (1,000, Connect JSON),
// answers in well under a second.
func TestFirstPageOfManyClusters(t *testing.T) {
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("FLEETSTREAM_PAGING_CLUSTERS")); err == nil && v > 0 {
		n = v
	}
	e := start(t, nil, clusterimport.Config{})
	ctx := testkit.Context(t, 10*time.Minute)
	began := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := range n {
		g.Go(func() error {
			_, err := e.client.RegisterCluster(gctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: fmt.Sprintf("c%05d", i),
				Labels: map[string]string{"env": []string{"prod", "dev"}[i%2], "region": fmt.Sprintf("r%d", i%10)}}))
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d clusters registered in %v", n, time.Since(began).Round(time.Millisecond))
	measure := func(name string, want int, call func() (int, error)) {
		t.Helper()
		var took []time.Duration
		for range 20 {
			start := time.Now()
			got, err := call()
			took = append(took, time.Since(start))
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if got != want {
				t.Fatalf("%s: first page of %d, want %d", name, got, want)
			}
		}
		slices.Sort(took)
		t.Logf("%s: first page of %d in %v (p50), %v (slowest of 20)", name, want, took[len(took)/2].Round(100*time.Microsecond), took[len(took)-1].Round(100*time.Microsecond))
		if took[len(took)-1] > time.Second {
			t.Errorf("%s: the first page took %v, over a second", name, took[len(took)-1])
		}
	}
	measure("default page (protobuf)", min(n, paging.DefaultSize), func() (int, error) {
		res, err := e.client.ListClusters(ctx, connect.NewRequest(&clusterv1.ListClustersRequest{}))
		if err != nil {
			return 0, err
		}
		return len(res.Msg.Clusters), nil
	})
	json := func(body string) func() (int, error) {
		return func() (int, error) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/fleetstream.cluster.v1.ClusterService/ListClusters", bytes.NewBufferString(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+testToken)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				return 0, err
			}
			defer res.Body.Close()
			data, err := io.ReadAll(res.Body)
			if err != nil || res.StatusCode != http.StatusOK {
				return 0, fmt.Errorf("HTTP %d %s %v", res.StatusCode, data, err)
			}
			return bytes.Count(data, []byte(`"name":"c0`)), nil
		}
	}
	measure("1,000 (Connect JSON, as the console asks)", min(n, paging.MaxSize), json(`{"pageSize":1000}`))
	measure("selector env=prod, 1,000 (Connect JSON)", min((n+1)/2, paging.MaxSize), json(`{"labelSelector":"env=prod","pageSize":1000}`))
}
