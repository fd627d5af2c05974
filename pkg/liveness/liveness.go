// Package liveness holds the heartbeat timing that agents and the hub services must agree on:
// how often an agent heartbeats, and how long the hub waits without one before it acts.
//
// The values are Karmada's and Kubernetes' (kubelet node-lease renewals every 10 s, a
// 40 s node-monitor / cluster-monitor grace period): four missed heartbeats before a cluster is
// unreachable. Each heartbeat costs the hub a read on core NATS and, every few, a stored
// last-seen write, so the interval sets an idle fleet's hub CPU (docs/scale.md: at 1,000
// clusters, 5 s heartbeats cost about 15% of a core).
package liveness

import "time"

const (
	// HeartbeatInterval is how often an agent heartbeats (the agent's --heartbeat-interval).
	HeartbeatInterval = 10 * time.Second
	// UnreachableAfter is how long a cluster's agent may be silent before the hub acts on it:
	// cluster-import taints it unreachable (--unreachable-after), the endpoint collector flags
	// its endpoints stale (--stale-after), and a hosted agent takes over from its in-cluster
	// one (--in-cluster-grace).
	UnreachableAfter = 40 * time.Second
)
