package reconcile

import (
	"context"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/view"
)

// Source feeds a controller keys: what changed.
type Source interface {
	// subscribe starts following the changes, and returns what calls add with the keys of
	// each change until ctx ends, and resync when it may have missed some. Subscribing comes
	// first, so a change made while the controller queues every key is not lost.
	subscribe(ctx context.Context) (feed func(q queue, resync func()))
}

// queue is what a source queues keys on: the controller.
type queue interface {
	Add(key string)
	AddAfter(key string, d time.Duration)
}

// updatesBuffer is how far a source may fall behind its cache before the cache cuts it off; it
// then resubscribes and every key is queued.
const updatesBuffer = 8192

type cacheSource[T proto.Message] struct {
	cache *view.Cache[T]
	keys  func(u view.Update[T]) []string
}

// Watch queues, for every change of cache, the keys keys returns for it (nil: the changed
// entry's own key).
func Watch[T proto.Message](cache *view.Cache[T], keys func(u view.Update[T]) []string) Source {
	if keys == nil {
		keys = func(u view.Update[T]) []string { return []string{u.Key} }
	}
	return &cacheSource[T]{cache: cache, keys: keys}
}

func (s *cacheSource[T]) subscribe(ctx context.Context) func(q queue, resync func()) {
	updates := s.cache.Updates(ctx, updatesBuffer)
	return func(q queue, resync func()) { s.feed(ctx, updates, q.Add, resync) }
}

func (s *cacheSource[T]) feed(ctx context.Context, updates <-chan view.Update[T], add func(string), resync func()) {
	for {
		for u := range updates {
			for _, k := range s.keys(u) {
				add(k)
			}
		}
		if ctx.Err() != nil {
			return
		}
		// Cut off for falling behind: whatever was missed is in the cache now. The controller
		// queued every key when it started; this source has missed changes since.
		updates = s.cache.Updates(ctx, updatesBuffer)
		resync()
	}
}

type delayed struct {
	src   Source
	delay func() time.Duration
}

// Delay makes src queue each key delay() after the change that named it instead of at once.
// A key already waiting is not queued again until its wait is over (a delayed add of a waiting
// key keeps the earlier moment), so the changes of a busy cache (a joining fleet: a change every
// few milliseconds) are reconciled once per wait rather than once each. A source that was cut
// off still queues every key at once: what it missed may be old.
func Delay(src Source, delay func() time.Duration) Source { return &delayed{src: src, delay: delay} }

func (s *delayed) subscribe(ctx context.Context) func(q queue, resync func()) {
	feed := s.src.subscribe(ctx)
	return func(q queue, resync func()) { feed(delayedQueue{q: q, delay: s.delay}, resync) }
}

type delayedQueue struct {
	q     queue
	delay func() time.Duration
}

func (d delayedQueue) Add(key string) { d.q.AddAfter(key, d.delay()) }

func (d delayedQueue) AddAfter(key string, after time.Duration) {
	d.q.AddAfter(key, max(after, d.delay()))
}
