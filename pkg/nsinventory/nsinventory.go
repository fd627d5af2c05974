// Package nsinventory splits a member cluster's namespace inventory into chunks that each fit in
// a NATS message, and assembles the chunks a reader holds back into the cluster's list.
//
// A namespace goes to chunk fnv32a(name) % n, n a power of two. A chunk covers the namespaces
// that go to its index under its count: it says which of them exist. A reader keeps the latest
// chunk per index, and for each namespace the newest chunk covering it decides (newest by the
// stream sequence the reader stamps as revision, so the agent's clock does not matter). While
// the count stays, a namespace stays in the same chunk, so the chunks of one publish may land in
// any order. When the count changes, the agent publishes the highest index first: a new chunk
// at index j then replaces a chunk of count c whose namespaces all go, under the new count n,
// to chunks already landed (to j + k·c ≥ j when c ≤ n; to j mod n = j when c > n, both powers
// of two). So while a publish lands, every namespace is decided by its new chunk or by the chunk
// that decided it before, and each is seen once. Chunks at indices not below n, leftovers of a
// larger count, are overruled once the new chunks covering their namespaces land; the agent then
// empties them to free the space. The chunks of one publish share a generation (the snapshot's
// time in unix nanoseconds, growing), which only breaks ties between entries without
// revisions. An inventory that fits in one chunk is the message as it was before chunking
// existed (no generation, no chunk count); it covers every namespace.
package nsinventory

import (
	"cmp"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
)

// MaxChunks bounds the chunk count: a split stops doubling there even if some chunk is still
// over the budget (it then fails to publish, as an oversized unchunked list did).
const MaxChunks = 1 << 16

// Chunk returns the chunk of namespace name among n chunks (n > 0): fnv32a(name) % n.
func Chunk(name string, n uint32) uint32 {
	const (
		offset32 = 2166136261
		prime32  = 16777619
	)
	h := uint32(offset32)
	for i := 0; i < len(name); i++ {
		h ^= uint32(name[i])
		h *= prime32
	}
	return h % n
}

// Generation returns the generation of a reported chunk: its generation field, or for a
// message without one (an unchunked inventory) its snapshot time in unix nanoseconds.
func Generation(inv *agentv1.NamespaceInventory) uint64 {
	if g := inv.GetGeneration(); g != 0 {
		return g
	}
	if t := inv.GetTime(); t != nil && t.AsTime().UnixNano() > 0 {
		return uint64(t.AsTime().UnixNano())
	}
	return 0
}

// Split returns inv as the fewest chunks, a power of two, whose encoded sizes are each at most
// budget bytes. When inv fits, it is returned alone and unchanged, exactly the message an agent
// sent before chunking existed. Otherwise every chunk carries inv's cluster name and time,
// generation (which must be non-zero), its index and the count; namespaces keep inv's order
// within a chunk. A namespace over the budget on its own cannot fit: its chunk is over the
// budget by it, the others are not (and doubling stops at MaxChunks).
func Split(inv *agentv1.NamespaceInventory, budget int, generation uint64) []*agentv1.NamespaceInventory {
	if proto.Size(inv) <= budget {
		return []*agentv1.NamespaceInventory{inv}
	}
	nss := inv.GetNamespaces()
	// What a chunk costs besides its namespaces: inv's other fields plus the chunk fields at
	// their largest.
	head := &agentv1.NamespaceInventory{ClusterName: inv.GetClusterName(), Time: inv.GetTime(),
		Generation: generation, Chunk: MaxChunks, Chunks: MaxChunks}
	base := proto.Size(head)
	sizes := make([]int, len(nss))
	for i, ns := range nss {
		n := proto.Size(ns)
		sizes[i] = protowire.SizeTag(2) + protowire.SizeBytes(n)
	}
	n := uint32(2)
	for ; n < MaxChunks; n *= 2 {
		if fits(nss, sizes, n, base, budget) {
			break
		}
	}
	chunks := make([]*agentv1.NamespaceInventory, n)
	for i := range chunks {
		chunks[i] = &agentv1.NamespaceInventory{ClusterName: inv.GetClusterName(), Time: inv.GetTime(),
			Generation: generation, Chunk: uint32(i), Chunks: n}
	}
	for _, ns := range nss {
		c := chunks[Chunk(ns.GetName(), n)]
		c.Namespaces = append(c.Namespaces, ns)
	}
	return chunks
}

// fits reports whether n chunks are small enough: each within budget, not counting namespaces
// that alone exceed it (no count makes their chunk fit; they ride along in it).
func fits(nss []*agentv1.Namespace, sizes []int, n uint32, base, budget int) bool {
	total := make([]int, n)
	for i, ns := range nss {
		if base+sizes[i] > budget {
			continue
		}
		c := Chunk(ns.GetName(), n)
		total[c] += sizes[i]
		if base+total[c] > budget {
			return false
		}
	}
	return true
}

// chunkCount is the number of chunks an entry says its generation has (0 means 1).
func chunkCount(e *clusterv1.NamespaceInventory) uint32 { return max(e.GetChunks(), 1) }

// newer reports whether a was reported after b. The revision (the stream sequence of the
// report, stamped by the projection) orders reports as the agent published them, whatever its
// clock says and across its restarts; the generation only breaks ties, as between entries
// built without revisions, and the index after it, so the order is total.
func newer(a, b *clusterv1.NamespaceInventory) bool {
	if a.GetRevision() != b.GetRevision() {
		return a.GetRevision() > b.GetRevision()
	}
	if a.GetGeneration() != b.GetGeneration() {
		return a.GetGeneration() > b.GetGeneration()
	}
	return a.GetChunk() > b.GetChunk()
}

// layout is the newest entry at each index among the entries of one chunk count.
type layout struct {
	n  uint32
	at map[uint32]*clusterv1.NamespaceInventory
}

// index returns the non-nil entries, the newest first, and their layouts by count.
func index(entries []*clusterv1.NamespaceInventory) ([]*clusterv1.NamespaceInventory, []layout) {
	var es []*clusterv1.NamespaceInventory
	for _, e := range entries {
		if e != nil {
			es = append(es, e)
		}
	}
	slices.SortFunc(es, func(a, b *clusterv1.NamespaceInventory) int {
		switch {
		case newer(a, b):
			return -1
		case newer(b, a):
			return 1
		}
		return 0
	})
	var ls []layout
	for _, e := range es {
		n := chunkCount(e)
		if e.GetChunk() >= n {
			continue // covers nothing
		}
		i := slices.IndexFunc(ls, func(l layout) bool { return l.n == n })
		if i < 0 {
			i = len(ls)
			ls = append(ls, layout{n: n, at: map[uint32]*clusterv1.NamespaceInventory{}})
		}
		if _, ok := ls[i].at[e.GetChunk()]; !ok {
			ls[i].at[e.GetChunk()] = e // es is newest first
		}
	}
	return es, ls
}

// decider returns the entry that decides whether namespace name, held by e, exists: the newest
// of e and the entries that cover name, those at index Chunk(name, n) of a count n. (An
// unchunked entry covers every name; an emptied leftover, its index not below its count, none.)
func decider(e *clusterv1.NamespaceInventory, name string, ls []layout) *clusterv1.NamespaceInventory {
	d := e
	for _, l := range ls {
		if c, ok := l.at[Chunk(name, l.n)]; ok && newer(c, d) {
			d = c
		}
	}
	return d
}

// Assemble merges the entries of one cluster's inventory (KV bucket cluster-inventory, one per
// chunk, in any order) into the cluster's list, sorted by name. For each namespace the newest
// entry (by revision, see newer) that covers it decides whether it exists: a namespace held by
// an entry is in the list when no newer entry covers it. So chunks of several generations and
// chunk counts merge into every namespace once, and leftovers of a larger count are ignored
// once the chunks covering their namespaces are newer (see the package comment for the order
// this needs from the agent). The result has the newest entry's cluster, generation and
// observed time, the highest revision, and chunk and chunks 0. It may be one of entries (an
// unchunked list that covers all others): callers must not modify it. Nil when entries holds
// none.
func Assemble(entries []*clusterv1.NamespaceInventory) *clusterv1.NamespaceInventory {
	es, ls := index(entries)
	if len(es) == 0 {
		return nil
	}
	newest := es[0]
	if newest.GetChunk() == 0 && newest.GetChunks() == 0 {
		return newest // unchunked, as before chunking existed; it covers every namespace
	}
	out := &clusterv1.NamespaceInventory{ClusterId: newest.GetClusterId(), ClusterName: newest.GetClusterName(),
		ObservedTime: newest.GetObservedTime(), Generation: newest.GetGeneration()}
	for _, e := range es {
		out.Revision = max(out.Revision, e.GetRevision())
	}
	seen := make(map[string]bool)
	for _, e := range es { // newest first: a name held twice is taken from the newer entry
		for _, ns := range e.GetNamespaces() {
			if seen[ns.GetName()] {
				continue
			}
			if decider(e, ns.GetName(), ls) == e {
				seen[ns.GetName()] = true
				out.Namespaces = append(out.Namespaces, ns)
			}
		}
	}
	slices.SortFunc(out.Namespaces, func(a, b *clusterv1.InventoryNamespace) int { return cmp.Compare(a.GetName(), b.GetName()) })
	return out
}

// Count returns how many namespaces Assemble(entries) would hold, without building the list
// when one chunk count decides every namespace: it is the only count among the entries that
// cover any, or all its chunks are present and newer than every entry of another count. It then
// trusts that the agent put every namespace in the chunk that covers it, once.
func Count(entries []*clusterv1.NamespaceInventory) int {
	es, ls := index(entries)
	if len(ls) == 0 {
		return 0
	}
	cur := ls[0] // the newest covering entry's count
	if len(ls) > 1 {
		if uint32(len(cur.at)) != cur.n {
			return len(Assemble(entries).GetNamespaces())
		}
		// es is newest first: the first entry of another count must come after every chunk
		// of cur.
		left := len(cur.at)
		for _, e := range es {
			if left == 0 {
				break
			}
			if cur.at[e.GetChunk()] == e {
				left--
			} else if e.GetChunk() < chunkCount(e) {
				return len(Assemble(entries).GetNamespaces())
			}
		}
	}
	total := 0
	for _, e := range cur.at {
		total += len(e.GetNamespaces())
	}
	return total
}
