package authz

import "sync"

// memoLimit bounds a memo: past it, the memo starts over rather than grow with every caller
// or namespace ever asked about.
const memoLimit = 10_000

// memo remembers answers computed from mirrors until one of them changes. Authorization runs
// on every call, and the mirrors change far less often than they are read.
type memo[K comparable, V any] struct {
	deps func() []<-chan struct{} // closed at the next change of what the answers depend on

	mu    sync.RWMutex
	stale []<-chan struct{}
	m     map[K]V
}

func (m *memo[K, V]) get(key K, compute func() V) V {
	m.mu.RLock()
	if m.m != nil && !anyClosed(m.stale) {
		if v, ok := m.m[key]; ok {
			m.mu.RUnlock()
			return v
		}
	}
	m.mu.RUnlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil || anyClosed(m.stale) || len(m.m) >= memoLimit {
		// The channels are taken before computing, so a change during the computation makes
		// its answer stale instead of lost.
		m.stale, m.m = m.deps(), map[K]V{}
	}
	v := compute()
	m.m[key] = v
	return v
}

func anyClosed(chs []<-chan struct{}) bool {
	for _, ch := range chs {
		select {
		case <-ch:
			return true
		default:
		}
	}
	return false
}
