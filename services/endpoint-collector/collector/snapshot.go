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
}

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

// clusterSnap is one served cluster of a snapshot.
type clusterSnap struct {
	name, id  string
	stale     bool
	lastSeen  int64
	weight    uint32
	slices    []*slice
	merged    []mref
	overrides []override
}

func (c *clusterSnap) endpointWeight(e *endpoint) (uint32, bool) {
	for i := range c.overrides {
		o := &c.overrides[i]
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

// snapshot is the immutable state of one service that queries read. Responses built from it are
// cached in it, so a popular service is encoded once per change, not once per request.
type snapshot struct {
	ns, name   string
	version    uint64
	weightsRev uint64
	clusters   []clusterSnap // served clusters, by name
	ready      uint32        // (endpoint, port) pairs that are ready, over served clusters
	total      uint32

	strs     *strtab
	resp     [4]atomic.Pointer[cachedResponse] // by filter, every port
	codec    *responseCodec
	released atomic.Bool
}

type cachedResponse struct {
	msg *endpointv1.GetServiceEndpointsResponse
	// Encodings made on first use (see codec.go).
	jsonOnce, binOnce sync.Once
	json, bin         []byte

	gz [2]*gzipped // the gzip of each encoding (by encJSON, encBinary); under responseCodec.mu

	home *atomic.Pointer[cachedResponse] // the snapshot's slot holding it
	used atomic.Bool                     // served since the clock hand last passed
	// Guarded by responseCodec.mu: the position in the clock (-1 when out of it) and the
	// estimated bytes held.
	slot int
	size int64
}

// release forgets the encodings of a superseded snapshot.
func (sn *snapshot) release() {
	if sn == nil || sn.codec == nil {
		return
	}
	sn.released.Store(true)
	for i := range sn.resp {
		if c := sn.resp[i].Load(); c != nil {
			sn.codec.forget(c)
		}
	}
}

// response returns the service's endpoints as the API serves them, cached while the response
// cache keeps it.
func (sn *snapshot) response(filter endpointv1.EndpointFilter, portName string) *endpointv1.GetServiceEndpointsResponse {
	if filter < 0 || int(filter) >= len(sn.resp) {
		filter = endpointv1.EndpointFilter_ENDPOINT_FILTER_READY
	}
	if portName != "" || !sn.codec.caching() {
		return sn.build(filter, portName)
	}
	home := &sn.resp[filter]
	if c := home.Load(); c != nil {
		if !c.used.Load() {
			c.used.Store(true)
		}
		return c.msg
	}
	c := &cachedResponse{msg: sn.build(filter, ""), home: home, slot: -1}
	c.size = responseBytes(c.msg)
	if !home.CompareAndSwap(nil, c) {
		if other := home.Load(); other != nil {
			return other.msg
		}
		return c.msg // cached by another request and already evicted: serve ours
	}
	sn.codec.admit(c)
	if sn.released.Load() {
		sn.codec.forget(c) // superseded meanwhile: do not keep the entry
	}
	return c.msg
}

// peek returns a cached response, or builds one without caching it: for readers that want
// every service once (the bucket writer, the xDS feed), which would otherwise fill the response
// cache with what no proxy asked for.
func (sn *snapshot) peek(filter endpointv1.EndpointFilter) *endpointv1.GetServiceEndpointsResponse {
	if c := sn.resp[filter].Load(); c != nil {
		return c.msg
	}
	return sn.build(filter, "")
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

// Sizes for responseBytes: the generated structs and the cache's own records (the entry and
// its sync.Map node, ~300 bytes with thousands of entries), rounded up to the allocator's size
// classes.
const (
	responseOverhead = 448
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

func (sn *snapshot) build(filter endpointv1.EndpointFilter, portName string) *endpointv1.GetServiceEndpointsResponse {
	out := &endpointv1.GetServiceEndpointsResponse{Namespace: sn.ns, Name: sn.name, Version: sn.version,
		Clusters: make([]*endpointv1.ClusterEndpoints, 0, len(sn.clusters))}
	var portID uint32
	if portName != "" {
		portID = sn.strs.id(portName)
	}
	// Serving-terminating endpoints are a fallback when nothing anywhere is ready.
	keep := func(f uint8) bool { return f&fReady != 0 }
	switch filter {
	case endpointv1.EndpointFilter_ENDPOINT_FILTER_ALL:
		keep = func(uint8) bool { return true }
	case endpointv1.EndpointFilter_ENDPOINT_FILTER_READY_OR_TERMINATING:
		if sn.ready == 0 {
			keep = func(f uint8) bool { return f&fServing != 0 && f&fTerminating != 0 }
		}
	}
	for ci := range sn.clusters {
		c := &sn.clusters[ci]
		ce := &endpointv1.ClusterEndpoints{ClusterId: c.id, ClusterName: c.name, Weight: c.weight, Stale: c.stale,
			Addresses: make([]*endpointv1.Address, 0, len(c.merged))}
		if c.lastSeen != 0 {
			ce.LastSeen = timestamppb.New(time.Unix(0, c.lastSeen))
		}
		for _, r := range c.merged {
			s := c.slices[r.s]
			e := &s.eps[r.e]
			p := &s.ports[r.p]
			if !keep(e.flags) || (portName != "" && p.name != portID) {
				continue
			}
			ew, _ := c.endpointWeight(e)
			ce.Addresses = append(ce.Addresses, &endpointv1.Address{
				Ip:             addrString(e),
				Port:           uint32(p.num),
				Weight:         effectiveWeight(ew, c.weight),
				Ready:          e.flags&fReady != 0,
				Serving:        e.flags&fServing != 0,
				Terminating:    e.flags&fTerminating != 0,
				Zone:           sn.strs.str(e.zone),
				Node:           sn.strs.str(e.node),
				PortName:       sn.strs.str(p.name),
				Protocol:       protoNames[p.proto],
				EndpointWeight: ew,
				Target:         s.target(e),
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
func (sn *snapshot) serviceEndpoints() *endpointv1.ServiceEndpoints {
	r := sn.peek(endpointv1.EndpointFilter_ENDPOINT_FILTER_ALL)
	return &endpointv1.ServiceEndpoints{Namespace: sn.ns, Name: sn.name, Clusters: r.Clusters, Version: sn.version,
		UpdateTime: timestamppb.Now()}
}
