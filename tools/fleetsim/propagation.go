package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// propagationMetric is the hub's own measure of its propagation promise (pkg/slo): from a
// change until the agent's applied status for the desired object it produced, by kind.
const propagationMetric = "fleetstream_propagation_duration_seconds"

// PropagationResult is that histogram as the hub holds it when the scenarios end, by kind of
// change: what an operator's dashboard shows for the run (docs/operations.md, the propagation
// SLO), beside fleetsim's own end-to-end figures. A hub restarted by the storm starts its
// histogram again, so with -fleetd and storm it covers the changes after the restart.
type PropagationResult struct {
	Kind  string `json:"kind"`
	Count uint64 `json:"count"`
	// P50 and P99 are estimated from the buckets as Prometheus' histogram_quantile does (linear
	// within a bucket; past the last finite bound, that bound), in seconds.
	P50 float64 `json:"p50_seconds"`
	P99 float64 `json:"p99_seconds"`
	// WithinGoal is the share observed within 2 s, the goal's bound (a grant applied on every
	// cluster within 2 s at p99): exact, 2 s being a bucket bound.
	WithinGoal float64 `json:"within_2s"`
}

// scrapePropagation reads the propagation histogram from the hub's /metrics.
func scrapePropagation(ctx context.Context, apiURL string) ([]PropagationResult, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, apiURL+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("hub metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("hub metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("hub metrics: %w", err)
	}
	return propagationOf(mfs[propagationMetric]), nil
}

// propagationOf summarizes each kind's histogram of mf (nil: none), kinds sorted.
func propagationOf(mf *dto.MetricFamily) []PropagationResult {
	var out []PropagationResult
	for _, m := range mf.GetMetric() {
		h := m.GetHistogram()
		if h == nil || h.GetSampleCount() == 0 {
			continue
		}
		kind := ""
		for _, l := range m.GetLabel() {
			if l.GetName() == "kind" {
				kind = l.GetValue()
			}
		}
		r := PropagationResult{Kind: kind, Count: h.GetSampleCount(), P50: histogramQuantile(0.5, h), P99: histogramQuantile(0.99, h)}
		for _, b := range h.GetBucket() {
			if b.GetUpperBound() == 2 {
				r.WithinGoal = float64(b.GetCumulativeCount()) / float64(h.GetSampleCount())
			}
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b PropagationResult) int {
		if a.Kind < b.Kind {
			return -1
		}
		if a.Kind > b.Kind {
			return 1
		}
		return 0
	})
	return out
}

// histogramQuantile estimates q of h as Prometheus' histogram_quantile does: the bucket holding the
// rank, interpolated linearly from its lower bound (0 for the first); a rank past the last
// finite bucket answers that bucket's bound.
func histogramQuantile(q float64, h *dto.Histogram) float64 {
	n := float64(h.GetSampleCount())
	if n == 0 {
		return math.NaN()
	}
	rank := q * n
	lower, below := 0.0, 0.0
	for _, b := range h.GetBucket() {
		upper, count := b.GetUpperBound(), float64(b.GetCumulativeCount())
		if math.IsInf(upper, 1) {
			break
		}
		if count >= rank {
			if count == below {
				return upper
			}
			return lower + (upper-lower)*(rank-below)/(count-below)
		}
		lower, below = upper, count
	}
	return lower
}
