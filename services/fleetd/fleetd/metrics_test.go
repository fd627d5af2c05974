package fleetd_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetstream/fleetstream/pkg/metriccatalog"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
	"github.com/fleetstream/fleetstream/services/gateway/gateway"
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
	ms, err := metriccatalog.Describe(append(inst.Metrics.Collectors(), gs.Registry().Collectors()...))
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
