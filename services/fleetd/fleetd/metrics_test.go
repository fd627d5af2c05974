package fleetd_test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/fleetstream/fleetstream/pkg/metriccatalog"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
	"github.com/fleetstream/fleetstream/services/gateway/gateway"
	"github.com/fleetstream/fleetstream/services/kube-bridge/kubebridge"
)

// catalogueEnv, when set, is where TestMetricCatalogue writes the catalogue instead of
// comparing it with docs/metrics.md (`make generate` and `make check-generated` set it).
const catalogueEnv = "METRIC_CATALOGUE_OUT"

// TestMetricCatalogue builds the catalogue from the collectors a running fleetd (with its xDS
// server) and a gateway register, checks every metric against the naming and help policy, and
// fails while docs/metrics.md differs from it: an operator reads the catalogue to write alerts.
func TestMetricCatalogue(t *testing.T) {
	inst, _ := startFleetd(t, func(c *fleetd.Config) { c.XDSListen = "127.0.0.1:0" })
	gs, err := server.New(server.Config{InsecureDev: true}, testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gateway.New(gateway.Config{Routes: map[string]string{"fleetstream.endpoint.v1.EndpointService": "http://" + inst.Addr},
		PollInterval: time.Second}, gs.Authenticator(), gs.Registry(), testkit.Logger(t)); err != nil {
		t.Fatal(err)
	}
	// The kube bridge's queues, which fleetd exports with --kube-bridge-kubeconfig: a bridge
	// built (not run, so the hub named is never dialled) for its collectors.
	bridge, err := kubebridge.New(kubebridge.Config{Kubeconfig: "unused"}, nil, &rest.Config{Host: "https://127.0.0.1:1"}, testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	ms, err := metriccatalog.Describe(slices.Concat(inst.Metrics.Collectors(), gs.Registry().Collectors(), bridge.Collectors()))
	if err != nil {
		t.Fatal(err)
	}
	if err := metriccatalog.Check(ms); err != nil {
		t.Error(err)
	}
	doc := metriccatalog.Render(ms)
	if out := os.Getenv(catalogueEnv); out != "" {
		if err := os.WriteFile(out, doc, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	path := filepath.Join("..", "..", "..", "docs", "metrics.md")
	have, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v: run 'make generate' and commit the result", err)
	}
	if !bytes.Equal(have, doc) {
		t.Errorf("docs/metrics.md is stale: run 'make generate' and commit the result; it should read:\n%s", doc)
	}
}
