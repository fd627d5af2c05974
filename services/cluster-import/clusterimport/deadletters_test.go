package clusterimport_test

import (
	"maps"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/topology"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

// fleetstream_dead_letters says what FLEET_DLQ holds by source, and a source whose messages are
// gone (expired, purged) is no longer reported: FleetstreamDeadLettersGrowing compares it over
// time, so a stale count would hide the next dead letters of that source.
func TestDeadLettersGaugeFollowsTheStream(t *testing.T) {
	e := start(t, nil, clusterimport.Config{})
	ctx := testkit.Context(t, 30*time.Second)
	if err := topology.Ensure(ctx, e.js.JS, 1, topology.DeadLetter()); err != nil {
		t.Fatal(err)
	}
	count := func(want map[string]float64) {
		t.Helper()
		if err := e.svc.CountDeadLetters(ctx); err != nil {
			t.Fatalf("count: %v", err)
		}
		if got := e.svc.DeadLetters(); !maps.Equal(got, want) {
			t.Fatalf("dead letters %v, want %v", got, want)
		}
	}
	count(map[string]float64{})
	for _, source := range []string{"FLEET_NS.view-ns-bindings", "FLEET_NS.view-ns-bindings", "FLEET_AGENT.endpoint-collector"} {
		if _, err := e.js.JS.Publish(ctx, topology.DeadLetterSubjectPrefix+"."+source, []byte("poison")); err != nil {
			t.Fatal(err)
		}
	}
	count(map[string]float64{"FLEET_NS.view-ns-bindings": 2, "FLEET_AGENT.endpoint-collector": 1})
	st, err := e.js.JS.Stream(ctx, topology.DeadLetterStreamName)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(ctx, jetstream.WithPurgeSubject(topology.DeadLetterSubjectPrefix+".FLEET_NS.view-ns-bindings")); err != nil {
		t.Fatal(err)
	}
	count(map[string]float64{"FLEET_AGENT.endpoint-collector": 1})
}
