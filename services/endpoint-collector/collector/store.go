package collector

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// The store keeps every endpoint of every service in every cluster in memory, compactly: the
// architecture plans for 1,000,000 endpoints and one collector holds them all. An endpoint is a
// fixed-size, pointer-free struct (IP and target uid as 16 bytes, zone and node as interned ids,
// conditions as bits) inside its slice's array, so the garbage collector never scans it and a
// million of them cost ~50 MB. Everything a query reads is an immutable snapshot published per
// service with an atomic pointer: readers take no lock and never see a half-applied change.

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

// endpoint is one EndpointSlice endpoint: 48 bytes, no pointers.
type endpoint struct {
	addr [16]byte // IPv4 in the last 4 bytes (IPv4-mapped form) when fV4 is set
	uid  [16]byte // targetRef uid (a UUID, or a hash of a non-UUID uid) when fHasUID is set
	zone uint32   // interned
	node uint32   // interned
	// target ("Pod/<name>") is targets[tOff:tOff+tLen] of the endpoint's slice.
	tOff  uint32
	tLen  uint16
	flags uint8
}

// rank orders copies of one endpoint found in several slices: the most ready one wins, as in
// kube-proxy, because an endpoint moving between slices is briefly in both and the older copy
// may be stale.
func (e *endpoint) rank() uint8 {
	switch {
	case e.flags&fReady != 0:
		return 2
	case e.flags&fServing != 0:
		return 1
	}
	return 0
}

type port struct {
	num   uint16
	proto uint8
	name  uint32 // interned
}

// slice is one EndpointSlice as last reported. Immutable once built: a new report builds a new
// one, so the parts of successive snapshots can hold copies of it that share its arrays.
type slice struct {
	// buf is the slice's name, then the arena of its endpoints' target names, after a header
	// of sliceHdr bytes: the name's length, big endian. One string rather than a name and an
	// arena: the slice is then 48 bytes instead of 64, and the ingester's index shares the
	// name. The namespace is not in it: the ingester's index is by namespace, and the snapshot
	// holding the slice is of a service of that namespace; leaving it out saves its length
	// and a separator in every slice (BenchmarkMemoryPerEndpoint: 55 bytes to 46 there, a
	// 48-byte allocation instead of 64).
	buf   string
	ports *[]port // shared with every slice of the same ports (portLists)
	eps   []endpoint
}

const sliceHdr = 2

// namelessBuf is the buf of a decoded slice without targets, before the ingester names it.
const namelessBuf = "\x00\x00"

// sliceBuf returns a slice's buf: its name (empty for a slice not yet named) and targets, false
// when the name is longer than its header can say (a Kubernetes name is at most 253 bytes).
func sliceBuf(name, targets string) (string, bool) {
	if len(name) > 0xFFFF {
		return "", false
	}
	if name == "" && targets == "" {
		return namelessBuf, true
	}
	var b strings.Builder
	b.Grow(sliceHdr + len(name) + len(targets))
	b.WriteByte(byte(len(name) >> 8))
	b.WriteByte(byte(len(name)))
	b.WriteString(name)
	b.WriteString(targets)
	return b.String(), true
}

// namelessBufOf returns the buf of a decoded slice with targets, before the ingester names it.
func namelessBufOf(targets []byte) string {
	if len(targets) == 0 {
		return namelessBuf
	}
	var b strings.Builder
	b.Grow(sliceHdr + len(targets))
	b.WriteString(namelessBuf)
	b.Write(targets)
	return b.String()
}

func (s *slice) nameEnd() int { return sliceHdr + (int(s.buf[0])<<8 | int(s.buf[1])) }

// name returns the slice's name.
func (s *slice) name() string { return s.buf[sliceHdr:s.nameEnd()] }

// targets returns the arena of target names.
func (s *slice) targets() string { return s.buf[s.nameEnd():] }

func (s *slice) target(e *endpoint) string {
	at := uint32(s.nameEnd()) + e.tOff
	return s.buf[at : at+uint32(e.tLen)]
}

// setName gives a decoded slice its name (from the report's subject), false when too long.
func (s *slice) setName(name string) bool {
	buf, ok := sliceBuf(name, s.targets())
	if ok {
		s.buf = buf
	}
	return ok
}

// noPorts is the ports of a slice without any (a headless Service): its endpoints are still
// addresses, on port 0.
var noPorts = &[]port{{}}

// portLists shares the port lists of slices: most slices of a fleet have one of a few (http
// 8080/TCP), so a slice points at the list of an earlier slice with the same ports instead of
// holding its own array, and a pointer rather than a slice header (the slice struct is then 64
// bytes instead of 80). The table is small and direct-mapped, so it stays bounded, and a list it
// no longer holds goes with the last slice using it.
type portLists struct {
	mu     sync.Mutex
	recent [256]*[]port
}

// share returns ports as a shared list; ports may be a caller's buffer.
func (t *portLists) share(ports []port) *[]port {
	if len(ports) == 0 {
		return noPorts
	}
	h := uint32(2166136261)
	for _, p := range ports {
		h = (h ^ (uint32(p.num) | uint32(p.proto)<<16)) * 16777619
		h = (h ^ p.name) * 16777619
	}
	e := &t.recent[(h^h>>8^h>>16^h>>24)%uint32(len(t.recent))]
	t.mu.Lock()
	defer t.mu.Unlock()
	if *e != nil && slices.Equal(**e, ports) {
		return *e
	}
	list := append([]port(nil), ports...)
	*e = &list
	return *e
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
// the slice itself, held here by value, and nothing else (more is nil), so a part costs no
// array of slices and no merge list of its own. Other parts put their other slices and their
// merge behind more. Holding the first slice here instead of an array of them, and the merge
// behind the same pointer, takes a served cluster (clusterSnap) from 64 bytes plus a 48-byte
// array of one slice to 72 bytes (BenchmarkMemoryPerEndpoint).
type part struct {
	cluster *clusterRef // the cluster, and in a served clusterSnap its id and staleness
	// first is the first slice by name; its buf is "" when the part has no slices (a part
	// being built: a keyed slice's buf is never empty). A slice never changes, so copies share
	// its endpoints, targets and ports.
	first slice
	more  *partMore
}

// partMore is what a part other than the usual one holds: its slices after the first (by name,
// by value), and its merge (refs), a list of its own.
type partMore struct {
	rest   []slice
	merged []mref
}

// nslices returns how many slices the part has.
func (p *part) nslices() int {
	switch {
	case p.first.buf == "":
		return 0
	case p.more == nil:
		return 1
	}
	return 1 + len(p.more.rest)
}

// slice returns the part's slice i, by name.
func (p *part) slice(i int) *slice {
	if i == 0 {
		return &p.first
	}
	return &p.more.rest[i-1]
}

// slices returns a new array of the part's slices, for the reconciler to change.
func (p *part) slices() []slice {
	n := p.nslices()
	if n == 0 {
		return nil
	}
	out := make([]slice, 1, n)
	out[0] = p.first
	if p.more != nil {
		out = append(out, p.more.rest...)
	}
	return out
}

// refs returns the part's merge.
func (p *part) refs() []mref {
	switch {
	case p.first.buf == "":
		return nil
	case p.more == nil:
		n := len(p.first.eps)
		return identity1[:n:n]
	}
	return p.more.merged
}

// setSlices makes ss (sorted by name, not shared with anything) the part's slices and merges
// them: the de-duplicated list of (endpoint, port) of the part.
func (p *part) setSlices(ss []slice) {
	p.more = nil
	if len(ss) == 0 {
		p.first = slice{}
		return
	}
	p.first = ss[0]
	n := 0
	for si := range ss {
		n += len(ss[si].eps) * len(*ss[si].ports)
	}
	refs := make([]mref, 0, n)
	for si := range ss {
		s := &ss[si]
		for ei := range s.eps {
			for pi := range *s.ports {
				refs = append(refs, mref{s: uint16(si), e: uint16(ei), p: uint8(pi)})
			}
		}
	}
	at := func(r mref) (*endpoint, *port) {
		s := &ss[r.s]
		return &s.eps[r.e], &(*s.ports)[r.p]
	}
	slices.SortFunc(refs, func(a, b mref) int {
		ea, pa := at(a)
		eb, pb := at(b)
		if c := compareAddr(&ea.addr, &eb.addr); c != 0 {
			return c
		}
		if c := cmp.Compare(pa.num, pb.num); c != 0 {
			return c
		}
		if c := cmp.Compare(pa.proto, pb.proto); c != 0 {
			return c
		}
		// Best copy first, then the first slice by name: the result does not depend on the
		// order reports arrived in.
		if c := cmp.Compare(eb.rank(), ea.rank()); c != 0 {
			return c
		}
		return cmp.Compare(a.s, b.s)
	})
	out := refs[:0]
	for i, r := range refs {
		if i > 0 {
			e, pt := at(r)
			le, lp := at(out[len(out)-1])
			if e.addr == le.addr && pt.num == lp.num && pt.proto == lp.proto {
				continue
			}
		}
		out = append(out, r)
	}
	if n := len(out); len(ss) == 1 && len(*ss[0].ports) == 1 && n == len(ss[0].eps) && n <= len(identity1) &&
		slices.Equal(out, identity1[:n]) {
		return // the usual part: identity1 over its one slice, nothing of its own (more nil)
	}
	m := &partMore{merged: slices.Clip(out)}
	if len(ss) > 1 {
		// An exact array: kept until the part changes, and ss[0] is held in first already.
		m.rest = append(make([]slice, 0, len(ss)-1), ss[1:]...)
	}
	p.more = m
}

// sortEndpoints puts a slice's endpoints in address order (stable: copies of one address keep
// the report's order), which is the order its merge lists them in: a slice with one port then
// merges to the shared identity1 instead of an array of its own, and merging costs a check.
func sortEndpoints(s *slice) {
	less := func(a, b endpoint) int { return compareAddr(&a.addr, &b.addr) }
	if !slices.IsSortedFunc(s.eps, less) {
		slices.SortStableFunc(s.eps, less)
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
	// pointer per service, the lock a write per publish.
	mu       sync.RWMutex
	services map[string]*snapshot

	cmu      sync.RWMutex
	clusters map[string]*clusterInfo

	version atomic.Uint64
	// addresses is the (endpoint, port) pairs of every service and cluster, evicted included:
	// what the response cache's default budget scales with.
	addresses atomic.Int64
	hub       hub
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{strs: newStrtab(), services: map[string]*snapshot{}, clusters: map[string]*clusterInfo{},
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
	return c
}

// Clusters returns every cluster the store has heard of.
func (st *Store) Clusters() []*clusterInfo {
	st.cmu.RLock()
	defer st.cmu.RUnlock()
	out := make([]*clusterInfo, 0, len(st.clusters))
	for _, c := range st.clusters {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b *clusterInfo) int { return cmp.Compare(a.name, b.name) })
	return out
}

// snapshot returns the current state of service key (nil if it has no endpoints anywhere).
func (st *Store) snapshot(key string) *snapshot {
	st.mu.RLock()
	sn := st.services[key]
	st.mu.RUnlock()
	return sn
}

// swap makes sn the current snapshot of service key (nil: the service is gone) and returns the
// one it replaces. Only the reconciler of key calls it.
func (st *Store) swap(key string, sn *snapshot) *snapshot {
	st.mu.Lock()
	defer st.mu.Unlock()
	old := st.services[key]
	if sn == nil {
		delete(st.services, key)
		return old
	}
	// Keyed by the snapshot's own key: assigning to a string key stores the string given, which
	// would otherwise keep a second copy of it.
	st.services[sn.key] = sn
	return old
}

// servicesIn returns the keys of the services with slices in cluster c, served or evicted.
func (st *Store) servicesIn(c *clusterInfo) []string {
	st.mu.RLock()
	defer st.mu.RUnlock()
	var out []string
	for key, sn := range st.services {
		for _, cs := range sn.parts() {
			if cs.cluster.info == c {
				out = append(out, key)
				break
			}
		}
	}
	return out
}

// Services returns the snapshots of every service accepted by keep, ordered by key.
func (st *Store) Services(keep func(ns, name string) bool) []*snapshot {
	st.mu.RLock()
	out := make([]*snapshot, 0, len(st.services))
	for key, sn := range st.services {
		if keep != nil {
			if ns, name, _ := strings.Cut(key, "/"); !keep(ns, name) {
				continue
			}
		}
		out = append(out, sn)
	}
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
