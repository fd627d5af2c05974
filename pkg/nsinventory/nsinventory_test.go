package nsinventory_test

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/nsinventory"
)

var snapshotTime = time.Date(2026, 11, 25, 18, 0, 0, 0, time.UTC)

// inventory is an agent snapshot of count namespaces ns-0000… with the label every namespace has.
func inventory(count int, at time.Time) *agentv1.NamespaceInventory {
	inv := &agentv1.NamespaceInventory{ClusterName: "member-1", Time: timestamppb.New(at)}
	for i := range count {
		name := fmt.Sprintf("ns-%05d", i)
		inv.Namespaces = append(inv.Namespaces, &agentv1.Namespace{Name: name, Phase: "Active",
			Labels: map[string]string{"kubernetes.io/metadata.name": name}})
	}
	return inv
}

// entry is what cluster-import's projection stores for one reported chunk.
func entry(c *agentv1.NamespaceInventory, revision uint64) *clusterv1.NamespaceInventory {
	e := &clusterv1.NamespaceInventory{ClusterName: c.GetClusterName(), Revision: revision,
		Generation: nsinventory.Generation(c), Chunk: c.GetChunk(), Chunks: c.GetChunks()}
	for _, ns := range c.GetNamespaces() {
		e.Namespaces = append(e.Namespaces, &clusterv1.InventoryNamespace{Name: ns.GetName(), Labels: ns.GetLabels(), Phase: ns.GetPhase()})
	}
	return e
}

func entries(chunks []*agentv1.NamespaceInventory, firstRevision uint64) []*clusterv1.NamespaceInventory {
	var out []*clusterv1.NamespaceInventory
	for i, c := range chunks {
		out = append(out, entry(c, firstRevision+uint64(i)))
	}
	return out
}

func names(inv *clusterv1.NamespaceInventory) []string {
	var out []string
	for _, ns := range inv.GetNamespaces() {
		out = append(out, ns.GetName())
	}
	return out
}

func rangeNames(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("ns-%05d", i))
	}
	return out
}

func TestSplit(t *testing.T) {
	for _, tc := range []struct {
		name   string
		count  int
		budget int
		// wantChunks is the chunk count, 1 for the unchanged message.
		wantChunks int
	}{
		{name: "empty", count: 0, budget: 1 << 10, wantChunks: 1},
		{name: "fits", count: 100, budget: 256 << 10, wantChunks: 1},
		{name: "just over", count: 100, budget: 6000, wantChunks: 2},
		{name: "30000 in a quarter of 1 MB", count: 30_000, budget: 256 << 10, wantChunks: 8},
		{name: "small budget", count: 2000, budget: 4 << 10, wantChunks: 32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inv := inventory(tc.count, snapshotTime)
			before := proto.Clone(inv)
			gen := uint64(snapshotTime.UnixNano())
			chunks := nsinventory.Split(inv, tc.budget, gen)
			if len(chunks) != tc.wantChunks {
				t.Fatalf("%d chunks, want %d", len(chunks), tc.wantChunks)
			}
			if tc.wantChunks == 1 {
				// The message an agent sent before chunking existed, byte for byte.
				a, _ := proto.MarshalOptions{Deterministic: true}.Marshal(chunks[0])
				b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(before)
				if !slices.Equal(a, b) || chunks[0] != inv {
					t.Fatalf("an inventory that fits was changed: %v", chunks[0])
				}
				return
			}
			seen := map[string]int{}
			for i, c := range chunks {
				if size := proto.Size(c); size > tc.budget {
					t.Errorf("chunk %d is %d bytes, budget %d", i, size, tc.budget)
				}
				if c.GetChunk() != uint32(i) || c.GetChunks() != uint32(len(chunks)) || c.GetGeneration() != gen ||
					c.GetClusterName() != "member-1" || !c.GetTime().AsTime().Equal(snapshotTime) {
					t.Errorf("chunk %d: chunk %d of %d, generation %d, cluster %q, time %v", i, c.GetChunk(), c.GetChunks(), c.GetGeneration(), c.GetClusterName(), c.GetTime().AsTime())
				}
				for _, ns := range c.GetNamespaces() {
					seen[ns.GetName()]++
					if got := nsinventory.Chunk(ns.GetName(), uint32(len(chunks))); got != uint32(i) {
						t.Errorf("%s in chunk %d, hashes to %d", ns.GetName(), i, got)
					}
				}
			}
			if len(seen) != tc.count {
				t.Errorf("%d namespaces in the chunks, want %d", len(seen), tc.count)
			}
			for n, k := range seen {
				if k != 1 {
					t.Errorf("%s in %d chunks", n, k)
				}
			}
			// Fewest chunks: half as many would not fit.
			half := len(chunks) / 2
			sizes := make([]int, half)
			for _, c := range chunks {
				sizes[c.GetChunk()%uint32(half)] += proto.Size(c)
			}
			if slices.Max(sizes) <= tc.budget {
				t.Errorf("%d chunks would have fit (largest %d bytes)", half, slices.Max(sizes))
			}
			got := nsinventory.Assemble(entries(chunks, 1))
			if want := rangeNames(0, tc.count); !slices.Equal(names(got), want) {
				t.Errorf("assembled %d namespaces, want %d", len(got.GetNamespaces()), len(want))
			}
		})
	}
}

// TestSplitOversizedNamespace checks that a namespace larger than the budget on its own does
// not make the split double on and on: it rides in its chunk, the other chunks fit.
func TestSplitOversizedNamespace(t *testing.T) {
	inv := inventory(50, snapshotTime)
	big := map[string]string{}
	for i := range 100 {
		big[fmt.Sprintf("label-%03d", i)] = "some-value-that-takes-room"
	}
	inv.Namespaces[7].Labels = big
	const budget = 2000
	if proto.Size(inv.Namespaces[7]) <= budget {
		t.Fatal("setup: namespace 7 fits")
	}
	chunks := nsinventory.Split(inv, budget, 1)
	if len(chunks) > 4 {
		t.Fatalf("%d chunks for 50 namespaces", len(chunks))
	}
	for _, c := range chunks {
		if proto.Size(c) > budget && !slices.ContainsFunc(c.GetNamespaces(), func(ns *agentv1.Namespace) bool { return ns.GetName() == "ns-00007" }) {
			t.Errorf("chunk %d: %d bytes without the oversized namespace", c.GetChunk(), proto.Size(c))
		}
	}
}

func TestAssemble(t *testing.T) {
	t0 := snapshotTime
	t1 := t0.Add(time.Second)
	// layout returns namespaces [from, to) snapshotted at at, in n chunks as Split lays them out.
	layout := func(from, to int, at time.Time, n uint32) []*agentv1.NamespaceInventory {
		inv := inventory(to, at)
		if n == 1 {
			inv.Namespaces = inv.Namespaces[from:]
			return []*agentv1.NamespaceInventory{inv}
		}
		chunks := make([]*agentv1.NamespaceInventory, n)
		for i := range chunks {
			chunks[i] = &agentv1.NamespaceInventory{ClusterName: inv.ClusterName, Time: inv.Time,
				Generation: uint64(at.UnixNano()), Chunk: uint32(i), Chunks: n}
		}
		for _, ns := range inv.Namespaces[from:] {
			c := chunks[nsinventory.Chunk(ns.Name, n)]
			c.Namespaces = append(c.Namespaces, ns)
		}
		return chunks
	}
	old := layout(0, 1000, t0, 32)
	grown := layout(0, 2000, t1, 64)
	shrunk := layout(0, 300, t1, 8)
	tiny := layout(0, 10, t1, 1) // one unchanged message
	moved := layout(500, 1000, t1, 32)
	shrunkHalf := layout(0, 500, t1, 16)
	emptied := func(from, to uint32, n uint32) []*agentv1.NamespaceInventory {
		var out []*agentv1.NamespaceInventory
		for i := from; i < to; i++ {
			out = append(out, &agentv1.NamespaceInventory{ClusterName: "member-1", Time: timestamppb.New(t1),
				Generation: uint64(t1.UnixNano()), Chunk: i, Chunks: n})
		}
		return out
	}
	cat := func(parts ...[]*agentv1.NamespaceInventory) []*agentv1.NamespaceInventory {
		return slices.Concat(parts...)
	}

	for _, tc := range []struct {
		name string
		// chunks are the latest message per subject, in publish order.
		chunks []*agentv1.NamespaceInventory
		want   []string
	}{
		{name: "one generation", chunks: old, want: rangeNames(0, 1000)},
		{name: "unchunked", chunks: tiny, want: rangeNames(0, 10)},
		{
			// Half of a new generation with the same count: every namespace once, the
			// deleted ones gone only from the chunks already republished.
			name:   "mixed generations, same count",
			chunks: cat(old[:16], moved[16:]),
			want: func() []string {
				var w []string
				for _, n := range rangeNames(0, 1000) {
					if nsinventory.Chunk(n, 32) < 16 || n >= "ns-00500" {
						w = append(w, n)
					}
				}
				return w
			}(),
		},
		{
			// Growing 32 → 64, the highest new chunks published first: the old chunks still
			// carry the rest, and nothing is counted twice.
			name:   "growing, half published",
			chunks: cat(old, grown[32:]),
			want: func() []string {
				var w []string
				for _, n := range rangeNames(0, 2000) {
					if nsinventory.Chunk(n, 64) >= 32 || n < "ns-01000" {
						w = append(w, n)
					}
				}
				return w
			}(),
		},
		{name: "grown", chunks: cat(old, grown), want: rangeNames(0, 2000)},
		{
			// Shrinking 32 → 8 with the leftovers not yet emptied: only chunks 0–7 count.
			name:   "shrunk, leftovers not emptied",
			chunks: cat(old, shrunk),
			want:   rangeNames(0, 300),
		},
		{name: "shrunk, leftovers emptied", chunks: cat(old, shrunk, emptied(8, 32, 8)), want: rangeNames(0, 300)},
		{
			// Shrinking 32 → 16, chunk 0 not yet republished: old chunks 0 and 16 (a leftover
			// index, not yet emptied) still decide the namespaces of new chunk 0.
			name:   "shrinking, chunk 0 old",
			chunks: cat(old, shrunkHalf[1:]),
			want: func() []string {
				var w []string
				for _, n := range rangeNames(0, 1000) {
					if n < "ns-00500" || nsinventory.Chunk(n, 16) == 0 {
						w = append(w, n)
					}
				}
				return w
			}(),
		},
		{name: "down to one message", chunks: cat(old, tiny, emptied(1, 32, 1)), want: rangeNames(0, 10)},
		{
			// An agent restarted after shrinking does not know the leftovers: the unchunked
			// message is newer than they are, by its time.
			name:   "down to one message after a restart",
			chunks: cat(old, tiny),
			want:   rangeNames(0, 10),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The latest message per index, in publish order, as the stream keeps them.
			latest := map[uint32]*clusterv1.NamespaceInventory{}
			for i, c := range tc.chunks {
				latest[c.GetChunk()] = entry(c, uint64(i+1))
			}
			es := slices.Collect(maps.Values(latest))
			got := nsinventory.Assemble(es)
			if !slices.Equal(names(got), tc.want) {
				g, w := names(got), tc.want
				t.Fatalf("assembled %d namespaces, want %d; missing %v, extra %v", len(g), len(w), diff(w, g), diff(g, w))
			}
			if n := nsinventory.Count(es); n != len(tc.want) {
				t.Errorf("Count = %d, want %d", n, len(tc.want))
			}
		})
	}
	if nsinventory.Assemble(nil) != nil {
		t.Error("Assemble(nil) is not nil")
	}
}

// diff returns the first few of a not in b.
func diff(a, b []string) []string {
	var out []string
	for _, s := range a {
		if !slices.Contains(b, s) {
			out = append(out, s)
			if len(out) == 5 {
				break
			}
		}
	}
	return out
}
