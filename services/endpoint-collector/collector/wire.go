package collector

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"
)

// Reports arrive on one ordered consumer, so decoding them is the collector's serial hot path.
// decodeReport reads an event envelope holding an EndpointSliceReport straight from the wire
// into the compact slice, without building the protobuf messages (which costs ~100 small
// allocations per 10-endpoint slice). It either yields exactly what the generated code plus
// convert yields, or declines with errSlowPath and the caller decodes with the generated code,
// which also produces the proper error for malformed input. So it checks what proto.Unmarshal
// checks, fields it ignores included: valid framing and field numbers, UTF-8 in every string
// field, and nested messages that parse; a field given twice is the last one, as a merge makes
// it. FuzzDecodeReport (wire_test.go) holds it to that on arbitrary bytes.

var errSlowPath = errors.New("not decodable on the fast path")

const reportTypeURL = "type.googleapis.com/fleetstream.endpoint.v1.EndpointSliceReport"

// Field numbers (envelope.proto, report.proto, google/protobuf/any.proto).
const (
	envID          = 1
	envType        = 2
	envAggregateID = 3
	envTime        = 4
	envActor       = 5
	envPayload     = 6
	anyTypeURL     = 1
	anyValue       = 2

	repClusterName     = 1
	repClusterID       = 2
	repNamespace       = 3
	repService         = 4
	repSlice           = 5
	repDeleted         = 6
	repAddressType     = 7
	repPorts           = 8
	repEndpoints       = 9
	repSession         = 10
	repGeneration      = 11
	repSliceUID        = 12
	repResourceVersion = 13
	repTime            = 14

	portName        = 1
	portPort        = 2
	portProtocol    = 3
	portAppProtocol = 4

	epAddresses   = 1
	epReady       = 2
	epServing     = 3
	epTerminating = 4
	epZone        = 5
	epNode        = 6
	epHostname    = 7
	epTarget      = 8

	tgtKind      = 1
	tgtNamespace = 2
	tgtName      = 3
	tgtUID       = 4
)

// reportHeader is what the ingester needs besides the slice itself.
type reportHeader struct {
	clusterID, service, session string
	deleted                     bool
	generation                  uint64
}

// fields calls f for every field of a message, with its raw value (varint as v, bytes as b).
// A field whose wire type does not match its declaration is an unknown field to the generated
// code, so callers match on number and type together and skip the rest.
func fields(data []byte, f func(num protowire.Number, typ protowire.Type, v uint64, b []byte) error) error {
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 || num > protowire.MaxValidNumber {
			return errSlowPath
		}
		data = data[n:]
		var (
			v uint64
			b []byte
		)
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(data)
		case protowire.BytesType:
			b, n = protowire.ConsumeBytes(data)
		default:
			n = protowire.ConsumeFieldValue(num, typ, data)
		}
		if n < 0 {
			return errSlowPath
		}
		data = data[n:]
		if err := f(num, typ, v, b); err != nil {
			return err
		}
	}
	return nil
}

// str checks a string field as proto.Unmarshal does.
func str(b []byte) error {
	if !utf8.Valid(b) {
		return errSlowPath
	}
	return nil
}

// checkStrings checks that every string field of a message among nums is valid UTF-8 (those the
// caller reads are checked by it).
func checkStrings(num protowire.Number, typ protowire.Type, b []byte, nums ...protowire.Number) error {
	if typ == protowire.BytesType && slices.Contains(nums, num) {
		return str(b)
	}
	return nil
}

// timestamp checks a google.protobuf.Timestamp: two varints, nothing to validate but framing.
func timestamp(b []byte) error {
	return fields(b, func(protowire.Number, protowire.Type, uint64, []byte) error { return nil })
}

// payloadOf returns the report bytes inside an envelope, or errSlowPath for any other payload.
func payloadOf(data []byte) ([]byte, error) {
	var typeOK, anyOK bool
	var value []byte
	err := fields(data, func(num protowire.Number, typ protowire.Type, _ uint64, b []byte) error {
		if typ != protowire.BytesType {
			return nil
		}
		switch num {
		case envType:
			typeOK = string(b) == reportTypeURL[len("type.googleapis.com/"):]
		case envID, envAggregateID, envActor:
			return str(b)
		case envTime:
			return timestamp(b)
		case envPayload:
			return fields(b, func(num protowire.Number, typ protowire.Type, _ uint64, b []byte) error {
				if typ != protowire.BytesType {
					return nil
				}
				switch num {
				case anyTypeURL:
					if anyOK = string(b) == reportTypeURL; !anyOK {
						return errSlowPath
					}
				case anyValue:
					value = b
				}
				return nil
			})
		}
		return nil
	})
	if err != nil || !typeOK || !anyOK || value == nil {
		return nil, errSlowPath
	}
	return value, nil
}

// decodeReport decodes an envelope holding an EndpointSliceReport. The slice is nil for a
// tombstone.
func (st *Store) decodeReport(data []byte, name string) (reportHeader, *slice, error) {
	var h reportHeader
	value, err := payloadOf(data)
	if err != nil {
		return h, nil, err
	}
	var (
		fqdn     bool
		pbuf     [4]port
		ports    = pbuf[:0]
		ebuf     [16][]byte
		epsBytes = ebuf[:0]
	)
	err = fields(value, func(num protowire.Number, typ protowire.Type, v uint64, b []byte) error {
		switch {
		case typ == protowire.VarintType && num == repDeleted:
			h.deleted = v != 0
		case typ == protowire.VarintType && num == repGeneration:
			h.generation = v
		case typ != protowire.BytesType:
		case num == repClusterID:
			h.clusterID = string(b)
			return str(b)
		case num == repService:
			h.service = string(b)
			return str(b)
		case num == repSession:
			h.session = string(b)
			return str(b)
		case num == repAddressType:
			fqdn = strings.EqualFold(string(b), "FQDN")
			return str(b)
		case num == repPorts:
			p, err := st.decodePort(b)
			if err != nil {
				return err
			}
			ports = append(ports, p)
		case num == repEndpoints:
			epsBytes = append(epsBytes, b)
		case num == repTime:
			return timestamp(b)
		default:
			return checkStrings(num, typ, b, repClusterName, repNamespace, repSlice, repSliceUID, repResourceVersion)
		}
		return nil
	})
	if err != nil {
		return h, nil, err
	}
	if len(epsBytes) > maxSliceEndpoints || len(ports) >= maxSlicePorts {
		return h, nil, errSlowPath // the slow path says why
	}
	// Every endpoint is decoded, also those of a report that is dropped or has no addresses:
	// the generated code rejects the whole report if one of them is malformed.
	shared := st.ports.share(ports)
	sc := getDecodeScratch(len(epsBytes))
	defer sc.put()
	eps, targets := sc.eps, sc.targets
	defer func() { sc.eps, sc.targets = eps[:0], targets[:0] }() // what append grew is kept too
	for _, b := range epsBytes {
		ep, ok, err := st.decodeEndpoint(b, &targets)
		if err != nil {
			return h, nil, err
		}
		if ok {
			eps = append(eps, ep)
		}
	}
	if h.deleted || h.service == "" {
		return h, nil, nil
	}
	if fqdn {
		eps = nil
	}
	s, ok := newSlice(eps, targets, shared, name, h.service)
	if !ok {
		return h, nil, errSlowPath // the slow path says why
	}
	return h, s, nil
}

// decodeScratch is what decodeReport decodes a slice's endpoints into before newSlice copies
// them into the slice's buf: taken from a pool, since a report's endpoints and targets were two
// allocations as large as the slice itself, every report.
type decodeScratch struct {
	eps     []endpoint
	targets []byte
}

// maxPooledEndpoints bounds the scratch a pool keeps: a rare slice of thousands of endpoints
// does not pin its arrays.
const maxPooledEndpoints = 1024

var decodeScratches = sync.Pool{New: func() any { return &decodeScratch{} }}

func getDecodeScratch(n int) *decodeScratch {
	sc := decodeScratches.Get().(*decodeScratch)
	if cap(sc.eps) < n {
		sc.eps = make([]endpoint, 0, n)
	}
	if cap(sc.targets) < 32*n {
		sc.targets = make([]byte, 0, 32*n)
	}
	return sc
}

func (sc *decodeScratch) put() {
	if cap(sc.eps) > maxPooledEndpoints || cap(sc.targets) > 32*maxPooledEndpoints {
		return
	}
	decodeScratches.Put(sc)
}

func (st *Store) decodePort(data []byte) (port, error) {
	var p port
	err := fields(data, func(num protowire.Number, typ protowire.Type, v uint64, b []byte) error {
		switch {
		case num == portPort && typ == protowire.VarintType:
			if v > 0xFFFF {
				return errSlowPath
			}
			p.num = uint16(v)
		case typ != protowire.BytesType:
		case num == portName:
			if err := str(b); err != nil {
				return err
			}
			p.name = st.strs.idBytes(b)
		case num == portProtocol:
			p.proto = protocolOf(unsafeString(b))
			return str(b)
		case num == portAppProtocol:
			return str(b)
		}
		return nil
	})
	return p, err
}

// decodeEndpoint decodes one endpoint; ok is false for one without a usable IP (convert skips
// those too).
func (st *Store) decodeEndpoint(data []byte, targets *[]byte) (endpoint, bool, error) {
	var (
		ep       endpoint
		haveAddr bool
		addrOK   bool
		kind     []byte
		name     []byte
		uid      []byte
	)
	err := fields(data, func(num protowire.Number, typ protowire.Type, v uint64, b []byte) error {
		switch {
		case typ == protowire.VarintType:
			var bit uint8
			switch num {
			case epReady:
				bit = fReady
			case epServing:
				bit = fServing
			case epTerminating:
				bit = fTerminating
			}
			if v != 0 {
				ep.flags |= bit
			} else {
				ep.flags &^= bit
			}
		case typ != protowire.BytesType:
		case num == epAddresses:
			if err := str(b); err != nil || haveAddr {
				return err // the first address only, but every one must be valid
			}
			haveAddr = true
			// ParseAddr keeps nothing of its input for an address without a zone, and a zone
			// is rejected, so parsing the wire bytes in place is safe.
			a, err := netip.ParseAddr(unsafeString(b))
			if err != nil || a.Zone() != "" {
				return nil
			}
			var v4 bool
			ep.addr, v4 = addrBytes(a)
			if v4 {
				ep.flags |= fV4
			}
			addrOK = true
		case num == epZone:
			if err := str(b); err != nil {
				return err
			}
			ep.zone = st.strs.idBytes(b)
		case num == epNode:
			if err := str(b); err != nil {
				return err
			}
			ep.node = st.strs.idBytes(b)
		case num == epHostname:
			return str(b)
		case num == epTarget:
			// A message field given twice is merged: each of its fields is the last one given.
			return fields(b, func(num protowire.Number, typ protowire.Type, _ uint64, b []byte) error {
				if typ != protowire.BytesType {
					return nil
				}
				switch num {
				case tgtKind:
					kind = b
				case tgtName:
					name = b
				case tgtUID:
					uid = b
				}
				return checkStrings(num, typ, b, tgtKind, tgtNamespace, tgtName, tgtUID)
			})
		}
		return nil
	})
	if err != nil || !addrOK {
		return ep, false, err
	}
	if len(uid) > 0 {
		ep.uid = uidBytes(unsafeString(uid))
		ep.flags |= fHasUID
	}
	if kind != nil || name != nil {
		n := len(name)
		if len(kind) > 0 {
			n += len(kind) + 1
		}
		if n > 0 && n <= 0xFFFF {
			ep.tOff, ep.tLen = uint32(len(*targets)), uint16(n)
			if len(kind) > 0 {
				*targets = append(append(*targets, kind...), '/')
			}
			*targets = append(*targets, name...)
		}
	}
	return ep, true, nil
}

// unsafeString views b as a string for a call that does not keep it. It is the collector's only
// use of package unsafe, and each of its three calls keeps nothing of the string once it returns:
// protocolOf only compares it; uidBytes copies it (hex decode of a concatenation, or a hash);
// netip.ParseAddr keeps nothing of an address without a zone, interns a zone through
// unique.Make (which copies strings), and the error it returns quotes the input but is dropped
// here. So the strings live no longer than the call, while the report's bytes cannot change:
// the consumer callback decodes synchronously on one goroutine, and nats.go hands every message
// a payload of its own (processMsg copies it out of the read buffer) that it never reuses. What
// the decoder keeps (header strings, interned names, targets) is copied; FuzzDecodeReport
// overwrites the input after decoding and checks that the result did not change.
func unsafeString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// idBytes is id for a byte slice, allocating only for a string not seen before.
func (t *strtab) idBytes(b []byte) uint32 {
	t.mu.RLock()
	id, ok := t.ids[string(b)] // no allocation for a map lookup
	t.mu.RUnlock()
	if ok {
		return id
	}
	return t.id(string(b))
}

// String renders a slice for tests and debugging.
func (s *slice) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s ports=%v", s.name(), *s.ports)
	s.eachEndpoint(func(_ int, e *endpoint, target string) {
		fmt.Fprintf(&b, " [%s f=%02x uid=%x z=%d n=%d t=%q]", addrString(e), e.flags, e.uid, e.zone, e.node, target)
	})
	return b.String()
}
