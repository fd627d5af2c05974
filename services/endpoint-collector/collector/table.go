package collector

import "hash/maphash"

// table is a set of values, each found by a key it holds (key): the collector's largest
// indexes, whose values already hold their keys, so a Go map would hold each key twice (a
// string header in its slot) at the map's load. A table holds each value once in a dense
// array, and a 4-byte slot for it in an open-addressing table at most half full (linear
// probing, deletion without tombstones): for a string value ~26 bytes against a map of
// string to string's ~51 (BenchmarkMemoryPerEndpoint). Not safe for concurrent use; readers
// (get, each) may share it.
type table[T any] struct {
	seed  maphash.Seed
	key   func(T) string
	vals  []T      // dense, in no order
	slots []uint32 // 0: empty; i+1: vals[i]
}

func newTable[T any](key func(T) string) *table[T] {
	return &table[T]{seed: maphash.MakeSeed(), key: key}
}

// sliceIndex holds the slices of one namespace of a cluster, found by name: each slice as the
// buf of its latest report, which says its name and its service's (slice.buf). It is what the
// ingester looks up on every report (which service had this slice?) and walks on a relist
// marker. The ingester's lock guards it.
type sliceIndex = table[string]

func newSliceIndex() *sliceIndex { return newTable(nameOf) }

func nameOf(buf string) string { return (&slice{buf: buf}).name() }

func (x *table[T]) len() int { return len(x.vals) }

func (x *table[T]) home(key string) int {
	return int(maphash.String(x.seed, key) & uint64(len(x.slots)-1))
}

// find returns the slot of key, or the empty slot where it would go and false.
func (x *table[T]) find(key string) (int, bool) {
	mask := len(x.slots) - 1
	for i := x.home(key); ; i = (i + 1) & mask {
		v := x.slots[i]
		if v == 0 {
			return i, false
		}
		if x.key(x.vals[v-1]) == key {
			return i, true
		}
	}
}

// get returns the value of key.
func (x *table[T]) get(key string) (T, bool) {
	if len(x.vals) > 0 {
		if i, ok := x.find(key); ok {
			return x.vals[x.slots[i]-1], true
		}
	}
	var zero T
	return zero, false
}

// put makes v the value of its key, and says whether the key is new.
func (x *table[T]) put(v T) bool {
	key := x.key(v)
	if len(x.vals) > 0 {
		if i, ok := x.find(key); ok {
			x.vals[x.slots[i]-1] = v
			return false
		}
	}
	if (len(x.vals)+1)*2 > len(x.slots) {
		x.resize(max(8, 2*len(x.slots)))
	}
	i, _ := x.find(key)
	x.vals = append(x.vals, v)
	x.slots[i] = uint32(len(x.vals))
	return true
}

// del forgets the value of key and returns it, if the table had one.
func (x *table[T]) del(key string) (T, bool) {
	var zero T
	if len(x.vals) == 0 {
		return zero, false
	}
	i, ok := x.find(key)
	if !ok {
		return zero, false
	}
	at := int(x.slots[i] - 1)
	old := x.vals[at]
	// Shift back what the emptied slot would cut off from its home.
	mask := len(x.slots) - 1
	for j := (i + 1) & mask; x.slots[j] != 0; j = (j + 1) & mask {
		h := x.home(x.key(x.vals[x.slots[j]-1]))
		// Slot j stays when its home is cyclically within (i, j].
		if (i < j && i < h && h <= j) || (j < i && (h > i || h <= j)) {
			continue
		}
		x.slots[i] = x.slots[j]
		i = j
	}
	x.slots[i] = 0
	// The last value takes the place of the one deleted.
	last := len(x.vals) - 1
	if at != last {
		moved := x.vals[last]
		x.vals[at] = moved
		j, _ := x.find(x.key(moved))
		x.slots[j] = uint32(at + 1)
	}
	x.vals[last] = zero
	x.vals = x.vals[:last]
	// Neither array shrinks by itself: give back what a table that lost most of its values no
	// longer needs.
	if len(x.slots) > 8 && len(x.vals)*8 < len(x.slots) {
		x.vals = append(make([]T, 0, 2*len(x.vals)), x.vals...)
		x.resize(len(x.slots) / 2)
	}
	return old, true
}

func (x *table[T]) resize(size int) {
	x.slots = make([]uint32, size)
	for k, v := range x.vals {
		i, _ := x.find(x.key(v))
		x.slots[i] = uint32(k + 1)
	}
}

// each calls f with every value; f may delete the value it is given (the walk goes from the end
// of vals, and a deletion moves the last value, one already walked, into the hole).
func (x *table[T]) each(f func(v T)) {
	for k := len(x.vals) - 1; k >= 0; k-- {
		if k < len(x.vals) {
			f(x.vals[k])
		}
	}
}
