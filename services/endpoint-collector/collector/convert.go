package collector

import (
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"net/netip"
	"strings"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
)

// Bounds of one slice. The EndpointSlice API allows 1000 endpoints and 100 ports; these are
// what the compact encoding can hold, so a report past them is malformed, not truncated.
const (
	maxSliceEndpoints = 1<<15 - 1
	maxSlicePorts     = 1 << 8
)

// convert turns a report into the compact slice the store keeps. Endpoints whose first address
// is not an IP (FQDN slices) are skipped: a proxy needs addresses it can connect to.
func (st *Store) convert(r *endpointv1.EndpointSliceReport, name string) (*slice, error) {
	if len(r.Endpoints) > maxSliceEndpoints || len(r.Ports) >= maxSlicePorts {
		return nil, fmt.Errorf("slice %s/%s: %d endpoints, %d ports is more than a slice can hold",
			r.Namespace, r.Slice, len(r.Endpoints), len(r.Ports))
	}
	ports := make([]port, 0, len(r.Ports))
	for _, p := range r.Ports {
		if p.Port > 0xFFFF {
			return nil, fmt.Errorf("slice %s/%s: port %d out of range", r.Namespace, r.Slice, p.Port)
		}
		ports = append(ports, port{num: uint16(p.Port), proto: protocolOf(p.Protocol), name: st.strs.id(p.Name)})
	}
	eps, targets := st.convertEndpoints(r)
	s, ok := newSlice(eps, targets, st.ports.share(ports), name, r.Service)
	if !ok {
		return nil, fmt.Errorf("slice %s/%.64s: a name of %d bytes or a service name of %d is longer than Kubernetes allows",
			r.Namespace, name, len(name), len(r.Service))
	}
	return s, nil
}

// convertEndpoints turns a report's endpoints into the store's, their targets in an arena.
func (st *Store) convertEndpoints(r *endpointv1.EndpointSliceReport) ([]endpoint, []byte) {
	if strings.EqualFold(r.AddressType, "FQDN") {
		return nil, nil
	}
	var targets []byte
	eps := make([]endpoint, 0, len(r.Endpoints))
	for _, e := range r.Endpoints {
		if len(e.Addresses) == 0 {
			continue
		}
		// Consumers use the first address only (the API says so for every address type).
		a, err := netip.ParseAddr(e.Addresses[0])
		if err != nil || a.Zone() != "" {
			continue
		}
		ep := endpoint{zone: st.strs.id(e.Zone), node: st.strs.id(e.Node)}
		var v4 bool
		ep.addr, v4 = addrBytes(a)
		if v4 {
			ep.flags |= fV4
		}
		if e.Ready {
			ep.flags |= fReady
		}
		if e.Serving {
			ep.flags |= fServing
		}
		if e.Terminating {
			ep.flags |= fTerminating
		}
		if t := e.GetTarget(); t != nil {
			if t.Uid != "" {
				ep.uid = uidBytes(t.Uid)
				ep.flags |= fHasUID
			}
			name := t.Name
			if t.Kind != "" {
				name = t.Kind + "/" + t.Name
			}
			if name != "" && len(name) <= 0xFFFF {
				ep.tOff, ep.tLen = uint32(len(targets)), uint16(len(name))
				targets = append(targets, name...)
			}
		}
		eps = append(eps, ep)
	}
	return eps, targets
}

// newSlice returns a decoded slice named name (from the report's subject), of service svc: eps,
// within maxSliceEndpoints, go in address order (sortEndpoints) and are encoded with their
// targets, from arena targets. False when a name is longer than a slice can hold.
func newSlice(eps []endpoint, targets []byte, ports *[]port, name, svc string) (*slice, bool) {
	sortEndpoints(eps)
	buf, ok := encodeSlice(name, svc, eps, targets)
	if !ok {
		return nil, false
	}
	return &slice{buf: buf, ports: ports}, true
}

func protocolOf(p string) uint8 {
	switch strings.ToUpper(p) {
	case "UDP":
		return protoUDP
	case "SCTP":
		return protoSCTP
	}
	return protoTCP
}

// uidBytes packs a Kubernetes uid (a UUID) into 16 bytes; anything else is hashed, which only
// needs to tell two objects apart.
func uidBytes(uid string) [16]byte {
	var out [16]byte
	if len(uid) == 36 && uid[8] == '-' && uid[13] == '-' && uid[18] == '-' && uid[23] == '-' {
		// The hex digits gathered in an array rather than by concatenation: this runs for every
		// endpoint of every report, and the strings were two allocations each.
		var h [32]byte
		n := copy(h[:], uid[0:8])
		n += copy(h[n:], uid[9:13])
		n += copy(h[n:], uid[14:18])
		n += copy(h[n:], uid[19:23])
		copy(h[n:], uid[24:36])
		if _, err := hex.Decode(out[:], h[:]); err == nil {
			return out
		}
	}
	f := fnv.New128a()
	_, _ = f.Write([]byte(uid))
	copy(out[:], f.Sum(nil))
	return out
}
