package collector

import (
	"fmt"
	"hash/maphash"
)

// table is a set of values, each found by a key it holds (key): the collector's largest
// indexes, whose values already hold their keys, so a Go map would hold each key twice (a
// string header in its slot) at the map's load. A table holds each value once in a dense
// array, and a 4-byte slot for it in an open-addressing table at most 7/8 full (linear
// probing, deletion without tombstones); a slot holds the top byte of its key's hash beside
// the value's index, so a probe reads a value only when that byte matches. For a string value
// ~22 bytes against a map of string to string's ~51 (BenchmarkMemoryPerEndpoint). A table
// holds at most maxTableLen values. Not safe for concurrent use; readers (get, each) may share
// it.
type table[T any] struct {
	seed  maphash.Seed
	key   func(T) string
	vals  []T      // dense, in no order
	slots []uint32 // 0: empty; else tag<<slotIndexBits | (i+1) for vals[i]
}

const (
	slotIndexBits = 24
	slotIndexMask = 1<<slotIndexBits - 1
	// maxTableLen is what a slot's index can say: 16,777,215 values, past what one collector
	// holds (a table is one cluster's slices of one namespace, or the services).
	maxTableLen = slotIndexMask
)

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

func (x *table[T]) hash(key string) (home int, tag uint32) {
	h := maphash.String(x.seed, key)
	return int(h & uint64(len(x.slots)-1)), uint32(h>>(64-(32-slotIndexBits))) << slotIndexBits
}

func (x *table[T]) home(key string) int {
	h, _ := x.hash(key)
	return h
}

// at returns the value of a full slot.
func (x *table[T]) at(slot uint32) T { return x.vals[slot&slotIndexMask-1] }

// find returns the slot of key, or the empty slot where it would go and false.
func (x *table[T]) find(key string) (int, bool) {
	mask := len(x.slots) - 1
	h, tag := x.hash(key)
	for i := h; ; i = (i + 1) & mask {
		v := x.slots[i]
		if v == 0 {
			return i, false
		}
		if v&^slotIndexMask == tag && x.key(x.at(v)) == key {
			return i, true
		}
	}
}

// slot returns the slot of value index i (of vals), with key's tag.
func (x *table[T]) slot(key string, i int) uint32 {
	_, tag := x.hash(key)
	return tag | uint32(i+1)
}

// get returns the value of key.
func (x *table[T]) get(key string) (T, bool) {
	if len(x.vals) > 0 {
		if i, ok := x.find(key); ok {
			return x.at(x.slots[i]), true
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
			x.vals[x.slots[i]&slotIndexMask-1] = v
			return false
		}
	}
	if len(x.vals) == maxTableLen {
		panic(fmt.Sprintf("collector: a table of %d values is full", maxTableLen))
	}
	if (len(x.vals)+1)*8 > len(x.slots)*7 {
		x.resize(max(8, 2*len(x.slots)))
	}
	i, _ := x.find(key)
	x.vals = append(x.vals, v)
	x.slots[i] = x.slot(key, len(x.vals)-1)
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
	at := int(x.slots[i]&slotIndexMask - 1)
	old := x.vals[at]
	// Shift back what the emptied slot would cut off from its home.
	mask := len(x.slots) - 1
	for j := (i + 1) & mask; x.slots[j] != 0; j = (j + 1) & mask {
		h := x.home(x.key(x.at(x.slots[j])))
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
		k := x.key(moved)
		j, _ := x.find(k)
		x.slots[j] = x.slot(k, at)
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
		key := x.key(v)
		i, _ := x.find(key)
		x.slots[i] = x.slot(key, k)
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
