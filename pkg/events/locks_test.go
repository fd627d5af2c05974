package events

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeView stands in for what a Command loads from: the revision it shows of each key.
type fakeView struct {
	mu  sync.Mutex
	rev map[string]uint64
}

func (v *fakeView) set(project string, rev uint64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.rev[project] = rev
}

func (v *fakeView) settled(project string, last uint64) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	rev, ok := v.rev[project]
	return !ok || rev >= last
}

func newTestLocks() (*Locks[int], *fakeView) {
	v := &fakeView{rev: map[string]uint64{}}
	return NewLocks[int](v.settled), v
}

// refs returns the holders and waiters of project's entry (0: no entry).
func (ls *Locks[S]) refsOf(project string) int {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if l := ls.m[project]; l != nil {
		return l.refs
	}
	return 0
}

// waitRefs waits until project's entry has n holders and waiters.
func waitRefs(t *testing.T, ls *Locks[int], project string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for ls.refsOf(project) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d holders and waiters, want %d", project, ls.refsOf(project), n)
		}
		time.Sleep(time.Millisecond) // paces the poll: refs has no change signal
	}
}

func TestLocksSerializeOneKey(t *testing.T) {
	ls, _ := newTestLocks()
	ctx := t.Context()
	first, err := ls.lock(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *lock[int], 1)
	go func() {
		l, err := ls.lock(ctx, "a")
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitRefs(t, ls, "a", 2) // the second caller waits on the lock
	select {
	case <-got:
		t.Fatal("a second holder got key a's lock while the first held it")
	default:
	}
	first.mem.last = 7 // what the holder appended is handed to the next one
	ls.unlock("a", first)
	second := <-got
	if second != first || second.mem.last != 7 {
		t.Fatalf("the next holder got %+v, want the same entry with last 7", second)
	}
	ls.unlock("a", second)

	// Many callers: never two inside at once.
	var inside, overlaps atomic.Int32
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			l, err := ls.lock(ctx, "a")
			if err != nil {
				t.Error(err)
				return
			}
			if inside.Add(1) > 1 {
				overlaps.Add(1)
			}
			inside.Add(-1)
			ls.unlock("a", l)
		})
	}
	wg.Wait()
	if n := overlaps.Load(); n > 0 {
		t.Fatalf("%d times two callers held key a's lock at once", n)
	}
}

func TestLocksOtherKeysDoNotWait(t *testing.T) {
	ls, _ := newTestLocks()
	a, err := ls.lock(t.Context(), "a")
	if err != nil {
		t.Fatal(err)
	}
	defer ls.unlock("a", a)
	// Had b to wait for a, this would end with the deadline.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	b, err := ls.lock(ctx, "b")
	if err != nil {
		t.Fatalf("lock b while a is held: %v", err)
	}
	ls.unlock("b", b)
}

func TestLocksCancelWhileWaiting(t *testing.T) {
	ls, _ := newTestLocks()
	held, err := ls.lock(t.Context(), "a")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		l, err := ls.lock(ctx, "a")
		if l != nil {
			t.Error("a cancelled caller got the lock")
		}
		errc <- err
	}()
	waitRefs(t, ls, "a", 2)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v, want context.Canceled", err)
	}
	if n := ls.refsOf("a"); n != 1 {
		t.Fatalf("after the waiter gave up: %d holders and waiters, want 1", n)
	}
	ls.unlock("a", held)
	if n := ls.len(); n != 0 {
		t.Fatalf("%d entries after the last holder left, want 0", n)
	}
	// The lock is free again.
	l, err := ls.lock(t.Context(), "a")
	if err != nil {
		t.Fatal(err)
	}
	ls.unlock("a", l)
}

func TestLocksFreeEntriesWhenSettled(t *testing.T) {
	tests := []struct {
		name     string
		view     uint64 // the revision the view shows; 0: the view does not hold the project
		last     uint64 // the holder's last append
		wantKept bool
	}{
		{name: "nothing appended", view: 3, last: 0},
		{name: "view shows the append", view: 5, last: 5},
		{name: "view is past the append", view: 6, last: 5},
		{name: "project not in the view", view: 0, last: 5},
		{name: "view behind the append", view: 4, last: 5, wantKept: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ls, v := newTestLocks()
			if tt.view > 0 {
				v.set("a", tt.view)
			}
			l, err := ls.lock(t.Context(), "a")
			if err != nil {
				t.Fatal(err)
			}
			l.mem.last = tt.last
			ls.unlock("a", l)
			if kept := ls.len() == 1; kept != tt.wantKept {
				t.Fatalf("entry kept: %v, want %v", kept, tt.wantKept)
			}
			if !tt.wantKept {
				return
			}
			// The kept entry carries the append to the next command; once the view has
			// caught up, it goes.
			next, err := ls.lock(t.Context(), "a")
			if err != nil {
				t.Fatal(err)
			}
			if next != l || next.mem.last != tt.last {
				t.Fatalf("next command got last %d, want the kept entry's %d", next.mem.last, tt.last)
			}
			v.set("a", tt.last)
			ls.unlock("a", next)
			if n := ls.len(); n != 0 {
				t.Fatalf("%d entries after the view caught up, want 0", n)
			}
		})
	}
}
