package reconcile

import (
	"context"

	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/view"
)

// Source feeds a controller keys: what changed.
type Source interface {
	// subscribe starts following the changes, and returns what calls add with the keys of
	// each change until ctx ends, and resync when it may have missed some. Subscribing comes
	// first, so a change made while the controller queues every key is not lost.
	subscribe(ctx context.Context) (feed func(add func(key string), resync func()))
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

func (s *cacheSource[T]) subscribe(ctx context.Context) func(add func(string), resync func()) {
	updates := s.cache.Updates(ctx, updatesBuffer)
	return func(add func(string), resync func()) { s.feed(ctx, updates, add, resync) }
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
