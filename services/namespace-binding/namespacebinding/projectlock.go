package namespacebinding

import (
	"context"
	"sync"

	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
)

// projectLocks serializes the commands of each project in this replica (appendProject): they
// queue instead of racing each other for one expected revision. Commands on different projects
// do not wait for each other.
//
// An entry lives while someone holds or awaits it, and after that until settled says the
// projects view has caught up with the entry's last append; until then the entry remembers
// what this replica appended, so a caller's next command on the project (one that did not wait
// for the view) does not start with a conflict.
type projectLocks struct {
	// settled reports whether the projects view shows project at last or later, or no longer
	// holds it: an entry's memory is then no better than the view, and it may go.
	settled func(project string, last uint64) bool

	mu sync.Mutex
	m  map[string]*projectLock
}

// projectLock is one project's lock. last is the sequence this replica's last append to the
// project's subject got (0: unknown), proj the project as of last (nil: unknown, only the view
// can tell); only the lock's holder uses them.
type projectLock struct {
	ch   chan struct{} // holds a token while locked
	refs int           // holders and waiters; guarded by projectLocks.mu
	last uint64
	proj *projectv1.Project
}

func newProjectLocks(settled func(project string, last uint64) bool) *projectLocks {
	return &projectLocks{settled: settled, m: make(map[string]*projectLock)}
}

// lock takes project's lock, or gives up when ctx ends.
func (ls *projectLocks) lock(ctx context.Context, project string) (*projectLock, error) {
	ls.mu.Lock()
	l := ls.m[project]
	if l == nil {
		l = &projectLock{ch: make(chan struct{}, 1)}
		ls.m[project] = l
	}
	l.refs++
	ls.mu.Unlock()
	select {
	case l.ch <- struct{}{}:
		return l, nil
	case <-ctx.Done():
		ls.release(project, l)
		return nil, ctx.Err()
	}
}

// unlock releases project's lock l, taken by lock.
func (ls *projectLocks) unlock(project string, l *projectLock) {
	<-l.ch
	ls.release(project, l)
}

// release drops a reference to l, and forgets l once nobody holds or awaits it and it is
// settled.
func (ls *projectLocks) release(project string, l *projectLock) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if l.refs--; l.refs > 0 {
		return
	}
	if ls.settled(project, l.last) {
		delete(ls.m, project)
	}
}

// len returns how many projects have an entry.
func (ls *projectLocks) len() int {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return len(ls.m)
}
