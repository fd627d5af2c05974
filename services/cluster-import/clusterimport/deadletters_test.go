package clusterimport_test

import (
	"fmt"
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

// A scrape never catches the gauge between two counts with a source missing: the alert would
// read the next sample as that source's first dead letters.
func TestDeadLettersGaugeNeverEmptiesBetweenCounts(t *testing.T) {
	g := clusterimport.NewDeadLetterGauge()
	prefix := topology.DeadLetterSubjectPrefix + "."
	counts := map[string]uint64{prefix + "FLEET_NS.view-ns-bindings": 2, prefix + "FLEET_AGENT.endpoint-collector": 1}
	g.Set(counts)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 20000; i++ {
			g.Set(counts)
		}
	}()
	for scrapes := 0; ; scrapes++ {
		select {
		case <-done:
			t.Logf("%d scrapes", scrapes)
			return
		default:
		}
		if got := g.Values(); len(got) != 2 {
			t.Fatalf("scrape %d saw %v between two counts of the same stream", scrapes, got)
		}
	}
}

// Past the cap, every count reports the same sources (the first in subject order), so the
// alert does not see sources come and go with map order.
func TestDeadLettersGaugeCapIsStable(t *testing.T) {
	g := clusterimport.NewDeadLetterGauge()
	prefix := topology.DeadLetterSubjectPrefix + "."
	counts := map[string]uint64{}
	want := map[string]float64{}
	for i := range clusterimport.MaxDeadLetterSources + 50 {
		source := fmt.Sprintf("FLEET_NS.view-%03d", i)
		counts[prefix+source] = uint64(i + 1)
		if i < clusterimport.MaxDeadLetterSources {
			want[source] = float64(i + 1)
		}
	}
	for round := range 20 {
		g.Set(counts)
		if got := g.Values(); !maps.Equal(got, want) {
			t.Fatalf("round %d: reported %d sources, not the first %d in order", round, len(got), len(want))
		}
	}
}
