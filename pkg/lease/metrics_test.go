package lease_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetstream/fleetstream/pkg/lease"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// fleetstream_lease_leading: the holder reports 1, a contender standing by 0; once the holder
// stops, the one that takes over reports 1 and the stopped one 0. Each replica has its own
// registry, as each process does; a second Register on one registry adopts the first gauge.
func TestLeaseLeadingGauge(t *testing.T) {
	j := testkit.StartJetStream(t)
	w := newWork(t)
	ttl := 3 * time.Second
	regA, regB := prometheus.NewRegistry(), prometheus.NewRegistry()
	mA, mB := lease.NewMetrics(), lease.NewMetrics()
	for _, r := range []struct {
		m   *lease.Metrics
		reg *prometheus.Registry
	}{{mA, regA}, {mB, regB}, {lease.NewMetrics(), regB}} {
		if err := r.m.Register(r.reg); err != nil {
			t.Fatal(err)
		}
	}
	leading := func(reg *prometheus.Registry) string {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "lease" && l.GetValue() == "test.lease" {
						if m.GetGauge().GetValue() == 1 {
							return "1"
						}
						return "0"
					}
				}
			}
		}
		return "none"
	}
	_, jsA := j.Connect(t)
	a := start(t, jsA, "a", ttl, w.fn("a", nil), lease.WithMetrics(mA))
	if got := waitStart(t, w, 5*time.Second); got != "a" {
		t.Fatalf("first holder %s", got)
	}
	_, jsB := j.Connect(t)
	start(t, jsB, "b", ttl, w.fn("b", nil), lease.WithMetrics(mB))
	testkit.Eventually(t, 5*time.Second, func() error {
		if a, b := leading(regA), leading(regB); a != "1" || b != "0" {
			return fmt.Errorf("holder a reports %s, standby b %s; want 1 and 0", a, b)
		}
		return nil
	})
	a.stop(t)
	if got := waitStart(t, w, ttl); got != "b" {
		t.Fatalf("next holder %s", got)
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		if a, b := leading(regA), leading(regB); a != "0" || b != "1" {
			return fmt.Errorf("stopped a reports %s, holder b %s; want 0 and 1", a, b)
		}
		return nil
	})
}
