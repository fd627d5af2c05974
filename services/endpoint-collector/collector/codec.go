package collector

import (
	"compress/gzip"
	"errors"
	"hash/maphash"
	"sync"
	"sync/atomic"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/server"
)

// A proxy polls GetServiceEndpoints far more often than the service changes, so the encoding
// of a response is done once per snapshot and reused: the codecs below recognise a cached
// response message (by pointer) and return its bytes. Any other message is encoded as Connect's
// own codecs do. A superseded snapshot forgets its entries; an in-flight request holding one is
// then simply encoded afresh.
//
// A cached response (message and encodings) costs about three times what the compact store
// spends on the same endpoints, so the cache is bounded by a byte budget over all services
// (Config.ResponseCacheBytes; by default a share of the store, see ResponseCacheBytesPerAddress). Past it, a clock sweep evicts: every hit sets an entry's used bit,
// the hand clears set bits and evicts the first entry found clear, so what is polled stays and
// what was asked once goes. An evicted response is built again on its next query.
//
// Clients ask for gzip (a Connect client sends Accept-Encoding: gzip on every unary call), so
// the gzip of a cached encoding is cached too (gzip.go): Connect hands its compressor the
// encoded bytes, not the message, so those are indexed by a hash of the bytes.
type responseCodec struct {
	cache sync.Map // *GetServiceEndpointsResponse -> *cachedResponse
	gz    sync.Map // uint64, maphash of an encoding -> *gzipped
	seed  maphash.Seed
	// Messages gzipped: cached encodings (once each) and others (per request); for tests.
	gzipsCached, gzipsPerRequest atomic.Int64

	// budget in bytes: < 0 caches nothing; 0 scales with the store, ResponseCacheBytesPerAddress
	// per address it holds (addresses), within [MinResponseCacheBytes, DefaultResponseCacheBytes].
	budget    int64
	addresses *atomic.Int64
	mu        sync.Mutex
	ring      []*cachedResponse // the clock, in no particular order
	hand      int
	bytes     int64
}

func newResponseCodec(budget int64, addresses *atomic.Int64) *responseCodec {
	return &responseCodec{budget: budget, addresses: addresses, seed: maphash.MakeSeed()}
}

func (r *responseCodec) caching() bool { return r != nil && r.budget >= 0 }

// limit is the budget now.
func (r *responseCodec) limit() int64 {
	if r.budget != 0 {
		return r.budget
	}
	return scaledBudget(r.addresses.Load())
}

// scaledBudget is the default budget of a store holding addresses addresses.
func scaledBudget(addresses int64) int64 {
	return min(DefaultResponseCacheBytes, max(MinResponseCacheBytes, ResponseCacheBytesPerAddress*addresses))
}

// admit adds c, already stored in its snapshot slot, to the clock and evicts past the budget.
func (r *responseCodec) admit(c *cachedResponse) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cache.Store(c.msg, c) // under mu: an encoding made from now on is accounted by grow
	c.slot = len(r.ring)
	r.ring = append(r.ring, c)
	r.bytes += c.size
	r.evictLocked()
}

// encoded accounts for encoding enc (kind encJSON or encBinary) of c, made after c was
// admitted, and indexes it for the gzip compressor. It returns the bytes c is to keep: enc, or
// the same bytes of another entry already indexed (READY and READY_OR_TERMINATING of a service
// with a ready endpoint are the same response), which c then shares with its gzip encoding.
func (r *responseCodec) encoded(c *cachedResponse, kind int, enc []byte) []byte {
	h := maphash.Bytes(r.seed, enc)
	r.mu.Lock()
	defer r.mu.Unlock()
	if c.slot < 0 {
		return enc // evicted or forgotten meanwhile: neither kept nor indexed
	}
	g := r.refGzippedLocked(c, h, enc)
	if g != nil {
		c.gz[kind] = g
		enc = g.raw
	}
	r.chargeLocked(c, int64(cap(enc)))
	r.evictLocked()
	return enc
}

func (r *responseCodec) chargeLocked(c *cachedResponse, n int64) {
	c.size += n
	r.bytes += n
}

// forget drops c (its snapshot was superseded). It may be called more than once.
func (r *responseCodec) forget(c *cachedResponse) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.removeLocked(c)
}

func (r *responseCodec) evictLocked() {
	limit := r.limit()
	for r.bytes > limit && len(r.ring) > 0 {
		if r.hand >= len(r.ring) {
			r.hand = 0
		}
		c := r.ring[r.hand]
		if c.used.Load() {
			c.used.Store(false)
			r.hand++
			continue
		}
		// Removing moves the last entry, the newest, to the hand: step past it, so that a new
		// entry is looked at after a whole turn, as in a clock, and not first (which kept
		// the entries that filled the cache and evicted every newer one at once).
		r.removeLocked(c)
		r.hand++
		c.evicted()
	}
}

func (r *responseCodec) removeLocked(c *cachedResponse) {
	if c.slot < 0 {
		return
	}
	last := len(r.ring) - 1
	r.ring[c.slot] = r.ring[last]
	r.ring[c.slot].slot = c.slot
	r.ring[last] = nil
	r.ring = r.ring[:last]
	c.slot = -1
	r.bytes -= c.size
	r.cache.Delete(c.msg)
	for k, g := range c.gz {
		if g != nil {
			r.unrefGzippedLocked(c, g)
			c.gz[k] = nil
		}
	}
}

// stats returns the entries and bytes held (tests and benchmarks).
func (r *responseCodec) stats() (entries int, bytes int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ring), r.bytes
}

func (r *responseCodec) lookup(m any) *cachedResponse {
	resp, ok := m.(*endpointv1.GetServiceEndpointsResponse)
	if !ok {
		return nil
	}
	c, ok := r.cache.Load(resp)
	if !ok {
		return nil
	}
	return c.(*cachedResponse)
}

// HandlerOptions are srv's options plus the caching codecs and gzip compressor.
func (c *Collector) HandlerOptions(srv *server.Server) []connect.HandlerOption {
	return append(append([]connect.HandlerOption{}, srv.HandlerOptions()...), c.codecOptions()...)
}

// codecOptions replace Connect's JSON and binary codecs and its gzip compressor with those that
// serve cached responses.
func (c *Collector) codecOptions() []connect.HandlerOption {
	return []connect.HandlerOption{
		connect.WithCodec(&jsonCodec{r: c.codec}), connect.WithCodec(&binaryCodec{r: c.codec}),
		connect.WithCompression("gzip", func() connect.Decompressor { return &gzip.Reader{} },
			func() connect.Compressor { return &gzipCompressor{r: c.codec} }),
	}
}

var errNotProto = errors.New("not a protobuf message")

type jsonCodec struct{ r *responseCodec }

func (j *jsonCodec) Name() string { return "json" }

func (j *jsonCodec) Marshal(m any) ([]byte, error) { return j.MarshalAppend(nil, m) }

// MarshalAppend copies cached bytes into dst: Connect recycles the buffers it encodes into, so
// the cache must never hand out its own slice.
func (j *jsonCodec) MarshalAppend(dst []byte, m any) ([]byte, error) {
	if c := j.r.lookup(m); c != nil {
		c.jsonOnce.Do(func() {
			if b, err := protojson.Marshal(c.msg); err == nil {
				c.json = j.r.encoded(c, encJSON, b)
			}
		})
		if c.json != nil {
			return append(dst, c.json...), nil
		}
	}
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, errNotProto
	}
	return protojson.MarshalOptions{}.MarshalAppend(dst, pm)
}

func (j *jsonCodec) Unmarshal(data []byte, m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return errNotProto
	}
	if len(data) == 0 {
		return errors.New("zero-length payload is not a valid JSON object")
	}
	if req, ok := m.(*endpointv1.GetServiceEndpointsRequest); ok && decodeGetRequest(data, req) {
		return nil
	}
	// Strict, as every handler of the server decodes JSON (pkg/server/codec.go).
	return server.UnmarshalJSON(data, pm)
}

type binaryCodec struct{ r *responseCodec }

func (b *binaryCodec) Name() string { return "proto" }

func (b *binaryCodec) Marshal(m any) ([]byte, error) { return b.MarshalAppend(nil, m) }

func (b *binaryCodec) MarshalAppend(dst []byte, m any) ([]byte, error) {
	if c := b.r.lookup(m); c != nil {
		c.binOnce.Do(func() {
			if bin, err := proto.Marshal(c.msg); err == nil {
				c.bin = b.r.encoded(c, encBinary, bin)
			}
		})
		if c.bin != nil {
			return append(dst, c.bin...), nil
		}
	}
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, errNotProto
	}
	return proto.MarshalOptions{}.MarshalAppend(dst, pm)
}

func (b *binaryCodec) IsBinary() bool { return true }

func (b *binaryCodec) Unmarshal(data []byte, m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return errNotProto
	}
	return server.UnmarshalBinary(data, pm)
}
