package collector

import (
	"google.golang.org/protobuf/proto"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
)

// decodeGetRequest decodes the JSON of a GetServiceEndpointsRequest as clients send it — an
// object of namespace, name, filter (enum name or small number) and portName (or port_name),
// plain ASCII strings — without protojson, which costs about a fifth of a served query's CPU in
// the handler (reflection, a tokenizer and several allocations for four fields). Anything else
// (escapes, non-ASCII, null, unknown or repeated fields, other number forms, undeclared filter
// numbers, malformed JSON) returns false with m untouched, for the server's strict decoder to
// decode or refuse; what it accepts, that decoder decodes to the same message
// (FuzzDecodeGetRequest).
func decodeGetRequest(data []byte, m *endpointv1.GetServiceEndpointsRequest) bool {
	d := getRequestDecoder{data: data}
	var (
		ns, name, port string
		filter         int32
		seen           uint8
	)
	d.ws()
	if !d.byte('{') {
		return false
	}
	d.ws()
	if !d.byte('}') {
		for {
			key, ok := d.str()
			if !ok {
				return false
			}
			d.ws()
			if !d.byte(':') {
				return false
			}
			d.ws()
			var bit uint8
			switch key {
			case "namespace":
				bit = 1
				ns, ok = d.str()
			case "name":
				bit = 2
				name, ok = d.str()
			case "filter":
				bit = 4
				filter, ok = d.enum()
			case "portName", "port_name":
				bit = 8
				port, ok = d.str()
			}
			if bit == 0 || !ok || seen&bit != 0 {
				return false
			}
			seen |= bit
			d.ws()
			if d.byte('}') {
				break
			}
			if !d.byte(',') {
				return false
			}
			d.ws()
		}
	}
	d.ws()
	if d.i != len(d.data) {
		return false
	}
	proto.Reset(m)
	m.Namespace, m.Name, m.Filter, m.PortName = ns, name, endpointv1.EndpointFilter(filter), port
	return true
}

type getRequestDecoder struct {
	data []byte
	i    int
}

func (d *getRequestDecoder) ws() {
	for d.i < len(d.data) {
		switch d.data[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *getRequestDecoder) byte(c byte) bool {
	if d.i < len(d.data) && d.data[d.i] == c {
		d.i++
		return true
	}
	return false
}

// str reads a string of printable ASCII without escapes.
func (d *getRequestDecoder) str() (string, bool) {
	if !d.byte('"') {
		return "", false
	}
	start := d.i
	for d.i < len(d.data) {
		switch c := d.data[d.i]; {
		case c == '"':
			s := string(d.data[start:d.i])
			d.i++
			return s, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return "", false
		}
		d.i++
	}
	return "", false
}

// enum reads an EndpointFilter as a value name or a declared number of at most 9 digits without
// a leading zero.
func (d *getRequestDecoder) enum() (int32, bool) {
	if d.i < len(d.data) && d.data[d.i] == '"' {
		s, ok := d.str()
		if !ok {
			return 0, false
		}
		v, ok := endpointv1.EndpointFilter_value[s]
		return v, ok
	}
	n, ok := d.number()
	if _, declared := endpointv1.EndpointFilter_name[n]; !ok || !declared {
		return 0, false // the strict decoder names the field
	}
	return n, true
}

// number reads a number of at most 9 digits without a leading zero.
func (d *getRequestDecoder) number() (int32, bool) {
	start := d.i
	var n int32
	for d.i < len(d.data) && d.data[d.i] >= '0' && d.data[d.i] <= '9' {
		n = n*10 + int32(d.data[d.i]-'0')
		d.i++
	}
	switch digits := d.i - start; {
	case digits == 0 || digits > 9 || digits > 1 && d.data[start] == '0':
		return 0, false
	}
	return n, true
}
