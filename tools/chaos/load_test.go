package chaos

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
)

// A write stuck in a fault holds its own slot only: writes of other objects go out meanwhile,
// a write of the same object is skipped (so the ledger's order per object stays the order they
// were sent), and Run returns only when the stuck write has ended.
func TestLoadDoesNotStallBehindAStuckWrite(t *testing.T) {
	ledger := &Ledger{}
	l := &Load{Ledger: ledger, Every: time.Hour, Timeout: 10 * time.Second}
	l.slots, l.inFlight = make(chan struct{}, MaxInFlight), map[string]bool{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	release := make(chan struct{})
	stuck := func(ctx context.Context) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
		}
	}
	ok := func(context.Context) error { return nil }
	l.write(ctx, "weight", "1", 1, stuck)
	l.write(ctx, "weight", "2", 2, ok) // same object, in flight: skipped
	l.write(ctx, "bind", "east/a", 0, ok)
	l.write(ctx, "grant", "u-a", 0, ok)

	deadline := time.After(5 * time.Second)
	for n := 0; n < 2; {
		select {
		case <-deadline:
			t.Fatalf("writes of other objects did not go out while one was stuck: %+v", ledger.Writes())
		case <-time.After(10 * time.Millisecond):
			n = len(ledger.Writes())
		}
	}
	if n := len(ledger.skipped); n != 1 {
		t.Errorf("%d writes skipped, want the second weight", n)
	}
	close(release)
	l.wg.Wait()
	ws := ledger.Writes()
	if len(ws) != 3 || ws[2].Kind != "weight" || ws[2].Outcome != Acked {
		t.Fatalf("ledger %+v, want the bind, the grant, then the stuck weight acknowledged", ws)
	}
	if ex := ledger.Expect(); !ex.Weights[1] || ex.Weights[2] {
		t.Errorf("expected weights %v, want only the one sent", ex.Weights)
	}
}

// Resume counts only writes sent at or after the fault: one in flight at the fault and
// acknowledged just after does not make writes look resumed.
func TestLedgerResumeCountsWritesSentAfterTheFault(t *testing.T) {
	t0 := time.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	l := &Ledger{}
	for _, w := range []Write{
		{Kind: "bind", Key: "east/a", Start: at(-time.Second), End: at(100 * time.Millisecond), Outcome: Acked},
		{Kind: "bind", Key: "east/b", Start: at(200 * time.Millisecond), End: at(3200 * time.Millisecond), Outcome: Unknown},
		{Kind: "grant", Key: "u-b", Start: at(700 * time.Millisecond), End: at(2500 * time.Millisecond), Outcome: Acked},
		{Kind: "bind", Key: "east/c", Start: at(1200 * time.Millisecond), End: at(1900 * time.Millisecond), Outcome: Refused},
		{Kind: "grant", Key: "u-c", Start: at(1700 * time.Millisecond), End: at(2600 * time.Millisecond), Outcome: Acked},
	} {
		l.add(w)
	}
	l.skip(at(-time.Millisecond))
	l.skip(at(time.Second))
	l.skip(at(3 * time.Second))
	d, failed, skipped, ok := l.Resume(t0)
	if !ok || d != 2500*time.Millisecond || failed != 1 || skipped != 1 {
		t.Fatalf("Resume = %s, %d failed, %d skipped, %v; want 2.5s, 1, 1, true", d, failed, skipped, ok)
	}
	if _, _, _, ok := l.Resume(at(4 * time.Second)); ok {
		t.Error("resumed although nothing was sent after the fault")
	}
}

// ResumeByKind says when each kind of write came back: a fault that stops binds may leave
// grants going.
func TestLedgerResumeByKind(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	l := &Ledger{}
	l.add(Write{Kind: "bind", Key: "east/a", Start: at(-time.Second), End: at(time.Second), Outcome: Acked})
	l.add(Write{Kind: "grant", Key: "u1", Start: at(100 * time.Millisecond), End: at(300 * time.Millisecond), Outcome: Acked})
	l.add(Write{Kind: "bind", Key: "east/b", Start: at(time.Second), End: at(4 * time.Second), Outcome: Unknown})
	l.add(Write{Kind: "bind", Key: "east/c", Start: at(5 * time.Second), End: at(6 * time.Second), Outcome: Acked})
	l.add(Write{Kind: "bind", Key: "east/d", Start: at(5500 * time.Millisecond), End: at(7 * time.Second), Outcome: Acked})
	l.add(Write{Kind: "weight", Key: "7", Start: at(time.Second), End: at(2 * time.Second), Outcome: Refused})
	got := l.ResumeByKind(t0)
	want := map[string]time.Duration{"grant": 300 * time.Millisecond, "bind": 6 * time.Second}
	if len(got) != len(want) || got["grant"] != want["grant"] || got["bind"] != want["bind"] {
		t.Fatalf("ResumeByKind = %v, want %v", got, want)
	}
}

// What a backup holds by the record: writes that ended before it started are in it, writes sent
// after it ended are not, and a write in flight meanwhile or with an unknown outcome may be.
func TestExpectAtBackup(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	start, end := at(10), at(20)
	l := &Ledger{}
	for _, w := range []Write{
		{Kind: "bind", Key: "east/a", Start: at(1), End: at(2), Outcome: Acked},   // in
		{Kind: "bind", Key: "east/b", Start: at(1), End: at(2), Outcome: Acked},   // in, then
		{Kind: "unbind", Key: "east/b", Start: at(3), End: at(4), Outcome: Acked}, // out again
		{Kind: "bind", Key: "east/c", Start: at(9), End: at(11), Outcome: Acked},  // in flight: either
		{Kind: "bind", Key: "east/d", Start: at(21), End: at(22), Outcome: Acked}, // after: not in it
		{Kind: "bind", Key: "east/e", Start: at(1), End: at(2), Outcome: Unknown}, // unknown: either
		{Kind: "bind", Key: "east/f", Start: at(1), End: at(2), Outcome: Refused}, // did not happen
		{Kind: "grant", Key: "u-1", Start: at(1), End: at(2), Outcome: Acked},     // in, and
		{Kind: "revoke", Key: "u-1", Start: at(25), End: at(26), Outcome: Acked},  // revoked after: still in
		{Kind: "grant", Key: "u-2", Start: at(1), End: at(2), Outcome: Unknown},   // unknown, then
		{Kind: "revoke", Key: "u-2", Start: at(3), End: at(4), Outcome: Acked},    // certain again
		{Kind: "weight", Key: "7", Start: at(1), End: at(2), Outcome: Acked, WeightPayload: 7},
		{Kind: "weight", Key: "8", Start: at(15), End: at(16), Outcome: Acked, WeightPayload: 8},
		{Kind: "weight", Key: "9", Start: at(21), End: at(22), Outcome: Acked, WeightPayload: 9},
	} {
		l.add(w)
	}
	got := l.ExpectAtBackup(start, end)
	one := func(v bool) map[bool]bool { return map[bool]bool{v: true} }
	both := map[bool]bool{true: true, false: true}
	for key, want := range map[string]map[bool]bool{"east/a": one(true), "east/b": one(false), "east/c": both, "east/d": nil, "east/e": both, "east/f": nil} {
		if fmt.Sprint(got.Bound[key]) != fmt.Sprint(want) {
			t.Errorf("binding %s: %v, want %v", key, got.Bound[key], want)
		}
	}
	for key, want := range map[string]map[bool]bool{"u-1": one(true), "u-2": one(false)} {
		if fmt.Sprint(got.Granted[key]) != fmt.Sprint(want) {
			t.Errorf("grant %s: %v, want %v", key, got.Granted[key], want)
		}
	}
	if fmt.Sprint(got.Weights) != fmt.Sprint(map[uint32]bool{7: true, 8: true}) {
		t.Errorf("weights %v, want 7 or 8", got.Weights)
	}
	if n := got.Uncertain(); n != 3 {
		t.Errorf("%d uncertain objects, want 3 (east/c, east/e, the weight)", n)
	}
	// A binding served that the backup cannot hold, and one never written before it ended.
	diffs := compareStates("binding", got.Bound, map[string]bool{"east/a": true, "east/b": true, "east/d": true})
	if len(diffs) != 2 {
		t.Errorf("differences %q, want east/b (unbound in the backup) and east/d (written after)", diffs)
	}
}
