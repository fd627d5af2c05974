package view_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// When the events a view must apply next were removed from its stream (retention limits or a
// purge), the engine fails loudly instead of building a partial view; a view that already
// applied what was removed goes on.
func TestViewRefusesToBuildWhenItsEventsAreGone(t *testing.T) {
	cases := []struct {
		name string
		// built is how far the view got before the purge: 0 not at all, 1 up to the purge point,
		// 2 only half-way.
		built   int
		version int // of the engine started after the purge (1 resumes, 2 rebuilds)
		wantErr bool
	}{
		{"first build after early events are gone", 0, 1, true},
		{"rebuild of a new version after early events are gone", 1, 2, true},
		{"view behind the purge point", 2, 1, true},
		{"view past the purge point resumes", 1, 1, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			j := testkit.StartJetStream(t)
			ensureStream(t, j.JS)
			ctx := testkit.Context(t, 30*time.Second)
			mid := appendHistory(t, j.JS, 200, 20)
			if tc.built > 0 {
				target := mid
				if tc.built == 2 {
					target = mid / 2
				}
				e, cancel, stopped := runEngine(t, j.JS, testProjection(1), view.WithBatch(8))
				testkit.Eventually(t, 20*time.Second, func() error {
					if e.Applied() < target {
						return errors.New("view not there yet")
					}
					return nil
				})
				cancel()
				// The batch in flight at cancel may still move the checkpoint: judge where the
				// view stopped only once it has.
				<-stopped
				if tc.built == 2 && e.Applied() >= mid {
					t.Skip("the view applied everything before it could be stopped half-way")
				}
			}
			stream, err := j.JS.Stream(ctx, "TEST")
			if err != nil {
				t.Fatal(err)
			}
			if err := stream.Purge(ctx, jetstream.WithPurgeSequence(mid)); err != nil {
				t.Fatal(err)
			}
			last := appendHistory(t, j.JS, 50, 20)
			e, _, done := runEngine(t, j.JS, testProjection(tc.version))
			if !tc.wantErr {
				if err := e.WaitApplied(ctx, last); err != nil {
					t.Fatal(err)
				}
				return
			}
			select {
			case err := <-done:
				if !errors.Is(err, view.ErrHistoryGone) {
					t.Fatalf("Run returned %v, want ErrHistoryGone", err)
				}
				t.Logf("refused as expected: %v", err)
			case <-ctx.Done():
				t.Fatal("the engine did not refuse to build on a stream missing its events")
			}
			select {
			case <-e.Ready():
				t.Fatal("a view missing events reports ready")
			default:
			}
		})
	}
}

// A stream keeping only the latest message per subject removes superseded messages by design:
// a view of it builds from what remains.
func TestViewBuildsFromALatestPerSubjectStream(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 30*time.Second)
	if _, err := j.JS.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: "TEST", Subjects: []string{"test.>"}, MaxMsgsPerSubject: 1,
	}); err != nil {
		t.Fatal(err)
	}
	last := appendHistory(t, j.JS, 300, 10)
	stream, err := j.JS.Stream(ctx, "TEST")
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.FirstSeq <= 1 {
		t.Fatalf("first sequence %d: nothing was superseded", info.State.FirstSeq)
	}
	e, _, _ := runEngine(t, j.JS, testProjection(1))
	if err := e.WaitApplied(ctx, last); err != nil {
		t.Fatal(err)
	}
}
