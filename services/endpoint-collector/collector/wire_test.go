package collector

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/fleetstream/fleetstream/pkg/events"
	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	eventv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/event/v1"
)

func envelope(t testing.TB, m proto.Message) []byte {
	t.Helper()
	env, err := events.NewEnvelope(context.Background(), "east", m, "test")
	if err != nil {
		t.Fatal(err)
	}
	data, err := proto.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// slow decodes with the generated code, as the ingester's fallback does.
func slow(st *Store, data []byte) (reportHeader, *slice, error) {
	in := newIngester(&Collector{store: st})
	return in.decodeSlow(data, "fleet.agent.east.endpointslice.ns.s", "s")
}

func sameSlice(a, b *slice) bool {
	if (a == nil) != (b == nil) {
		return false
	}
	if a == nil {
		return true
	}
	return reflect.DeepEqual(*a.ports, *b.ports) && a.buf == b.buf
}

// wireCases are reports with every shape the decoders handle: all fields, invalid and zoned
// addresses, IPv6, headless, FQDN, tombstones, reports without a service, and random ones.
func wireCases() []*endpointv1.EndpointSliceReport {
	cases := []*endpointv1.EndpointSliceReport{
		{Service: "cart", Slice: "cart-1", AddressType: "IPv4", SessionId: "s", Generation: 3, ClusterId: "id",
			Ports: []*endpointv1.EndpointPort{{Name: "http", Port: 8080, Protocol: "TCP"}, {Name: "dns", Port: 53, Protocol: "UDP"}},
			Endpoints: []*endpointv1.Endpoint{
				{Addresses: []string{"10.0.0.1", "10.0.0.2"}, Ready: true, Serving: true, Zone: "a", Node: "n1",
					Target: &endpointv1.TargetRef{Kind: "Pod", Name: "p1", Uid: "7f000000-0000-0000-0000-000000000001"}},
				{Addresses: []string{"10.0.0.3"}, Terminating: true, Serving: true, Target: &endpointv1.TargetRef{Uid: "not-a-uuid"}},
				{Addresses: []string{"not-an-ip"}, Ready: true},
				{Addresses: []string{"fe80::1%eth0"}, Ready: true},
				{Ready: true},
				{Addresses: []string{"::ffff:10.0.0.9"}, Target: &endpointv1.TargetRef{Kind: "Pod"}},
			}},
		{Service: "v6", Slice: "v6-1", AddressType: "IPv6", Endpoints: []*endpointv1.Endpoint{{Addresses: []string{"fd00::1"}, Ready: true}}},
		{Service: "headless", Slice: "h-1", Endpoints: []*endpointv1.Endpoint{{Addresses: []string{"10.1.0.1"}, Ready: true}}},
		{Service: "ext", Slice: "ext-1", AddressType: "FQDN", Ports: []*endpointv1.EndpointPort{{Port: 443}},
			Endpoints: []*endpointv1.Endpoint{{Addresses: []string{"example.com"}, Ready: true}}},
		{Service: "cart", Slice: "gone", Deleted: true},
		{Slice: "orphan", Endpoints: []*endpointv1.Endpoint{{Addresses: []string{"10.0.0.1"}}}},
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := range 200 {
		r := &endpointv1.EndpointSliceReport{Service: fmt.Sprintf("svc-%d", i%7), Slice: fmt.Sprintf("s-%d", i),
			SessionId: "sess", Generation: uint64(rnd.IntN(5))}
		for p := range rnd.IntN(3) {
			r.Ports = append(r.Ports, &endpointv1.EndpointPort{Name: fmt.Sprintf("p%d", p), Port: uint32(rnd.IntN(70000)),
				Protocol: []string{"TCP", "UDP", "SCTP", "", "tcp"}[rnd.IntN(5)]})
		}
		for e := range rnd.IntN(12) {
			ep := &endpointv1.Endpoint{Ready: rnd.IntN(2) == 0, Serving: rnd.IntN(2) == 0, Terminating: rnd.IntN(3) == 0,
				Zone: fmt.Sprintf("z%d", rnd.IntN(3)), Node: fmt.Sprintf("n%d", rnd.IntN(4))}
			if rnd.IntN(10) > 0 {
				ep.Addresses = []string{fmt.Sprintf("10.%d.%d.%d", i, e, rnd.IntN(256))}
			}
			if rnd.IntN(3) > 0 {
				ep.Target = &endpointv1.TargetRef{Kind: "Pod", Name: fmt.Sprintf("pod-%d-%d", i, e), Uid: fmt.Sprintf("uid-%d", rnd.IntN(1000))}
			}
			r.Endpoints = append(r.Endpoints, ep)
		}
		cases = append(cases, r)
	}
	return cases
}

// The wire decoder and the generated code agree on every report.
func TestWireDecoderMatchesGeneratedCode(t *testing.T) {
	cases := wireCases()
	for i, r := range cases {
		st := NewStore()
		data := envelope(t, r)
		hs, ss, serr := slow(st, data)
		hf, sf, err := st.decodeReport(data, "s")
		if serr != nil {
			// Malformed: the fast path must decline it, so that the slow path's error is what
			// gets reported.
			if err != errSlowPath {
				t.Fatalf("case %d: slow path rejects (%v), fast path says %v", i, serr, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("case %d: fast path: %v", i, err)
		}
		if hf != hs {
			t.Fatalf("case %d: headers differ:\nfast %+v\nslow %+v", i, hf, hs)
		}
		if !sameSlice(sf, ss) {
			t.Fatalf("case %d: slices differ:\nfast %v\nslow %v", i, sf, ss)
		}
	}
}

// FuzzDecodeReport holds the wire decoder to the generated code on arbitrary bytes: when it
// accepts a message, proto.Unmarshal of the envelope and the report accepts it too and convert
// yields the same header and slice; when the generated code rejects a message, the wire decoder
// declines it (errSlowPath), so the ingester reports the generated code's error. Declining a
// valid message is allowed (the slow path then decodes it); wire_test's table checks that real
// reports are not declined. The decoded result must also not share memory with the input: it
// is checked again after the input is overwritten. The seeds (real reports, other payloads,
// and edits the agent never makes: repeated fields, invalid UTF-8, huge field numbers) run with
// every `go test`; `go test -fuzz FuzzDecodeReport` explores from them.
func FuzzDecodeReport(f *testing.F) {
	for _, r := range wireCases()[:12] {
		f.Add(envelope(f, r))
	}
	f.Add(encodeReport(f, benchSlice("east", 7, 0, 10, 1)))
	f.Add(envelope(f, &agentv1.Heartbeat{ClusterName: "east"}))
	f.Add([]byte("\xff\xff\xff"))
	f.Add([]byte{})
	for _, extra := range [][]byte{
		// A second target with an empty uid and kind, a second ready=false, a second zone.
		protowire.AppendTag(nil, repEndpoints, protowire.BytesType),
		// Invalid UTF-8 in a field the wire decoder otherwise ignores (slice name).
		protowire.AppendString(protowire.AppendTag(nil, repSlice, protowire.BytesType), "\xc3\x28"),
		// A field number above the largest valid one.
		protowire.AppendVarint(protowire.AppendTag(nil, protowire.MaxValidNumber+1, protowire.VarintType), 1),
		// A malformed timestamp.
		protowire.AppendBytes(protowire.AppendTag(nil, repTime, protowire.BytesType), []byte{0x08}),
	} {
		if len(extra) == 1 { // the endpoint edit
			ep := &endpointv1.Endpoint{Addresses: []string{"10.9.9.9"}, Ready: true, Zone: "a",
				Target: &endpointv1.TargetRef{Kind: "Pod", Name: "p", Uid: "7f000000-0000-0000-0000-000000000002"}}
			b, err := proto.Marshal(ep)
			if err != nil {
				f.Fatal(err)
			}
			b = protowire.AppendVarint(protowire.AppendTag(b, epReady, protowire.VarintType), 0)
			b = protowire.AppendString(protowire.AppendTag(b, epZone, protowire.BytesType), "b")
			b = protowire.AppendBytes(protowire.AppendTag(b, epTarget, protowire.BytesType),
				protowire.AppendString(protowire.AppendTag(nil, tgtUID, protowire.BytesType), ""))
			extra = protowire.AppendBytes(extra, b)
		}
		r := &endpointv1.EndpointSliceReport{Service: "s", Slice: "s-1", AddressType: "IPv4"}
		value, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		env := &eventv1.Envelope{Type: string(r.ProtoReflect().Descriptor().FullName()),
			Payload: &anypb.Any{TypeUrl: reportTypeURL, Value: append(value, extra...)}}
		data, err := proto.Marshal(env)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		st := NewStore()
		hs, ss, serr := slow(st, in) // first, so that both see the same interned ids
		data := bytes.Clone(in)
		hf, sf, err := st.decodeReport(data, "s")
		if err != nil {
			if err != errSlowPath {
				t.Fatalf("the wire decoder returned %v; it may only decline (errSlowPath)", err)
			}
			return
		}
		if serr != nil {
			t.Fatalf("the wire decoder accepted what the generated code rejects (%v):\nheader %+v\nslice %v", serr, hf, sf)
		}
		if hf != hs {
			t.Fatalf("headers differ:\nwire      %+v\ngenerated %+v", hf, hs)
		}
		if !sameSlice(sf, ss) {
			t.Fatalf("slices differ:\nwire      %v\ngenerated %v", sf, ss)
		}
		before := fmt.Sprintf("%+v %v", hf, sf)
		for i := range data {
			data[i] = 0xA5
		}
		if after := fmt.Sprintf("%+v %v", hf, sf); after != before {
			t.Fatalf("the decoded report shares memory with its input:\nbefore %s\nafter  %s", before, after)
		}
	})
}

// Other payloads, and garbage, go to the slow path (which rejects them).
func TestWireDecoderDeclines(t *testing.T) {
	st := NewStore()
	for name, data := range map[string][]byte{
		"heartbeat": envelope(t, &agentv1.Heartbeat{ClusterName: "east"}),
		"garbage":   []byte("\xff\xff\xff"),
		"empty":     nil,
	} {
		if _, _, err := st.decodeReport(data, "s"); err != errSlowPath {
			t.Errorf("%s: want errSlowPath, got %v", name, err)
		}
	}
}

func BenchmarkDecodeReport(b *testing.B) {
	data := encodeReport(b, benchSlice("east", 1, 0, 10, 1))
	st := NewStore()
	b.Run("wire", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := st.decodeReport(data, "s"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("generated", func(b *testing.B) {
		in := newIngester(&Collector{store: st})
		for b.Loop() {
			if _, _, err := in.decodeSlow(data, "x", "s"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
