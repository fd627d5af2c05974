package events

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/event/v1"
)

// DefaultConflicts is how many lost races a Command decides again after, unless it says
// otherwise: two writers on one aggregate race once or twice, not five times.
const DefaultConflicts = 5

// ErrBusy means a Command gave up waiting for its Lock: nothing was appended.
var ErrBusy = errors.New("busy with other commands")

// Command is one write to one aggregate, the way every API write is made (the Decide/Evolve
// shape of bruth/rita, with JetStream's expected last subject sequence as the check): load the
// state and the revision it is at, decide from it alone which events follow, append them
// expecting that revision. A lost race (ErrConflict) means the decision was made on a state
// that is no longer current, so the Command loads again and decides again, a bounded number of
// times, unless the caller stated the revision it expects (Expected): then the caller decides,
// and gets the conflict as it came.
type Command[S any] struct {
	// Store appends the events to Subject, with AggregateID in their envelopes (AggregateIDOf,
	// when set, takes it from the state instead: an id that is not the aggregate's name).
	Store         *Store
	Subject       string
	AggregateID   string
	AggregateIDOf func(state S) string

	// Load returns the state the next append must find and its revision, the sequence of the
	// subject's last event as the state knows it. min is 0 on the first attempt and, after a
	// lost race, the least revision the current state can have: Load waits (bounded) for its
	// source, typically a view, to show it, and answers with what it has if it does not.
	Load func(ctx context.Context, min uint64) (state S, rev uint64, err error)
	// Decide returns the events that follow from state, in order (none: nothing to do), or why
	// the command is refused. It reads nothing else that a lost race could change, so deciding
	// again on a reloaded state is always right.
	Decide func(state S) ([]proto.Message, error)

	// Expected is the revision the caller expects (an API's expected_revision; 0: none). Load
	// checks it against the state; a race lost after that is returned, not retried.
	Expected uint64
	// MaxConflicts is how many lost races are decided again; the next one is returned (0:
	// DefaultConflicts, negative: none, for a write whose lost race has an answer of its own,
	// such as a creation's AlreadyExists).
	MaxConflicts int

	// Prepare, when set, runs after each Load and before Decide, for what Decide reads beside
	// the state and must see as of rev (another view of the same stream, say).
	Prepare func(ctx context.Context, state S, rev uint64) error
	// BeforeAppend, when set, runs before each event's append: for a write outside the stream
	// that the event announces (sealed credentials), which must land before it and only if the
	// decision stands.
	BeforeAppend func(ctx context.Context, state S, ev proto.Message) error

	// Evolve, when set, applies an event to a state (the aggregate's projection): ok is false
	// when it cannot. The Command then knows the state after its own append (kept in Lock for
	// the next command) and, with CatchUp, after the events that beat it.
	Evolve func(state S, ev *Event) (next S, ok bool)
	// CatchUp, when set with Evolve, is the stream of Subject: after a lost race the Command
	// reads the events appended since its revision (at most MaxCatchUp) and evolves its state
	// with them instead of waiting for Load's source to show them.
	CatchUp    jetstream.Stream
	MaxCatchUp int

	// Lock, when set, serializes the commands on LockKey (default Subject) in this process:
	// they queue instead of racing each other for one expectation, and each starts from the
	// state the previous one left (Evolve), without waiting for Load's source to show it.
	Lock    *Locks[S]
	LockKey string

	// DryRun, when set, makes Run load, prepare and decide exactly as for a write and return
	// the decided events (Result.Events, Sequence 0) without appending them or running
	// BeforeAppend: an API's dry run answers what the write would do, or refuses as it would.
	DryRun bool
}

// DefaultCatchUp bounds the events a Command with CatchUp folds before leaving it to Load.
const DefaultCatchUp = 32

// Result is what a Command did.
type Result[S any] struct {
	// State is the state the events were decided from, at Revision.
	State    S
	Revision uint64
	// Events are the events appended (none: the decision was to do nothing; with DryRun, the
	// events that would have been), Sequence the stream sequence of the last of them (0 when
	// none, and with DryRun).
	Events   []proto.Message
	Sequence uint64
}

// memory is what a Command knows of its aggregate beyond what Load shows: last is the
// subject's last sequence as this process left or read it (0: nothing), state the aggregate
// as of last when known.
type memory[S any] struct {
	last  uint64
	state S
	known bool
}

// Run executes the command.
func (c Command[S]) Run(ctx context.Context) (Result[S], error) {
	var res Result[S]
	var mem memory[S]
	if c.Lock != nil {
		key := c.LockKey
		if key == "" {
			key = c.Subject
		}
		l, err := c.Lock.lock(ctx, key)
		if err != nil {
			return res, fmt.Errorf("%w: %w", ErrBusy, err)
		}
		mem = l.mem
		defer func() {
			l.mem = mem
			c.Lock.unlock(key, l)
		}()
	}
	maxConflicts := c.MaxConflicts
	if maxConflicts == 0 {
		maxConflicts = DefaultConflicts
	}
	var min uint64
	for conflicts := 0; ; conflicts++ {
		state, rev, err := c.load(ctx, mem, min)
		if err != nil {
			return res, err
		}
		if c.Prepare != nil {
			if err := c.Prepare(ctx, state, rev); err != nil {
				return res, err
			}
		}
		evs, err := c.Decide(state)
		if err != nil {
			return res, err
		}
		res = Result[S]{State: state, Revision: rev}
		if len(evs) == 0 {
			return res, nil
		}
		if c.DryRun {
			// Nothing appended: the lock's memory (mem) stays what it was.
			res.Events = evs
			return res, nil
		}
		seq, err := c.append(ctx, state, rev, evs)
		if err == nil {
			mem = c.after(state, seq, evs)
			res.Events, res.Sequence = evs, seq
			return res, nil
		}
		mem = memory[S]{}
		if !IsConflict(err) || c.Expected != 0 || conflicts >= maxConflicts {
			return res, err
		}
		if ctx.Err() != nil {
			return res, fmt.Errorf("%s: %w (after %v)", c.Subject, ctx.Err(), err)
		}
		// seq is the last sequence this attempt appended or expected: something came after it.
		min = seq + 1
		if c.CatchUp != nil && c.Evolve != nil && seq == rev {
			if mem, err = c.catchUp(ctx, state, rev); err != nil {
				return res, err
			}
		}
	}
}

// load returns the state to decide from: Load's, unless this process knows better (mem). A
// state this process appended or read from the stream is newer than a view that has not
// caught up with it; a view that has is as good, and may be newer still.
func (c Command[S]) load(ctx context.Context, mem memory[S], min uint64) (S, uint64, error) {
	if mem.last == 0 {
		return c.Load(ctx, min)
	}
	if state, rev, err := c.Load(ctx, 0); err == nil && rev >= mem.last {
		return state, rev, nil
	}
	if mem.known {
		return mem.state, mem.last, nil
	}
	return c.Load(ctx, max(min, mem.last))
}

// append appends evs in order, each expecting the one before, the first expecting rev, and
// returns the last sequence appended, or the one a failed append expected.
func (c Command[S]) append(ctx context.Context, state S, rev uint64, evs []proto.Message) (uint64, error) {
	id := c.AggregateID
	if c.AggregateIDOf != nil {
		id = c.AggregateIDOf(state)
	}
	seq := rev
	for _, ev := range evs {
		if c.BeforeAppend != nil {
			if err := c.BeforeAppend(ctx, state, ev); err != nil {
				return seq, err
			}
		}
		next, err := c.Store.Append(ctx, c.Subject, id, At(seq), ev)
		if err != nil {
			return seq, err
		}
		seq = next
	}
	return seq, nil
}

// after returns what the Command knows once it appended evs, the last at seq, to state.
func (c Command[S]) after(state S, seq uint64, evs []proto.Message) memory[S] {
	mem := memory[S]{last: seq}
	if c.Evolve == nil || len(evs) != 1 {
		// Several events: their sequences between rev and seq are not known here.
		return mem
	}
	ev := &Event{Envelope: &eventv1.Envelope{Time: timestamppb.New(time.Now())}, Payload: evs[0], Subject: c.Subject, Sequence: seq}
	mem.state, mem.known = c.Evolve(state, ev)
	return mem
}

// catchUp reads the events appended to the subject after state (at rev) from the stream and
// evolves state with them: what the subject holds now, without waiting for Load's source.
// Past MaxCatchUp events, or one Evolve cannot apply, it returns the subject's last sequence
// only, for Load to wait on.
func (c Command[S]) catchUp(ctx context.Context, state S, rev uint64) (memory[S], error) {
	limit := c.MaxCatchUp
	if limit <= 0 {
		limit = DefaultCatchUp
	}
	seq := rev
	for range limit {
		msg, err := c.CatchUp.GetMsg(ctx, seq+1, jetstream.WithGetMsgSubject(c.Subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return memory[S]{last: seq, state: state, known: true}, nil
		}
		if err != nil {
			return memory[S]{}, fmt.Errorf("read %s after %d: %w", c.Subject, seq, err)
		}
		ev, err := Decode(msg.Data)
		if err != nil {
			return memory[S]{}, fmt.Errorf("read %s at %d: %w", c.Subject, msg.Sequence, err)
		}
		ev.Sequence, ev.Subject = msg.Sequence, msg.Subject
		next, ok := c.Evolve(state, ev)
		if !ok {
			break
		}
		state, seq = next, msg.Sequence
	}
	last, err := LastSequence(ctx, c.CatchUp, c.Subject)
	if err != nil {
		return memory[S]{}, err
	}
	return memory[S]{last: last}, nil
}
