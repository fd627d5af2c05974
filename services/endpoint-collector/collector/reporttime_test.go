package collector

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// Report → served: a live EndpointSlice report is timed from its stream time to the snapshot
// that takes it in being served, once; a report the collector replays at start (written while
// it was down) is not timed, its age being the downtime, not the collector's work.
func TestReportToServedIsTimedFromTheReport(t *testing.T) {
	const name = "fleetstream_endpoint_report_served_seconds"
	js := testkit.StartJetStream(t)
	if _, err := New(testkit.Context(t, 10*time.Second), js.JS, Config{}, testkit.Logger(t)); err != nil { // the topology
		t.Fatal(err)
	}
	a := newFakeAgent(t, js.JS, "A", "c_1")
	a.report("shop", "cart", "cart-a", http8080, ep{ip: "10.0.0.1", conds: "RS"}) // before the collector runs
	h := startCollector(t, js.JS, Config{})
	reg := prometheus.NewRegistry()
	reg.MustRegister(h.c.metrics.served)
	h.eventually("shop", "cart", ready, "A[10.0.0.1:8080]")
	if hist := testkit.Histogram(t, reg, name, "", ""); hist.GetSampleCount() != 0 {
		t.Fatalf("a report replayed at start was timed: %d observations", hist.GetSampleCount())
	}

	t0 := testkit.WallNow()
	a.report("shop", "cart", "cart-a", http8080, ep{ip: "10.0.0.2", conds: "RS"})
	h.eventually("shop", "cart", ready, "A[10.0.0.2:8080]")
	most := testkit.WallSince(t0).Seconds()
	testkit.Eventually(t, 5*time.Second, func() error {
		if n := testkit.Histogram(t, reg, name, "", "").GetSampleCount(); n != 1 {
			return fmt.Errorf("%d observations, want 1", n)
		}
		return nil
	})
	testkit.CheckObservation(t, "the report served", testkit.Histogram(t, reg, name, "", ""), 0, most)
}
