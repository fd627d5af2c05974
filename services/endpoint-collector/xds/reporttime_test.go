package xds

import (
	"fmt"
	"testing"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/collector"
)

// Report → pushed over xDS: an agent's EndpointSlice report is timed from its stream time to
// the xDS caches handing the changed assignment to the open streams, once per change, before
// the subscribed client has it; a report that changes no assignment (the same endpoints again)
// is not timed.
func TestReportToXDSPushIsTimedFromTheReport(t *testing.T) {
	const name = "fleetstream_endpoint_report_pushed_seconds"
	h := startHarness(t, collector.Config{StaleAfter: time.Minute, EvictAfter: time.Hour}, testkit.Logger(t))
	reg := prometheus.NewRegistry()
	reg.MustRegister(h.xds.pushed)
	count := func() uint64 { return testkit.Histogram(t, reg, name, "", "").GetSampleCount() }
	east := newAgent(t, h.js, "east")
	east.startHeartbeats(100 * time.Millisecond)
	ads := newADSClient(t, dial(t, h.addr, tokenReader))
	ads.subscribe(resourcev3.EndpointType, claName)

	t0 := testkit.WallNow()
	east.report("shop", "cart", "cart-e1", 9000, pod{"10.0.1.1", "R", "a"})
	eventually(t, 10*time.Second, func() error {
		s, err := ads.assignment(claName)
		if err != nil {
			return err
		}
		if s != "east/a@100[10.0.1.1:9000 w100 HEALTHY]" {
			return fmt.Errorf("assignment %s", s)
		}
		return nil
	})
	most := testkit.WallSince(t0).Seconds()
	if n := count(); n != 1 {
		t.Fatalf("%d pushes timed once the client has the assignment, want 1", n)
	}
	testkit.CheckObservation(t, "the report pushed", testkit.Histogram(t, reg, name, "", ""), 0, most)

	// The same endpoints reported again: nothing to push, nothing timed.
	east.report("shop", "cart", "cart-e1", 9000, pod{"10.0.1.1", "R", "a"})
	time.Sleep(500 * time.Millisecond)
	if n := count(); n != 1 {
		t.Fatalf("a report that changed no assignment timed a push: %d observations", n)
	}
}
