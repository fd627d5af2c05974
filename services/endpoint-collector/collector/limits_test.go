package collector

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// The attack: a compromised agent reports far more EndpointSlices and endpoints than its
// cluster may hold. The collector holds at most its limits of them (in memory, in bucket
// `endpoints`, after a restart too), counts and reports the refusals, and serves the other
// cluster as before; a relist within the limits clears the condition.
func TestAgentOverItsEndpointLimitsIsRefusedAndReported(t *testing.T) {
	js := testkit.StartJetStream(t)
	cfg := Config{Limits: Limits{MaxEndpointSlicesPerCluster: 5, MaxEndpointsPerCluster: 12}, ViewFlushInterval: 10 * time.Millisecond}
	h := startCollector(t, js.JS, cfg)
	evil := newFakeAgent(t, js.JS, "evil", "c_evil")
	good := newFakeAgent(t, js.JS, "good", "c_good")

	good.report("web", "api", "api-1", http8080, ep{ip: "10.1.0.1", conds: "RS"})
	for i := range 20 {
		evil.report("flood", fmt.Sprintf("svc%d", i), fmt.Sprintf("svc%d-x", i), http8080, ep{ip: fmt.Sprintf("10.9.0.%d", i+1), conds: "RS"})
	}
	good.report("web", "api", "api-1", http8080, ep{ip: "10.1.0.1", conds: "RS"}, ep{ip: "10.1.0.2", conds: "RS"})
	h.eventually("web", "api", ready, "good[10.1.0.1:8080 10.1.0.2:8080]")
	// Reports are applied in order: the first five slices are held, the fifteen after them not.
	h.eventually("flood", "svc4", ready, "evil[10.9.0.5:8080]")
	for i := 5; i < 20; i++ {
		h.eventually("flood", fmt.Sprintf("svc%d", i), ready, "<none>")
	}
	if got := testutil.ToFloat64(h.c.refused.WithLabelValues("evil", limitSlices)); got != 15 {
		t.Errorf("refusals counted for the slice limit: %v, want 15", got)
	}
	if got := testutil.ToFloat64(h.c.refused.WithLabelValues("good", limitSlices)); got != 0 {
		t.Errorf("refusals counted for the good cluster: %v", got)
	}
	waitLimitCondition(t, js.JS, "evil", limitSlices)
	assertBucketServices(t, js.JS, "flood", 5)

	// An update that would take the cluster past its endpoint limit: the slice is no longer
	// served (its last accepted endpoints are not the agent's any more), the others are.
	var many []ep
	for i := range 20 {
		many = append(many, ep{ip: fmt.Sprintf("10.9.1.%d", i+1), conds: "RS"})
	}
	evil.report("flood", "svc0", "svc0-x", http8080, many...)
	h.eventually("flood", "svc0", ready, "<none>")
	h.eventually("flood", "svc1", ready, "evil[10.9.0.2:8080]")
	if got := testutil.ToFloat64(h.c.refused.WithLabelValues("evil", limitEndpoints)); got != 1 {
		t.Errorf("refusals counted for the endpoint limit: %v, want 1", got)
	}
	waitLimitCondition(t, js.JS, "evil", limitEndpoints)

	// A restart replays the stream: the limits hold the same way, the condition stays.
	h.stop()
	h = startCollector(t, js.JS, cfg)
	h.eventually("web", "api", ready, "good[10.1.0.1:8080 10.1.0.2:8080]")
	// The replay takes the latest report of each slice in stream order, which is not the order
	// they were first applied in: which five are held may differ, that at most five are not.
	if n := servedServices(t, h, "flood", 20); n != 5 {
		t.Errorf("after a restart %d services of the over-limit cluster are served, want 5", n)
	}
	if h.c.limitStatus.Get("evil") == nil {
		t.Error("after a restart the over-limit cluster is not reported")
	}
	assertBucketServices(t, js.JS, "flood", 5)

	// The agent restarts within its limits: once its relist completes, the condition goes.
	evil.restart()
	evil.report("flood", "svc1", "svc1-x", http8080, ep{ip: "10.9.0.2", conds: "RS"})
	evil.sync()
	h.eventually("flood", "svc2", ready, "<none>")
	waitLimitCondition(t, js.JS, "evil", "")
	h.eventually("flood", "svc1", ready, "evil[10.9.0.2:8080]")
}

// servedServices returns how many of services svc0..svc<n-1> of ns are served.
func servedServices(t *testing.T, h *harness, ns string, n int) int {
	t.Helper()
	served := 0
	for i := range n {
		_, err := h.get(ns, fmt.Sprintf("svc%d", i), ready)
		switch {
		case err == nil:
			served++
		case connect.CodeOf(err) != connect.CodeNotFound:
			t.Fatalf("get %s/svc%d: %v", ns, i, err)
		}
	}
	return served
}

// waitLimitCondition waits until bucket agent-limits says cluster is over limit (reason), or
// within its limits ("").
func waitLimitCondition(t *testing.T, js jetstream.JetStream, cluster, limit string) {
	t.Helper()
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, subjects.AgentLimitsBucket)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		e, err := kv.Get(ctx, subjects.AgentLimitsKey(cluster, limitsReader))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			if limit == "" {
				return nil
			}
			return fmt.Errorf("no condition for %s", cluster)
		}
		if err != nil {
			return err
		}
		c := &clusterv1.Condition{}
		if err := proto.Unmarshal(e.Value(), c); err != nil {
			return err
		}
		if limit == "" || c.Reason != limit || c.Type != subjects.ConditionAgentWithinLimits || c.Status != clusterv1.ConditionStatus_CONDITION_STATUS_FALSE {
			return fmt.Errorf("condition of %s: %v, want reason %q", cluster, c, limit)
		}
		return nil
	})
}

// assertBucketServices checks that bucket `endpoints` holds at most max services of namespace ns.
func assertBucketServices(t *testing.T, js jetstream.JetStream, ns string, max int) {
	t.Helper()
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, subjects.EndpointsBucket)
	if err != nil {
		t.Fatal(err)
	}
	// Let the writer flush whatever it would.
	time.Sleep(200 * time.Millisecond)
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for k := range lister.Keys() {
		if strings.HasPrefix(k, ns+".") {
			n++
		}
	}
	if n > max {
		t.Errorf("bucket %s holds %d services of namespace %s, want at most %d", subjects.EndpointsBucket, n, ns, max)
	}
}
