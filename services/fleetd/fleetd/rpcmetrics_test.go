package fleetd_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"connectrpc.com/connect"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
)

// The RPC metrics say what kind of caller called, never who: a user, one of Fleetstream's own
// services (a system: identity of the token file), or a caller refused before it was known.
// Each call below moves exactly its kind's series, and no series carries a caller's name.
func TestRPCMetricsLabelTheCallerKindNotTheCaller(t *testing.T) {
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(apiToken+",admin\ntoken-bob,bob\ntoken-svc,system:test-exporter\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	inst, _ := startFleetd(t, func(c *fleetd.Config) { c.Server.TokenFile = tokens })
	const procedure = clusterv1connect.ClusterServiceListClustersProcedure
	count := func(caller string) float64 {
		t.Helper()
		var n float64
		mfs, err := inst.Metrics.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "fleetstream_rpc_requests_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				for _, v := range labels {
					if v == "admin" || v == "bob" || v == "system:test-exporter" {
						t.Fatalf("a series names its caller: %v", labels)
					}
				}
				if labels["procedure"] == procedure && labels["caller"] == caller {
					n += m.GetCounter().GetValue()
				}
			}
		}
		return n
	}
	call := func(token string) {
		t.Helper()
		c := clusterv1connect.NewClusterServiceClient(http.DefaultClient, "http://"+inst.Addr)
		req := connect.NewRequest(&clusterv1.ListClustersRequest{})
		if token != "" {
			req.Header().Set("Authorization", "Bearer "+token)
		}
		_, _ = c.ListClusters(context.Background(), req) // a denial is counted as well
	}
	kinds := []string{"user", "service", "unauthenticated", "anonymous"}
	for _, tc := range []struct {
		name, token, want string
	}{
		{"platform admin", apiToken, "user"},
		{"a user", "token-bob", "user"},
		{"a service", "token-svc", "service"},
		{"a wrong token", "token-nobody", "unauthenticated"},
		{"no token", "", "unauthenticated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := map[string]float64{}
			for _, k := range kinds {
				before[k] = count(k)
			}
			call(tc.token)
			for _, k := range kinds {
				want := before[k]
				if k == tc.want {
					want++
				}
				if got := count(k); got != want {
					t.Errorf("caller=%q: %g calls, want %g", k, got, want)
				}
			}
			if h := testkit.Histogram(t, inst.Metrics, "fleetstream_rpc_duration_seconds", "caller", tc.want); h.GetSampleCount() == 0 {
				t.Errorf("no duration observed for caller=%q", tc.want)
			}
		})
	}
}

// Under --insecure-dev nobody is authenticated: every call is an anonymous caller's.
func TestRPCMetricsCountInsecureDevCallersAsAnonymous(t *testing.T) {
	inst, _ := startFleetd(t, func(c *fleetd.Config) { c.Server.TokenFile, c.Server.InsecureDev = "", true })
	c := clusterv1connect.NewClusterServiceClient(http.DefaultClient, "http://"+inst.Addr)
	if _, err := c.ListClusters(context.Background(), connect.NewRequest(&clusterv1.ListClustersRequest{})); err != nil {
		t.Fatal(err)
	}
	if h := testkit.Histogram(t, inst.Metrics, "fleetstream_rpc_duration_seconds", "caller", "anonymous"); h.GetSampleCount() != 1 {
		t.Fatalf("%d anonymous calls timed, want 1", h.GetSampleCount())
	}
}
