package fleetd_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1/placementv1connect"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// The agents as an operator watches them: per cluster set, how many members have their own
// agent connected, a hub-hosted one, a lost one or none yet (fleetstream_cluster_set_agents),
// and per cluster how old its last heartbeat is (fleetstream_agent_heartbeat_age_seconds). The
// heartbeats are the agents' own, on core NATS, through cluster-import's liveness; the set is
// an admin's, with a label selector.
func TestAgentMetricsByClusterSetAndHeartbeatAge(t *testing.T) {
	inst, clusters := startFleetd(t) // agents lost after 3 s without a heartbeat
	ctx := testkit.Context(t, 60*time.Second)
	for name, env := range map[string]string{"own": "prod", "hosted": "prod", "gone": "prod", "never": "prod", "dev-1": "dev"} {
		if _, err := clusters.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: name, Labels: map[string]string{"env": env}})); err != nil {
			t.Fatal(err)
		}
	}
	sets := placementv1connect.NewClusterSetServiceClient(http.DefaultClient, "http://"+inst.Addr, connect.WithInterceptors(bearer(apiToken)))
	if _, err := sets.CreateClusterSet(ctx, connect.NewRequest(&placementv1.CreateClusterSetRequest{Name: "prod",
		Selector: &placementv1.ClusterSetSelector{Type: placementv1.SelectorType_SELECTOR_TYPE_LABEL_SELECTOR,
			LabelSelector: &placementv1.LabelSelector{MatchLabels: map[string]string{"env": "prod"}}}})); err != nil {
		t.Fatal(err)
	}
	// heartbeat sends cluster's heartbeats every 300 ms until the returned stop.
	heartbeat := func(cluster string, hosted bool) (stop func()) {
		hctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			tick := time.NewTicker(300 * time.Millisecond)
			defer tick.Stop()
			for {
				data, _ := proto.Marshal(&agentv1.Heartbeat{ClusterName: cluster, SessionId: "s-" + cluster, Time: timestamppb.Now(), Hosted: hosted})
				if err := inst.JS.Conn().Publish(subjects.AgentLiveHeartbeat(cluster), data); err != nil && hctx.Err() == nil {
					t.Errorf("heartbeat of %s: %v", cluster, err)
				}
				select {
				case <-hctx.Done():
					return
				case <-tick.C:
				}
			}
		}()
		stop = func() { cancel(); <-done }
		t.Cleanup(stop)
		return stop
	}
	heartbeat("own", false)
	heartbeat("hosted", true)
	heartbeat("dev-1", false)
	stopGone := heartbeat("gone", false)

	const agents = "fleetstream_cluster_set_agents"
	// setAgents reads set's series: state → clusters.
	setAgents := func(set string) map[string]float64 {
		t.Helper()
		mfs, err := inst.Metrics.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() != agents {
				continue
			}
			for _, m := range mf.GetMetric() {
				l := map[string]string{}
				for _, p := range m.GetLabel() {
					l[p.GetName()] = p.GetValue()
				}
				if l["cluster_set"] == set {
					out[l["state"]] = m.GetGauge().GetValue()
				}
			}
		}
		return out
	}
	want := func(set string, w map[string]float64) func() error {
		return func() error {
			if got := setAgents(set); fmt.Sprint(got) != fmt.Sprint(w) {
				return fmt.Errorf("%s{cluster_set=%q}: %v, want %v", agents, set, got, w)
			}
			return nil
		}
	}
	testkit.Eventually(t, 20*time.Second, want("prod", map[string]float64{"connected": 2, "hosted": 1, "lost": 0, "never_connected": 1}))
	testkit.Eventually(t, 20*time.Second, want("global", map[string]float64{"connected": 3, "hosted": 1, "lost": 0, "never_connected": 1}))

	const age = "fleetstream_agent_heartbeat_age_seconds"
	if v, ok := testkit.Gauge(t, inst.Metrics, age, "cluster", "own"); !ok || v > 3 {
		t.Errorf("%s{cluster=own} = %.3f (reported: %v), want a heartbeat at most a third of the 3 s --unreachable-after old", age, v, ok)
	}
	if v, ok := testkit.Gauge(t, inst.Metrics, age, "cluster", "never"); ok {
		t.Errorf("%s{cluster=never} = %.3f: a cluster without an agent has a heartbeat age", age, v)
	}

	// gone's agent stops: its heartbeat ages past --unreachable-after and it is lost.
	stopGone()
	stopped := testkit.WallNow()
	testkit.Eventually(t, 20*time.Second, want("prod", map[string]float64{"connected": 1, "hosted": 1, "lost": 1, "never_connected": 1}))
	since := testkit.WallSince(stopped).Seconds() // before the scrape: its age is at least this
	v, ok := testkit.Gauge(t, inst.Metrics, age, "cluster", "gone")
	if !ok || v < since || v > testkit.WallSince(stopped).Seconds()+1.5 {
		t.Errorf("%s{cluster=gone} = %.3f (reported: %v), want the %.3fs since its agent stopped plus at most a third of --unreachable-after", age, v, ok, since)
	}
	if v, _ := testkit.Gauge(t, inst.Metrics, age, "cluster", "own"); v > 3 {
		t.Errorf("%s{cluster=own} = %.3f while it heartbeats", age, v)
	}
}
