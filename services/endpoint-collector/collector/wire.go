package collector

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"
)

// Reports arrive on one ordered consumer, so decoding them is the collector's serial hot path.
// decodeReport reads an event envelope holding an EndpointSliceReport straight from the wire
// into the compact slice, without building the protobuf messages (which costs ~100 small
// allocations per 10-endpoint slice). Anything unexpected returns errSlowPath and the caller
// decodes with the generated code, which also produces the proper error for malformed input;
// wire_test.go checks both paths agree.

var errSlowPath = errors.New("not decodable on the fast path")

const reportTypeURL = "type.googleapis.com/fleetstream.endpoint.v1.EndpointSliceReport"

// Field numbers (envelope.proto, report.proto).
const (
	envType    = 2
	envPayload = 6
	anyTypeURL = 1
	anyValue   = 2

	repClusterID   = 2
	repService     = 4
	repDeleted     = 6
	repAddressType = 7
	repPorts       = 8
	repEndpoints   = 9
	repSession     = 10
	repGeneration  = 11

	portName     = 1
	portPort     = 2
	portProtocol = 3

	epAddresses   = 1
	epReady       = 2
	epServing     = 3
	epTerminating = 4
	epZone        = 5
	epNode        = 6
	epTarget      = 8

	tgtKind = 1
	tgtName = 3
	tgtUID  = 4
)

// reportHeader is what the ingester needs besides the slice itself.
type reportHeader struct {
	clusterID, service, session string
	deleted                     bool
	generation                  uint64
}

// fields calls f for every field of a message, with its raw value (varint as v, bytes as b).
func fields(data []byte, f func(num protowire.Number, typ protowire.Type, v uint64, b []byte) error) error {
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
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

// payloadOf returns the report bytes inside an envelope, or errSlowPath for any other payload.
func payloadOf(data []byte) ([]byte, error) {
	var typeOK bool
	var value []byte
	err := fields(data, func(num protowire.Number, typ protowire.Type, _ uint64, b []byte) error {
		if typ != protowire.BytesType {
			return nil
		}
		switch num {
		case envType:
			typeOK = string(b) == reportTypeURL[len("type.googleapis.com/"):]
		case envPayload:
			return fields(b, func(num protowire.Number, typ protowire.Type, _ uint64, b []byte) error {
				if typ != protowire.BytesType {
					return nil
				}
				switch num {
				case anyTypeURL:
					if string(b) != reportTypeURL {
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
	if err != nil || !typeOK || value == nil {
		return nil, errSlowPath
	}
	return value, nil
}

// decodeReport decodes an envelope holding an EndpointSliceReport. The slice is nil for a
// tombstone.
func (st *Store) decodeReport(data []byte) (reportHeader, *slice, error) {
	var h reportHeader
	value, err := payloadOf(data)
	if err != nil {
		return h, nil, err
	}
	var (
		fqdn     bool
		ports    []port
		epsBytes [][]byte
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
		case num == repService:
			h.service = string(b)
		case num == repSession:
			h.session = string(b)
		case num == repAddressType:
			fqdn = strings.EqualFold(string(b), "FQDN")
		case num == repPorts:
			p, err := st.decodePort(b)
			if err != nil {
				return err
			}
			ports = append(ports, p)
		case num == repEndpoints:
			epsBytes = append(epsBytes, b)
		}
		return nil
	})
	if err != nil {
		return h, nil, err
	}
	if h.deleted || h.service == "" {
		return h, nil, nil
	}
	if len(epsBytes) > maxSliceEndpoints || len(ports) >= maxSlicePorts {
		return h, nil, errSlowPath // the slow path says why
	}
	s := &slice{ports: ports}
	if len(s.ports) == 0 {
		s.ports = []port{{}}
	}
	if fqdn {
		return h, s, nil
	}
	s.eps = make([]endpoint, 0, len(epsBytes))
	targets := make([]byte, 0, 32*len(epsBytes))
	for _, b := range epsBytes {
		ep, ok, err := st.decodeEndpoint(b, &targets)
		if err != nil {
			return h, nil, err
		}
		if ok {
			s.eps = append(s.eps, ep)
		}
	}
	s.targets = string(targets)
	return h, s, nil
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
		case num == portName && typ == protowire.BytesType:
			p.name = st.strs.idBytes(b)
		case num == portProtocol && typ == protowire.BytesType:
			p.proto = protocolOf(unsafeString(b))
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
			}
		case typ != protowire.BytesType:
		case num == epAddresses:
			if haveAddr {
				return nil // the first address only
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
			ep.zone = st.strs.idBytes(b)
		case num == epNode:
			ep.node = st.strs.idBytes(b)
		case num == epTarget:
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
					if len(b) > 0 {
						ep.uid = uidBytes(unsafeString(b))
						ep.flags |= fHasUID
					}
				}
				return nil
			})
		}
		return nil
	})
	if err != nil || !addrOK {
		return ep, false, err
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

// unsafeString views b as a string for a call that does not keep it.
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
	fmt.Fprintf(&b, "%s ports=%v", s.name, s.ports)
	for i := range s.eps {
		e := &s.eps[i]
		fmt.Fprintf(&b, " [%s f=%02x uid=%x z=%d n=%d t=%q]", addrString(e), e.flags, e.uid, e.zone, e.node, s.target(e))
	}
	return b.String()
}
