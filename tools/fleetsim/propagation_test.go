package main

import (
	"math"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

func histogram(count uint64, buckets map[float64]uint64) *dto.Histogram {
	h := &dto.Histogram{SampleCount: proto.Uint64(count)}
	for _, ub := range []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30} {
		h.Bucket = append(h.Bucket, &dto.Bucket{UpperBound: proto.Float64(ub), CumulativeCount: proto.Uint64(buckets[ub])})
	}
	return h
}

// The estimates are Prometheus' histogram_quantile's on the same buckets.
func TestQuantile(t *testing.T) {
	// 100 observations: 50 within 0.1 s, 90 within 0.5 s, 99 within 2 s, one past 30 s.
	h := histogram(100, map[float64]uint64{0.05: 0, 0.1: 50, 0.25: 60, 0.5: 90, 1: 95, 2: 99, 5: 99, 10: 99, 30: 99})
	for _, tt := range []struct {
		q, want float64
	}{
		{0.5, 0.1},            // the 50th is the 0.1 bucket's last
		{0.25, 0.075},         // half way through (0.05, 0.1]
		{0.99, 2},             // the 99th is the 2 s bucket's last
		{0.995, 30},           // past the last finite bucket: its bound
		{0.92, 0.5 + 0.5*2/5}, // 2 of the 5 in (0.5, 1]
	} {
		if got := histogramQuantile(tt.q, h); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("histogramQuantile(%g) = %g, want %g", tt.q, got, tt.want)
		}
	}
	mf := &dto.MetricFamily{Metric: []*dto.Metric{
		{Label: []*dto.LabelPair{{Name: proto.String("kind"), Value: proto.String("revoke")}}, Histogram: h},
		{Label: []*dto.LabelPair{{Name: proto.String("kind"), Value: proto.String("grant")}}, Histogram: histogram(0, nil)},
	}}
	got := propagationOf(mf)
	if len(got) != 1 || got[0].Kind != "revoke" || got[0].Count != 100 || got[0].WithinGoal != 0.99 {
		t.Fatalf("propagationOf: %+v, want revoke only (grant has no samples), 100, 99%% within 2 s", got)
	}
}
