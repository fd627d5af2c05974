package events

import (
	"context"
	"sync"
)

// Locks serializes Commands per key in this process (Command.Lock): they queue instead of
// racing each other for one expected revision. Commands on different keys do not wait for
// each other.
//
// An entry lives while someone holds or awaits it, and after that until settled says the
// Commands' Load shows the entry's last append; until then the entry remembers what this
// process appended, so a caller's next command on the key (one that did not wait for the view)
// does not start with a conflict.
type Locks[S any] struct {
	// settled reports whether Load shows the key's aggregate at last or later, or no longer
	// holds it: an entry's memory is then no better than Load, and it may go.
	settled func(key string, last uint64) bool

	mu sync.Mutex
	m  map[string]*lock[S]
}

// lock is one key's lock. mem is what the holder's Command knows beyond Load (memory); only
// the lock's holder uses it.
type lock[S any] struct {
	ch   chan struct{} // holds a token while locked
	refs int           // holders and waiters; guarded by Locks.mu
	mem  memory[S]
}

// NewLocks returns locks whose entries go once settled says Load has caught up with them.
func NewLocks[S any](settled func(key string, last uint64) bool) *Locks[S] {
	return &Locks[S]{settled: settled, m: make(map[string]*lock[S])}
}

// lock takes key's lock, or gives up when ctx ends.
func (ls *Locks[S]) lock(ctx context.Context, key string) (*lock[S], error) {
	ls.mu.Lock()
	l := ls.m[key]
	if l == nil {
		l = &lock[S]{ch: make(chan struct{}, 1)}
		ls.m[key] = l
	}
	l.refs++
	ls.mu.Unlock()
	select {
	case l.ch <- struct{}{}:
		return l, nil
	case <-ctx.Done():
		ls.release(key, l)
		return nil, ctx.Err()
	}
}

// unlock releases key's lock l, taken by lock.
func (ls *Locks[S]) unlock(key string, l *lock[S]) {
	<-l.ch
	ls.release(key, l)
}

// release drops a reference to l, and forgets l once nobody holds or awaits it and it is
// settled.
func (ls *Locks[S]) release(key string, l *lock[S]) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if l.refs--; l.refs > 0 {
		return
	}
	if ls.settled(key, l.mem.last) {
		delete(ls.m, key)
	}
}

// len returns how many keys have an entry.
func (ls *Locks[S]) len() int {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return len(ls.m)
}
