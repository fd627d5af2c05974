package testkit

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Histogram returns the series of histogram name whose label has value, as /metrics would
// serve it from g (nil: no such series yet). An empty label reads the series without labels.
func Histogram(t testing.TB, g prometheus.Gatherer, name, label, value string) *dto.Histogram {
	t.Helper()
	return series(t, g, name, label, value).GetHistogram()
}

// Gauge returns the value of the series of gauge name whose label has value, as /metrics would
// serve it from g, and whether there is such a series. An empty label reads the series
// without labels.
func Gauge(t testing.TB, g prometheus.Gatherer, name, label, value string) (float64, bool) {
	t.Helper()
	m := series(t, g, name, label, value)
	if m == nil {
		return 0, false
	}
	return m.GetGauge().GetValue(), true
}

// Counter returns the value of the series of counter name whose label has value (0 while
// there is none: a counter not yet incremented). An empty label reads the series without
// labels.
func Counter(t testing.TB, g prometheus.Gatherer, name, label, value string) float64 {
	t.Helper()
	return series(t, g, name, label, value).GetCounter().GetValue()
}

func series(t testing.TB, g prometheus.Gatherer, name, label, value string) *dto.Metric {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" && len(m.GetLabel()) == 0 {
				return m
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m
				}
			}
		}
	}
	return nil
}

// CheckObservation checks that h holds exactly one observation, between least and most
// seconds, counted in every bucket whose bound is at least it and in no other.
func CheckObservation(t testing.TB, what string, h *dto.Histogram, least, most float64) {
	t.Helper()
	if h.GetSampleCount() != 1 {
		t.Fatalf("%s: %d observations, want 1", what, h.GetSampleCount())
	}
	v := h.GetSampleSum()
	if v < least || v > most {
		t.Fatalf("%s took %.3fs by the histogram, want within [%.3f, %.3f]", what, v, least, most)
	}
	for _, b := range h.GetBucket() {
		in := uint64(0)
		if v <= b.GetUpperBound() {
			in = 1
		}
		if b.GetCumulativeCount() != in {
			t.Fatalf("%s: %.3fs counted %d up to le=%g", what, v, b.GetCumulativeCount(), b.GetUpperBound())
		}
	}
}

// WallNow is time.Now without its monotonic reading. A span that is compared with one starting
// at a NATS message's time (a wall-clock time) must be measured on the wall clock too: the two
// clocks drift apart while the wall clock is slewed.
func WallNow() time.Time { return time.Now().Round(0) }

// WallSince is the wall-clock time since t.
func WallSince(t time.Time) time.Duration { return WallNow().Sub(t.Round(0)) }
