package view_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// viewGauges reads the view metrics of reg: name → view → value.
func viewGauges(t *testing.T, reg *prometheus.Registry) map[string]map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "view" {
					if out[mf.GetName()] == nil {
						out[mf.GetName()] = map[string]float64{}
					}
					out[mf.GetName()][l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return out
}

// waitGauges polls reg until ok holds of its view gauges, failing after a deadline with the
// last ones read.
func waitGauges(t *testing.T, reg *prometheus.Registry, what string, ok func(g map[string]map[string]float64) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		g := viewGauges(t, reg)
		if ok(g) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: view metrics %v", what, g)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The view metrics are read from the engines at each scrape, so what an alert sees is the
// engine's state now: a leader stuck in a batch shows its lease, its events pending and a
// checkpoint that does not move (FleetstreamViewStalled), and once it goes on, nothing pending
// and the stream's last sequence. Two sets registered on one registry (fleetd's services) are
// both reported, and a view nobody leads reports 0 (FleetstreamViewLeaseUnheld).
func TestMetricsReportLeaseLagAndCheckpoint(t *testing.T) {
	j := testkit.StartJetStream(t)
	ensureStream(t, j.JS)
	beforeAppend := testkit.WallNow()
	last := appendHistory(t, j.JS, 50, 5)
	afterAppend := testkit.WallNow()

	stuck := testProjection(1)
	apply := stuck.Apply
	gate, blocked := make(chan struct{}), make(chan struct{})
	var once, opened sync.Once
	open := func() { opened.Do(func() { close(gate) }) }
	stuck.Apply = func(ev *events.Event) ([]view.Change, error) {
		once.Do(func() { close(blocked) })
		<-gate
		return apply(ev)
	}
	idle := testProjection(1)
	idle.Name, idle.Bucket = "test-idle", jetstream.KeyValueConfig{Bucket: "TESTVIEW2", History: 1}

	var c1, c2 *view.Cache[*clusterv1.Cluster]
	running, notRunning := view.NewSet(j.JS, zap.NewNop()), view.NewSet(j.JS, zap.NewNop())
	view.Add(running, stuck, &c1)
	view.Add(notRunning, idle, &c2)
	reg := prometheus.NewRegistry()
	for _, s := range []*view.Set{running, notRunning} {
		if err := s.Register(reg); err != nil {
			t.Fatalf("register: %v", err)
		}
	}
	g := viewGauges(t, reg)
	for _, v := range []string{"test", "test-idle"} {
		if g["fleetstream_view_leading"][v] != 0 || g["fleetstream_view_pending_events"][v] != 0 {
			t.Fatalf("view %s reports a lease or pending events before any engine runs: %v", v, g)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	started := time.Now()
	go func() { done <- running.Run(ctx) }()
	t.Cleanup(func() {
		open() // a failed check must not leave the engine blocked for Run to wait on
		cancel()
		<-done
	})
	select {
	case <-blocked:
	case err := <-done:
		t.Fatalf("set stopped: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the engine never applied an event")
	}
	waitGauges(t, reg, "a stuck leader", func(g map[string]map[string]float64) bool {
		return g["fleetstream_view_leading"]["test"] == 1 && g["fleetstream_view_pending_events"]["test"] == 50 &&
			g["fleetstream_view_applied_sequence"]["test"] == 0
	})
	if g := viewGauges(t, reg); g["fleetstream_view_leading"]["test-idle"] != 0 {
		t.Errorf("a view nobody runs reports a leader: %v", g)
	}
	// The stuck leader's lag in seconds is the age of the first event it has not applied (the
	// history's first), and grows while it stays stuck; it is not ready.
	time.Sleep(200 * time.Millisecond)
	least := testkit.WallSince(afterAppend).Seconds()
	g = viewGauges(t, reg)
	most := testkit.WallSince(beforeAppend).Seconds()
	if lag := g["fleetstream_view_lag_seconds"]["test"]; lag < least || lag > most {
		t.Errorf("a stuck leader's lag %.3fs, want the age of its first unapplied event, within [%.3f, %.3f]", lag, least, most)
	}
	if ready, ok := g["fleetstream_view_time_to_ready_seconds"]["test"]; ok {
		t.Errorf("a stuck leader reports it was ready after %.3fs", ready)
	}
	time.Sleep(200 * time.Millisecond)
	if lag := viewGauges(t, reg)["fleetstream_view_lag_seconds"]["test"]; lag < least+0.2 {
		t.Errorf("a stuck leader's lag %.3fs 200ms later, want at least %.3fs", lag, least+0.2)
	}
	open()
	waitGauges(t, reg, "a leader caught up", func(g map[string]map[string]float64) bool {
		return g["fleetstream_view_leading"]["test"] == 1 && g["fleetstream_view_pending_events"]["test"] == 0 &&
			g["fleetstream_view_applied_sequence"]["test"] == float64(last) && g["fleetstream_view_lag_seconds"]["test"] == 0
	})
	// Ready once caught up: after the stuck time above, within the time since Run started.
	g = viewGauges(t, reg)
	ready, ok := g["fleetstream_view_time_to_ready_seconds"]["test"]
	if !ok || ready < 0.4 || ready > time.Since(started).Seconds() {
		t.Errorf("time to ready %.3fs (reported: %v), want within [0.4, %.3f]", ready, ok, time.Since(started).Seconds())
	}
	if _, ok := g["fleetstream_view_time_to_ready_seconds"]["test-idle"]; ok {
		t.Errorf("a view nobody runs reports a time to ready: %v", g)
	}
}

// A leader that was caught up and then gets stuck in a batch still shows the events piling up
// behind it: its lag is read at each scrape, not only when a batch ends (no batch ends while it
// is stuck), so FleetstreamViewStalled sees pending events and a checkpoint that does not move.
func TestMetricsShowPendingOfALeaderStuckWhileCaughtUp(t *testing.T) {
	j := testkit.StartJetStream(t)
	ensureStream(t, j.JS)
	last := appendHistory(t, j.JS, 20, 5)

	p := testProjection(1)
	apply := p.Apply
	var block atomic.Bool
	gate, blocked := make(chan struct{}), make(chan struct{})
	var once, opened sync.Once
	open := func() { opened.Do(func() { close(gate) }) }
	p.Apply = func(ev *events.Event) ([]view.Change, error) {
		if block.Load() {
			once.Do(func() { close(blocked) })
			<-gate
		}
		return apply(ev)
	}
	var c *view.Cache[*clusterv1.Cluster]
	set := view.NewSet(j.JS, zap.NewNop())
	view.Add(set, p, &c)
	reg := prometheus.NewRegistry()
	if err := set.Register(reg); err != nil {
		t.Fatalf("register: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- set.Run(ctx) }()
	t.Cleanup(func() {
		open()
		cancel()
		<-done
	})
	waitGauges(t, reg, "a leader caught up", func(g map[string]map[string]float64) bool {
		return g["fleetstream_view_leading"]["test"] == 1 && g["fleetstream_view_pending_events"]["test"] == 0 &&
			g["fleetstream_view_applied_sequence"]["test"] == float64(last)
	})

	block.Store(true)
	ctx2 := testkit.Context(t, 30*time.Second)
	store := events.NewStore(j.JS, "test")
	for i := range 5 {
		if _, err := store.Append(ctx2, "test.k000", "k000", events.Any, &clusterv1.ClusterUpdated{Id: "k000", Labels: map[string]string{"stuck": strconv.Itoa(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-blocked:
	case err := <-done:
		t.Fatalf("set stopped: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the engine never took the new events")
	}
	waitGauges(t, reg, "a leader stuck after catching up", func(g map[string]map[string]float64) bool {
		return g["fleetstream_view_leading"]["test"] == 1 && g["fleetstream_view_pending_events"]["test"] == 5 &&
			g["fleetstream_view_applied_sequence"]["test"] == float64(last)
	})
	open()
	waitGauges(t, reg, "the leader going on", func(g map[string]map[string]float64) bool {
		return g["fleetstream_view_pending_events"]["test"] == 0 && g["fleetstream_view_applied_sequence"]["test"] == float64(last+5)
	})
}
