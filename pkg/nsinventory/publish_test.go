package nsinventory_test

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/nsinventory"
)

// nsSet is a namespace inventory by name: the value is what the namespace's labels say (which
// snapshot reported it), so a test sees which chunk a namespace was taken from.
type nsSet map[string]string

// lay lays set out in n chunks of generation gen as the agent does (Split's placement; n == 1
// is the unchunked message).
func lay(set nsSet, gen uint64, n uint32) []*agentv1.NamespaceInventory {
	if n == 1 {
		inv := &agentv1.NamespaceInventory{ClusterName: "member-1"}
		for _, name := range slices.Sorted(maps.Keys(set)) {
			inv.Namespaces = append(inv.Namespaces, &agentv1.Namespace{Name: name, Labels: map[string]string{"v": set[name]}})
		}
		return []*agentv1.NamespaceInventory{inv}
	}
	cs := make([]*agentv1.NamespaceInventory, n)
	for i := range cs {
		cs[i] = &agentv1.NamespaceInventory{ClusterName: "member-1", Generation: gen, Chunk: uint32(i), Chunks: n}
	}
	for _, name := range slices.Sorted(maps.Keys(set)) {
		c := cs[nsinventory.Chunk(name, n)]
		c.Namespaces = append(c.Namespaces, &agentv1.Namespace{Name: name, Labels: map[string]string{"v": set[name]}})
	}
	return cs
}

// kv is a cluster's entries of bucket cluster-inventory: the latest report per chunk index,
// stamped with the stream sequence as the projection does.
type kv struct {
	seq     uint64
	entries map[uint32]*clusterv1.NamespaceInventory
}

func (s *kv) land(c *agentv1.NamespaceInventory) {
	s.seq++
	if s.entries == nil {
		s.entries = map[uint32]*clusterv1.NamespaceInventory{}
	}
	s.entries[c.GetChunk()] = entry(c, s.seq)
}

// assemble returns what a reader sees, after checking that the list is sorted, holds each
// namespace once and that Count agrees.
func (s *kv) assemble(t *testing.T) nsSet {
	t.Helper()
	es := slices.Collect(maps.Values(s.entries))
	inv := nsinventory.Assemble(es)
	got := nsSet{}
	for i, ns := range inv.GetNamespaces() {
		if i > 0 && inv.Namespaces[i-1].GetName() >= ns.GetName() {
			t.Fatalf("%s after %s: not sorted or twice", ns.GetName(), inv.Namespaces[i-1].GetName())
		}
		got[ns.GetName()] = ns.GetLabels()["v"]
	}
	if n := nsinventory.Count(es); n != len(got) {
		t.Fatalf("Count = %d, Assemble holds %d", n, len(got))
	}
	return got
}

// randomSet returns a random subset of names ns-000…ns-<universe>, valued v.
func randomSet(rng *rand.Rand, universe int, v string) nsSet {
	s := nsSet{}
	keep := rng.Float64()
	for i := range universe {
		if rng.Float64() < keep {
			s[fmt.Sprintf("ns-%03d", i)] = v
		}
	}
	return s
}

// evolve returns a successor of old: most of it kept (some relabelled), some removed, some added.
func evolve(rng *rand.Rand, old nsSet, universe int, v string) nsSet {
	s := nsSet{}
	for name, val := range old {
		switch r := rng.Float64(); {
		case r < 0.15:
			// removed
		case r < 0.5:
			s[name] = v
		default:
			s[name] = val
		}
	}
	for range rng.IntN(universe/2 + 1) {
		s[fmt.Sprintf("ns-%03d", rng.IntN(universe))] = v
	}
	return s
}

func randomCount(rng *rand.Rand) uint32 { return 1 << rng.IntN(6) } // 1 … 32

// checkLanding checks what a reader sees while a publish of set in n chunks lands: a namespace
// whose new chunk has landed is as set says, any other as the reader saw it before the publish
// (so each is there once, and none that both lists hold goes missing).
func checkLanding(t *testing.T, got, before, set nsSet, n uint32, landed map[uint32]bool) {
	t.Helper()
	names := map[string]bool{}
	for _, s := range []nsSet{got, before, set} {
		for name := range s {
			names[name] = true
		}
	}
	for name := range names {
		want, from := before, "before"
		if landed[nsinventory.Chunk(name, n)] {
			want, from = set, "new"
		}
		g, gok := got[name]
		w, wok := want[name]
		if gok != wok || g != w {
			_, inBefore := before[name]
			_, inNew := set[name]
			t.Fatalf("%s: got %q (present %v), want %q (present %v) from the %s list; in the list before %v, in the new one %v",
				name, g, gok, w, wok, from, inBefore, inNew)
		}
	}
}

// TestAssembleShrinkMidPublish is the reviewer's case: going from 4 chunks to 2, with only new
// chunk 1 landed (the highest index goes first), the old chunks 2 and 3, above the new count,
// still decide the namespaces of new chunk 0 that old chunk 0 does not hold.
func TestAssembleShrinkMidPublish(t *testing.T) {
	set := nsSet{}
	for i := range 40 {
		set[fmt.Sprintf("ns-%d", i)] = "old"
	}
	for _, revisions := range []bool{true, false} {
		t.Run(fmt.Sprintf("revisions %v", revisions), func(t *testing.T) {
			var s kv
			for _, c := range lay(set, 100, 4) {
				s.land(c)
			}
			s.land(lay(set, 200, 2)[1])
			if !revisions {
				// Entries built without stream sequences: the generation orders them.
				for _, e := range s.entries {
					e.Revision = 0
				}
			}
			if got := s.assemble(t); len(got) != len(set) {
				t.Fatalf("%d of %d namespaces", len(got), len(set))
			}
		})
	}
}

// TestAssembleWhilePublishing lands random prefixes of one publish onto a fully landed older
// inventory, with random chunk counts up and down. With the count the same or smaller, new
// chunks may land in any order; when it grows, the new indices at or above the old count land
// before the others (the agent publishes the highest index first), in any order among them.
func TestAssembleWhilePublishing(t *testing.T) {
	const universe = 300
	for seed := range uint64(250) {
		rng := rand.New(rand.NewPCG(seed, 1))
		old := randomSet(rng, universe, "old")
		m, n := randomCount(rng), randomCount(rng)
		newSet := evolve(rng, old, universe, "new")
		t.Run(fmt.Sprintf("seed %d: %d→%d chunks", seed, m, n), func(t *testing.T) {
			var s kv
			for _, c := range slices.Backward(lay(old, 100, m)) {
				s.land(c)
			}
			before := s.assemble(t)
			if !maps.Equal(before, old) {
				t.Fatalf("old list: %d namespaces, want %d", len(before), len(old))
			}
			chunks := lay(newSet, 200, n)
			var high, low []uint32
			for i := range n {
				if n > m && i >= m {
					high = append(high, i)
				} else {
					low = append(low, i)
				}
			}
			rng.Shuffle(len(high), func(i, j int) { high[i], high[j] = high[j], high[i] })
			rng.Shuffle(len(low), func(i, j int) { low[i], low[j] = low[j], low[i] })
			landed := map[uint32]bool{}
			for _, i := range slices.Concat(high, low) {
				s.land(chunks[i])
				landed[i] = true
				checkLanding(t, s.assemble(t), before, newSet, n, landed)
			}
			if got := s.assemble(t); !maps.Equal(got, newSet) {
				t.Fatalf("all landed: %d namespaces, want the new list's %d", len(got), len(newSet))
			}
		})
	}
}

// agentModel publishes as services/cluster-agent/agent/inventory.go does: the highest index
// first, chunks unchanged since the last publish of the same count skipped, leftovers of a
// larger count emptied after.
type agentModel struct {
	published  uint32
	generation uint64
	sent       map[uint32]string
	sentOf     uint32
}

// publish returns the messages of one publish, in order, and what a landed message i does to
// the model (the agent's bookkeeping after a successful append).
func (a *agentModel) publish(set nsSet, n uint32, clock uint64, resync bool) ([]*agentv1.NamespaceInventory, func(i int)) {
	gen := max(clock, a.generation+1)
	chunks := lay(set, gen, n)
	if n > 1 || a.published > 1 {
		a.generation = gen
	}
	if n == 1 && a.published > 1 {
		chunks[0].Generation, chunks[0].Chunks = gen, 1
	}
	full := n == 1 || n != a.sentOf || resync
	if n != a.sentOf {
		a.sent, a.sentOf = map[uint32]string{}, n
	}
	var msgs []*agentv1.NamespaceInventory
	for i := int(n) - 1; i >= 0; i-- {
		if old, ok := a.sent[uint32(i)]; ok && old == digest(chunks[i]) && !full {
			continue
		}
		msgs = append(msgs, chunks[i])
	}
	for i := n; i < a.published; i++ {
		msgs = append(msgs, &agentv1.NamespaceInventory{ClusterName: "member-1", Generation: gen, Chunk: i, Chunks: n})
	}
	return msgs, func(i int) {
		c := msgs[i]
		if c.GetChunk() < n {
			a.sent[c.GetChunk()] = digest(c)
			a.published = max(a.published, c.GetChunk()+1)
		}
		if i == len(msgs)-1 {
			a.published = n
		}
	}
}

// failed is the agent's bookkeeping after an append failed.
func (a *agentModel) failed() { a.sent, a.sentOf = nil, 0 }

func digest(c *agentv1.NamespaceInventory) string {
	var b strings.Builder
	fmt.Fprint(&b, c.GetChunks())
	for _, ns := range c.GetNamespaces() {
		fmt.Fprintf(&b, ",%s=%s", ns.GetName(), ns.GetLabels()["v"])
	}
	return b.String()
}

// TestAssembleAgentPublishes runs random sequences of agent publishes (counts up and down,
// unchanged chunks skipped, publishes failing halfway, agents restarting with a clock behind
// the last one) and checks what a reader sees after every message: each namespace whose chunk
// of the publish under way has landed as the agent reports it, every other as before the
// publish, and after a complete publish exactly the agent's list.
func TestAssembleAgentPublishes(t *testing.T) {
	const universe = 300
	for seed := range uint64(30) {
		t.Run(fmt.Sprintf("seed %d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 2))
			var (
				s     kv
				agent agentModel
				clock = uint64(1_000_000)
				set   = randomSet(rng, universe, "v0")
			)
			for round := range 20 {
				if round > 0 {
					set = evolve(rng, set, universe, fmt.Sprintf("v%d", round))
				}
				if rng.IntN(8) == 0 {
					// A new agent process: it knows nothing of what the last one published,
					// and its clock may be behind.
					agent = agentModel{}
					clock -= uint64(rng.IntN(2000))
				}
				clock += uint64(rng.IntN(1000))
				n := randomCount(rng)
				msgs, sent := agent.publish(set, n, clock, rng.IntN(4) == 0)
				before := s.assemble(t)
				landed := map[uint32]bool{}
				fail := len(msgs) + 1
				if rng.IntN(4) == 0 {
					fail = rng.IntN(len(msgs) + 1)
				}
				for i, c := range msgs {
					if i == fail {
						agent.failed()
						break
					}
					s.land(c)
					sent(i)
					if c.GetChunk() < n {
						landed[c.GetChunk()] = true
					}
					checkLanding(t, s.assemble(t), before, set, n, landed)
				}
				if fail > len(msgs) {
					if got := s.assemble(t); !maps.Equal(got, set) {
						t.Fatalf("round %d (%d chunks) complete: %d namespaces, want %d", round, n, len(got), len(set))
					}
				}
			}
		})
	}
}
