package collector

import "hash/maphash"

// sliceIndex holds the slices of one namespace of a cluster, found by name: each slice as the
// buf of its latest report, which says its name and its service's (slice.buf). It is what the
// ingester looks up on every report (which service had this slice?) and walks on a relist
// marker, with one slice per Service in most fleets: a Go map of name to service key cost
// ~51 bytes a slice (a 32-byte slot at the map's load), this ~26 (the buf's string header in
// a dense array, and a 4-byte slot of an open-addressing table at most half full;
// BenchmarkMemoryPerEndpoint). Not safe for concurrent use: the ingester's lock guards it.
type sliceIndex struct {
	seed maphash.Seed
	bufs []string // dense, in no order
	// table is the open-addressing table over bufs, by name, with linear probing: 0 is an
	// empty slot, i+1 is bufs[i].
	table []uint32
}

func newSliceIndex() *sliceIndex { return &sliceIndex{seed: maphash.MakeSeed()} }

func nameOf(buf string) string { return (&slice{buf: buf}).name() }

func (x *sliceIndex) len() int { return len(x.bufs) }

func (x *sliceIndex) home(name string) int {
	return int(maphash.String(x.seed, name) & uint64(len(x.table)-1))
}

// find returns the slot of name, or the empty slot where it would go and false.
func (x *sliceIndex) find(name string) (int, bool) {
	mask := len(x.table) - 1
	for i := x.home(name); ; i = (i + 1) & mask {
		v := x.table[i]
		if v == 0 {
			return i, false
		}
		if nameOf(x.bufs[v-1]) == name {
			return i, true
		}
	}
}

// get returns the buf of slice name.
func (x *sliceIndex) get(name string) (string, bool) {
	if len(x.bufs) == 0 {
		return "", false
	}
	i, ok := x.find(name)
	if !ok {
		return "", false
	}
	return x.bufs[x.table[i]-1], true
}

// put makes buf the slice of its name, and says whether the name is new.
func (x *sliceIndex) put(buf string) bool {
	name := nameOf(buf)
	if len(x.bufs) > 0 {
		if i, ok := x.find(name); ok {
			x.bufs[x.table[i]-1] = buf
			return false
		}
	}
	if (len(x.bufs)+1)*2 > len(x.table) {
		x.resize(max(8, 2*len(x.table)))
	}
	i, _ := x.find(name)
	x.bufs = append(x.bufs, buf)
	x.table[i] = uint32(len(x.bufs))
	return true
}

// del forgets slice name, and says whether the index had it.
func (x *sliceIndex) del(name string) bool {
	if len(x.bufs) == 0 {
		return false
	}
	i, ok := x.find(name)
	if !ok {
		return false
	}
	at := int(x.table[i] - 1)
	// Shift back what the empty slot would cut off from its home (deletion without tombstones).
	mask := len(x.table) - 1
	for j := (i + 1) & mask; x.table[j] != 0; j = (j + 1) & mask {
		h := x.home(nameOf(x.bufs[x.table[j]-1]))
		// Entry j stays when its home is cyclically within (i, j].
		if (i < j && i < h && h <= j) || (j < i && (h > i || h <= j)) {
			continue
		}
		x.table[i] = x.table[j]
		i = j
	}
	x.table[i] = 0
	// The last buf takes the place of the one deleted.
	last := len(x.bufs) - 1
	if at != last {
		moved := x.bufs[last]
		x.bufs[at] = moved
		j, _ := x.find(nameOf(moved))
		x.table[j] = uint32(at + 1)
	}
	x.bufs[last] = ""
	x.bufs = x.bufs[:last]
	// Neither array shrinks by itself: give back what a cluster that lost most of its slices
	// no longer needs.
	if len(x.table) > 8 && len(x.bufs)*8 < len(x.table) {
		x.bufs = append(make([]string, 0, 2*len(x.bufs)), x.bufs...)
		x.resize(len(x.table) / 2)
	}
	return true
}

func (x *sliceIndex) resize(size int) {
	x.table = make([]uint32, size)
	for k, buf := range x.bufs {
		i, _ := x.find(nameOf(buf))
		x.table[i] = uint32(k + 1)
	}
}

// each calls f with every slice's buf; f may delete the slice it is given (the walk goes from
// the end of bufs, and a deletion moves the last buf, one already walked, into the hole).
func (x *sliceIndex) each(f func(buf string)) {
	for k := len(x.bufs) - 1; k >= 0; k-- {
		if k < len(x.bufs) {
			f(x.bufs[k])
		}
	}
}
