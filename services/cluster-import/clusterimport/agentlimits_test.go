package clusterimport_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/events"
	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

func publishHeartbeat(t *testing.T, js jetstream.JetStream, hb *agentv1.Heartbeat) uint64 {
	t.Helper()
	hb.Time = timestamppb.Now()
	seq, err := events.NewStore(js, "agent").Append(testkit.Context(t, 10*time.Second), subjects.AgentHeartbeat(hb.ClusterName), hb.ClusterName, events.Any, hb)
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

// The attack: an agent heartbeats a 900 KB agent_version, a kubernetesVersion of
// `v1.0.0<script>` and an oversized resource quantity. None of it is stored (no event, no
// status entry), the cluster stays connected with what it had, and the refusal is reported
// (condition, metric) until a clean heartbeat; a first heartbeat with a bad version still
// connects its cluster.
func TestInvalidHeartbeatFieldsNeverReachAnEvent(t *testing.T) {
	e := start(t, nil, clusterimport.Config{})
	ctx := testkit.Context(t, 60*time.Second)
	register(t, e, "c1", nil)
	register(t, e, "c2", nil)
	get := func(name string) *clusterv1.Cluster {
		res, err := e.client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: name}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg.Cluster
	}
	connected := func(name string) error {
		if c := clusterimport.Condition(get(name), clusterimport.ConditionAgentConnected); c == nil || c.Status != clusterv1.ConditionStatus_CONDITION_STATUS_TRUE {
			return fmt.Errorf("%s not connected: %v", name, c)
		}
		return nil
	}
	withinLimits := func(name string, want bool) func() error {
		return func() error {
			c := clusterimport.Condition(get(name), subjects.ConditionAgentWithinLimits)
			switch {
			case want && c != nil:
				return fmt.Errorf("%s: %v", name, c)
			case !want && (c == nil || c.Status != clusterv1.ConditionStatus_CONDITION_STATUS_FALSE || c.Reason != "InvalidHeartbeat"):
				return fmt.Errorf("%s: condition %v, want InvalidHeartbeat", name, c)
			}
			return nil
		}
	}

	publishHeartbeat(t, e.js.JS, &agentv1.Heartbeat{ClusterName: "c1", KubernetesVersion: "v1.34.4", AgentVersion: "v0.9.0", SessionId: "s1"})
	testkit.Eventually(t, 10*time.Second, func() error { return connected("c1") })

	huge := strings.Repeat("A", 900<<10)
	bad := &agentv1.Heartbeat{ClusterName: "c1", KubernetesVersion: "v1.0.0<script>", AgentVersion: huge, SessionId: "s1",
		Resources: &agentv1.ClusterResources{NodeCount: 1, Allocatable: map[string]string{"cpu": strings.Repeat("9", 5000)}}}
	seq := publishHeartbeat(t, e.js.JS, bad)
	waitHandled(t, e.js.JS, seq)
	testkit.Eventually(t, 10*time.Second, withinLimits("c1", false))
	c := get("c1")
	if err := connected("c1"); err != nil {
		t.Fatal(err)
	}
	if c.Status.KubernetesVersion != "v1.34.4" || c.Status.AgentVersion != "v0.9.0" {
		t.Errorf("status after the bad heartbeat: kubernetes %q agent %.20q", c.Status.KubernetesVersion, c.Status.AgentVersion)
	}
	cond := clusterimport.Condition(c, subjects.ConditionAgentWithinLimits)
	for _, field := range []string{"kubernetesVersion", "agentVersion", "resources"} {
		if !strings.Contains(cond.Message, field+":") {
			t.Errorf("condition message does not name %s: %s", field, cond.Message)
		}
		if got := e.svc.HeartbeatFieldsRefused("c1", field); got != 1 {
			t.Errorf("metric for %s: %v, want 1", field, got)
		}
	}
	if strings.Contains(cond.Message, "<script>") || len(cond.Message) > 1024 {
		t.Errorf("condition message repeats what the agent sent: %.200s", cond.Message)
	}

	// A first heartbeat with a bad version: connected all the same, without a version.
	seq = publishHeartbeat(t, e.js.JS, &agentv1.Heartbeat{ClusterName: "c2", KubernetesVersion: "v1.0.0<script>", AgentVersion: "v0.9.0"})
	waitHandled(t, e.js.JS, seq)
	testkit.Eventually(t, 10*time.Second, func() error { return connected("c2") })
	testkit.Eventually(t, 10*time.Second, withinLimits("c2", false))

	// Nothing of it is in any stream but the agent's own reports: no event, no status entry.
	for _, stream := range []string{subjects.ClusterStream, "KV_" + subjects.ClusterStatusBucket, "KV_" + subjects.ClustersBucket, "KV_" + subjects.AgentLimitsBucket} {
		scanStream(t, e.js.JS, stream, [][]byte{[]byte("<script>"), []byte(huge[:1024]), []byte("99999999999999999999")})
	}

	// A clean heartbeat clears the condition.
	publishHeartbeat(t, e.js.JS, &agentv1.Heartbeat{ClusterName: "c1", KubernetesVersion: "v1.34.5", AgentVersion: "v0.9.1", SessionId: "s1"})
	testkit.Eventually(t, 10*time.Second, withinLimits("c1", true))
	testkit.Eventually(t, 10*time.Second, func() error {
		if v := get("c1").Status.KubernetesVersion; v != "v1.34.5" {
			return fmt.Errorf("version %q", v)
		}
		return nil
	})
}

// scanStream fails t if any message of stream holds any of needles.
func scanStream(t *testing.T, js jetstream.JetStream, stream string, needles [][]byte) {
	t.Helper()
	ctx := context.Background()
	r, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatalf("%s: %v", stream, err)
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for n := uint64(0); n < info.State.Msgs; n++ {
		m, err := r.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("%s: message %d of %d: %v", stream, n+1, info.State.Msgs, err)
		}
		for _, needle := range needles {
			if bytes.Contains(m.Data(), needle) {
				t.Errorf("%s: %s holds %.40q", stream, m.Subject(), needle)
			}
		}
	}
}
