// Package viewapi is what the API handlers of the hub services do alike with the objects they
// serve from a view.Cache: read one or all of them once the service is ready, check a
// conditional write's expected revision, wait until a write shows in the view
// (read-your-writes), and stream a watch, with the same codes and words in every service
// (pkg/apierr, pkg/apiwait). A service keeps its projection, its validation and what its
// handlers make of the objects.
package viewapi

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/apiwait"
	"github.com/fleetstream/fleetstream/pkg/events"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// Object is what a view serves: an object whose revision is the sequence of the last event on
// its subject, which a conditional write expects.
type Object interface {
	proto.Message
	GetRevision() uint64
}

// Kind is one kind of object a service serves from a view.
type Kind[T Object] struct {
	// Name is how answers name the kind ("cluster set").
	Name string
	// Cache is the view the objects are read from.
	Cache *view.Cache[T]
	// Key returns the cache key of the object called name.
	Key func(name string) string
	// Gate is the service's readiness: nothing is read before it opens.
	Gate apiwait.Gate
}

// Get answers a request for the object called name (the request's field "name"): a DNS label,
// read once the service is ready, NotFound when there is none.
func (k Kind[T]) Get(ctx context.Context, name string) (T, error) {
	var v apierr.Violations
	v.DNSLabel("name", name)
	if err := k.Gate.Admit(ctx, &v); err != nil {
		var zero T
		return zero, err
	}
	return k.Current(name, 0)
}

// Selected admits a request that selects objects by their labels with the request's field
// "label_selector" ("" selects all) and returns the parsed selector.
func Selected(ctx context.Context, g apiwait.Gate, selector string) (labels.Selector, error) {
	var v apierr.Violations
	sel := v.Selector("label_selector", selector)
	if err := g.Admit(ctx, &v); err != nil {
		return nil, err
	}
	return sel, nil
}

// List returns the objects keep keeps (all with nil), in key order, once the service is ready.
func (k Kind[T]) List(ctx context.Context, keep func(key string, v T) bool) ([]T, error) {
	if err := k.Gate.Ready(ctx); err != nil {
		return nil, err
	}
	return k.Cache.List(keep), nil
}

// Current returns the object called name for a write that expects it at revision expected (0:
// at whatever revision): NotFound when there is none, RevisionMismatch when it is at another.
// The caller has been admitted (Gate.Admit).
func (k Kind[T]) Current(name string, expected uint64) (T, error) {
	var zero T
	cur, ok := k.Cache.Get(k.Key(name))
	if !ok {
		return zero, apierr.NotFound(k.Name, name)
	}
	if expected != 0 && expected != cur.GetRevision() {
		return zero, apierr.RevisionMismatch(k.Name, name, cur.GetRevision(), expected)
	}
	return cur, nil
}

// Load is the events.Command Load of a write to the object called name that expects it at
// revision expected (0: at whatever revision): Current, after waiting (bounded, best effort:
// the append checks anyway) until the view shows revision min or later, or no object.
func (k Kind[T]) Load(name string, expected uint64) func(ctx context.Context, min uint64) (T, uint64, error) {
	return func(ctx context.Context, min uint64) (T, uint64, error) {
		if min > 0 {
			_ = apiwait.Visible(ctx, "change", func(ctx context.Context) error {
				return k.Cache.WaitFor(ctx, k.Key(name), func(v T, ok bool) bool { return !ok || v.GetRevision() >= min })
			})
		}
		cur, err := k.Current(name, expected)
		if err != nil {
			return cur, 0, err
		}
		return cur, cur.GetRevision(), nil
	}
}

// Await waits until the view holds the object called name at event seq or later
// (read-your-writes) and returns it; ok is false when a later event removed it meanwhile.
func (k Kind[T]) Await(ctx context.Context, name string, seq uint64) (cur T, ok bool, err error) {
	return Await(ctx, k.Cache, k.Key(name), seq)
}

// AwaitPast waits until the view has moved the object called name past revision rev, changed
// or removed: how a write that deletes it waits until the deletion shows.
func (k Kind[T]) AwaitPast(ctx context.Context, name string, rev uint64) error {
	return AwaitPast(ctx, k.Cache, k.Key(name), rev)
}

// Await is Kind.Await for the entry at key of c.
func Await[T Object](ctx context.Context, c *view.Cache[T], key string, seq uint64) (cur T, ok bool, err error) {
	if err := apiwait.Visible(ctx, "change", func(ctx context.Context) error { return c.WaitRevision(ctx, key, seq, false) }); err != nil {
		return cur, false, err
	}
	cur, ok = c.Get(key)
	return cur, ok, nil
}

// AwaitPast is Kind.AwaitPast for the entry at key of c.
func AwaitPast[T Object](ctx context.Context, c *view.Cache[T], key string, rev uint64) error {
	return apiwait.Visible(ctx, "change", func(ctx context.Context) error {
		return c.WaitFor(ctx, key, func(v T, ok bool) bool { return !ok || v.GetRevision() > rev })
	})
}

// Create appends ev to subject (in stream) as the creation of an aggregate that may have lived
// there before: only when the subject is empty or its last event ended that life (ended). The
// view may not yet show a creation appended a moment ago, so the subject itself is read, and
// expecting it exactly as it is lets only one of two concurrent creations append; the other
// answers exists, as it would had it come second. It returns the event's sequence.
func Create(ctx context.Context, store *events.Store, stream jetstream.Stream, subject, aggregateID string, ended func(last proto.Message) bool, ev proto.Message, exists error) (uint64, error) {
	res, err := events.Command[*events.Event]{
		Store: store, Subject: subject, AggregateID: aggregateID, MaxConflicts: -1,
		Load: func(ctx context.Context, _ uint64) (*events.Event, uint64, error) {
			seq, last, err := events.Last(ctx, stream, subject)
			return last, seq, err
		},
		Decide: func(last *events.Event) ([]proto.Message, error) {
			if last != nil && !ended(last.Payload) {
				return nil, exists
			}
			return []proto.Message{ev}, nil
		},
	}.Run(ctx)
	switch {
	case events.IsConflict(err):
		return 0, exists
	case err != nil:
		return 0, apierr.Internal(err)
	}
	return res.Sequence, nil
}

// Remove appends the event end returns for the object load returns (or answers load's error:
// none, or not at the expected revision), expecting the object's revision. A lost race answers
// concurrent (nil: apierr.Internal's Aborted), for the caller to read again. It returns the
// object removed.
func Remove[T Object](ctx context.Context, store *events.Store, subject, aggregateID string, load func() (T, error), end func(cur T) proto.Message, concurrent error) (T, error) {
	res, err := events.Command[T]{
		Store: store, Subject: subject, AggregateID: aggregateID, MaxConflicts: -1,
		Load: func(context.Context, uint64) (T, uint64, error) {
			cur, err := load()
			if err != nil {
				return cur, 0, err
			}
			return cur, cur.GetRevision(), nil
		},
		Decide: func(cur T) ([]proto.Message, error) { return []proto.Message{end(cur)}, nil },
	}.Run(ctx)
	switch {
	case events.IsConflict(err) && concurrent != nil:
		return res.State, concurrent
	case err != nil:
		return res.State, apierr.Internal(err)
	}
	return res.State, nil
}

// ErrStop ends a watch without an error when send returns it (what is watched is gone).
var ErrStop = errors.New("watch ended")

// Watch hands every update to send until ctx ends, send fails or returns ErrStop (nil then),
// or the view closes updates because the watcher fell behind: then the watch ends with
// apierr.WatchFellBehind(what), and the client watches again.
func Watch[T proto.Message](ctx context.Context, updates <-chan view.Update[T], what string, send func(view.Update[T]) error) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case u, ok := <-updates:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return apierr.WatchFellBehind(what)
			}
			if err := send(u); err != nil {
				if errors.Is(err, ErrStop) {
					return nil
				}
				return err
			}
		}
	}
}

// Builtin is an object a service's binary wants to exist as it says (a built-in role template,
// a built-in cluster set), written through the events an admin's change would append.
type Builtin[T Object] struct {
	// What names it in errors and the log ("role template project-owner").
	What string
	// Cache is its view and Key its entry there.
	Cache *view.Cache[T]
	Key   string
	// Store appends to Subject (of Stream), with AggregateID in the envelopes.
	Store       *events.Store
	Stream      jetstream.Stream
	Subject     string
	AggregateID string
	// Ended reports whether the subject's last event ended the object's life (its deletion):
	// a subject that ends otherwise holds an object the view has not shown yet.
	Ended func(last proto.Message) bool
	// Decide returns the events that bring cur (ok false: absent) to what the binary wants, none
	// when it is so already.
	Decide func(cur T, ok bool) []proto.Message
}

// Entry is the state of a write that may create its object: the view's entry, or none (OK
// false).
type Entry[T Object] struct {
	Cur T
	OK  bool
}

// LoadEntry is the events.Command Load of a write to the entry at key of c that may create it,
// whose events are on subject of stream: the entry once c shows revision min or later; when c
// has none, the subject's last sequence, for a creation to expect, unless the subject's last
// event is not ended's (a deletion), i.e. an object c has not shown yet (another writer's
// creation a moment ago): then the entry once c shows it (bounded: apiwait.Visible).
func LoadEntry[T Object](c *view.Cache[T], key string, stream jetstream.Stream, subject string, ended func(last proto.Message) bool) func(ctx context.Context, min uint64) (Entry[T], uint64, error) {
	return func(ctx context.Context, min uint64) (Entry[T], uint64, error) {
		if cur, ok := c.Get(key); ok && cur.GetRevision() >= min {
			return Entry[T]{cur, true}, cur.GetRevision(), nil
		}
		seq, last, err := events.Last(ctx, stream, subject)
		if err != nil {
			return Entry[T]{}, 0, err
		}
		if last == nil || ended(last.Payload) {
			return Entry[T]{}, seq, nil
		}
		if err := apiwait.Visible(ctx, "change", func(ctx context.Context) error { return c.WaitRevision(ctx, key, seq, false) }); err != nil {
			return Entry[T]{}, 0, err
		}
		cur, ok := c.Get(key)
		return Entry[T]{cur, ok}, cur.GetRevision(), nil
	}
}

// Ensure brings b to what the binary wants: an events.Command whose state is b's view entry
// (LoadEntry), decided again after a lost race, as replicas starting together lose one to another
// until one of them sees the winner's write and has nothing left to do. It returns once the
// view shows this replica's write, if it made one.
func Ensure[T Object](ctx context.Context, log *zap.Logger, b Builtin[T]) error {
	var res events.Result[Entry[T]]
	for {
		var err error
		res, err = events.Command[Entry[T]]{
			Store: b.Store, Subject: b.Subject, AggregateID: b.AggregateID,
			Load:   LoadEntry(b.Cache, b.Key, b.Stream, b.Subject, b.Ended),
			Decide: func(e Entry[T]) ([]proto.Message, error) { return b.Decide(e.Cur, e.OK), nil },
		}.Run(ctx)
		if err == nil {
			break
		}
		// Another replica's write the view has not shown within apiwait.Patience (its lease
		// holder stalled or changing hands): a start has no caller to answer, so it waits on
		// rather than fail the service.
		if connect.CodeOf(err) != connect.CodeUnavailable || ctx.Err() != nil {
			return fmt.Errorf("built-in %s: %w", b.What, err)
		}
		log.Info("built-in "+b.What+": waiting for the view to show another replica's write", zap.Error(err))
		select {
		case <-ctx.Done():
			return fmt.Errorf("built-in %s: %w", b.What, ctx.Err())
		case <-time.After(time.Second):
		}
	}
	if len(res.Events) == 0 {
		return nil
	}
	if err := b.Cache.WaitRevision(ctx, b.Key, res.Sequence, false); err != nil {
		return fmt.Errorf("built-in %s: %w", b.What, err)
	}
	log.Info("built-in " + b.What + " written")
	return nil
}
