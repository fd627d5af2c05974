package clusterimport

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// HeartbeatFieldsRefused is fleet_cluster_agent_heartbeat_fields_refused_total of cluster and
// field.
func (s *Registry) HeartbeatFieldsRefused(cluster, field string) float64 {
	return testutil.ToFloat64(s.metrics.heartbeatFields.WithLabelValues(cluster, field))
}

// ReportsPurged is fleet_cluster_agent_reports_purged_total of cluster and limit.
func (s *Registry) ReportsPurged(cluster, limit string) float64 {
	return testutil.ToFloat64(s.metrics.reportsPurged.WithLabelValues(cluster, limit))
}

// InventoryEntriesRefused is fleet_cluster_agent_inventory_entries_refused_total of cluster.
func (s *Registry) InventoryEntriesRefused(cluster string) float64 {
	return testutil.ToFloat64(s.metrics.inventoryEntries.WithLabelValues(cluster))
}

// CountDeadLetters counts what FLEET_DLQ holds now, as runDeadLetters does every 30 s.
func (s *Registry) CountDeadLetters(ctx context.Context) error { return s.countDeadLetters(ctx) }

// DeadLetters is fleetstream_dead_letters by source, as a scrape would read it.
func (s *Registry) DeadLetters() map[string]float64 { return gaugeBySource(s.metrics.deadLetters) }

func gaugeBySource(vec *prometheus.GaugeVec) map[string]float64 {
	out := map[string]float64{}
	ch := make(chan prometheus.Metric)
	go func() { vec.Collect(ch); close(ch) }()
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err == nil {
			out[pb.GetLabel()[0].GetValue()] = pb.GetGauge().GetValue()
		}
	}
	return out
}

// DeadLetterGauge is fleetstream_dead_letters as countDeadLetters keeps it, apart from a
// running Registry (whose own counts would interleave with a test's).
type DeadLetterGauge struct {
	m   limitMetrics
	src deadLetterSources
}

func NewDeadLetterGauge() *DeadLetterGauge { return &DeadLetterGauge{m: newLimitMetrics()} }

// Set reports FLEET_DLQ's counts by subject, as countDeadLetters does.
func (g *DeadLetterGauge) Set(counts map[string]uint64) { g.src.set(g.m.deadLetters, counts) }

// Values is the gauge by source, as a scrape would read it.
func (g *DeadLetterGauge) Values() map[string]float64 { return gaugeBySource(g.m.deadLetters) }

// MaxDeadLetterSources is how many sources fleetstream_dead_letters reports at most.
const MaxDeadLetterSources = maxDeadLetterSources
