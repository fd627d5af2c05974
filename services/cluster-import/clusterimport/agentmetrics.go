package clusterimport

import (
	"github.com/prometheus/client_golang/prometheus"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
)

var heartbeatAgeDesc = prometheus.NewDesc("fleetstream_agent_heartbeat_age_seconds",
	"Seconds since the hub last recorded a heartbeat of the cluster's agent (in-cluster or hosted), by cluster, read at scrape from bucket cluster-status: "+
		"the server's receive time, recorded at least every third of --unreachable-after while nothing else changes, so up to that much older than the last heartbeat. "+
		"No series for a cluster no agent has heartbeated for.",
	[]string{"cluster"}, nil)

// heartbeatAge reports fleetstream_agent_heartbeat_age_seconds for every registered cluster
// with a recorded heartbeat. Every replica reads the same bucket, so every replica reports the
// same ages (an alert takes the max or min over replicas, alike). The cluster label is a
// registered cluster's name: admin-chosen and bounded by the fleet, as the agent counters are.
type heartbeatAge struct{ s *Registry }

func (c heartbeatAge) Describe(ch chan<- *prometheus.Desc) { ch <- heartbeatAgeDesc }

// MetricType says the gauge's type to the metric catalogue before any agent has heartbeated.
func (c heartbeatAge) MetricType() string { return "gauge" }

func (c heartbeatAge) Collect(ch chan<- prometheus.Metric) {
	select {
	case <-c.s.ready:
	default:
		return // the caches are not read before the registry is ready
	}
	now := c.s.now()
	type registered struct{ key, name string }
	var clusters []registered
	c.s.clusters.List(func(key string, cl *clusterv1.Cluster) bool {
		clusters = append(clusters, registered{key, cl.Name})
		return false
	})
	for _, cl := range clusters {
		st, ok := c.s.status.Get(cl.key)
		if !ok || st.GetLastSeen() == nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(heartbeatAgeDesc, prometheus.GaugeValue, max(now.Sub(st.LastSeen.AsTime()), 0).Seconds(), cl.name)
	}
}
