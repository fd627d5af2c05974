// Package liveness holds the heartbeat timing that agents and the hub services must agree on:
// how often an agent heartbeats, and how long the hub waits without one before it acts.
//
// The values are Karmada's and Kubernetes' (kubelet node-lease renewals every 10 s, a
// 40 s node-monitor / cluster-monitor grace period). The hub counts the silence from the last
// heartbeat it stored, and stores one only when the stored one is a third of UnreachableAfter
// old: with these values every other heartbeat, so a silent cluster is acted on 30 to 40 s
// after its last heartbeat (three or four missed), as Kubernetes' controller, which also
// counts from the lease it last saw renewed. Each heartbeat costs the hub a read on core NATS and, every few, a stored
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
