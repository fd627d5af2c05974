package testkit

import (
	"sync"
	"testing"

	"connectrpc.com/connect"
)

// OneWins runs try n times at once (i numbers the attempt) and fails the test unless exactly one
// attempt succeeded and every other failed with code lost: how a race to create one thing must
// end.
func OneWins(t testing.TB, n int, lost connect.Code, try func(i int) error) {
	t.Helper()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = try(i) })
	}
	wg.Wait()
	wins := 0
	for i, err := range errs {
		switch {
		case err == nil:
			wins++
		case connect.CodeOf(err) != lost:
			t.Errorf("attempt %d: %v", i, err)
		}
	}
	if wins != 1 {
		t.Fatalf("%d of %d attempts won, want exactly 1 (%v)", wins, n, errs)
	}
}
