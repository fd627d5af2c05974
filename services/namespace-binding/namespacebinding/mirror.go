package namespacebinding

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/view"
)

// item is one mirrored entry with the KV revision it was stored at: desired objects are compared
// by KV revision with what agents report, claims are released with compare-and-delete.
type item[T proto.Message] struct {
	Key string
	Rev uint64
	Val T
}

// change is one update seen by a mirror subscriber; Old is the previous value (zero if none),
// New the current one (zero after a delete).
type change[T proto.Message] struct {
	Key      string
	Old, New T
	HadOld   bool
	Deleted  bool
}

// mirror keeps a bucket (or the part of it matching a key filter) in memory, like view.Cache,
// and adds what this service needs on top: KV revisions, secondary indexes (bindings by project
// and by cluster), and the view checkpoint, so an API call can wait until everything its event
// changed is visible. Every replica has its own.
type mirror[T proto.Message] struct {
	kv     jetstream.KeyValue
	filter string
	newT   func() T
	index  func(key string, v T) []string
	log    *zap.Logger
	ready  chan struct{}

	mu         sync.RWMutex
	items      map[string]item[T]
	idx        map[string]map[string]struct{}
	checkpoint uint64
	changed    chan struct{}
	subs       map[chan change[T]]struct{}
}

// newMirror mirrors the keys of kv matching filter (">" for all). index, if set, returns the
// index terms an entry is listed under.
func newMirror[T proto.Message](kv jetstream.KeyValue, filter string, newT func() T, index func(string, T) []string, log *zap.Logger) *mirror[T] {
	return &mirror[T]{kv: kv, filter: filter, newT: newT, index: index, log: log, ready: make(chan struct{}),
		items: make(map[string]item[T]), idx: make(map[string]map[string]struct{}),
		changed: make(chan struct{}), subs: make(map[chan change[T]]struct{})}
}

// Ready is closed once the initial content is loaded.
func (m *mirror[T]) Ready() <-chan struct{} { return m.ready }

// Run watches the bucket until ctx is done.
func (m *mirror[T]) Run(ctx context.Context) error {
	w, err := m.kv.Watch(ctx, m.filter)
	if err != nil {
		return fmt.Errorf("watch bucket %s: %w", m.kv.Bucket(), err)
	}
	defer func() { _ = w.Stop() }()
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
				return errors.New("watch of bucket " + m.kv.Bucket() + " ended")
			}
			if e == nil {
				if initial {
					initial = false
					close(m.ready)
				}
				continue
			}
			m.apply(e)
		}
	}
}

func (m *mirror[T]) apply(e jetstream.KeyValueEntry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e.Key() == view.MetaKey {
		// The projection engine writes its checkpoint after every entry of a batch, so once
		// the mirror has seen checkpoint n it has seen every change of events up to n.
		var meta struct {
			Checkpoint uint64 `json:"checkpoint"`
		}
		if e.Operation() == jetstream.KeyValuePut && json.Unmarshal(e.Value(), &meta) == nil && meta.Checkpoint > m.checkpoint {
			m.checkpoint = meta.Checkpoint
			m.broadcast()
		}
		return
	}
	c := change[T]{Key: e.Key()}
	old, had := m.items[c.Key]
	if had {
		c.Old, c.HadOld = old.Val, true
		m.unindex(c.Key, old.Val)
	}
	switch e.Operation() {
	case jetstream.KeyValuePut:
		v := m.newT()
		if err := proto.Unmarshal(e.Value(), v); err != nil {
			m.log.Error("undecodable entry", zap.String("bucket", m.kv.Bucket()), zap.String("key", c.Key), zap.Error(err))
			if had {
				m.reindex(c.Key, old.Val)
			}
			return
		}
		m.items[c.Key] = item[T]{Key: c.Key, Rev: e.Revision(), Val: v}
		m.reindex(c.Key, v)
		c.New = v
	default:
		if !had {
			return
		}
		delete(m.items, c.Key)
		c.Deleted = true
	}
	m.broadcast()
	for ch := range m.subs {
		select {
		case ch <- c:
		default:
			// A subscriber that cannot keep up is cut off; it resubscribes and gets a snapshot.
			delete(m.subs, ch)
			close(ch)
		}
	}
}

func (m *mirror[T]) broadcast() {
	close(m.changed)
	m.changed = make(chan struct{})
}

func (m *mirror[T]) reindex(key string, v T) {
	if m.index == nil {
		return
	}
	for _, term := range m.index(key, v) {
		set := m.idx[term]
		if set == nil {
			set = make(map[string]struct{})
			m.idx[term] = set
		}
		set[key] = struct{}{}
	}
}

func (m *mirror[T]) unindex(key string, v T) {
	if m.index == nil {
		return
	}
	for _, term := range m.index(key, v) {
		if set := m.idx[term]; set != nil {
			delete(set, key)
			if len(set) == 0 {
				delete(m.idx, term)
			}
		}
	}
}

// Get returns the entry at key. Values are shared: callers must not modify them.
func (m *mirror[T]) Get(key string) (item[T], bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	it, ok := m.items[key]
	return it, ok
}

// Lookup returns the entries listed under index term, ordered by key.
func (m *mirror[T]) Lookup(term string) []item[T] {
	m.mu.RLock()
	defer m.mu.RUnlock()
	set := m.idx[term]
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]item[T], len(keys))
	for i, k := range keys {
		out[i] = m.items[k]
	}
	return out
}

// Keys returns the keys listed under index term, sorted.
func (m *mirror[T]) Keys(term string) []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	keys := make([]string, 0, len(m.idx[term]))
	for k := range m.idx[term] {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Count returns how many entries are listed under term.
func (m *mirror[T]) Count(term string) int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.idx[term])
}

// List returns every entry accepted by keep (all if nil), ordered by key.
func (m *mirror[T]) List(keep func(key string, v T) bool) []item[T] {
	m.mu.RLock()
	defer m.mu.RUnlock()
	keys := make([]string, 0, len(m.items))
	for k, it := range m.items {
		if keep == nil || keep(k, it.Val) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	out := make([]item[T], len(keys))
	for i, k := range keys {
		out[i] = m.items[k]
	}
	return out
}

// Len returns the number of entries.
func (m *mirror[T]) Len() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.items)
}

// Changed returns a channel closed at the next change.
func (m *mirror[T]) Changed() <-chan struct{} {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.changed
}

// WaitFor blocks until cond holds for the entry at key.
func (m *mirror[T]) WaitFor(ctx context.Context, key string, cond func(it item[T], ok bool) bool) error {
	for {
		m.mu.RLock()
		it, ok := m.items[key]
		ch := m.changed
		m.mu.RUnlock()
		if cond(it, ok) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s in bucket %s: %w", key, m.kv.Bucket(), ctx.Err())
		case <-ch:
		}
	}
}

// WaitCheckpoint blocks until the mirror has seen every change the projection made for events
// up to stream sequence seq.
func (m *mirror[T]) WaitCheckpoint(ctx context.Context, seq uint64) error {
	for {
		m.mu.RLock()
		cp, ch := m.checkpoint, m.changed
		m.mu.RUnlock()
		if cp >= seq {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for bucket %s to reach %d (at %d): %w", m.kv.Bucket(), seq, cp, ctx.Err())
		case <-ch:
		}
	}
}

// Subscribe returns a channel of every later change, closed when ctx ends or the subscriber
// falls more than buf changes behind.
func (m *mirror[T]) Subscribe(ctx context.Context, buf int) <-chan change[T] {
	ch := make(chan change[T], buf)
	m.mu.Lock()
	m.subs[ch] = struct{}{}
	m.mu.Unlock()
	go func() {
		<-ctx.Done()
		m.mu.Lock()
		if _, ok := m.subs[ch]; ok {
			delete(m.subs, ch)
			close(ch)
		}
		m.mu.Unlock()
	}()
	return ch
}
