package view

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/proto"
)

// Set is the views a service owns, each declared once (Add): its projection, its engine and the
// cache the service reads it through. From that one declaration the set runs every engine, opens
// every cache once its engine has created the bucket, says when all are Ready, and lists the
// projections (for view.Verify and tools/chaos) and their buckets. Without it a view was five
// hand-kept edits: an engine field, a cache field, a line in Run, a bucket lookup in start and a
// line in Projections().
type Set struct {
	js      jetstream.JetStream
	log     *zap.Logger
	opts    []Option
	members []*member
	err     error
	ready   chan struct{}
}

// member is one view of a set.
type member struct {
	p      Projection
	engine *Engine
	// open builds the view's cache on kv and stores it where Add was told; the cache is then
	// run with run and is loaded when ready closes.
	open func(kv jetstream.KeyValue) (run func(context.Context) error, ready <-chan struct{})
}

// NewSet returns an empty set whose engines read and write through js with opts (WithReplicas
// and the like apply to every view of a service). js may be nil for a set that is only listed
// (Projections, Buckets), never run.
func NewSet(js jetstream.JetStream, log *zap.Logger, opts ...Option) *Set {
	if log == nil {
		log = zap.NewNop()
	}
	return &Set{js: js, log: log, opts: opts, ready: make(chan struct{})}
}

// Add declares the view p, whose entries are T, and returns its engine. When the set runs, the
// cache of p's bucket (with opts) is stored in *cache once the engine has created the bucket and
// before Ready closes; a service reads *cache only after that, as it did with a cache it opened
// itself. An engine p cannot have (its entry type has no revision field) is the set's Err, and
// Add then returns nil.
func Add[T proto.Message](s *Set, p Projection, cache **Cache[T], opts ...CacheOption) *Engine {
	e, err := NewEngine(s.js, p, s.log, s.opts...)
	if err != nil {
		s.err = errors.Join(s.err, fmt.Errorf("view %s: %w", p.Name, err))
		return nil
	}
	newT := func() T { return p.New().(T) }
	if _, ok := p.New().(T); !ok {
		s.err = errors.Join(s.err, fmt.Errorf("view %s: entries are %T, not the cache's type", p.Name, p.New()))
		return nil
	}
	m := &member{p: p, engine: e, open: func(kv jetstream.KeyValue) (func(context.Context) error, <-chan struct{}) {
		c := NewCache(s.js, kv, newT, s.log, opts...)
		*cache = c
		return c.Run, c.Ready()
	}}
	s.members = append(s.members, m)
	return e
}

// Err is what went wrong declaring the set's views (nil if nothing).
func (s *Set) Err() error { return s.err }

// Projections are the set's views in the order they were added: the order tools index.
func (s *Set) Projections() []Projection {
	out := make([]Projection, len(s.members))
	for i, m := range s.members {
		out[i] = m.p
	}
	return out
}

// Buckets are the configurations of the set's view buckets, in the order of Projections. The
// engines create them; a topology or permission check reads them here.
func (s *Set) Buckets() []jetstream.KeyValueConfig {
	out := make([]jetstream.KeyValueConfig, len(s.members))
	for i, m := range s.members {
		out[i] = m.p.Bucket
	}
	return out
}

// Ready is closed once every engine has caught up and every cache has loaded its bucket.
func (s *Set) Ready() <-chan struct{} { return s.ready }

// Run runs every engine and, as each engine's bucket comes to exist, its cache, until ctx is
// done or one of them fails. It returns nil when ctx ends.
func (s *Set) Run(ctx context.Context) error {
	if s.err != nil {
		return s.err
	}
	g, ctx := errgroup.WithContext(ctx)
	readies := make([]<-chan struct{}, len(s.members))
	opened := make(chan int, len(s.members))
	for i, m := range s.members {
		g.Go(func() error { return m.engine.Run(ctx) })
		g.Go(func() error {
			// The engine creates the bucket before it is ready: the cache opens it after.
			select {
			case <-m.engine.Ready():
			case <-ctx.Done():
				return nil
			}
			// Every view opens its bucket when the fleet has caught up, the hub at its busiest:
			// a lookup that times out is tried again, not the end of the service.
			kv, err := WaitBucket(ctx, s.js, m.p.Bucket.Bucket, nil)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("view %s: bucket %s: %w", m.p.Name, m.p.Bucket.Bucket, err)
			}
			run, ready := m.open(kv)
			readies[i] = ready
			opened <- i
			return run(ctx)
		})
	}
	g.Go(func() error {
		for range s.members {
			select {
			case <-opened:
			case <-ctx.Done():
				return nil
			}
		}
		// Every cache is stored (each send on opened follows its store) before this reads them.
		for _, ch := range readies {
			select {
			case <-ch:
			case <-ctx.Done():
				return nil
			}
		}
		close(s.ready)
		return nil
	})
	return g.Wait()
}
