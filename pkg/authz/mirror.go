package authz

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/view"
)

// mirror is a view.Cache of a bucket another service owns, attached once the bucket exists.
// Until then the view is empty, which denies rather than allows: a process may start before
// the services whose views it reads, and must neither wait for them nor guess. If the watch
// ends (the owner rebuilt the bucket, the bus restarted) the mirror attaches again and keeps
// answering from the old cache until the new one has loaded: authorization never takes the
// process down with it.
type mirror[T proto.Message] struct {
	bucket   string
	newT     func() T
	opts     []view.CacheOption
	ready    chan struct{} // closed once empty-for-now or loaded
	attached chan struct{} // closed once a cache is installed

	cur atomic.Pointer[attachment[T]]
	mu  sync.Mutex
	// swapped is closed when another cache is installed.
	swapped chan struct{}
}

type attachment[T proto.Message] struct {
	kv    jetstream.KeyValue
	cache *view.Cache[T]
}

func newMirror[T proto.Message](bucket string, newT func() T, opts ...view.CacheOption) *mirror[T] {
	return &mirror[T]{bucket: bucket, newT: newT, opts: opts, ready: make(chan struct{}), attached: make(chan struct{}),
		swapped: make(chan struct{})}
}

// get returns the cache, or nil while the bucket does not exist.
func (m *mirror[T]) get() *view.Cache[T] {
	if a := m.cur.Load(); a != nil {
		return a.cache
	}
	return nil
}

// changed returns channels of which one is closed at the next change of the mirrored view
// (another cache installed included).
func (m *mirror[T]) changed() []<-chan struct{} {
	m.mu.Lock()
	sw := m.swapped
	m.mu.Unlock()
	if c := m.get(); c != nil {
		return []<-chan struct{}{c.Changed(), sw}
	}
	return []<-chan struct{}{sw}
}

func (m *mirror[T]) install(kv jetstream.KeyValue, c *view.Cache[T]) {
	first := m.cur.Swap(&attachment[T]{kv: kv, cache: c}) == nil
	m.mu.Lock()
	close(m.swapped)
	m.swapped = make(chan struct{})
	m.mu.Unlock()
	if first {
		close(m.attached)
	}
	m.markReady()
}

func (m *mirror[T]) lookup(term string) []T {
	if c := m.get(); c != nil {
		return c.Lookup(term)
	}
	return nil
}

// list returns every value, in key order.
func (m *mirror[T]) list() []T {
	if c := m.get(); c != nil {
		return c.List(nil)
	}
	return nil
}

func (m *mirror[T]) readyCh() <-chan struct{} { return m.ready }

func (m *mirror[T]) getKey(key string) (T, bool) {
	if c := m.get(); c != nil {
		return c.Get(key)
	}
	var zero T
	return zero, false
}

// catchUp waits until the mirror has seen the bucket as it is now. A view written by another
// process reaches each of its watchers on its own schedule, so a caller granted a right a
// moment ago may be asked about it before this mirror has the grant.
func (m *mirror[T]) catchUp(ctx context.Context, js jetstream.JetStream) error {
	a := m.cur.Load()
	if a == nil {
		// Not attached yet: if the bucket exists by now, attaching is at most a poll away.
		if _, err := js.KeyValue(ctx, m.bucket); err != nil {
			if errors.Is(err, jetstream.ErrBucketNotFound) {
				return nil
			}
			return fmt.Errorf("authz: bucket %s: %w", m.bucket, err)
		}
		select {
		case <-m.attached:
			a = m.cur.Load()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	st, err := a.kv.Status(ctx)
	if err != nil {
		return fmt.Errorf("authz: status of bucket %s: %w", m.bucket, err)
	}
	si, ok := st.(interface{ StreamInfo() *jetstream.StreamInfo })
	if !ok {
		return nil
	}
	return a.cache.WaitSeen(ctx, si.StreamInfo().State.LastSeq)
}

func (m *mirror[T]) run(ctx context.Context, js jetstream.JetStream, log *zap.Logger) error {
	logged := false
	for ctx.Err() == nil {
		// Bounded: a lookup lost while JetStream starts (or the connection reconnects) was
		// otherwise waited for as long as the process lives, and the authorizer never got ready
		// (TestFailedStartStopsWhatItStarted under load).
		kctx, kcancel := context.WithTimeout(ctx, lookupTimeout)
		kv, err := js.KeyValue(kctx, m.bucket)
		kcancel()
		switch {
		case err == nil:
			m.follow(ctx, js, kv, log)
			continue
		case errors.Is(err, jetstream.ErrBucketNotFound):
			// Not created yet (or being rebuilt: the old cache, if any, keeps answering).
			m.markReady()
			if !logged {
				log.Info("view does not exist yet; its owner creates it when it starts", zap.String("bucket", m.bucket))
				logged = true
			}
		case ctx.Err() == nil:
			log.Warn("authorization view unavailable; retrying", zap.String("bucket", m.bucket), zap.Error(err))
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
	return nil
}

// follow mirrors kv with a new cache, installed once loaded, until view.Follow ends it: its
// bucket was deleted, or deleted and created again (a rebuilt view, which a reader resuming at
// the old stream's next sequence would miss the start of).
func (m *mirror[T]) follow(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, log *zap.Logger) {
	c := view.NewCache(js, kv, m.newT, log, m.opts...)
	err := view.Follow(ctx, kv, c, nil, func() { m.install(kv, c) })
	switch {
	case ctx.Err() != nil:
	case errors.Is(err, view.ErrBucketReplaced):
		log.Info("authorization view was rebuilt or is gone; attaching again", zap.String("bucket", m.bucket))
	default:
		log.Warn("authorization view watch ended; attaching again", zap.String("bucket", m.bucket), zap.Error(err))
		sleep(ctx, 250*time.Millisecond)
	}
}

// lookupTimeout bounds each request that attaches a mirror.
const lookupTimeout = 10 * time.Second

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func (m *mirror[T]) markReady() {
	select {
	case <-m.ready:
	default:
		close(m.ready)
	}
}
