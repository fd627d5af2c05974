package slo

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
)

func applied(rev uint64) *desiredv1.AppliedStatus {
	return &desiredv1.AppliedStatus{DesiredRevision: rev, Phase: desiredv1.Phase_PHASE_APPLIED}
}

// A key written twice before it is applied is measured from the first change, once; a failure
// keeps it pending; a resync's write (no change time) and a forgotten key are not measured.
func TestPropagation(t *testing.T) {
	p := NewPropagation()
	t0 := time.Unix(1000, 0)
	now := t0
	p.now = func() time.Time { return now }

	p.Written("c1.RoleBinding.web.dev", 5, "grant", t0)
	p.Written("c1.RoleBinding.web.dev", 7, "grant", t0.Add(time.Second))
	p.Reported("c1.RoleBinding.web.dev", &desiredv1.AppliedStatus{DesiredRevision: 7, Phase: desiredv1.Phase_PHASE_FAILED})
	p.Reported("c1.RoleBinding.web.dev", applied(5)) // the older object: not yet
	now = t0.Add(1500 * time.Millisecond)
	p.Reported("c1.RoleBinding.web.dev", applied(7))
	p.Reported("c1.RoleBinding.web.dev", applied(7)) // the same status again: already taken

	p.Written("c1.ClusterRole..dev", 3, "grant", time.Time{})
	p.Reported("c1.ClusterRole..dev", applied(3))
	p.Written("c2.ClusterRole..dev", 4, "revoke", t0)
	p.Forget("c2.ClusterRole..dev")
	p.Reported("c2.ClusterRole..dev", applied(4))

	if n := testutil.CollectAndCount(p.hist); n != 1 {
		t.Fatalf("%d series, want grant only", n)
	}
	var m dto.Metric
	if err := p.hist.WithLabelValues("grant").(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	if h := m.GetHistogram(); h.GetSampleCount() != 1 || h.GetSampleSum() != 1.5 {
		t.Fatalf("grant: %d observations summing %gs, want one of 1.5s (from the first write)", h.GetSampleCount(), h.GetSampleSum())
	}
}

// Two services of one process (fleetd) share the histogram: both register, both observe.
func TestPropagationSharedByServices(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, b := NewPropagation(), NewPropagation()
	for _, p := range []*Propagation{a, b} {
		if err := p.Register(reg); err != nil {
			t.Fatal(err)
		}
	}
	a.Written("k", 1, "grant", time.Now())
	a.Reported("k", applied(1))
	b.Written("k", 1, "bind", time.Now())
	b.Reported("k", applied(1))
	if n := testutil.CollectAndCount(reg, "fleetstream_propagation_duration_seconds"); n != 2 {
		t.Fatalf("%d series on the registry, want grant and bind", n)
	}
}
