package placement

import (
	"github.com/prometheus/client_golang/prometheus"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
)

// Agent states of fleetstream_cluster_set_agents: each member of a set is in exactly one, so
// a set's states sum to its member count.
const (
	agentConnected      = "connected"       // its own agent, inside the cluster, heartbeats
	agentHosted         = "hosted"          // a hub-hosted agent heartbeats for it
	agentLost           = "lost"            // it had an agent, silent past --unreachable-after
	agentNeverConnected = "never_connected" // registered, no agent has heartbeated yet
)

var agentStates = []string{agentConnected, agentHosted, agentLost, agentNeverConnected}

// conditionAgentConnected is cluster-import's condition (clusterimport.ConditionAgentConnected):
// Unknown from registration to the first heartbeat, True while the cluster's agent heartbeats,
// False once it was lost.
const conditionAgentConnected = "AgentConnected"

var setAgentsDesc = prometheus.NewDesc("fleetstream_cluster_set_agents",
	"Member clusters of each cluster set by the state of their agent, read at scrape from the cluster registry: connected (its own agent heartbeats), "+
		"hosted (a hub-hosted agent does), lost (silent past --unreachable-after), never_connected. A cluster in several sets counts in each.",
	[]string{"cluster_set", "state"}, nil)

// setAgents reports fleetstream_cluster_set_agents. The cluster_set label is a set's name:
// only a platform admin creates sets (authz: admin create clustersets), so its values are
// bounded by what the platform team defines, like cluster names, and are what an operator
// groups a fleet by; no project member or API caller adds one.
type setAgents struct{ s *Service }

func (c setAgents) Describe(ch chan<- *prometheus.Desc) { ch <- setAgentsDesc }

// MetricType says the gauge's type to the metric catalogue before the caches are ready.
func (c setAgents) MetricType() string { return "gauge" }

func (c setAgents) Collect(ch chan<- prometheus.Metric) {
	select {
	case <-c.s.ready:
	default:
		return // the caches are not set before placement is ready
	}
	sets := c.s.clusterSets.List(nil)
	f, err := c.s.fleet(sets)
	if err != nil {
		return // an inconsistent registry: the API says so (Internal); a scrape has no one to tell
	}
	state := map[string]string{}
	for _, cl := range c.s.clusters.List(nil) {
		state[cl.Name] = agentState(cl)
	}
	for _, set := range sets {
		members, _ := f.Members(set.Name)
		counts := map[string]int{}
		for _, m := range members {
			counts[state[m]]++
		}
		for _, st := range agentStates {
			ch <- prometheus.MustNewConstMetric(setAgentsDesc, prometheus.GaugeValue, float64(counts[st]), set.Name, st)
		}
	}
}

// agentState is the state of c's agent as cluster-import last recorded it.
func agentState(c *clusterv1.Cluster) string {
	for _, cond := range c.GetStatus().GetConditions() {
		if cond.Type != conditionAgentConnected {
			continue
		}
		switch cond.Status {
		case clusterv1.ConditionStatus_CONDITION_STATUS_TRUE:
			if c.GetStatus().GetAgentHosted() {
				return agentHosted
			}
			return agentConnected
		case clusterv1.ConditionStatus_CONDITION_STATUS_FALSE:
			return agentLost
		}
	}
	return agentNeverConnected // Unknown until the first heartbeat (AgentNeverConnected)
}
