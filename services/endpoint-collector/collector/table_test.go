package collector

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// A table (here of slice bufs, by name) answers as a map of name to buf would through puts, deletes (which shift entries
// back and move the last buf) and walks that delete, as it grows to thousands of slices and
// shrinks back to a few.
func TestTableMatchesAMap(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 2))
		x := newSliceIndex()
		want := map[string]string{}
		names := 40 + rng.IntN(3000)
		for step := range 20000 {
			name := fmt.Sprintf("s-%d", rng.IntN(names))
			// Grow for a while, then shrink: the table's resizing both ways is exercised.
			grow := step%10000 < 6000
			switch op := rng.IntN(100); {
			case op < 60 && grow || op < 30:
				buf := namedBuf(name, fmt.Sprintf("svc-%d", step))
				_, had := want[name]
				if added := x.put(buf); added == had {
					t.Fatalf("seed %d step %d: put %s said new %v, had %v", seed, step, name, added, had)
				}
				want[name] = buf
			case op < 99:
				prev, had := want[name]
				if old, ok := x.del(name); ok != had || old != prev {
					t.Fatalf("seed %d step %d: del %s said %v", seed, step, name, !had)
				}
				delete(want, name)
			default: // a walk that deletes every other slice
				i, before := 0, x.len()
				seen := map[string]bool{}
				x.each(func(buf string) {
					n := nameOf(buf)
					if seen[n] {
						t.Fatalf("seed %d step %d: %s walked twice", seed, step, n)
					}
					seen[n] = true
					if i++; i%2 == 0 {
						x.del(n)
						delete(want, n)
					}
				})
				if i != before {
					t.Fatalf("seed %d step %d: walked %d of %d", seed, step, i, before)
				}
			}
			if x.len() != len(want) || (x.len() > 0 && 8*x.len() > 7*len(x.slots)) {
				t.Fatalf("seed %d step %d: %d slices in a table of %d, want %d", seed, step, x.len(), len(x.slots), len(want))
			}
			if step%500 == 0 || x.len() < 8 {
				for n, buf := range want {
					if got, ok := x.get(n); !ok || got != buf {
						t.Fatalf("seed %d step %d: %s not found", seed, step, n)
					}
				}
				if _, ok := x.get("absent"); ok {
					t.Fatalf("seed %d step %d: found a slice never put", seed, step)
				}
			}
		}
		if x.len() < 64 && len(x.slots) > 64*8 {
			t.Fatalf("seed %d: %d slices left in a table of %d", seed, x.len(), len(x.slots))
		}
	}
}

// BenchmarkTableGet: looking up 50,000 slices by name in a table (7/8 full at this size), and in
// a Go map of name to service key as the index was before, found and not found.
//
//	go test -run '^$' -bench TableGet ./collector/
func BenchmarkTableGet(b *testing.B) {
	const n = 50000
	x := newSliceIndex()
	m := map[string]string{}
	names := make([]string, n)
	for i := range names {
		buf := namedBuf(fmt.Sprintf("svc-%d-east-0", i), fmt.Sprintf("svc-%d", i))
		x.put(buf)
		names[i] = nameOf(buf)
		m[names[i]] = "bench/svc"
	}
	absent := make([]string, n)
	for i := range absent {
		absent[i] = fmt.Sprintf("svc-%d-west-0", i)
	}
	for _, tc := range []struct {
		name string
		keys []string
		get  func(string) bool
	}{
		{"table/found", names, func(k string) bool { _, ok := x.get(k); return ok }},
		{"map/found", names, func(k string) bool { _, ok := m[k]; return ok }},
		{"table/absent", absent, func(k string) bool { _, ok := x.get(k); return ok }},
		{"map/absent", absent, func(k string) bool { _, ok := m[k]; return ok }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			i := 0
			for b.Loop() {
				tc.get(tc.keys[i%n])
				i++
			}
		})
	}
}
