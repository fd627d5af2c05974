package events_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// counter is the aggregate of the command tests: the number its last event set (label "n")
// and the revision of that event.
type counter struct {
	n   int
	rev uint64
}

func setN(n int) *clusterv1.ClusterUpdated {
	return &clusterv1.ClusterUpdated{Id: "c", Labels: map[string]string{"n": strconv.Itoa(n)}}
}

func evolveCounter(_ counter, ev *events.Event) (counter, bool) {
	u, ok := ev.Payload.(*clusterv1.ClusterUpdated)
	if !ok {
		return counter{}, false
	}
	n, err := strconv.Atoi(u.Labels["n"])
	return counter{n: n, rev: ev.Sequence}, err == nil
}

// loadLast loads the counter from the subject's last event, as a current view would show it.
func loadLast(stream jetstream.Stream, subject string) func(ctx context.Context, _ uint64) (counter, uint64, error) {
	return func(ctx context.Context, _ uint64) (counter, uint64, error) {
		seq, last, err := events.Last(ctx, stream, subject)
		if err != nil || last == nil {
			return counter{}, seq, err
		}
		c, _ := evolveCounter(counter{}, last)
		return c, seq, nil
	}
}

func TestCommand(t *testing.T) {
	errRefused := errors.New("refused")
	tests := []struct {
		name string
		// rivals is how many of the first attempts a rival beats, appending n+10 between
		// the command's load and its append (-1: every attempt).
		rivals int
		// stale makes Load answer the state before any rival, as a view that never catches up.
		stale    bool
		catchUp  bool
		expected bool // the caller expects the revision it loaded
		refuse   bool // Decide refuses
		timeout  time.Duration

		wantErr     func(error) bool
		wantDecides int
		wantNs      []int // the n of each event on the subject after the command
	}{{
		name:        "no race",
		wantDecides: 1, wantNs: []int{1, 2},
	}, {
		name:   "a lost race is decided again on the new state",
		rivals: 1, wantDecides: 2, wantNs: []int{1, 11, 12},
	}, {
		name:   "an expected revision that no longer holds returns the conflict",
		rivals: 1, expected: true,
		wantErr: func(err error) bool { return errors.Is(err, events.ErrConflict) }, wantDecides: 1, wantNs: []int{1, 11},
	}, {
		name:    "races are retried a bounded number of times",
		rivals:  -1,
		wantErr: func(err error) bool { return events.IsConflict(err) }, wantDecides: events.DefaultConflicts + 1,
		wantNs: []int{1, 11, 21, 31, 41, 51, 61},
	}, {
		name:    "a decide error appends nothing",
		refuse:  true,
		wantErr: func(err error) bool { return errors.Is(err, errRefused) }, wantDecides: 1, wantNs: []int{1},
	}, {
		name:   "a stale load is caught up from the stream",
		rivals: 2, stale: true, catchUp: true,
		wantDecides: 3, wantNs: []int{1, 11, 21, 22},
	}, {
		name:   "context cancellation stops retries",
		rivals: -1, timeout: 300 * time.Millisecond,
		wantErr: func(err error) bool { return errors.Is(err, context.DeadlineExceeded) },
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, stream := setup(t)
			ctx := testkit.Context(t, 20*time.Second)
			store := events.NewStore(j.JS, "test")
			const subject = "test.counter"
			first, err := store.Append(ctx, subject, "c", events.Empty, setN(1))
			if err != nil {
				t.Fatal(err)
			}
			load := loadLast(stream, subject)
			var decides, rivals atomic.Int32
			cmd := events.Command[counter]{
				Store: store, Subject: subject, AggregateID: "c",
				Load: func(ctx context.Context, min uint64) (counter, uint64, error) {
					if tt.stale {
						return counter{n: 1, rev: first}, first, nil
					}
					return load(ctx, min)
				},
				Prepare: func(ctx context.Context, state counter, rev uint64) error {
					if tt.rivals >= 0 && int(rivals.Load()) >= tt.rivals {
						return nil
					}
					rivals.Add(1)
					// The rival appends on the subject as it is, past what the command loaded.
					cur, seq, err := loadLast(stream, subject)(ctx, 0)
					if err != nil {
						return err
					}
					_, err = store.Append(ctx, subject, "c", events.At(seq), setN(cur.n+10))
					if ctx.Err() != nil {
						return nil // the command's deadline passed while the rival appended
					}
					return err
				},
				Decide: func(state counter) ([]proto.Message, error) {
					decides.Add(1)
					if tt.refuse {
						return nil, errRefused
					}
					return []proto.Message{setN(state.n + 1)}, nil
				},
			}
			if tt.expected {
				cmd.Expected = first
			}
			if tt.catchUp {
				cmd.Evolve, cmd.CatchUp = evolveCounter, stream
			}
			runCtx := ctx
			if tt.timeout > 0 {
				cmd.MaxConflicts = 1 << 30
				var cancel context.CancelFunc
				runCtx, cancel = context.WithTimeout(ctx, tt.timeout)
				defer cancel()
			}
			start := time.Now()
			res, err := cmd.Run(runCtx)
			switch {
			case tt.wantErr == nil && err != nil:
				t.Fatalf("run: %v", err)
			case tt.wantErr != nil && !tt.wantErr(err):
				t.Fatalf("run: error %v is not the one wanted", err)
			}
			if tt.timeout > 0 {
				if d := time.Since(start); d > 10*tt.timeout {
					t.Fatalf("run took %s after its context ended at %s", d, tt.timeout)
				}
				return // how many rounds fit in the timeout is the machine's business
			}
			if got := int(decides.Load()); got != tt.wantDecides {
				t.Errorf("decided %d times, want %d", got, tt.wantDecides)
			}
			var ns []int
			for seq := uint64(1); ; seq++ {
				m, err := stream.GetMsg(ctx, seq)
				if errors.Is(err, jetstream.ErrMsgNotFound) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				ev, err := events.Decode(m.Data)
				if err != nil {
					t.Fatal(err)
				}
				c, _ := evolveCounter(counter{}, ev)
				ns = append(ns, c.n)
			}
			if !slices.Equal(ns, tt.wantNs) {
				t.Errorf("subject holds %v, want %v", ns, tt.wantNs)
			}
			if err == nil && len(res.Events) == 1 && res.Sequence != uint64(len(ns)) {
				t.Errorf("result sequence %d, want %d (the last event)", res.Sequence, len(ns))
			}
		})
	}
}

// TestCommandLockKeepsOwnAppends checks that a locked command starts from the state the
// previous one on its key appended, without waiting for a Load that does not show it yet.
func TestCommandLockKeepsOwnAppends(t *testing.T) {
	j, stream := setup(t)
	ctx := testkit.Context(t, 20*time.Second)
	store := events.NewStore(j.JS, "test")
	const subject = "test.counter"
	first, err := store.Append(ctx, subject, "c", events.Empty, setN(1))
	if err != nil {
		t.Fatal(err)
	}
	locks := events.NewLocks[counter](func(string, uint64) bool { return false })
	var loads atomic.Int32
	for want := 2; want <= 4; want++ {
		res, err := events.Command[counter]{
			Store: store, Subject: subject, AggregateID: "c", Lock: locks, Evolve: evolveCounter,
			// A view stuck at the first event: only the lock's memory knows better.
			Load: func(context.Context, uint64) (counter, uint64, error) {
				loads.Add(1)
				return counter{n: 1, rev: first}, first, nil
			},
			Decide: func(state counter) ([]proto.Message, error) { return []proto.Message{setN(state.n + 1)}, nil },
		}.Run(ctx)
		if err != nil {
			t.Fatalf("command %d: %v", want, err)
		}
		if got := res.State.n + 1; got != want {
			t.Fatalf("command decided n=%d, want %d", got, want)
		}
	}
	if _, last, err := events.Last(ctx, stream, subject); err != nil {
		t.Fatal(err)
	} else if c, _ := evolveCounter(counter{}, last); c.n != 4 {
		t.Fatalf("last n %d, want 4", c.n)
	}
}

// TestCommandDryRun checks that a dry run decides as a write would, refuses as it would, and
// appends nothing (BeforeAppend included).
func TestCommandDryRun(t *testing.T) {
	errRefused := errors.New("refused")
	for _, refuse := range []bool{false, true} {
		t.Run(map[bool]string{false: "decided", true: "refused"}[refuse], func(t *testing.T) {
			j, stream := setup(t)
			ctx := testkit.Context(t, 20*time.Second)
			store := events.NewStore(j.JS, "test")
			const subject = "test.counter"
			if _, err := store.Append(ctx, subject, "c", events.Empty, setN(1)); err != nil {
				t.Fatal(err)
			}
			var before atomic.Int32
			// Never settled: what a command leaves in the lock's memory stays for the next.
			locks := events.NewLocks[counter](func(string, uint64) bool { return false })
			res, err := events.Command[counter]{
				Store: store, Subject: subject, AggregateID: "c", DryRun: true,
				Lock: locks, Evolve: evolveCounter,
				Load: loadLast(stream, subject),
				Decide: func(state counter) ([]proto.Message, error) {
					if refuse {
						return nil, errRefused
					}
					return []proto.Message{setN(state.n + 1)}, nil
				},
				BeforeAppend: func(context.Context, counter, proto.Message) error { before.Add(1); return nil },
			}.Run(ctx)
			switch {
			case refuse && !errors.Is(err, errRefused):
				t.Fatalf("refused dry run: error %v, want the refusal", err)
			case !refuse && err != nil:
				t.Fatal(err)
			case !refuse && (len(res.Events) != 1 || !proto.Equal(res.Events[0], setN(2)) || res.Sequence != 0 || res.Revision != 1):
				t.Fatalf("dry run result %+v, want the event n=2 decided at revision 1, sequence 0", res)
			}
			if before.Load() != 0 {
				t.Error("a dry run ran BeforeAppend")
			}
			if seq, err := events.LastSequence(ctx, stream, subject); err != nil || seq != 1 {
				t.Fatalf("subject's last sequence %d (%v) after a dry run, want 1: nothing appended", seq, err)
			}
			// A write on the same Locks after the dry run takes the lock at once (the dry run
			// released it) and decides from the stored state, not from the dry run's decision.
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			var saw []int // the states Decide saw: a stale memory costs a conflict and a second try
			res, err = events.Command[counter]{
				Store: store, Subject: subject, AggregateID: "c",
				Lock: locks, Evolve: evolveCounter,
				Load: loadLast(stream, subject),
				Decide: func(state counter) ([]proto.Message, error) {
					saw = append(saw, state.n)
					return []proto.Message{setN(state.n + 1)}, nil
				},
			}.Run(wctx)
			if err != nil {
				t.Fatalf("a write after the dry run on the same locks: %v", err)
			}
			if !slices.Equal(saw, []int{1}) || len(res.Events) != 1 || !proto.Equal(res.Events[0], setN(2)) || res.Sequence != 2 {
				t.Fatalf("the write after the dry run decided from n=%v, result %+v; want once from n=1, the event n=2 at sequence 2", saw, res)
			}
		})
	}
}
