package collector

import (
	"errors"
	"fmt"
	"sync"

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
type responseCodec struct {
	cache sync.Map // *GetServiceEndpointsResponse -> *cachedResponse
}

func newResponseCodec() *responseCodec { return &responseCodec{} }

func (r *responseCodec) remember(c *cachedResponse) { r.cache.Store(c.msg, c) }
func (r *responseCodec) forget(m *endpointv1.GetServiceEndpointsResponse) {
	r.cache.Delete(m)
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

// HandlerOptions are srv's options plus the caching codecs.
func (c *Collector) HandlerOptions(srv *server.Server) []connect.HandlerOption {
	return append(append([]connect.HandlerOption{}, srv.HandlerOptions()...),
		connect.WithCodec(&jsonCodec{r: c.codec}), connect.WithCodec(&binaryCodec{r: c.codec}))
}

var errNotProto = errors.New("not a protobuf message")

type jsonCodec struct{ r *responseCodec }

func (j *jsonCodec) Name() string { return "json" }

func (j *jsonCodec) Marshal(m any) ([]byte, error) { return j.MarshalAppend(nil, m) }

// MarshalAppend copies cached bytes into dst: Connect recycles the buffers it encodes into, so
// the cache must never hand out its own slice.
func (j *jsonCodec) MarshalAppend(dst []byte, m any) ([]byte, error) {
	if c := j.r.lookup(m); c != nil {
		c.jsonOnce.Do(func() { c.json, _ = protojson.Marshal(c.msg) })
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
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(data, pm); err != nil {
		return fmt.Errorf("unmarshal into %T: %w", m, err)
	}
	return nil
}

type binaryCodec struct{ r *responseCodec }

func (b *binaryCodec) Name() string { return "proto" }

func (b *binaryCodec) Marshal(m any) ([]byte, error) { return b.MarshalAppend(nil, m) }

func (b *binaryCodec) MarshalAppend(dst []byte, m any) ([]byte, error) {
	if c := b.r.lookup(m); c != nil {
		c.binOnce.Do(func() { c.bin, _ = proto.Marshal(c.msg) })
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
	return proto.Unmarshal(data, pm)
}
