package view

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
)

// Op says what happened to an entry.
type Op int

const (
	Put Op = iota + 1
	Delete
)

// Update is one change seen in the bucket. For Delete, Value is the entry as it was.
type Update[T proto.Message] struct {
	Op    Op
	Key   string
	Value T
}

// Cache mirrors a view bucket in memory by watching it, so reads (get, list, selectors, watch
// streams) cost no round trip. Every replica of a service has its own.
type Cache[T proto.Message] struct {
	kv    jetstream.KeyValue
	newT  func() T
	log   *zap.Logger
	ready chan struct{}

	mu      sync.RWMutex
	items   map[string]T
	changed chan struct{}
	subs    map[chan Update[T]]struct{}
}

// NewCache returns a cache of kv whose entries decode into newT().
func NewCache[T proto.Message](kv jetstream.KeyValue, newT func() T, log *zap.Logger) *Cache[T] {
	return &Cache[T]{kv: kv, newT: newT, log: log, ready: make(chan struct{}),
		items: make(map[string]T), changed: make(chan struct{}), subs: make(map[chan Update[T]]struct{})}
}

// Ready is closed once the bucket's initial content is loaded.
func (c *Cache[T]) Ready() <-chan struct{} { return c.ready }

// Run watches the bucket until ctx is done.
func (c *Cache[T]) Run(ctx context.Context) error {
	w, err := c.kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch bucket %s: %w", c.kv.Bucket(), err)
	}
	defer w.Stop()
	initial := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return errors.New("watch of bucket " + c.kv.Bucket() + " ended")
			}
			if e == nil {
				if initial {
					initial = false
					close(c.ready)
				}
				continue
			}
			c.apply(e)
		}
	}
}

func (c *Cache[T]) apply(e jetstream.KeyValueEntry) {
	if e.Key() == MetaKey {
		return
	}
	var u Update[T]
	u.Key = e.Key()
	c.mu.Lock()
	defer c.mu.Unlock()
	switch e.Operation() {
	case jetstream.KeyValuePut:
		v := c.newT()
		if err := proto.Unmarshal(e.Value(), v); err != nil {
			c.log.Error("undecodable view entry", zap.String("bucket", c.kv.Bucket()), zap.String("key", e.Key()), zap.Error(err))
			return
		}
		c.items[u.Key] = v
		u.Op, u.Value = Put, v
	default:
		old, ok := c.items[u.Key]
		if !ok {
			return
		}
		delete(c.items, u.Key)
		u.Op, u.Value = Delete, old
	}
	close(c.changed)
	c.changed = make(chan struct{})
	for ch := range c.subs {
		select {
		case ch <- u:
		default:
			// A subscriber that cannot keep up is cut off; it resubscribes and gets a snapshot.
			delete(c.subs, ch)
			close(ch)
		}
	}
}

// Get returns the entry at key.
func (c *Cache[T]) Get(key string) (T, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	v, ok := c.items[key]
	return v, ok
}

// List returns the entries accepted by keep (all if nil), ordered by key. Entries are shared:
// callers must not modify them.
func (c *Cache[T]) List(keep func(key string, v T) bool) []T {
	c.mu.RLock()
	keys := make([]string, 0, len(c.items))
	for k, v := range c.items {
		if keep == nil || keep(k, v) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	out := make([]T, len(keys))
	for i, k := range keys {
		out[i] = c.items[k]
	}
	c.mu.RUnlock()
	return out
}

// Len returns the number of entries.
func (c *Cache[T]) Len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.items)
}

// Subscribe returns the current entries and a channel of every later change, atomically. The
// channel is closed when ctx ends or when the subscriber falls more than buf changes behind.
func (c *Cache[T]) Subscribe(ctx context.Context, buf int) ([]Update[T], <-chan Update[T]) {
	ch := make(chan Update[T], buf)
	c.mu.Lock()
	snap := make([]Update[T], 0, len(c.items))
	for k, v := range c.items {
		snap = append(snap, Update[T]{Op: Put, Key: k, Value: v})
	}
	c.subs[ch] = struct{}{}
	c.mu.Unlock()
	sort.Slice(snap, func(i, j int) bool { return snap[i].Key < snap[j].Key })
	go func() {
		<-ctx.Done()
		c.mu.Lock()
		if _, ok := c.subs[ch]; ok {
			delete(c.subs, ch)
			close(ch)
		}
		c.mu.Unlock()
	}()
	return snap, ch
}

// WaitFor blocks until cond holds for the entry at key (v is the zero T and ok false when the
// key is absent).
func (c *Cache[T]) WaitFor(ctx context.Context, key string, cond func(v T, ok bool) bool) error {
	for {
		c.mu.RLock()
		v, ok := c.items[key]
		ch := c.changed
		c.mu.RUnlock()
		if cond(v, ok) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s in bucket %s: %w", key, c.kv.Bucket(), ctx.Err())
		case <-ch:
		}
	}
}

// WaitRevision blocks until the entry at key has applied the event at seq: it is present with a
// revision of at least seq, or, when deleted is true, gone.
func (c *Cache[T]) WaitRevision(ctx context.Context, key string, seq uint64, deleted bool) error {
	return c.WaitFor(ctx, key, func(v T, ok bool) bool {
		if deleted {
			return !ok
		}
		return ok && Revision(v) >= seq
	})
}
