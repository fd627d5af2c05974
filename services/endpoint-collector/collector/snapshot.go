package collector

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
)

// Liveness of a cluster's agent.
type clusterState int32

const (
	stateLive clusterState = iota
	// stateStale: silent past the stale delay, or back after an eviction and not yet relisted.
	// Its endpoints are served, flagged.
	stateStale
	// stateEvicted: silent past the evict delay. Its endpoints are kept but not served, so they
	// are back at once when the agent returns.
	stateEvicted
)

func (s clusterState) String() string {
	return [...]string{"live", "stale", "evicted"}[s]
}

// clusterInfo is what the collector knows about one cluster, shared by all its services.
type clusterInfo struct {
	name     string
	id       atomic.Pointer[string]
	lastSeen atomic.Int64 // unix nanoseconds, server receive time of its last message
	state    atomic.Int32
	// resyncing is set when an evicted cluster's agent returns, until its relist completes.
	resyncing atomic.Bool
	// fromRegistry: the id came from cluster-import's registry, which outranks the agent's.
	fromRegistry atomic.Bool
	// deregistered: the registry confirmed the cluster's deregistration; its endpoints are no
	// longer served, whatever its agent last said, until it is registered again.
	deregistered atomic.Bool

	refMu sync.Mutex
	refs  []*clusterRef // interned (ref): a few, as the cluster's id rarely changes
}

// clusterRef is a cluster as a snapshot serves it: the cluster, its id and whether it was stale
// when the snapshot was published. Interned per cluster, so that a snapshot's cluster holds
// the three as one pointer. It keeps the record its usual parts share (usualFor): a part is
// then its first slice's string and one pointer (part).
type clusterRef struct {
	info  *clusterInfo
	id    string
	stale bool

	mu    sync.Mutex
	usual map[*[]port]*partX // the partX of every usual part of this cluster, by its ports (part)
}

// usualFor returns the record of every usual part of r whose slice has ports (shared, so the
// same for the same ports: portLists).
func (r *clusterRef) usualFor(ports *[]port) *partX {
	r.mu.Lock()
	defer r.mu.Unlock()
	if x, ok := r.usual[ports]; ok {
		return x
	}
	if r.usual == nil {
		r.usual = map[*[]port]*partX{}
	}
	x := &partX{cluster: r, ports: ports}
	r.usual[ports] = x
	return x
}

// ref returns the interned clusterRef of c with id and stale.
func (c *clusterInfo) ref(id string, stale bool) *clusterRef {
	c.refMu.Lock()
	defer c.refMu.Unlock()
	for _, r := range c.refs {
		if r.id == id && r.stale == stale {
			return r
		}
	}
	r := &clusterRef{info: c, id: id, stale: stale}
	c.refs = append(c.refs, r)
	return r
}

// bare returns c's clusterRef without id, not stale: a part's before it is served, or evicted.
func (c *clusterInfo) bare() *clusterRef { return c.ref("", false) }

func (c *clusterInfo) ID() string {
	if p := c.id.Load(); p != nil {
		return *p
	}
	return ""
}

func (c *clusterInfo) setID(id string) bool {
	if id == "" || c.ID() == id {
		return false
	}
	c.id.Store(&id)
	return true
}

func (c *clusterInfo) State() clusterState { return clusterState(c.state.Load()) }

// DefaultWeight is the weight of an endpoint or cluster nobody set one for.
const DefaultWeight = 100

// override is one endpoint weight in force for a cluster.
type override struct {
	addr   [16]byte
	uid    [16]byte
	hasUID bool
	weight uint32
}

// clusterSnap is one cluster of a snapshot: the part (the service's slices in that cluster,
// shared with the snapshots before and after as long as they do not change) and what the
// snapshot serves it with: the cluster's id and staleness (part.ref, a clusterRef) and its
// weight (snapshot.clusterWeight). 24 bytes. When the cluster's agent was last heard is read
// from the cluster when a response is built, not kept here: 8 bytes per cluster of every
// service (BenchmarkMemoryPerEndpoint), and a response then says when the agent was last
// heard as of the response, not as of the service's last change.
type clusterSnap struct {
	part
}

// targetIndex says where each endpoint's target starts in its slice's targets(), for a reader
// of a part's endpoints in merge order. Read in slice order (the usual part, and a slice's
// ports one after the other), a start is the one before plus its length; otherwise the starts
// of a slice are taken once, when read out of order.
type targetIndex struct {
	p      *part
	si, ei int    // the endpoint read last
	at     uint32 // and where its target starts
	starts [][]uint32
}

func targetStarts(p *part) targetIndex { return targetIndex{p: p, si: -1} }

func (t *targetIndex) of(si, ei int) uint32 {
	switch {
	case ei == 0:
		t.at = 0
	case si == t.si && ei == t.ei:
	case si == t.si && ei == t.ei+1:
		s := t.p.slice(si)
		t.at += uint32(s.tLen(t.ei))
	default:
		if t.starts == nil {
			t.starts = make([][]uint32, t.p.nslices())
		}
		if t.starts[si] == nil {
			s := t.p.slice(si)
			t.starts[si] = s.targetStarts(nil)
		}
		t.at = t.starts[si][ei]
	}
	t.si, t.ei = si, ei
	return t.at
}

func (c *clusterSnap) name() string { return c.ref().info.name }

func (c *clusterSnap) stale() bool { return c.ref().stale }

func (c *clusterSnap) clusterID() string { return c.ref().id }

// endpointWeight is e's weight among overrides, the cluster's (snapshot.overridesOf).
func endpointWeight(overrides []override, e *endpoint) (uint32, bool) {
	for i := range overrides {
		o := &overrides[i]
		if o.addr != e.addr {
			continue
		}
		// A weight set for another pod does not pass to this one that reuses its IP.
		if o.hasUID && (e.flags&fHasUID == 0 || o.uid != e.uid) {
			continue
		}
		return o.weight, true
	}
	return DefaultWeight, false
}

// snapWeights is what a snapshot keeps of its service's weights, when it has any (most services
// have none: a nil pointer then costs 8 bytes instead of a revision and a list per cluster).
type snapWeights struct {
	rev uint64
	// overrides is grouped by cluster in the order of the snapshot's clusters; cluster[i] is
	// where the overrides of clusters[i] end.
	overrides []override
	ends      []int32
	// clusters is the weight of each served cluster, in the order of the snapshot's clusters;
	// nil when all are DefaultWeight.
	clusters []uint32
}

// snapshot is the immutable state of one service that queries read, and the state its next
// snapshot is made from. Responses built from it are cached in it, so a popular service is
// encoded once per change, not once per request. A service costs this struct (64 bytes, a size
// class: what every snapshot shares, snapEnv, is passed in by the caller rather than pointed
// at, and its count of ready endpoints is counted when asked), its clusters (24 bytes each:
// the first slice's string and one pointer, part) and its slices' strings.
type snapshot struct {
	key     string // namespace/name
	version uint64
	// reportedAt is the stream time of the earliest agent report this snapshot took in (zero:
	// it took in none, e.g. a weight or liveness change, or a report replayed at start).
	reportedAt time.Time
	// clusters are the served ones, by name. Past their length, within their capacity, are the
	// evicted clusters (by name): kept, not served, back at once when their agent returns.
	clusters []clusterSnap
	weights  *snapWeights
	// resp is made on the first response cached, and is releasedSlots once the snapshot is
	// superseded (release): nothing is cached in it from then on.
	resp atomic.Pointer[respSlots]
}

// snapEnv is what every snapshot of a collector shares: the store's strings and the response
// cache. Callers pass it (Collector.env).
type snapEnv struct {
	strs  *strtab
	codec *responseCodec
}

// respSlots holds a snapshot's cached responses, by filter, every port.
type respSlots [4]atomic.Pointer[cachedResponse]

// releasedSlots marks a superseded snapshot's resp (release): one sentinel instead of a flag in
// every snapshot. It never holds an entry.
var releasedSlots = new(respSlots)

func (sn *snapshot) names() (ns, name string) {
	ns, name, _ = splitKey(sn.key)
	return ns, name
}

// parts returns every cluster of the snapshot, the evicted ones included.
func (sn *snapshot) parts() []clusterSnap { return sn.clusters[:cap(sn.clusters)] }

// total returns the (endpoint, port) pairs over served clusters.
func (sn *snapshot) total() uint32 {
	var n int
	for i := range sn.clusters {
		n += len(sn.clusters[i].refs())
	}
	return uint32(n)
}

// ready returns the (endpoint, port) pairs that are ready, over served clusters. Counted when
// asked (ListServices, and a READY_OR_TERMINATING response being built, which walks them all
// anyway) rather than kept: 4 bytes in every snapshot took it past a 64-byte size class.
func (sn *snapshot) ready() uint32 {
	var n uint32
	for i := range sn.clusters {
		cs := &sn.clusters[i]
		for _, r := range cs.refs() {
			if s := cs.slice(int(r.s)); s.flags(int(r.e))&fReady != 0 {
				n++
			}
		}
	}
	return n
}

// clusterWeight returns the weight of served cluster i.
func (sn *snapshot) clusterWeight(i int) uint32 {
	if w := sn.weights; w != nil && w.clusters != nil {
		return w.clusters[i]
	}
	return DefaultWeight
}

func (sn *snapshot) weightsRev() uint64 {
	if sn.weights == nil {
		return 0
	}
	return sn.weights.rev
}

// overridesOf returns the endpoint weights of served cluster i.
func (sn *snapshot) overridesOf(i int) []override {
	w := sn.weights
	if w == nil || len(w.ends) == 0 {
		return nil
	}
	start := int32(0)
	if i > 0 {
		start = w.ends[i-1]
	}
	return w.overrides[start:w.ends[i]]
}

// cached returns the cached response for filter, nil when there is none.
func (sn *snapshot) cached(filter endpointv1.EndpointFilter) *cachedResponse {
	slots := sn.resp.Load()
	if slots == nil || slots == releasedSlots {
		return nil
	}
	return slots[filter].Load()
}

type cachedResponse struct {
	msg *endpointv1.GetServiceEndpointsResponse
	// Encodings made on first use (see codec.go).
	jsonOnce, binOnce sync.Once
	json, bin         []byte

	gz [2]*gzipped // the gzip of each encoding (by encJSON, encBinary); under responseCodec.mu

	owner  *snapshot
	slots  *respSlots // the owner's slots, holding it at filter
	filter uint8
	used   atomic.Bool // served since the clock hand last passed
	// Guarded by responseCodec.mu: the position in the clock (-1 when out of it) and the
	// estimated bytes held.
	slot int
	size int64
}

// release forgets the encodings of a superseded snapshot: its slots become releasedSlots, so
// nothing is cached in it any more, and the entries they held leave the cache.
func (sn *snapshot) release(codec *responseCodec) {
	if sn == nil {
		return
	}
	slots := sn.resp.Swap(releasedSlots)
	if slots == nil || slots == releasedSlots || codec == nil {
		return
	}
	for i := range slots {
		if c := slots[i].Load(); c != nil {
			codec.forget(c)
		}
	}
}

// response returns the service's endpoints as the API serves them, cached while the response
// cache keeps it.
func (sn *snapshot) response(env *snapEnv, filter endpointv1.EndpointFilter, portName string) *endpointv1.GetServiceEndpointsResponse {
	if filter <= 0 || int(filter) >= len(respSlots{}) {
		filter = endpointv1.EndpointFilter_ENDPOINT_FILTER_READY // unspecified: one entry with READY
	}
	if portName != "" || !env.codec.caching() {
		return sn.build(env.strs, filter, portName)
	}
	slots := sn.resp.Load()
	for slots == nil {
		sn.resp.CompareAndSwap(nil, new(respSlots))
		slots = sn.resp.Load()
	}
	if slots == releasedSlots {
		return sn.build(env.strs, filter, "") // superseded: served once, not cached
	}
	home := &slots[filter]
	if c := home.Load(); c != nil {
		if !c.used.Load() {
			c.used.Store(true)
		}
		return c.msg
	}
	c := &cachedResponse{msg: sn.build(env.strs, filter, ""), owner: sn, slots: slots, filter: uint8(filter), slot: -1}
	c.size = responseBytes(c.msg)
	if !home.CompareAndSwap(nil, c) {
		if other := home.Load(); other != nil {
			return other.msg
		}
		return c.msg // cached by another request and already evicted: serve ours
	}
	env.codec.admit(c)
	if sn.resp.Load() != slots {
		env.codec.forget(c) // superseded (releasedSlots), or the slots let go, meanwhile: do not keep the entry
	}
	return c.msg
}

// evicted takes c out of its snapshot, and the snapshot's slots too once they hold nothing: a
// snapshot queried once and evicted since costs nothing more than one never queried. A response
// cached into the slots while they are let go sees it (response) and forgets its entry.
func (c *cachedResponse) evicted() {
	if !c.slots[c.filter].CompareAndSwap(c, nil) {
		return
	}
	for i := range c.slots {
		if c.slots[i].Load() != nil {
			return
		}
	}
	c.owner.resp.CompareAndSwap(c.slots, nil)
}

// peek returns a cached response, or builds one without caching it: for readers that want
// every service once (the bucket writer, the xDS feed), which would otherwise fill the response
// cache with what no proxy asked for.
func (sn *snapshot) peek(strs *strtab, filter endpointv1.EndpointFilter) *endpointv1.GetServiceEndpointsResponse {
	if c := sn.cached(filter); c != nil {
		return c.msg
	}
	return sn.build(strs, filter, "")
}

// responseBytes estimates the heap a cached response holds, its encodings aside (those are
// counted as they are made): the message, the cache entry, per cluster its message, and per
// address its message, its place in the cluster's list and its IP string; zone, node, port name,
// protocol and target are shared with the store. TestResponseBytesEstimate checks it against
// the heap.
func responseBytes(m *endpointv1.GetServiceEndpointsResponse) int64 {
	n := int64(responseOverhead)
	for _, ce := range m.Clusters {
		n += clusterOverhead
		for _, a := range ce.Addresses {
			n += addressOverhead + roundAlloc(len(a.Ip))
		}
	}
	return n
}

// Sizes for responseBytes: the generated structs and the cache's own records (the entry, its
// sync.Map node and its place in the clock, ~330 bytes with thousands of entries; and the
// snapshot's slots, 32 bytes, which the first response cached in a snapshot makes), rounded up
// to the allocator's size classes. TestCachedBytesMatchHeap checks the whole charge.
const (
	responseOverhead = 512
	clusterOverhead  = 112
	addressOverhead  = 168
)

// roundAlloc rounds a small allocation up as Go's allocator does (to 8, then 16 bytes).
func roundAlloc(n int) int64 {
	switch {
	case n == 0:
		return 0
	case n <= 8:
		return 8
	}
	return int64(n+15) &^ 15
}

func (sn *snapshot) build(strs *strtab, filter endpointv1.EndpointFilter, portName string) *endpointv1.GetServiceEndpointsResponse {
	ns, name := sn.names()
	out := &endpointv1.GetServiceEndpointsResponse{Namespace: ns, Name: name, Version: sn.version,
		Clusters: make([]*endpointv1.ClusterEndpoints, 0, len(sn.clusters))}
	var portID uint32
	if portName != "" {
		portID = strs.id(portName)
	}
	// Serving-terminating endpoints are a fallback when nothing anywhere is ready.
	keep := func(f uint8) bool { return f&fReady != 0 }
	switch filter {
	case endpointv1.EndpointFilter_ENDPOINT_FILTER_ALL:
		keep = func(uint8) bool { return true }
	case endpointv1.EndpointFilter_ENDPOINT_FILTER_READY_OR_TERMINATING:
		if sn.ready() == 0 {
			keep = func(f uint8) bool { return f&fServing != 0 && f&fTerminating != 0 }
		}
	}
	for ci := range sn.clusters {
		c := &sn.clusters[ci]
		cw := sn.clusterWeight(ci)
		ce := &endpointv1.ClusterEndpoints{ClusterId: c.clusterID(), ClusterName: c.name(), Weight: cw, Stale: c.stale(),
			Addresses: make([]*endpointv1.Address, 0, len(c.refs()))}
		overrides := sn.overridesOf(ci)
		if seen := c.ref().info.lastSeen.Load(); seen != 0 {
			ce.LastSeen = timestamppb.New(time.Unix(0, seen))
		}
		starts := targetStarts(&c.part)
		for _, r := range c.refs() {
			s := c.slice(int(r.s))
			ev := s.ep(int(r.e))
			e := &ev
			p := &(*s.ports)[r.p]
			if !keep(e.flags) || (portName != "" && p.name != portID) {
				continue
			}
			ew, _ := endpointWeight(overrides, e)
			ce.Addresses = append(ce.Addresses, &endpointv1.Address{
				Ip:             addrString(e),
				Port:           uint32(p.num),
				Weight:         effectiveWeight(ew, cw),
				Ready:          e.flags&fReady != 0,
				Serving:        e.flags&fServing != 0,
				Terminating:    e.flags&fTerminating != 0,
				Zone:           strs.str(e.zone),
				Node:           strs.str(e.node),
				PortName:       strs.str(p.name),
				Protocol:       protoNames[p.proto],
				EndpointWeight: ew,
				Target:         s.target(int(r.e), starts.of(int(r.s), int(r.e))),
			})
		}
		out.Clusters = append(out.Clusters, ce)
	}
	return out
}

// effectiveWeight folds the cluster weight (a percentage) into the endpoint weight, so a proxy
// that only reads address weights, like the seed's, still honours a drained or canary cluster.
func effectiveWeight(endpointWeight, clusterWeight uint32) uint32 {
	if endpointWeight == 0 || clusterWeight == 0 {
		return 0
	}
	w := uint64(endpointWeight) * uint64(clusterWeight) / DefaultWeight
	return uint32(max(w, 1))
}

func addrString(e *endpoint) string { return addrOf(e).String() }

func addrOf(e *endpoint) netip.Addr {
	if e.flags&fV4 != 0 {
		return netip.AddrFrom4([4]byte(e.addr[12:]))
	}
	return netip.AddrFrom16(e.addr)
}

// addrBytes returns a's 16-byte form and whether it is IPv4.
func addrBytes(a netip.Addr) ([16]byte, bool) {
	if a.Is4() || a.Is4In6() {
		return netip.AddrFrom4(a.Unmap().As4()).As16(), true
	}
	return a.As16(), false
}

// serviceEndpoints is the snapshot as bucket `endpoints` keeps it: every endpoint. It reuses a
// cached ALL response but does not cache one: the bucket writer encodes every snapshot once, and
// caching that response kept a second copy of every service's endpoints in memory (about 220
// bytes per endpoint with 10 per slice, BenchmarkMemoryPerEndpoint) for a filter few queries use.
func (sn *snapshot) serviceEndpoints(strs *strtab) *endpointv1.ServiceEndpoints {
	r := sn.peek(strs, endpointv1.EndpointFilter_ENDPOINT_FILTER_ALL)
	return &endpointv1.ServiceEndpoints{Namespace: r.Namespace, Name: r.Name, Clusters: r.Clusters, Version: sn.version,
		UpdateTime: timestamppb.Now()}
}
