// Package nsinventory splits a member cluster's namespace inventory into chunks that each fit in
// a NATS message, and assembles the chunks a reader holds back into the cluster's list.
//
// A namespace goes to chunk fnv32a(name) % n, n a power of two: while n stays the same a
// namespace stays in the same chunk, so a reader that sees some chunks of a new inventory and
// the others of the previous one still sees every namespace once. The chunks of one published
// inventory share a generation (the snapshot's time in unix nanoseconds), and the newest
// generation's chunk count says which chunk indices count; chunks above it are leftovers of a
// larger inventory and are ignored. An inventory that fits in one chunk is the message as it
// was before chunking existed (no generation, no chunk count); its time stands in for the
// generation.
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

// current returns the entries that count, the newest generation and its chunk count: the
// entries below the newest generation's count, at most one per index (the newest).
func current(entries []*clusterv1.NamespaceInventory) (counted []*clusterv1.NamespaceInventory, gen uint64, n uint32) {
	var newest *clusterv1.NamespaceInventory
	for _, e := range entries {
		if e == nil {
			continue
		}
		if newest == nil || e.GetGeneration() > newest.GetGeneration() ||
			e.GetGeneration() == newest.GetGeneration() && e.GetRevision() > newest.GetRevision() {
			newest = e
		}
	}
	if newest == nil {
		return nil, 0, 0
	}
	gen, n = newest.GetGeneration(), chunkCount(newest)
	byIndex := make(map[uint32]*clusterv1.NamespaceInventory, n)
	for _, e := range entries {
		if e == nil || e.GetChunk() >= n {
			continue
		}
		if o, ok := byIndex[e.GetChunk()]; !ok || e.GetGeneration() > o.GetGeneration() {
			byIndex[e.GetChunk()] = e
		}
	}
	for _, e := range byIndex {
		counted = append(counted, e)
	}
	slices.SortFunc(counted, func(a, b *clusterv1.NamespaceInventory) int { return cmp.Compare(a.GetChunk(), b.GetChunk()) })
	return counted, gen, n
}

// Assemble merges the entries of one cluster's inventory (KV bucket cluster-inventory, one per
// chunk, in any order) into the cluster's list, sorted by name. Only chunks below the newest
// generation's chunk count count. A namespace from an older chunk is left out when the chunk it
// belongs to under the newest count is present from a newer generation (that chunk alone now
// says whether it exists); a namespace in two chunks (the count just changed) is taken from the
// newer one. The result has the newest chunk's cluster name, generation and observed time, the
// highest revision, and chunk and chunks 0. It may be one of entries (a list in a single chunk):
// callers must not modify it. Nil when entries holds none.
func Assemble(entries []*clusterv1.NamespaceInventory) *clusterv1.NamespaceInventory {
	counted, gen, n := current(entries)
	if len(counted) == 0 {
		return nil
	}
	if len(counted) == 1 && n == 1 && counted[0].GetChunk() == 0 && counted[0].GetChunks() == 0 {
		return counted[0] // unchunked, as before chunking existed
	}
	out := &clusterv1.NamespaceInventory{Generation: gen}
	genOf := make(map[uint32]uint64, len(counted)) // chunk index → generation, for the newest count
	for _, e := range counted {
		if chunkCount(e) == n {
			genOf[e.GetChunk()] = e.GetGeneration()
		}
		if e.GetRevision() > out.Revision {
			out.Revision = e.Revision
		}
		if e.GetGeneration() == gen && (out.ObservedTime == nil || e.GetObservedTime().AsTime().After(out.ObservedTime.AsTime())) {
			out.ClusterId, out.ClusterName, out.ObservedTime = e.GetClusterId(), e.GetClusterName(), e.GetObservedTime()
		}
	}
	type pick struct {
		ns  *clusterv1.InventoryNamespace
		gen uint64
	}
	picked := make(map[string]pick)
	for _, e := range counted {
		g := e.GetGeneration()
		for _, ns := range e.GetNamespaces() {
			if chunkCount(e) != n {
				// Laid out under another count: the chunk the namespace belongs to now decides
				// if it is present from a newer generation.
				if og, ok := genOf[Chunk(ns.GetName(), n)]; ok && og > g {
					continue
				}
			}
			if p, ok := picked[ns.GetName()]; !ok || g > p.gen {
				picked[ns.GetName()] = pick{ns, g}
			}
		}
	}
	out.Namespaces = make([]*clusterv1.InventoryNamespace, 0, len(picked))
	for _, p := range picked {
		out.Namespaces = append(out.Namespaces, p.ns)
	}
	slices.SortFunc(out.Namespaces, func(a, b *clusterv1.InventoryNamespace) int { return cmp.Compare(a.GetName(), b.GetName()) })
	return out
}

// Count returns how many namespaces Assemble(entries) would hold, without building the list
// when every counted chunk is laid out for the newest count (each namespace is then in
// exactly one of them, whatever their generations).
func Count(entries []*clusterv1.NamespaceInventory) int {
	counted, _, n := current(entries)
	total := 0
	for _, e := range counted {
		if chunkCount(e) != n {
			return len(Assemble(entries).GetNamespaces())
		}
		total += len(e.GetNamespaces())
	}
	return total
}
