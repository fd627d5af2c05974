package namespacebinding

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/events"
	"github.com/fleetstream/fleetstream/pkg/view"
	"github.com/fleetstream/fleetstream/pkg/viewapi"
)

// create appends ev to subject (in stream) as the creation of an aggregate that may have lived
// there before: only when the subject is empty or its last event ended that life (ended). The
// view may not yet show a creation appended a moment ago, so the subject itself is read, and
// expecting it exactly as it is lets only one of two concurrent creations append; the other
// answers exists, as it would had it come second.
func (s *Service) create(ctx context.Context, stream jetstream.Stream, subject, aggregateID string, ended func(last proto.Message) bool, ev proto.Message, exists error) (uint64, error) {
	res, err := events.Command[*events.Event]{
		Store: s.store, Subject: subject, AggregateID: aggregateID, MaxConflicts: -1,
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

// remove appends the event end returns for the entry at key of c, which the subject's
// appends project, expecting the revision the entry is at: notFound when there is none, and a
// lost race is concurrent (the caller reads again). It returns the entry removed.
func remove[T viewapi.Object](ctx context.Context, store *events.Store, c *view.Cache[T], key, subject string, end func(cur T) proto.Message, notFound, concurrent error) (T, error) {
	res, err := events.Command[T]{
		Store: store, Subject: subject, AggregateID: key, MaxConflicts: -1,
		Load: func(context.Context, uint64) (T, uint64, error) {
			cur, ok := c.Get(key)
			if !ok {
				return cur, 0, notFound
			}
			return cur, cur.GetRevision(), nil
		},
		Decide: func(cur T) ([]proto.Message, error) { return []proto.Message{end(cur)}, nil },
	}.Run(ctx)
	switch {
	case events.IsConflict(err):
		return res.State, concurrent
	case err != nil:
		return res.State, apierr.Internal(err)
	}
	return res.State, nil
}
