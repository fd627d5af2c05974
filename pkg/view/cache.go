package view

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/consumer"
)

// Op says what happened to an entry.
type Op int

const (
	Put Op = iota + 1
	Delete
)

// Update is one change seen in the bucket. For Delete, Value is the entry as it was. Prev is the
// entry before the change (for Delete the same as Value), or the zero T if the key was absent.
type Update[T proto.Message] struct {
	Op    Op
	Key   string
	Value T
	Prev  T
	// Revision is the KV revision of the change; in a snapshot, the revision of the entry.
	Revision uint64
	// Time is when the change was stored in the view (its KV message's time): for a projection,
	// its event's time plus the projection's lag. Zero in a snapshot, which is no change.
	Time time.Time
}

// Entry is a cached entry with the KV revision it was stored at, for compare-and-set writes and
// for comparing with what others report about it. Value is shared: callers must not modify it.
type Entry[T proto.Message] struct {
	Key        string
	KVRevision uint64
	Value      T
}

// CacheOption configures a Cache.
type CacheOption func(*cacheConfig)

type cacheConfig struct {
	filter string
	index  any // func(key string, v T) []string of the cache's T
}

// WithFilter mirrors only the keys matching filter, a NATS subject filter (">", all keys, is the
// default). WaitCheckpoint needs a filter that matches MetaKey.
func WithFilter(filter string) CacheOption { return func(c *cacheConfig) { c.filter = filter } }

// WithIndex lists every entry under the terms index returns for it, for Lookup, Keys and Count.
// Its T must be the cache's: NewCache panics otherwise.
func WithIndex[T proto.Message](index func(key string, v T) []string) CacheOption {
	return func(c *cacheConfig) { c.index = index }
}

// Cache mirrors a view bucket in memory by reading it, so reads (get, list, index lookups,
// selectors, watch streams) cost no round trip. Every replica of a service has its own.
type Cache[T proto.Message] struct {
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	newT   func() T
	log    *zap.Logger
	filter string
	index  func(key string, v T) []string
	ready  chan struct{}
	// readyOnce: Run may be called again after it returned (a caller restarting it after an
	// error); it then goes on from the last change read.
	readyOnce sync.Once

	mu    sync.RWMutex
	items map[string]Entry[T]
	terms map[string]map[string]struct{} // index term → keys
	// checkpoint is the highest view checkpoint seen in the bucket's MetaKey.
	checkpoint uint64
	// seen is the KV revision of the last change read, whatever its key.
	seen uint64
	// sent is the KV revision of the last change passed to subscribers.
	sent    uint64
	changed chan struct{}
	// subs are the subscribers, each with the channel that ends its ctx watcher when the
	// subscriber is cut off (else a loop that resubscribes with one long-lived ctx would keep a
	// goroutine and a buffer per cut-off until that ctx ends).
	subs map[chan Update[T]]chan struct{}
}

// cachePull is how many of the bucket's changes a cache keeps buffered.
const cachePull = 256

// NewCache returns a cache of kv, read through js, whose entries decode into newT().
func NewCache[T proto.Message](js jetstream.JetStream, kv jetstream.KeyValue, newT func() T, log *zap.Logger, opts ...CacheOption) *Cache[T] {
	cfg := cacheConfig{filter: jetstream.AllKeys}
	for _, o := range opts {
		o(&cfg)
	}
	c := &Cache[T]{js: js, kv: kv, newT: newT, log: log, filter: cfg.filter, ready: make(chan struct{}),
		items: make(map[string]Entry[T]), terms: make(map[string]map[string]struct{}),
		changed: make(chan struct{}), subs: make(map[chan Update[T]]chan struct{})}
	if cfg.index != nil {
		index, ok := cfg.index.(func(string, T) []string)
		if !ok {
			panic(fmt.Sprintf("view: index %T of a cache of %T", cfg.index, newT()))
		}
		c.index = index
	}
	return c
}

// Ready is closed once the bucket's initial content is loaded.
func (c *Cache[T]) Ready() <-chan struct{} { return c.ready }

// The headers and subject layout of a KV bucket's stream (nats.go's, not exported by it).
const (
	kvOperationHeader = "KV-Operation"
	kvSubjectPrefix   = "$KV."
)

// Run reads the bucket until ctx is done. It returns an error only if the bucket's stream
// refuses it a consumer (the bucket was deleted).
//
// A KV bucket is a stream holding, with history 1, each key's last change: the cache reads it
// with consumer.Ordered from the beginning and then follows it, which is what nats.go's KV
// watch does, but nats.go's watch has a fixed 5 s idle heartbeat (a watch whose consumer was on
// a crashed NATS node stays silent 10 s) and replaces its consumer without a bounded wait, and
// every authorization check and read-your-writes wait hangs on the caches (issue 14). The
// ordered reader notices silence after two 1 s heartbeats and replaces its consumer with 1 s
// attempts; it resumes after the last revision read, so nothing is skipped or applied twice.
func (c *Cache[T]) Run(ctx context.Context) error {
	bucket := c.kv.Bucket()
	prefix := kvSubjectPrefix + bucket + "."
	// A Run after an earlier one returned goes on after the last change that one read.
	c.mu.RLock()
	from := c.seen + 1
	c.mu.RUnlock()
	r, err := consumer.NewOrdered(ctx, c.js, "KV_"+bucket, []string{prefix + c.filter}, from, cachePull, c.log)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("read bucket %s: %w", bucket, err)
	}
	defer r.Stop()
	if r.InitialPending() == 0 {
		c.markReady()
	}
	err = r.Each(ctx, func(m jetstream.Msg, md *jetstream.MsgMetadata) {
		op := jetstream.KeyValuePut
		switch m.Headers().Get(kvOperationHeader) {
		case "DEL":
			op = jetstream.KeyValueDelete
		case "PURGE":
			op = jetstream.KeyValuePurge
		}
		c.apply(strings.TrimPrefix(m.Subject(), prefix), op, m.Data(), md.Sequence.Stream, md.Timestamp)
		if md.NumPending == 0 {
			c.markReady()
		}
	})
	if err != nil {
		return fmt.Errorf("read bucket %s: %w", bucket, err)
	}
	return nil
}

func (c *Cache[T]) markReady() { c.readyOnce.Do(func() { close(c.ready) }) }

// apply applies the change at KV revision rev of key.
func (c *Cache[T]) apply(key string, op jetstream.KeyValueOp, value []byte, rev uint64, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rev > c.seen {
		c.seen = rev
		// Waiters of WaitSeen must wake even when the change is one the cache ignores.
		defer c.broadcast()
	}
	if key == MetaKey {
		// The engine moves the checkpoint only after every entry write of a batch, so once the
		// cache has seen checkpoint n it has seen every change of the events up to n.
		var m meta
		if op == jetstream.KeyValuePut && json.Unmarshal(value, &m) == nil && m.Checkpoint > c.checkpoint {
			c.checkpoint = m.Checkpoint
			c.broadcast()
		}
		return
	}
	old, had := c.items[key]
	u := Update[T]{Key: key, Prev: old.Value, Revision: rev, Time: at}
	switch op {
	case jetstream.KeyValuePut:
		v := c.newT()
		if err := proto.Unmarshal(value, v); err != nil {
			c.log.Error("undecodable view entry", zap.String("bucket", c.kv.Bucket()), zap.String("key", key), zap.Error(err))
			return
		}
		if had {
			c.unindex(key, old.Value)
		}
		c.items[key] = Entry[T]{Key: key, KVRevision: rev, Value: v}
		c.reindex(key, v)
		u.Op, u.Value = Put, v
	default:
		if !had {
			return
		}
		c.unindex(key, old.Value)
		delete(c.items, key)
		u.Op, u.Value = Delete, old.Value
	}
	c.broadcast()
	c.sent = rev
	for ch, cut := range c.subs {
		select {
		case ch <- u:
		default:
			// A subscriber that cannot keep up is cut off; it resubscribes and gets a snapshot.
			delete(c.subs, ch)
			close(ch)
			close(cut)
		}
	}
}

// broadcast wakes everyone waiting for a change. c.mu must be held.
func (c *Cache[T]) broadcast() {
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *Cache[T]) reindex(key string, v T) {
	if c.index == nil {
		return
	}
	for _, term := range c.index(key, v) {
		set := c.terms[term]
		if set == nil {
			set = make(map[string]struct{})
			c.terms[term] = set
		}
		set[key] = struct{}{}
	}
}

func (c *Cache[T]) unindex(key string, v T) {
	if c.index == nil {
		return
	}
	for _, term := range c.index(key, v) {
		if set := c.terms[term]; set != nil {
			delete(set, key)
			if len(set) == 0 {
				delete(c.terms, term)
			}
		}
	}
}

// Get returns the entry at key.
func (c *Cache[T]) Get(key string) (T, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.items[key]
	return e.Value, ok
}

// GetFresh is Get for a key another service may have just written: on a miss it asks the bucket
// itself and, when the key is there, waits until the cache has seen that revision. A cluster
// registered through cluster-import is then bindable at once through namespace-binding, whose
// cache of the registry may still be a few milliseconds behind. A hit is answered from the
// cache as Get would: only a key the cache does not hold costs a round trip. key must match the
// cache's filter.
func (c *Cache[T]) GetFresh(ctx context.Context, key string) (T, bool, error) {
	if v, ok := c.Get(key); ok {
		return v, true, nil
	}
	var zero T
	e, err := c.kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		return zero, false, nil
	case err != nil:
		return zero, false, fmt.Errorf("get %s from bucket %s: %w", key, c.kv.Bucket(), err)
	}
	rev := e.Revision()
	err = c.WaitFor(ctx, key, func(_ T, _ bool) bool {
		c.mu.RLock()
		defer c.mu.RUnlock()
		return c.seen >= rev
	})
	if err != nil {
		return zero, false, err
	}
	// The cache has seen the revision read (or a later one): its answer now is as new as the
	// bucket's was, a delete since included.
	v, ok := c.Get(key)
	return v, ok, nil
}

// GetEntry returns the entry at key with its KV revision.
func (c *Cache[T]) GetEntry(key string) (Entry[T], bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.items[key]
	return e, ok
}

// List returns the entries accepted by keep (all if nil), ordered by key. Entries are shared:
// callers must not modify them.
func (c *Cache[T]) List(keep func(key string, v T) bool) []T {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.values(c.keys(keep))
}

// Entries is List with keys and KV revisions.
func (c *Cache[T]) Entries(keep func(key string, v T) bool) []Entry[T] {
	c.mu.RLock()
	defer c.mu.RUnlock()
	keys := c.keys(keep)
	out := make([]Entry[T], len(keys))
	for i, k := range keys {
		out[i] = c.items[k]
	}
	return out
}

// Lookup returns the entries listed under index term (see WithIndex), ordered by key.
func (c *Cache[T]) Lookup(term string) []T {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.values(sortedKeys(c.terms[term]))
}

// LookupUnordered returns the entries listed under index term in no particular order: for a
// loop that visits each of a large term's entries once per pass, where sorting them (as Lookup
// does) was most of the pass (docs/scale.md: a following namespace on 5,000 clusters).
func (c *Cache[T]) LookupUnordered(term string) []T {
	c.mu.RLock()
	defer c.mu.RUnlock()
	set := c.terms[term]
	out := make([]T, 0, len(set))
	for k := range set {
		out = append(out, c.items[k].Value)
	}
	return out
}

// Keys returns the keys listed under index term, sorted.
func (c *Cache[T]) Keys(term string) []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return sortedKeys(c.terms[term])
}

// Count returns how many entries are listed under index term.
func (c *Cache[T]) Count(term string) int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.terms[term])
}

// keys returns the keys of the entries accepted by keep (all if nil), sorted. c.mu must be held.
func (c *Cache[T]) keys(keep func(key string, v T) bool) []string {
	keys := make([]string, 0, len(c.items))
	for k, e := range c.items {
		if keep == nil || keep(k, e.Value) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

// values returns the entries at keys. c.mu must be held.
func (c *Cache[T]) values(keys []string) []T {
	out := make([]T, len(keys))
	for i, k := range keys {
		out[i] = c.items[k].Value
	}
	return out
}

func sortedKeys(set map[string]struct{}) []string {
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Len returns the number of entries.
func (c *Cache[T]) Len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.items)
}

// Changed returns a channel closed at the next change of an entry or of the view's checkpoint.
func (c *Cache[T]) Changed() <-chan struct{} {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.changed
}

// Subscribe returns the current entries and a channel of every later change, atomically. The
// channel is closed when ctx ends or when the subscriber falls more than buf changes behind.
func (c *Cache[T]) Subscribe(ctx context.Context, buf int) ([]Update[T], <-chan Update[T]) {
	snap, _, ch := c.subscribe(ctx, buf, true)
	return snap, ch
}

// SubscribeAt is Subscribe that also returns the subscriber's starting position for Current:
// the revision of the last change the snapshot includes.
func (c *Cache[T]) SubscribeAt(ctx context.Context, buf int) ([]Update[T], uint64, <-chan Update[T]) {
	return c.subscribe(ctx, buf, true)
}

// Current waits until the cache has seen every change the bucket held when Current was called,
// and returns the position a subscriber must have reached to have taken all of them: the
// revision of the last update the cache sent (a subscriber is there once it has taken an
// update of at least that revision or subscribed at one). It lets a test tell "the subscriber
// did nothing" from "the subscriber has not got there yet". Only meaningful without a key
// filter.
func (c *Cache[T]) Current(ctx context.Context) (uint64, error) {
	st, err := c.kv.Status(ctx)
	if err != nil {
		return 0, fmt.Errorf("status of bucket %s: %w", c.kv.Bucket(), err)
	}
	si, ok := st.(interface{ StreamInfo() *jetstream.StreamInfo })
	if !ok {
		return 0, fmt.Errorf("status of bucket %s: no stream info in %T", c.kv.Bucket(), st)
	}
	if err := c.WaitSeen(ctx, si.StreamInfo().State.LastSeq); err != nil {
		return 0, err
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.sent, nil
}

// Updates is Subscribe without the snapshot, for a subscriber that reads the current entries
// itself afterwards.
func (c *Cache[T]) Updates(ctx context.Context, buf int) <-chan Update[T] {
	_, _, ch := c.subscribe(ctx, buf, false)
	return ch
}

func (c *Cache[T]) subscribe(ctx context.Context, buf int, snapshot bool) ([]Update[T], uint64, <-chan Update[T]) {
	ch := make(chan Update[T], buf)
	var snap []Update[T]
	c.mu.Lock()
	if snapshot {
		snap = make([]Update[T], 0, len(c.items))
		for k, e := range c.items {
			snap = append(snap, Update[T]{Op: Put, Key: k, Value: e.Value, Revision: e.KVRevision})
		}
	}
	cut := make(chan struct{})
	c.subs[ch] = cut
	at := c.sent
	c.mu.Unlock()
	sort.Slice(snap, func(i, j int) bool { return snap[i].Key < snap[j].Key })
	go func() {
		select {
		case <-ctx.Done():
		case <-cut:
			return // cut off: ch is closed and gone from subs already
		}
		c.mu.Lock()
		if _, ok := c.subs[ch]; ok {
			delete(c.subs, ch)
			close(ch)
		}
		c.mu.Unlock()
	}()
	return snap, at, ch
}

// WaitFor blocks until cond holds for the entry at key (v is the zero T and ok false when the
// key is absent).
func (c *Cache[T]) WaitFor(ctx context.Context, key string, cond func(v T, ok bool) bool) error {
	for {
		c.mu.RLock()
		e, ok := c.items[key]
		ch := c.changed
		c.mu.RUnlock()
		if cond(e.Value, ok) {
			return nil
		}
		if err := c.waitChange(ctx, ch); err != nil {
			return fmt.Errorf("wait for %s in bucket %s: %w", key, c.kv.Bucket(), err)
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

// WaitSeen blocks until the cache has seen the bucket's change at KV revision rev, or a later
// one: given the bucket's last revision, the cache is then at least as new as the bucket was.
// Only meaningful without a key filter.
func (c *Cache[T]) WaitSeen(ctx context.Context, rev uint64) error {
	for {
		c.mu.RLock()
		seen, ch := c.seen, c.changed
		c.mu.RUnlock()
		if seen >= rev {
			return nil
		}
		if err := c.waitChange(ctx, ch); err != nil {
			return fmt.Errorf("wait for bucket %s to reach revision %d (at %d): %w", c.kv.Bucket(), rev, seen, err)
		}
	}
}

// WaitCheckpoint blocks until the cache has seen every change the view's projection made for
// events up to stream sequence seq, whichever keys they touched.
func (c *Cache[T]) WaitCheckpoint(ctx context.Context, seq uint64) error {
	for {
		c.mu.RLock()
		cp, ch := c.checkpoint, c.changed
		c.mu.RUnlock()
		if cp >= seq {
			return nil
		}
		if err := c.waitChange(ctx, ch); err != nil {
			return fmt.Errorf("wait for bucket %s to reach %d (at %d): %w", c.kv.Bucket(), seq, cp, err)
		}
	}
}

// waitChange waits for ch (the cache's change signal) or ctx.
func (c *Cache[T]) waitChange(ctx context.Context, ch <-chan struct{}) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-ch:
		return nil
	}
}
