package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

// Ways a simulated cluster can misbehave (-misbehave kind=N,…) while the rest of the fleet is
// measured (issue 26, "Misbehaving clusters"). Misbehaving clusters join and get the namespace
// and the grants like the others, but are not timed; afterwards each must have converged
// anyway (except where its misbehaviour forbids it), and what it tried must have been refused.
const (
	// misReconnect: the agent's NATS connection is dropped and re-established every second.
	misReconnect = "reconnect"
	// misFlood: the agent heartbeats ten times as often as -heartbeat.
	misFlood = "flood"
	// misInventory: the cluster holds 30,000 namespaces, all in its inventory.
	misInventory = "inventory"
	// misForeign: besides running normally, the agent publishes a heartbeat on another
	// cluster's subject and subscribes to another cluster's desired state, every second.
	misForeign = "foreign"
	// misNoAck: the agent never acknowledges anything. In our protocol the only
	// acknowledgements an agent gives are its `applied` statuses (bucket applied): the
	// desired-state feed (pkg/kvfeed) is core NATS and its replays use ordered consumers, so
	// neither has an ack to withhold. This agent applies what it is given but never writes a
	// status: every write to the applied bucket is dropped as if it never happened. The hub
	// must show its namespace binding as not applied (Pending, waiting for the agent) while
	// the rest of the fleet goes on.
	misNoAck = "noack"
)

// bigInventory is the namespace count of a misInventory cluster.
const bigInventory = 30_000

func misbehaviours() []string {
	return []string{misFlood, misForeign, misInventory, misNoAck, misReconnect}
}

// parseMisbehave reads "kind=N,kind=N".
func parseMisbehave(s string) (map[string]int, error) {
	out := map[string]int{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		kind, n, ok := strings.Cut(strings.TrimSpace(part), "=")
		count, err := strconv.Atoi(n)
		switch {
		case !ok || err != nil || count < 1:
			return nil, fmt.Errorf("-misbehave: %q is not kind=N with N ≥ 1", part)
		case !contains(misbehaviours(), kind):
			return nil, fmt.Errorf("-misbehave: unknown kind %q (%s)", kind, strings.Join(misbehaviours(), ", "))
		}
		out[kind] += count
	}
	return out, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// MisbehaviourResult is what became of the misbehaving clusters of one kind.
type MisbehaviourResult struct {
	Kind     string `json:"kind"`
	Clusters int    `json:"clusters"`
	// Converged counts those that, in the end, hold what the fleet was given (the project
	// namespace, and the RoleBinding as the last round left it).
	Converged int `json:"converged"`
	// Refused counts what NATS refused them (permission violations), for misForeign.
	Refused int64 `json:"refused,omitempty"`
	// HeartbeatRatio is, for misFlood, the hub's count of the cluster's heartbeats
	// (fleet_cluster_agent_heartbeats_total on /metrics) over a well-behaved cluster's: how
	// the flood shows.
	HeartbeatRatio float64 `json:"heartbeat_ratio,omitempty"`
	// NamespaceCount is, for misInventory, the namespaces the hub shows for the cluster
	// (GetCluster's status.namespace_count), and OutOfLimits whether it shows the cluster's
	// AgentWithinLimits=False: a huge inventory is visible one way or the other.
	NamespaceCount int32 `json:"namespace_count,omitempty"`
	OutOfLimits    bool  `json:"out_of_limits,omitempty"`
	// BindingPhase is, for misNoAck, the phase the hub shows for the cluster's namespace
	// binding (with its reason): not Available, since the agent never said it applied it.
	BindingPhase string `json:"binding_phase,omitempty"`
}

// misbehave starts c's misbehaviour once its agent runs; it stops with ctx.
func (c *simCluster) misbehave(ctx context.Context, victim string) {
	tick := func(f func()) {
		go func() {
			f()
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					f()
				}
			}
		}()
	}
	switch c.misbehaviour {
	case misReconnect:
		tick(func() { _ = c.nc.ForceReconnect() })
	case misForeign:
		tick(func() {
			_ = c.nc.Publish(subjects.AgentHeartbeat(victim), []byte("not yours"))
			_ = c.nc.Publish(subjects.AgentLiveHeartbeat(victim), []byte("not yours"))
			if sub, err := c.nc.SubscribeSync(subjects.FeedSubject(subjects.DesiredRBACBucket, keys.Encode(victim)+".>")); err == nil {
				_ = c.nc.Flush()
				_ = sub.Unsubscribe()
			}
		})
	}
}

// permissionErrors counts the permission violations NATS reports to c's connection.
func (c *simCluster) permissionErrorHandler() nats.Option {
	return nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if err != nil && strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			c.refused.Add(1)
		}
	})
}

// checkMisbehaving reports, per kind, how many misbehaving clusters converged to what the
// fleet holds (ns bound; a RoleBinding held exactly when wantRoleBinding), waiting up to
// timeout, and what was refused; a cluster that never converges, or a foreign one that was
// never refused, is lost.
// A huge inventory must show on the cluster (its namespace count, or AgentWithinLimits=False),
// and an agent that never acknowledges must show as such: its namespace binding not Available
// while a well-behaved cluster's is.
func checkMisbehaving(ctx context.Context, h *hub, good string, bad []*simCluster, project, ns string, wantRoleBinding bool, timeout, heartbeatWindow time.Duration, res *Result) {
	byKind := map[string]*MisbehaviourResult{}
	deadline := time.Now().Add(timeout)
	for _, c := range bad {
		r := byKind[c.misbehaviour]
		if r == nil {
			r = &MisbehaviourResult{Kind: c.misbehaviour}
			byKind[c.misbehaviour] = r
		}
		r.Clusters++
		converged := false
		for {
			hasNS := c.nsApplied.Load() != 0
			hasRB, err := c.holdsRoleBinding(ns)
			if hasNS && err == nil && hasRB == wantRoleBinding {
				converged = true
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if converged {
			r.Converged++
		} else {
			res.Lost = append(res.Lost, fmt.Sprintf("misbehaving (%s): %s never converged", c.misbehaviour, c.name))
		}
		if c.misbehaviour == misFlood {
			ratio, err := heartbeatRatio(ctx, h.apiURL, c.name, good, heartbeatWindow)
			if err != nil || ratio < 2 {
				res.Lost = append(res.Lost, fmt.Sprintf("misbehaving (%s): %s's flood not visible on /metrics (ratio %.1f, %v)", c.misbehaviour, c.name, ratio, err))
			}
			r.HeartbeatRatio = ratio
		}
		if c.misbehaviour == misInventory {
			var err error
			for {
				r.NamespaceCount, r.OutOfLimits, err = inventoryShown(ctx, h, c.name)
				if (err == nil && (r.NamespaceCount >= bigInventory || r.OutOfLimits)) || time.Now().After(deadline) || ctx.Err() != nil {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			if r.NamespaceCount < bigInventory && !r.OutOfLimits {
				res.Lost = append(res.Lost, fmt.Sprintf("misbehaving (%s): %s's %d namespaces not visible on the hub (namespace count %d, not out of limits, %v)",
					c.misbehaviour, c.name, bigInventory, r.NamespaceCount, err))
			}
		}
		if c.misbehaviour == misNoAck {
			// The good cluster's binding Available first: the hub's view has caught up, so the
			// silent one's Pending is its silence, not the view's lag.
			var goodPhase, phase projectv1.BindingPhase
			var reason string
			var err error
			for {
				goodPhase, _, err = bindingPhase(ctx, h, project, good, ns)
				if err == nil && goodPhase == projectv1.BindingPhase_BINDING_PHASE_AVAILABLE {
					phase, reason, err = bindingPhase(ctx, h, project, c.name, ns)
				}
				if (err == nil && goodPhase == projectv1.BindingPhase_BINDING_PHASE_AVAILABLE) || time.Now().After(deadline) || ctx.Err() != nil {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			r.BindingPhase = strings.TrimPrefix(phase.String(), "BINDING_PHASE_") + " (" + reason + ")"
			switch {
			case err != nil || goodPhase != projectv1.BindingPhase_BINDING_PHASE_AVAILABLE:
				res.Lost = append(res.Lost, fmt.Sprintf("misbehaving (%s): the well-behaved %s's binding never Available (%s, %v)", c.misbehaviour, good, goodPhase, err))
			case phase == projectv1.BindingPhase_BINDING_PHASE_AVAILABLE:
				res.Lost = append(res.Lost, fmt.Sprintf("misbehaving (%s): %s never acknowledged, yet the hub shows its binding Available", c.misbehaviour, c.name))
			}
		}
		if c.misbehaviour == misForeign {
			for c.refused.Load() == 0 && time.Now().Before(deadline) && ctx.Err() == nil {
				time.Sleep(100 * time.Millisecond)
			}
			n := c.refused.Load()
			r.Refused += n
			if n == 0 {
				res.Lost = append(res.Lost, fmt.Sprintf("misbehaving (%s): %s was never refused", c.misbehaviour, c.name))
			}
		}
	}
	for _, r := range byKind {
		res.Misbehaving = append(res.Misbehaving, *r)
	}
	sort.Slice(res.Misbehaving, func(i, j int) bool { return res.Misbehaving[i].Kind < res.Misbehaving[j].Kind })
}

// heartbeatRatio reads the hub's /metrics twice, window apart, and divides how many heartbeats
// of cluster it counted meanwhile by how many of other.
func heartbeatRatio(ctx context.Context, apiURL, cluster, other string, window time.Duration) (float64, error) {
	before, err := heartbeatCounts(ctx, apiURL)
	if err != nil {
		return 0, err
	}
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(window):
	}
	after, err := heartbeatCounts(ctx, apiURL)
	if err != nil {
		return 0, err
	}
	d := after[other] - before[other]
	if d <= 0 {
		return 0, fmt.Errorf("no heartbeats of %s on /metrics in %v", other, window)
	}
	return (after[cluster] - before[cluster]) / d, nil
}

// heartbeatCounts reads fleet_cluster_agent_heartbeats_total per cluster from the hub's /metrics.
func heartbeatCounts(ctx context.Context, apiURL string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, apiURL+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	counts := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), `fleet_cluster_agent_heartbeats_total{cluster="`)
		if !ok {
			continue
		}
		name, rest, _ := strings.Cut(line, `"} `)
		if v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64); err == nil {
			counts[name] = v
		}
	}
	return counts, sc.Err()
}

// silentStatusJS is the JetStream handle of a misNoAck agent: everything as usual, except that
// what the agent writes into the applied bucket (its acknowledgements) never arrives.
type silentStatusJS struct{ jetstream.JetStream }

func (j silentStatusJS) KeyValue(ctx context.Context, bucket string) (jetstream.KeyValue, error) {
	kv, err := j.JetStream.KeyValue(ctx, bucket)
	if err != nil || bucket != subjects.AppliedBucket {
		return kv, err
	}
	return silentKV{kv}, nil
}

// silentKV swallows writes: the agent believes them done (so it does not retry), the hub never
// sees them.
type silentKV struct{ jetstream.KeyValue }

func (silentKV) Put(context.Context, string, []byte) (uint64, error) { return 0, nil }

func (silentKV) Delete(context.Context, string, ...jetstream.KVDeleteOpt) error { return nil }

// bindingPhase returns the phase the hub shows for project's binding of ns on cluster.
func bindingPhase(ctx context.Context, h *hub, project, cluster, ns string) (projectv1.BindingPhase, string, error) {
	// Every page: the namespace may be past the first.
	req := &projectv1.ListNamespaceBindingsRequest{Project: project, Cluster: cluster}
	for {
		resp, err := h.projects.ListNamespaceBindings(ctx, connect.NewRequest(req))
		if err != nil {
			return 0, "", err
		}
		for _, b := range resp.Msg.GetBindings() {
			if b.GetNamespace() == ns {
				return b.GetPhase(), b.GetReason(), nil
			}
		}
		if resp.Msg.GetNextPageToken() == "" {
			break
		}
		req.PageToken = resp.Msg.GetNextPageToken()
	}
	return 0, "", fmt.Errorf("no binding of %s on %s", ns, cluster)
}

// inventoryShown returns the namespace count the hub shows for cluster and whether it reports
// the agent out of its limits (AgentWithinLimits=False): either way a huge inventory is seen.
func inventoryShown(ctx context.Context, h *hub, cluster string) (int32, bool, error) {
	resp, err := h.clusters.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: cluster}))
	if err != nil {
		return 0, false, err
	}
	cl := resp.Msg.GetCluster()
	cond := clusterimport.Condition(cl, subjects.ConditionAgentWithinLimits)
	return cl.GetStatus().GetNamespaceCount(), cond != nil && cond.Status == clusterv1.ConditionStatus_CONDITION_STATUS_FALSE, nil
}
