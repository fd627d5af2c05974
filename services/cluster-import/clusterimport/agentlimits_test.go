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
	"google.golang.org/protobuf/proto"
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

// The attack: an agent floods FLEET_AGENT with unique report subjects, then with large ones.
// Its cluster keeps at most its limits there (the rest is purged), which is counted and shown
// on the cluster; the other cluster's reports and the flooding agent's heartbeat stay, and
// the condition goes once the agent keeps within its limits.
func TestAgentReportFloodIsBoundedPerCluster(t *testing.T) {
	e := start(t, nil, clusterimport.Config{CheckInterval: 100 * time.Millisecond,
		AgentLimits: clusterimport.AgentLimits{MaxReportSubjectsPerCluster: 20, MaxReportBytesPerCluster: 64 << 10}})
	ctx := testkit.Context(t, 60*time.Second)
	register(t, e, "evil", nil)
	register(t, e, "good", nil)
	publish := func(subject string, size int) {
		t.Helper()
		if _, err := e.js.JS.Publish(ctx, subject, bytes.Repeat([]byte{'x'}, size)); err != nil {
			t.Fatal(err)
		}
	}
	stream, err := e.js.JS.Stream(ctx, subjects.AgentStreamName)
	if err != nil {
		t.Fatal(err)
	}
	subjectsOf := func(cluster string) map[string]uint64 {
		t.Helper()
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subjects.AgentPrefixFor(cluster)+".>"))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Subjects
	}
	for i := range 10 {
		publish(subjects.AgentPrefixFor("good")+fmt.Sprintf(".report.%d", i), 1024)
	}
	publishHeartbeat(t, e.js.JS, &agentv1.Heartbeat{ClusterName: "evil", KubernetesVersion: "v1.34.4"})

	for i := range 300 {
		publish(subjects.AgentPrefixFor("evil")+fmt.Sprintf(".flood.%d", i), 2048)
	}
	testkit.Eventually(t, 20*time.Second, func() error {
		if n := len(subjectsOf("evil")); n > 21 { // 20 and the heartbeat
			return fmt.Errorf("evil holds %d subjects", n)
		}
		return nil
	})
	// Large messages on subjects it holds: the byte limit.
	for i := range 10 {
		publish(subjects.AgentPrefixFor("evil")+fmt.Sprintf(".flood.%d", i), 30<<10)
	}
	testkit.Eventually(t, 20*time.Second, func() error {
		info, err := stream.Info(ctx)
		if err != nil {
			return err
		}
		// Before the bounds: 300 × 2 KB and 10 × 30 KB. Now: evil's 64 KB, good's 10 KB, two
		// heartbeats and the stores' overhead.
		if info.State.Bytes > 100<<10 {
			return fmt.Errorf("FLEET_AGENT holds %d bytes", info.State.Bytes)
		}
		return nil
	})
	if got := subjectsOf("good"); len(got) != 10 {
		t.Errorf("the good cluster's reports: %d subjects, want 10", len(got))
	}
	if _, ok := subjectsOf("evil")[subjects.AgentHeartbeat("evil")]; !ok {
		t.Error("the flooding agent's heartbeat was purged")
	}
	for _, limit := range []string{"ReportSubjectsPerCluster", "ReportBytesPerCluster"} {
		if got := e.svc.ReportsPurged("evil", limit); got == 0 {
			t.Errorf("no purge counted for %s", limit)
		}
	}
	if got := e.svc.ReportsPurged("good", "ReportSubjectsPerCluster"); got != 0 {
		t.Errorf("purges counted for the good cluster: %v", got)
	}
	cond := func(name string) *clusterv1.Condition {
		res, err := e.client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: name}))
		if err != nil {
			t.Fatal(err)
		}
		return clusterimport.Condition(res.Msg.Cluster, subjects.ConditionAgentWithinLimits)
	}
	if c := cond("good"); c != nil {
		t.Errorf("good cluster: %v", c)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if c := cond("evil"); c == nil || !strings.HasPrefix(c.Reason, "Report") {
			return fmt.Errorf("evil: condition %v", c)
		}
		return nil
	})
	// The agent keeps within its limits now: the condition goes.
	testkit.Eventually(t, 20*time.Second, func() error {
		if c := cond("evil"); c != nil {
			return fmt.Errorf("evil: condition %v", c)
		}
		return nil
	})
}

// The attack: an agent's namespace inventory carries names and labels Kubernetes would never
// have (markup, 900 bytes). The view keeps only what is valid, reports what it dropped, and
// clears the condition with a clean inventory.
func TestInvalidInventoryEntriesAreDropped(t *testing.T) {
	e := start(t, nil, clusterimport.Config{})
	ctx := testkit.Context(t, 60*time.Second)
	register(t, e, "c1", nil)
	publishInventory := func(nss ...*agentv1.Namespace) {
		t.Helper()
		if _, err := events.NewStore(e.js.JS, "agent").Append(ctx, subjects.AgentInventory("c1"), "c1", events.Any,
			&agentv1.NamespaceInventory{ClusterName: "c1", Namespaces: nss, Generation: uint64(time.Now().UnixNano())}); err != nil {
			t.Fatal(err)
		}
	}
	get := func() *clusterv1.GetClusterResponse {
		res, err := e.client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "c1", IncludeInventory: true}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg
	}
	publishInventory(
		&agentv1.Namespace{Name: "web", Phase: "Active"},
		&agentv1.Namespace{Name: "x<script>", Phase: "Active"},
		&agentv1.Namespace{Name: strings.Repeat("a", 900), Phase: "Active"},
		&agentv1.Namespace{Name: "shop", Phase: "Hacked", Labels: map[string]string{"team": "a", "bad key!": "v", "k": "<script>"}},
	)
	testkit.Eventually(t, 10*time.Second, func() error {
		res := get()
		c := clusterimport.Condition(res.Cluster, subjects.ConditionAgentWithinLimits)
		if c == nil || c.Reason != "InvalidInventory" {
			return fmt.Errorf("condition %v", c)
		}
		if !strings.Contains(c.Message, "namespaces[1].name") || !strings.Contains(c.Message, "namespaces[3].labels") || strings.Contains(c.Message, "<script>") {
			return fmt.Errorf("condition message %s", c.Message)
		}
		return nil
	})
	var names []string
	for _, ns := range get().Inventory.GetNamespaces() {
		names = append(names, ns.Name)
		if ns.Name == "shop" && (len(ns.Labels) != 1 || ns.Labels["team"] != "a" || ns.Phase != "") {
			t.Errorf("shop kept %v phase %q", ns.Labels, ns.Phase)
		}
	}
	if strings.Join(names, ",") != "shop,web" && strings.Join(names, ",") != "web,shop" {
		t.Errorf("inventory namespaces %v, want web and shop", names)
	}
	if got := e.svc.InventoryEntriesRefused("c1"); got < 5 {
		t.Errorf("metric: %v entries refused, want at least 5", got)
	}
	scanStream(t, e.js.JS, "KV_"+subjects.ClusterInventoryBucket, [][]byte{[]byte("<script>"), []byte(strings.Repeat("a", 100))})

	publishInventory(&agentv1.Namespace{Name: "web", Phase: "Active"})
	testkit.Eventually(t, 10*time.Second, func() error {
		if c := clusterimport.Condition(get().Cluster, subjects.ConditionAgentWithinLimits); c != nil {
			return fmt.Errorf("condition %v", c)
		}
		return nil
	})
}

// What another hub reader (endpoint-collector) records in bucket agent-limits shows on the
// cluster, merged with cluster-import's own, and goes with its entry.
func TestGetClusterShowsEveryReadersLimitCondition(t *testing.T) {
	e := start(t, nil, clusterimport.Config{})
	ctx := testkit.Context(t, 30*time.Second)
	register(t, e, "c1", nil)
	kv, err := e.js.JS.KeyValue(ctx, subjects.AgentLimitsBucket)
	if err != nil {
		t.Fatal(err)
	}
	data, err := proto.Marshal(&clusterv1.Condition{Type: subjects.ConditionAgentWithinLimits, Status: clusterv1.ConditionStatus_CONDITION_STATUS_FALSE,
		Reason: "EndpointSlicesPerCluster", Message: "too many slices", LastTransitionTime: timestamppb.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, subjects.AgentLimitsKey("c1", "endpoint-collector"), data); err != nil {
		t.Fatal(err)
	}
	cond := func() *clusterv1.Condition {
		res, err := e.client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "c1"}))
		if err != nil {
			t.Fatal(err)
		}
		return clusterimport.Condition(res.Msg.Cluster, subjects.ConditionAgentWithinLimits)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if c := cond(); c == nil || c.Reason != "EndpointSlicesPerCluster" || c.Message != "too many slices" {
			return fmt.Errorf("condition %v", c)
		}
		return nil
	})
	// And cluster-import's own: both reasons, both messages.
	publishHeartbeat(t, e.js.JS, &agentv1.Heartbeat{ClusterName: "c1", KubernetesVersion: "v1.0.0<script>"})
	testkit.Eventually(t, 10*time.Second, func() error {
		if c := cond(); c == nil || !strings.Contains(c.Reason, "EndpointSlicesPerCluster") || !strings.Contains(c.Reason, "InvalidHeartbeat") ||
			!strings.Contains(c.Message, "too many slices") || !strings.Contains(c.Message, "kubernetesVersion") {
			return fmt.Errorf("condition %v", c)
		}
		return nil
	})
	publishHeartbeat(t, e.js.JS, &agentv1.Heartbeat{ClusterName: "c1", KubernetesVersion: "v1.34.4"})
	if err := kv.Delete(ctx, subjects.AgentLimitsKey("c1", "endpoint-collector")); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if c := cond(); c != nil {
			return fmt.Errorf("condition %v", c)
		}
		return nil
	})
}
