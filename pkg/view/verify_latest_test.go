package view_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// register appends a ClusterRegistered for each key, a whole snapshot of its entry as agent
// reports are, and returns the last sequence.
func register(t *testing.T, ctx context.Context, store *events.Store, gen string, keys ...string) uint64 {
	t.Helper()
	var last uint64
	for _, k := range keys {
		seq, err := store.Append(ctx, "test."+k, k, events.Any, &clusterv1.ClusterRegistered{Id: k, Name: k, Labels: map[string]string{"gen": gen}})
		if err != nil {
			t.Fatal(err)
		}
		last = seq
	}
	return last
}

// A view of a stream that keeps only the latest message per subject (FLEET_AGENT), whose engine
// lags: a message past the checkpoint may have removed one the engine applied, so the rebuild
// cannot be trusted. Verify must not report that as a mismatch of the correct view: it says it
// found no stable moment (ErrNotStable), and once the engine has caught up the view equals its
// rebuild. A stream keeping every message compares at the lagging checkpoint as before.
func TestVerifyLaggingEngine(t *testing.T) {
	for _, c := range []struct {
		name          string
		perSubject    int64
		first         []string
		then          string
		wantNotStable bool
		entries       int // once caught up
	}{
		{"latest per subject, a folded key superseded", 1, []string{"a", "b", "c"}, "a", true, 3},
		{"latest per subject, every folded message superseded", 1, []string{"a"}, "a", true, 1},
		// Which keys a removed message had cannot be known, so any message past the checkpoint
		// counts, also one of a subject seen for the first time.
		{"latest per subject, a new subject", 1, []string{"a", "b"}, "c", true, 3},
		{"every message kept", 0, []string{"a", "b", "c"}, "a", false, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			j := testkit.StartJetStream(t)
			ctx := testkit.Context(t, 60*time.Second)
			if _, err := j.JS.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
				Name: "TEST", Subjects: []string{"test.>"}, MaxMsgsPerSubject: c.perSubject,
			}); err != nil {
				t.Fatal(err)
			}
			store := events.NewStore(j.JS, "test")
			checkpoint := register(t, ctx, store, "1", c.first...)
			e, cancel, done := runEngine(t, j.JS, testProjection(1))
			if err := e.WaitApplied(ctx, checkpoint); err != nil {
				t.Fatal(err)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("engine: %v", err)
			}
			last := register(t, ctx, store, "2", c.then)

			v, err := view.Verify(ctx, j.JS, testProjection(1), view.VerifyAttempts(3, 10*time.Millisecond))
			switch {
			case c.wantNotStable && !errors.Is(err, view.ErrNotStable):
				t.Fatalf("lagging engine: %+v, %v; want ErrNotStable", v, err)
			case c.wantNotStable && len(v.Mismatches) > 0:
				t.Fatalf("lagging engine: mismatches %+v reported with %v", v.Mismatches, err)
			case !c.wantNotStable && (err != nil || !v.Equal() || v.Checkpoint != checkpoint):
				t.Fatalf("lagging engine: %+v, %v; want equal at checkpoint %d", v, err, checkpoint)
			}

			e, _, _ = runEngine(t, j.JS, testProjection(1))
			if err := e.WaitApplied(ctx, last); err != nil {
				t.Fatal(err)
			}
			v, err = view.Verify(ctx, j.JS, testProjection(1), view.VerifyAttempts(3, 10*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			if !v.Equal() || v.Checkpoint != last {
				t.Fatalf("caught up: %+v, want equal at checkpoint %d", v, last)
			}
			if v.Entries != c.entries {
				t.Errorf("caught up: %d entries, want %d", v.Entries, c.entries)
			}
		})
	}
}

// Verify started while the engine lags (as the chaos suite's check right after a fault) ends
// with the comparison once the engine catches up, not with a false mismatch.
func TestVerifyWaitsForTheEngineToCatchUp(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 60*time.Second)
	if _, err := j.JS.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: "TEST", Subjects: []string{"test.>"}, MaxMsgsPerSubject: 1,
	}); err != nil {
		t.Fatal(err)
	}
	store := events.NewStore(j.JS, "test")
	checkpoint := register(t, ctx, store, "1", "a", "b", "c")
	e, cancel, done := runEngine(t, j.JS, testProjection(1))
	if err := e.WaitApplied(ctx, checkpoint); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("engine: %v", err)
	}
	last := register(t, ctx, store, "2", "a", "b")

	type result struct {
		v   view.Verification
		err error
	}
	verified := make(chan result, 1)
	go func() {
		v, err := view.Verify(ctx, j.JS, testProjection(1))
		verified <- result{v, err}
	}()
	runEngine(t, j.JS, testProjection(1))
	r := <-verified
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !r.v.Equal() || r.v.Checkpoint != last || r.v.Entries != 3 {
		t.Fatalf("%+v, want equal at checkpoint %d with 3 entries", r.v, last)
	}
}
