package agentlimits_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/agentlimits"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

func refusal(reason string) *clusterv1.Condition {
	return &clusterv1.Condition{Type: subjects.ConditionAgentWithinLimits, Status: clusterv1.ConditionStatus_CONDITION_STATUS_FALSE, Reason: reason}
}

// entry returns reader's entry of cluster: its reason, "" when there is none.
func entry(ctx context.Context, kv jetstream.KeyValue, cluster, reader string) (string, error) {
	e, err := kv.Get(ctx, subjects.AgentLimitsKey(cluster, reader))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	c := &clusterv1.Condition{}
	if err := proto.Unmarshal(e.Value(), c); err != nil {
		return "", err
	}
	return c.Reason, nil
}

// TestRunWritesBehindAndOutlivesTheBucket: a writer started before its bucket exists waits for
// it rather than stopping the service (a lookup that fails is not fatal: at 10,000 clusters a
// timed-out one stopped fleetd); the entries follow Set; after a restart, an entry the previous
// run left for a cluster now within its limits is removed and another reader's are left alone.
func TestRunWritesBehindAndOutlivesTheBucket(t *testing.T) {
	js := testkit.StartJetStream(t)
	ctx := testkit.Context(t, time.Minute)
	run := func(s *agentlimits.Status) (stop func()) {
		errc := make(chan error, 1)
		rctx, cancel := context.WithCancel(ctx)
		go func() { errc <- s.Run(rctx, js.JS, 100*time.Millisecond, testkit.Logger(t)) }()
		return func() {
			t.Helper()
			cancel()
			if err := <-errc; err != nil {
				t.Fatalf("Run: %v", err)
			}
		}
	}
	var kv jetstream.KeyValue
	want := func(cluster, reader, reason string) {
		t.Helper()
		testkit.Eventually(t, 10*time.Second, func() error {
			got, err := entry(ctx, kv, cluster, reader)
			if err != nil {
				return err
			}
			if got != reason {
				return fmt.Errorf("%s's entry of %s: %q, want %q", reader, cluster, got, reason)
			}
			return nil
		})
	}

	s := agentlimits.New("me")
	s.Set("over", refusal("TooManySlices"))
	s.Set("was-over", refusal("TooManyEndpoints"))
	stop := run(s)
	time.Sleep(500 * time.Millisecond) // Run is looking for a bucket that does not exist yet
	var err error
	if kv, err = js.JS.CreateKeyValue(ctx, subjects.AgentLimitsBucketConfig()); err != nil {
		t.Fatal(err)
	}
	data, _ := proto.Marshal(refusal("Other"))
	if _, err := kv.Put(ctx, subjects.AgentLimitsKey("was-over", "other"), data); err != nil {
		t.Fatal(err)
	}
	want("over", "me", "TooManySlices")
	want("was-over", "me", "TooManyEndpoints")
	s.Set("over", nil)
	s.Set("late", refusal("TooManyEndpoints"))
	want("over", "me", "")
	want("late", "me", "TooManyEndpoints")
	if s.Get("late").GetReason() != "TooManyEndpoints" || s.Get("over") != nil {
		t.Fatalf("Get: late %v, over %v", s.Get("late"), s.Get("over"))
	}
	stop()

	// Restarted: only "late" is still over its limits.
	s = agentlimits.New("me")
	s.Set("late", refusal("TooManyEndpoints"))
	defer run(s)()
	want("was-over", "me", "")
	want("late", "me", "TooManyEndpoints")
	want("was-over", "other", "Other")
}
