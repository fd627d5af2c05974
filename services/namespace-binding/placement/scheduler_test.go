package placement

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/events"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// failingAppends fails every append to one subject while failing is set, and records when each
// was tried.
type failingAppends struct {
	appender
	subject string

	mu       sync.Mutex
	failing  bool
	attempts []time.Time
}

func (f *failingAppends) Append(ctx context.Context, subject, aggregateID string, expect events.Expect, payload proto.Message) (uint64, error) {
	if subject == f.subject {
		f.mu.Lock()
		f.attempts = append(f.attempts, time.Now())
		failing := f.failing
		f.mu.Unlock()
		if failing {
			return 0, errors.New("injected: the bus refuses this subject")
		}
	}
	return f.appender.Append(ctx, subject, aggregateID, expect, payload)
}

func (f *failingAppends) tried() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.attempts...)
}

func (f *failingAppends) heal() {
	f.mu.Lock()
	f.failing = false
	f.mu.Unlock()
}

// TestFailingPlacementBacksOffAlone: a placement whose decision cannot be appended is retried
// with a backoff of its own that doubles (1 s, then 2 s, then 4 s: the scheduler used to retry
// every placement every second, whatever failed), while another placement is decided at once;
// once the appends work again, the failed placement is decided too.
func TestFailingPlacementBacksOffAlone(t *testing.T) {
	fail := &failingAppends{subject: subjects.PlacementDecision("team", "stuck"), failing: true}
	h := startTestHub(t, func(s *Service) {
		fail.appender = s.decisionStore
		s.decisionStore = fail
	})
	h.putCluster(t, clusterName(1), nil)
	h.putCluster(t, clusterName(2), nil)
	h.bindSet(t, "team", "global")
	// The fleet and the binding are taken in first, so nothing but its own retries queues the
	// failing placement again.
	if err := h.svc.WaitSchedulingRound(testkit.Context(t, 20*time.Second)); err != nil {
		t.Fatal(err)
	}

	h.createPlacement(t, &placementv1.Placement{Project: "team", Name: "stuck"})
	testkit.Eventually(t, 20*time.Second, func() error {
		if n := len(fail.tried()); n < 3 {
			return errors.New("the failing placement was tried fewer than 3 times")
		}
		return nil
	})
	tried := fail.tried()
	// Lower bounds only: a loaded machine makes a wait longer, never shorter.
	for i, least := range []time.Duration{900 * time.Millisecond, 1900 * time.Millisecond} {
		if gap := tried[i+1].Sub(tried[i]); gap < least {
			t.Fatalf("retry %d of the failing placement came %s after the attempt before it, want at least %s (a per-key backoff doubling from 1 s)", i+1, gap, least)
		}
	}

	// The failing placement now waits 4 s for its next try; another is decided meanwhile.
	h.createPlacement(t, &placementv1.Placement{Project: "team", Name: "fine"})
	h.waitDecided(t, "team", "fine", 2, 10*time.Second)
	if n := len(fail.tried()); n != 3 {
		t.Errorf("the failing placement was tried %d times by the time the other was decided, want 3: the other waited for its retry", n)
	}
	if _, ok := h.svc.decisions.Get(placementKey("team", "stuck")); ok {
		t.Fatal("the failing placement has a decision")
	}

	fail.heal()
	h.waitDecided(t, "team", "stuck", 2, 20*time.Second)
}
