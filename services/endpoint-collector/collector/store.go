package collector

import (
	"cmp"
	"encoding/binary"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// The store keeps every endpoint of every service in every cluster in memory, compactly: the
// architecture plans for 1,000,000 endpoints and one collector holds them all. An endpoint is a
// fixed-size record (an IPv4 address in 4 bytes or an IPv6 one in 16, the target's uid in 16,
// zone and node as interned ids, conditions as bits) inside its slice's string, so the garbage
// collector never scans it and a million of them cost 31-43 MB. Everything a query reads is an
// immutable snapshot per service, swapped in whole: readers hold the store's read lock only to
// find it, and never see a half-applied change.

// Endpoint condition and address bits.
const (
	fReady uint8 = 1 << iota
	fServing
	fTerminating
	fV4
	fHasUID
)

// Protocols of a port, as stored.
const (
	protoTCP uint8 = iota
	protoUDP
	protoSCTP
)

var protoNames = [...]string{"TCP", "UDP", "SCTP"}

// endpoint is one EndpointSlice endpoint as code works with it: 48 bytes, no pointers. A slice
// holds its endpoints encoded (slice.buf), fewer bytes each; ep decodes one.
type endpoint struct {
	addr [16]byte // IPv4 in the last 4 bytes (IPv4-mapped form) when fV4 is set
	uid  [16]byte // targetRef uid (a UUID, or a hash of a non-UUID uid) when fHasUID is set
	zone uint32   // interned
	node uint32   // interned
	// target ("Pod/<name>"): while a slice is decoded, targets[tOff:tOff+tLen] of the
	// decoder's arena; in a slice, its endpoint's place in the slice's targets (slice.target).
	tOff  uint32
	tLen  uint16
	flags uint8
}

// rank orders copies of one endpoint found in several slices: the most ready one wins, as in
// kube-proxy, because an endpoint moving between slices is briefly in both and the older copy
// may be stale.
func (e *endpoint) rank() uint8 { return rankOf(e.flags) }

func rankOf(flags uint8) uint8 {
	switch {
	case flags&fReady != 0:
		return 2
	case flags&fServing != 0:
		return 1
	}
	return 0
}

type port struct {
	num   uint16
	proto uint8
	name  uint32 // interned
}

// slice is one EndpointSlice as last reported, in one string and a shared port list. Immutable
// once built: a new report builds a new one, so the parts of successive snapshots can hold
// copies of it that share its string.
//
// buf is, in order: a 4-byte header (the name's length; how the service's name is held; the
// number of endpoints, with v4Slice set when every address is IPv4, little endian), the
// endpoints as fixed-size records (recV4 or recV6 bytes: address, uid, zone, node, target
// length, flags), the name, the service's name unless it begins the slice's (as Kubernetes
// names slices: "<service>-<suffix>"), then the endpoints' targets one after the other. One
// string rather than an array of endpoint structs and a string of names: the slice is then 24
// bytes instead of 48, an IPv4 endpoint 31 bytes instead of 48, and a slice of one endpoint
// one allocation instead of two (BenchmarkMemoryPerEndpoint). The service's name is in it so
// that the ingester's index can hold a slice's buf alone (sliceIndex). A target's place is the
// sum of the lengths before it, so readers that go through many endpoints take the places once
// (targetStarts). The namespace is not in it: the ingester's index is by namespace, and the
// snapshot holding the slice is of a service of that namespace.
type slice struct {
	buf   string
	ports *[]port // shared with every slice of the same ports (portLists)
}

const (
	sliceHdr = 4
	v4Slice  = 0x8000 // in the header's count
	// The header's second byte: svcPrefix and the length of the service's name when the slice's
	// name begins with it and a dash, else the length of the service's name that follows the
	// slice's (0 in a slice not yet named).
	svcPrefix = 0x80
	maxName   = 0xFF // a Kubernetes name is at most 253 bytes
	maxSvc    = 0x7F // a Service's name is a DNS label: at most 63 bytes
	recV4     = 4 + 16 + 4 + 4 + 2 + 1
	recV6     = 16 + 16 + 4 + 4 + 2 + 1
)

// encodeSlice returns the buf of a slice named name, of service svc, holding eps (in the order
// given), whose targets are in arena targets; false when a name or the endpoints are more than
// a buf can say.
func encodeSlice(name, svc string, eps []endpoint, targets []byte) (string, bool) {
	if len(name) > maxName || len(svc) > maxSvc || len(eps) > maxSliceEndpoints {
		return "", false
	}
	v4 := true
	size := sliceHdr + len(name)
	for i := range eps {
		v4 = v4 && eps[i].flags&fV4 != 0
		size += int(eps[i].tLen)
	}
	width, count := recV6, len(eps)
	if v4 {
		width, count = recV4, count|v4Slice
	}
	svcInfo, own := svcBytes(name, svc)
	size += width*len(eps) + len(own)
	// A builder: one allocation, the string's.
	var b strings.Builder
	b.Grow(size)
	b.Write([]byte{byte(len(name)), svcInfo, byte(count), byte(count >> 8)})
	var rec [recV6]byte
	for i := range eps {
		e := &eps[i]
		r := rec[:0]
		if v4 {
			r = append(r, e.addr[12:]...)
		} else {
			r = append(r, e.addr[:]...)
		}
		r = append(r, e.uid[:]...)
		r = binary.LittleEndian.AppendUint32(r, e.zone)
		r = binary.LittleEndian.AppendUint32(r, e.node)
		r = binary.LittleEndian.AppendUint16(r, e.tLen)
		r = append(r, e.flags)
		b.Write(r)
	}
	b.WriteString(name)
	b.WriteString(own)
	for i := range eps {
		b.Write(targets[eps[i].tOff : eps[i].tOff+uint32(eps[i].tLen)])
	}
	return b.String(), true
}

// svcBytes returns the header byte that says how a slice named name holds the name of its
// service svc, and what it holds of it after its own.
func svcBytes(name, svc string) (byte, string) {
	if svc != "" && len(name) > len(svc) && name[len(svc)] == '-' && name[:len(svc)] == svc {
		return svcPrefix | byte(len(svc)), ""
	}
	return byte(len(svc)), svc
}

func (s *slice) width() int {
	if s.buf[3]&(v4Slice>>8) != 0 {
		return recV4
	}
	return recV6
}

// n returns how many endpoints the slice has.
func (s *slice) n() int { return int(s.buf[2]) | int(s.buf[3]&^(v4Slice>>8))<<8 }

func (s *slice) nameStart() int { return sliceHdr + s.n()*s.width() }

func (s *slice) nameEnd() int { return s.nameStart() + int(s.buf[0]) }

func (s *slice) targetsStart() int {
	if s.buf[1]&svcPrefix != 0 {
		return s.nameEnd()
	}
	return s.nameEnd() + int(s.buf[1])
}

// name returns the slice's name.
func (s *slice) name() string { return s.buf[s.nameStart():s.nameEnd()] }

// service returns the name of the slice's service.
func (s *slice) service() string {
	if n := int(s.buf[1] &^ svcPrefix); s.buf[1]&svcPrefix != 0 {
		return s.name()[:n]
	}
	return s.buf[s.nameEnd():s.targetsStart()]
}

// targets returns the targets of the slice's endpoints, one after the other.
func (s *slice) targets() string { return s.buf[s.targetsStart():] }

// rec returns endpoint i's record and whether addresses in it are IPv4 (4 bytes).
func (s *slice) rec(i int) (string, bool) {
	w := s.width()
	at := sliceHdr + i*w
	return s.buf[at : at+w], w == recV4
}

// ep decodes endpoint i; its tOff is not set (target).
func (s *slice) ep(i int) endpoint {
	r, v4 := s.rec(i)
	var e endpoint
	if v4 {
		e.addr[10], e.addr[11] = 0xff, 0xff
		copy(e.addr[12:], r[:4])
		r = r[4:]
	} else {
		copy(e.addr[:], r[:16])
		r = r[16:]
	}
	copy(e.uid[:], r[:16])
	e.zone = le32(r[16:])
	e.node = le32(r[20:])
	e.tLen = uint16(r[24]) | uint16(r[25])<<8
	e.flags = r[26]
	return e
}

// addr returns endpoint i's address (in endpoint's form) and flags, what merging compares.
func (s *slice) addr(i int) ([16]byte, uint8) {
	r, v4 := s.rec(i)
	var a [16]byte
	if v4 {
		a[10], a[11] = 0xff, 0xff
		copy(a[12:], r[:4])
	} else {
		copy(a[:], r[:16])
	}
	return a, r[len(r)-1]
}

// flags returns endpoint i's condition and address bits.
func (s *slice) flags(i int) uint8 {
	r, _ := s.rec(i)
	return r[len(r)-1]
}

func le32(s string) uint32 {
	return uint32(s[0]) | uint32(s[1])<<8 | uint32(s[2])<<16 | uint32(s[3])<<24
}

// targetStarts appends where each endpoint's target starts in targets() to dst.
func (s *slice) targetStarts(dst []uint32) []uint32 {
	w := s.width()
	at := uint32(0)
	for i := range s.n() {
		dst = append(dst, at)
		r := sliceHdr + i*w + w - 3
		at += uint32(s.buf[r]) | uint32(s.buf[r+1])<<8
	}
	return dst
}

// tLen returns the length of endpoint i's target.
func (s *slice) tLen(i int) int {
	r, _ := s.rec(i)
	return int(r[len(r)-3]) | int(r[len(r)-2])<<8
}

// target returns endpoint i's target, whose place in targets() is start (targetStarts).
func (s *slice) target(i int, start uint32) string {
	r, _ := s.rec(i)
	n := uint32(r[len(r)-3]) | uint32(r[len(r)-2])<<8
	t := s.targets()
	return t[start : start+n]
}

// setName gives a decoded slice its name (from the report's subject) and its service's, false
// when one is longer than the buf can say.
func (s *slice) setName(name, svc string) bool {
	if len(name) > maxName || len(svc) > maxSvc {
		return false
	}
	svcInfo, own := svcBytes(name, svc)
	var b strings.Builder
	b.Grow(s.nameStart() + len(name) + len(own) + len(s.targets()))
	b.WriteByte(byte(len(name)))
	b.WriteByte(svcInfo)
	b.WriteString(s.buf[2:s.nameStart()])
	b.WriteString(name)
	b.WriteString(own)
	b.WriteString(s.targets())
	s.buf = b.String()
	return true
}

// eachEndpoint calls f with every endpoint of the slice and its target, in order.
func (s *slice) eachEndpoint(f func(i int, e *endpoint, target string)) {
	t := s.targets()
	at := 0
	for i := range s.n() {
		e := s.ep(i)
		f(i, &e, t[at:at+int(e.tLen)])
		at += int(e.tLen)
	}
}

// noPorts is the ports of a slice without any (a headless Service): its endpoints are still
// addresses, on port 0.
var noPorts = &[]port{{}}

// portLists shares the port lists of slices: most slices of a fleet have one of a few (http
// 8080/TCP), so a slice points at the one list of its ports instead of holding its own array,
// and a pointer rather than a slice header (a slice is then 24 bytes instead of 40). One list per
// distinct content, kept like the interned strings (strtab): a fleet has few, and the lists'
// pointers then stand for their contents, which the usual parts' records are keyed by
// (clusterRef.usualFor).
type portLists struct {
	mu    sync.Mutex
	lists map[string]*[]port // by the ports' bytes: number, protocol and interned name of each
}

// share returns ports as a shared list; ports may be a caller's buffer.
func (t *portLists) share(ports []port) *[]port {
	if len(ports) == 0 {
		return noPorts
	}
	var kb [7 * 8]byte
	key := kb[:0]
	for _, p := range ports {
		key = append(key, byte(p.num), byte(p.num>>8), p.proto)
		key = binary.LittleEndian.AppendUint32(key, p.name)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if l, ok := t.lists[string(key)]; ok { // no allocation for the lookup
		return l
	}
	if t.lists == nil {
		t.lists = map[string]*[]port{}
	}
	list := append([]port(nil), ports...)
	t.lists[string(key)] = &list
	return &list
}

// mref points at one (endpoint, port) of a part's slices: the merged, de-duplicated list of a
// service in one cluster is an array of these, sorted by (ip, port, protocol).
type mref struct {
	s uint16 // slice index in the part
	e uint16 // endpoint index in the slice (a slice holds at most 1000)
	p uint8  // port index in the slice (a slice holds at most 100)
}

// part is the state of one service in one cluster: its slices by name, and their merge. A part
// is a value inside its service's snapshot (clusterSnap) and never changes once published: the
// reconciler copies it, gives it new slices (setSlices) and publishes a new snapshot.
//
// The usual part is one slice on one port whose merge is the identity (identity1): that part is
// the slice's string, held here, and a pointer to a record its cluster keeps for every usual
// part with the same ports (clusterRef.usualFor), so a part costs no array of slices, no merge
// list and no record of its own. Other parts put their cluster, the first slice's ports, their
// other slices and their merge in a partX of their own. A part is then 24 bytes
// (BenchmarkMemoryPerEndpoint: a service in two clusters 16 bytes less than with a pointer for
// the cluster and one for the ports, 32 less than with a third for what is not the usual).
type part struct {
	// first is the string of the first slice by name, "" when the part has no slices (a part
	// being built: a slice's string is never empty). A slice never changes, so copies share
	// its string.
	first string
	x     *partX
}

// partX is a part's cluster (and in a served clusterSnap its id and staleness), the ports of
// its first slice and, in a part other than the usual one, its slices after the first (by
// name, by value) and its merge (refs), a list of its own.
type partX struct {
	cluster *clusterRef
	ports   *[]port
	rest    []slice
	merged  []mref // nil in the usual part
}

// newPart returns a part of cluster r without slices.
func newPart(r *clusterRef) part { return part{x: r.usualFor(noPorts)} }

// ref returns the part's cluster.
func (p *part) ref() *clusterRef { return p.x.cluster }

func (p *part) usual() bool { return p.x.merged == nil }

// setRef makes r the part's cluster.
func (p *part) setRef(r *clusterRef) {
	switch {
	case p.x.cluster == r:
	case p.usual():
		p.x = r.usualFor(p.x.ports)
	default:
		x := *p.x // the part before keeps its own
		x.cluster = r
		p.x = &x
	}
}

// nslices returns how many slices the part has.
func (p *part) nslices() int {
	if p.first == "" {
		return 0
	}
	return 1 + len(p.x.rest)
}

// slice returns the part's slice i, by name.
func (p *part) slice(i int) slice {
	if i == 0 {
		return slice{buf: p.first, ports: p.x.ports}
	}
	return p.x.rest[i-1]
}

// slices returns a new array of the part's slices, for the reconciler to change.
func (p *part) slices() []slice {
	n := p.nslices()
	if n == 0 {
		return nil
	}
	out := make([]slice, 1, n)
	out[0] = p.slice(0)
	return append(out, p.x.rest...)
}

// refs returns the part's merge.
func (p *part) refs() []mref {
	switch {
	case p.first == "":
		return nil
	case p.usual():
		n := (&slice{buf: p.first}).n()
		return identity1[:n:n]
	}
	return p.x.merged
}

// setSlices makes ss (sorted by name, not shared with anything) the part's slices and merges
// them: the de-duplicated list of (endpoint, port) of the part.
func (p *part) setSlices(ss []slice) {
	r := p.ref()
	if len(ss) == 0 {
		p.first, p.x = "", r.usualFor(noPorts)
		return
	}
	p.first = ss[0].buf
	if len(ss) == 1 && len(*ss[0].ports) == 1 && ss[0].n() <= len(identity1) && (ss[0].n() == 0 || ascending(&ss[0])) {
		p.x = r.usualFor(ss[0].ports) // the usual part: identity1 over its one slice, nothing of its own
		return
	}
	// Every (endpoint, port) as a key that orders it, decoded from the slices' strings once:
	// the address (big endian, so ordered as numbers as its bytes are), then in tail the
	// port, protocol, rank (best first) and the slice, ahead of the reference itself.
	type keyed struct{ hi, lo, tail uint64 }
	n := 0
	for si := range ss {
		n += ss[si].n() * len(*ss[si].ports)
	}
	var stack [64]keyed // most parts: no allocation for the keys
	ks := stack[:0]
	if n > len(stack) {
		ks = make([]keyed, 0, n)
	}
	for si := range ss {
		s := &ss[si]
		for ei := range s.n() {
			a, f := s.addr(ei)
			hi, lo := binary.BigEndian.Uint64(a[:8]), binary.BigEndian.Uint64(a[8:])
			for pi, pt := range *s.ports {
				ks = append(ks, keyed{hi, lo, uint64(pt.num)<<44 | uint64(pt.proto)<<42 | uint64(3-rankOf(f))<<40 |
					uint64(si)<<24 | uint64(ei)<<8 | uint64(pi)})
			}
		}
	}
	// Best copy first, then the first slice by name: the result does not depend on the order
	// reports arrived in.
	slices.SortFunc(ks, func(a, b keyed) int {
		if a.hi != b.hi {
			return cmp.Compare(a.hi, b.hi)
		}
		if a.lo != b.lo {
			return cmp.Compare(a.lo, b.lo)
		}
		return cmp.Compare(a.tail, b.tail)
	})
	// One (endpoint, port) per address and port: the first, the best copy.
	const portOf = uint64(1<<18-1) << 42 // port and protocol in tail
	m := 0
	for i := range ks {
		if i > 0 && ks[i].hi == ks[m-1].hi && ks[i].lo == ks[m-1].lo && ks[i].tail&portOf == ks[m-1].tail&portOf {
			continue
		}
		ks[m] = ks[i]
		m++
	}
	out := make([]mref, m)
	for i := range out {
		t := ks[i].tail
		out[i] = mref{s: uint16(t >> 24), e: uint16(t >> 8), p: uint8(t)}
	}
	x := &partX{cluster: r, ports: ss[0].ports, merged: out}
	if len(ss) > 1 {
		// An exact array: kept until the part changes, and ss[0] is held in first already.
		x.rest = append(make([]slice, 0, len(ss)-1), ss[1:]...)
	}
	p.x = x
}

// ascending says whether a slice's addresses are in strictly ascending order: distinct and as
// sortEndpoints leaves them. With one port, its merge is then the identity, with no sorting.
func ascending(s *slice) bool {
	prev, _ := s.addr(0)
	for i := 1; i < s.n(); i++ {
		a, _ := s.addr(i)
		if compareAddr(&prev, &a) >= 0 {
			return false
		}
		prev = a
	}
	return true
}

// sortEndpoints puts a decoded slice's endpoints in address order (stable: copies of one address
// keep the report's order), which is the order its merge lists them in: a slice with one port
// then merges to the shared identity1 instead of an array of its own, and merging costs a check.
func sortEndpoints(eps []endpoint) {
	less := func(a, b endpoint) int { return compareAddr(&a.addr, &b.addr) }
	if !slices.IsSortedFunc(eps, less) {
		slices.SortStableFunc(eps, less)
	}
}

// identity1 is the merge of one slice with one port whose endpoints are distinct (they are in
// address order, sortEndpoints), the usual small service in a cluster: such parts share it
// rather than each holding the same array.
var identity1 = func() []mref {
	out := make([]mref, 1024)
	for i := range out {
		out[i].e = uint16(i)
	}
	return out
}()

func compareAddr(a, b *[16]byte) int {
	for i := range a {
		if a[i] != b[i] {
			return cmp.Compare(a[i], b[i])
		}
	}
	return 0
}

// strtab interns the strings endpoints repeat (zones, nodes, port names): an endpoint stores a
// uint32. Ids are never reused; the table grows with distinct values, not with endpoints.
type strtab struct {
	mu   sync.RWMutex
	ids  map[string]uint32
	strs []string
}

func newStrtab() *strtab { return &strtab{ids: map[string]uint32{"": 0}, strs: []string{""}} }

func (t *strtab) id(s string) uint32 {
	t.mu.RLock()
	id, ok := t.ids[s]
	t.mu.RUnlock()
	if ok {
		return id
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if id, ok := t.ids[s]; ok {
		return id
	}
	s = stringsClone(s)
	id = uint32(len(t.strs))
	t.strs = append(t.strs, s)
	t.ids[s] = id
	return id
}

func (t *strtab) str(id uint32) string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if int(id) < len(t.strs) {
		return t.strs[id]
	}
	return ""
}

// stringsClone copies s so an interned string does not pin the decoded report it came from.
func stringsClone(s string) string { return string([]byte(s)) }

// Store is the in-memory endpoint store.
type Store struct {
	strs  *strtab
	ports portLists

	// services holds the current snapshot of every service with endpoints. A snapshot holds its
	// parts as well (clusterSnap), so the state the reconciler works from and the state queries
	// read are one and the same, not two copies. It is replaced under mu by the reconciler
	// working on the service's key (the work queue hands a key to one worker at a time), not
	// through a per-service record with an atomic pointer: that record cost 8 bytes and a
	// pointer per service, the lock a write per publish. A table by the snapshot's key rather
	// than a map: a map's slot would hold the key again (34 bytes a service at its load, against
	// ~19; BenchmarkMemoryPerEndpoint).
	mu       sync.RWMutex
	services *table[*snapshot]
	// owned holds, by namespace/name, the whole state of each service in a namespace a project
	// owns: every cluster's part, what the reconciler works from and platform admins read.
	// What services serves of it is one snapshot per owning project (key "ns/name@project"),
	// built from those parts at publish (ownership.go); when one project owns the namespace on
	// every cluster reporting the service, its snapshot is the whole state too, in both tables
	// (owned finds it by the key's service part, serviceOf). A service in a namespace nobody
	// owns is in services alone, under its own key, as before: it costs nothing more.
	owned *table[*snapshot]

	cmu      sync.RWMutex
	clusters map[string]*clusterInfo
	// unregistered are the clusters the registry has not shown (yet): normally none, so the
	// sweep for deregistrations the registry view cannot show is no pass over the fleet
	// (docs/scale.md: at 10,000 clusters it was a seventh of the hub's CPU during a join).
	unregistered map[string]*clusterInfo

	version atomic.Uint64
	// addresses is the (endpoint, port) pairs of every service and cluster, evicted included:
	// what the response cache's default budget scales with.
	addresses atomic.Int64
	hub       hub
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{strs: newStrtab(), services: newTable(func(sn *snapshot) string { return sn.key }), owned: newTable(serviceOf),
		clusters: map[string]*clusterInfo{}, unregistered: map[string]*clusterInfo{},
		hub: hub{watchers: map[string]map[*watcher]struct{}{}}}
}

// cluster returns the shared state of cluster name, creating it.
func (st *Store) cluster(name string) *clusterInfo {
	st.cmu.RLock()
	c, ok := st.clusters[name]
	st.cmu.RUnlock()
	if ok {
		return c
	}
	st.cmu.Lock()
	defer st.cmu.Unlock()
	if c, ok := st.clusters[name]; ok {
		return c
	}
	c = &clusterInfo{name: name}
	st.clusters[name] = c
	st.unregistered[name] = c
	return c
}

// registered marks c as shown by the registry (its id outranks the agent's from now on).
func (st *Store) registered(c *clusterInfo) {
	if c.fromRegistry.Swap(true) {
		return
	}
	st.cmu.Lock()
	delete(st.unregistered, c.name)
	st.cmu.Unlock()
}

// Registered returns the names of the clusters the registry has shown that are not known to be
// deregistered.
func (st *Store) Registered() []string {
	st.cmu.RLock()
	defer st.cmu.RUnlock()
	var out []string
	for name, c := range st.clusters {
		if c.fromRegistry.Load() && !c.deregistered.Load() {
			out = append(out, name)
		}
	}
	return out
}

// Unregistered returns the clusters the store has heard of that the registry has not shown and
// that are not known to be deregistered.
func (st *Store) Unregistered() []*clusterInfo {
	st.cmu.RLock()
	defer st.cmu.RUnlock()
	var out []*clusterInfo
	for _, c := range st.unregistered {
		if !c.fromRegistry.Load() && !c.deregistered.Load() {
			out = append(out, c)
		}
	}
	return out
}

// snapshot returns the current state of service key (nil if it has no endpoints anywhere).
func (st *Store) snapshot(key string) *snapshot {
	st.mu.RLock()
	sn, _ := st.services.get(key)
	st.mu.RUnlock()
	return sn
}

// state returns the whole state of service key (namespace/name), served as it is or, in an
// owned namespace, per owning project; nil if it has no endpoints anywhere.
func (st *Store) state(key string) *snapshot {
	st.mu.RLock()
	sn, ok := st.services.get(key)
	if !ok {
		sn, _ = st.owned.get(key)
	}
	st.mu.RUnlock()
	return sn
}

// publish installs what service key serves and its state (ownership.go): served, each under
// its key; whole, when not nil, as its state, apart from what is served (an owned namespace:
// it may be one of served); the snapshots under dropped keys are no longer served, nor the one
// under key unless served has it. It returns the snapshots replaced (to release; none still
// installed) and whether key itself was served before. Only the reconciler of key calls it.
func (st *Store) publish(key string, whole *snapshot, served []*snapshot, dropped []string) (released []*snapshot, baseWasServed bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	gone := func(sn *snapshot, ok bool) {
		if ok && sn != nil && !slices.Contains(released, sn) {
			released = append(released, sn)
		}
	}
	_, baseWasServed = st.services.get(key)
	baseServed := false
	for _, sn := range served {
		gone(st.services.get(sn.key))
		st.services.put(sn)
		baseServed = baseServed || sn.key == key
	}
	if !baseServed {
		gone(st.services.del(key))
	}
	for _, k := range dropped {
		gone(st.services.del(k))
	}
	if whole != nil {
		gone(st.owned.get(key))
		st.owned.put(whole)
	} else {
		gone(st.owned.del(key))
	}
	// A snapshot replaced in one table may still be installed in the other (a project's,
	// unchanged, that was the whole state): it is not released.
	return slices.DeleteFunc(released, func(sn *snapshot) bool {
		cur, ok := st.services.get(sn.key)
		if ok && cur == sn {
			return true
		}
		w, ok := st.owned.get(key)
		return ok && w == sn
	}), baseWasServed
}

// serviceOf is the key of the service whose state sn is: its key without a project.
func serviceOf(sn *snapshot) string {
	k, _, _ := strings.Cut(sn.key, viewSep)
	return k
}

// servicesIn returns the keys of the services with slices in cluster c, served or evicted.
func (st *Store) servicesIn(c *clusterInfo) []string {
	st.mu.RLock()
	defer st.mu.RUnlock()
	var out []string
	each := func(sn *snapshot) {
		if isView(sn.key) {
			return // its service's state, in owned, has the same parts
		}
		for _, cs := range sn.parts() {
			if cs.ref().info == c {
				out = append(out, serviceOf(sn))
				break
			}
		}
	}
	st.services.each(each)
	st.owned.each(each)
	return out
}

// list returns the snapshots whose key keep accepts, ordered by key: what is served (services
// merged across clusters and projects' views) or, with whole, every service's whole state.
func (st *Store) list(whole bool, keep func(key string) bool) []*snapshot {
	var out []*snapshot
	st.mu.RLock()
	st.services.each(func(sn *snapshot) {
		if (!whole || !isView(sn.key)) && keep(sn.key) {
			out = append(out, sn)
		}
	})
	if whole {
		st.owned.each(func(sn *snapshot) {
			if keep(sn.key) {
				out = append(out, sn)
			}
		})
	}
	st.mu.RUnlock()
	slices.SortFunc(out, func(a, b *snapshot) int {
		ans, an, ap := splitKey(a.key)
		bns, bn, bp := splitKey(b.key)
		return cmp.Or(cmp.Compare(ans, bns), cmp.Compare(an, bn), cmp.Compare(ap, bp))
	})
	return out
}

// serviceKeys returns the key of every service with endpoints (not of views), owned or not.
func (st *Store) serviceKeys() []string {
	st.mu.RLock()
	defer st.mu.RUnlock()
	out := make([]string, 0, st.services.len()+st.owned.len())
	st.services.each(func(sn *snapshot) {
		if !isView(sn.key) {
			out = append(out, sn.key)
		}
	})
	st.owned.each(func(sn *snapshot) { out = append(out, serviceOf(sn)) })
	return out
}

// Services returns the snapshots of every service accepted by keep, ordered by key.
func (st *Store) Services(keep func(ns, name string) bool) []*snapshot {
	st.mu.RLock()
	out := make([]*snapshot, 0, st.services.len())
	st.services.each(func(sn *snapshot) {
		if keep != nil {
			if ns, name := sn.names(); !keep(ns, name) {
				return
			}
		}
		out = append(out, sn)
	})
	st.mu.RUnlock()
	slices.SortFunc(out, func(a, b *snapshot) int {
		ans, an := a.names()
		bns, bn := b.names()
		if c := cmp.Compare(ans, bns); c != 0 {
			return c
		}
		return cmp.Compare(an, bn)
	})
	return out
}

// hub tells watchers of a service that it changed. A notification is a token in a channel of
// one: a burst of changes wakes a slow watcher once, and it then reads the latest snapshot.
type hub struct {
	mu       sync.Mutex
	watchers map[string]map[*watcher]struct{}
}

type watcher struct{ ch chan struct{} }

func (h *hub) add(key string) *watcher {
	w := &watcher{ch: make(chan struct{}, 1)}
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.watchers[key]
	if m == nil {
		m = map[*watcher]struct{}{}
		h.watchers[key] = m
	}
	m[w] = struct{}{}
	return w
}

func (h *hub) remove(key string, w *watcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.watchers[key], w)
	if len(h.watchers[key]) == 0 {
		delete(h.watchers, key)
	}
}

func (h *hub) notify(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.watchers[key] {
		select {
		case w.ch <- struct{}{}:
		default:
		}
	}
}
