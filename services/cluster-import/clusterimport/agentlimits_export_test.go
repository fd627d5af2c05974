package clusterimport

import "github.com/prometheus/client_golang/prometheus/testutil"

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
