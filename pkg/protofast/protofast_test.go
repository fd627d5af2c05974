package protofast

import (
	"bytes"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	eventv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/event/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
)

// The types on the event store's and the view engine's hot paths must take the fast path.
var (
	_ vtMarshaler   = (*eventv1.Envelope)(nil)
	_ vtUnmarshaler = (*eventv1.Envelope)(nil)
	_ vtMarshaler   = (*clusterv1.Cluster)(nil)
	_ vtUnmarshaler = (*clusterv1.Cluster)(nil)
	_ vtMarshaler   = (*clusterv1.ClusterUpdated)(nil)
	_ vtUnmarshaler = (*clusterv1.ClusterUpdated)(nil)
)

func representative(t testing.TB) []proto.Message {
	ts := timestamppb.New(time.Date(2026, 11, 26, 7, 50, 1, 123456789, time.UTC))
	cluster := &clusterv1.Cluster{
		Id: "c-1", Name: "prod-eu", Revision: 42,
		Labels: map[string]string{"env": "prod", "region": "eu-west-1", "empty": "", "ünïcode": "✓"},
		Claims: map[string]string{"updates": "7"},
		Taints: []*clusterv1.Taint{{Key: "k", Value: "v", Effect: clusterv1.TaintEffect_TAINT_EFFECT_NO_SELECT, TimeAdded: ts}, {}},
		Status: &clusterv1.ClusterStatus{
			KubernetesVersion: "v1.34.4", LastSeen: ts, CredentialsSet: true, NamespaceCount: -3,
			Resources: &clusterv1.ClusterResources{Allocatable: map[string]string{"cpu": "4"}, Capacity: map[string]string{"cpu": "8", "memory": "32Gi"}, NodeCount: 3},
		},
		CreateTime: ts, UpdateTime: &timestamppb.Timestamp{},
		ImportedBy: &clusterv1.ImportOrigin{Policy: "p", Source: &clusterv1.ImportSourceRef{Cluster: "hub", Name: "x"}},
		AdoptedBy:  []*clusterv1.ImportOrigin{{Policy: "a"}, {Policy: "b"}},
	}
	updated := &clusterv1.ClusterUpdated{Id: "k0001", Fields: []string{"labels", "claims"}, Labels: map[string]string{"env": "prod", "seq": "12345"}}
	payload, err := anypb.New(updated)
	if err != nil {
		t.Fatal(err)
	}
	return []proto.Message{
		&clusterv1.Cluster{},
		cluster,
		updated,
		&clusterv1.ClusterRegistered{Id: "k0002", Name: "k0002"},
		&eventv1.Envelope{Id: "0b1c3a52-6a0e-4b57-9a38-9d4ad1c5b0a1", Type: "fleetstream.cluster.v1.ClusterUpdated", AggregateId: "k0001", Time: ts, Actor: "alice", Payload: payload},
		&eventv1.Envelope{Payload: &anypb.Any{}},
		&endpointv1.ServiceWeights{Namespace: "ns", Name: "svc", ClusterWeights: map[string]uint32{"a": 1, "b": 0, "c": 4294967295},
			EndpointWeights: []*endpointv1.EndpointWeight{{Ip: "10.0.0.1", ClusterName: "a", Weight: 7}}, Revision: 9},
		&rbacv1.GetPropagationStatusRequest{Target: &rbacv1.GetPropagationStatusRequest_RoleTemplate{RoleTemplate: "admin"}},
		&rbacv1.GetPropagationStatusRequest{Target: &rbacv1.GetPropagationStatusRequest_Binding{Binding: &rbacv1.BindingRef{Project: "p"}}},
	}
}

func hasMap(m proto.Message) bool {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	c, _ := proto.Marshal(m)
	// Every representative message with a non-empty map is listed here by type; the check
	// above only catches maps that happened to be ordered differently.
	switch m.(type) {
	case *clusterv1.Cluster, *clusterv1.ClusterUpdated, *endpointv1.ServiceWeights:
		return true
	}
	return !bytes.Equal(b, c)
}

// What MarshalAppend writes decodes, with proto.Unmarshal, to a message equal to the one given;
// what proto.Marshal writes decodes, with Unmarshal, to an equal message; without maps the bytes
// are proto.Marshal's own.
func TestVTAndProtoEncodingsDecodeToEqualMessages(t *testing.T) {
	for _, m := range representative(t) {
		name := string(m.ProtoReflect().Descriptor().FullName())
		want, err := proto.Marshal(m)
		if err != nil {
			t.Fatalf("%s: proto.Marshal: %v", name, err)
		}
		prefix := []byte("prefix")
		got, err := MarshalAppend(append([]byte(nil), prefix...), m)
		if err != nil {
			t.Fatalf("%s: MarshalAppend: %v", name, err)
		}
		if !bytes.HasPrefix(got, prefix) {
			t.Fatalf("%s: MarshalAppend overwrote what it appended to", name)
		}
		got = got[len(prefix):]
		if len(got) != len(want) {
			t.Errorf("%s: %d bytes, proto.Marshal %d", name, len(got), len(want))
		}
		if !hasMap(m) && !bytes.Equal(got, want) {
			t.Errorf("%s: bytes differ from proto.Marshal's:\n got %x\nwant %x", name, got, want)
		}
		back := m.ProtoReflect().New().Interface()
		if err := proto.Unmarshal(got, back); err != nil {
			t.Fatalf("%s: proto.Unmarshal of MarshalAppend's bytes: %v", name, err)
		}
		if !proto.Equal(back, m) {
			t.Errorf("%s: MarshalAppend's bytes decode to %v, want %v", name, back, m)
		}
		fast := m.ProtoReflect().New().Interface()
		if err := Unmarshal(want, fast); err != nil {
			t.Fatalf("%s: Unmarshal of proto.Marshal's bytes: %v", name, err)
		}
		if !proto.Equal(fast, m) {
			t.Errorf("%s: Unmarshal gives %v, want %v", name, fast, m)
		}
	}
}

// A message without generated methods (structpb is not generated here) takes the proto path.
func TestNonGeneratedTypesKeepWorking(t *testing.T) {
	s, err := structpb.NewStruct(map[string]any{"a": 1.5, "b": []any{"x", true}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := MarshalAppend(nil, s)
	if err != nil {
		t.Fatal(err)
	}
	back := &structpb.Struct{}
	if err := Unmarshal(b, back); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(back, s) {
		t.Errorf("got %v, want %v", back, s)
	}
}

// proto refuses strings that are not UTF-8 on both sides; the generated code does not check,
// so protofast must.
func TestInvalidUTF8IsRefusedAsProtoRefusesIt(t *testing.T) {
	bad := string([]byte{0xff, 'x'})
	for _, m := range []proto.Message{
		&clusterv1.ClusterRegistered{Id: bad},
		&clusterv1.ClusterUpdated{Labels: map[string]string{"k": bad}},
		&clusterv1.ClusterUpdated{Labels: map[string]string{bad: "v"}},
		&clusterv1.ClusterUpdated{Fields: []string{"ok", bad}},
		&clusterv1.Cluster{Status: &clusterv1.ClusterStatus{Resources: &clusterv1.ClusterResources{Capacity: map[string]string{"cpu": bad}}}},
		&clusterv1.Cluster{AdoptedBy: []*clusterv1.ImportOrigin{{Source: &clusterv1.ImportSourceRef{Name: bad}}}},
	} {
		_, perr := proto.Marshal(m)
		if perr == nil {
			t.Fatalf("%v: proto.Marshal accepted it", m)
		}
		if _, err := MarshalAppend(nil, m); err == nil || err.Error() != perr.Error() {
			t.Errorf("%v: MarshalAppend error %v, want proto's %v", m, err, perr)
		}
		// The bytes proto would write if it did not check: the generated code's.
		raw, err := m.(interface{ MarshalVT() ([]byte, error) }).MarshalVT()
		if err != nil {
			t.Fatal(err)
		}
		uerr := proto.Unmarshal(raw, m.ProtoReflect().New().Interface())
		if uerr == nil {
			t.Fatalf("%v: proto.Unmarshal accepted it", m)
		}
		if err := Unmarshal(raw, m.ProtoReflect().New().Interface()); err == nil || err.Error() != uerr.Error() {
			t.Errorf("%v: Unmarshal error %v, want proto's %v", m, err, uerr)
		}
	}
}

// A known field sent with another wire type is an unknown field to proto; the generated code
// refuses it, and protofast must answer as proto does.
func TestWrongWireTypeDecodesAsProtoDecodesIt(t *testing.T) {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.VarintType) // id is a string: bytes type
	b = protowire.AppendVarint(b, 7)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendString(b, "name")
	want := &clusterv1.ClusterRegistered{}
	if err := proto.Unmarshal(b, want); err != nil {
		t.Fatalf("proto.Unmarshal: %v", err)
	}
	got := &clusterv1.ClusterRegistered{}
	if err := Unmarshal(b, got); err != nil {
		t.Fatalf("Unmarshal: %v", err)
	}
	if !proto.Equal(got, want) || !bytes.Equal(got.ProtoReflect().GetUnknown(), want.ProtoReflect().GetUnknown()) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// Whatever the bytes, Unmarshal accepts them exactly when proto.Unmarshal does, and then
// decodes them to an equal message.
func FuzzUnmarshalAgreesWithProto(f *testing.F) {
	for _, m := range representative(f) {
		b, _ := proto.Marshal(m)
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0x02, 0xff, 0xfe})
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, m := range []proto.Message{&eventv1.Envelope{}, &clusterv1.Cluster{}, &clusterv1.ClusterUpdated{}, &endpointv1.ServiceWeights{}} {
			want := m.ProtoReflect().New().Interface()
			perr := proto.Unmarshal(data, want)
			got := m.ProtoReflect().New().Interface()
			err := Unmarshal(data, got)
			if (err == nil) != (perr == nil) {
				t.Fatalf("%T: Unmarshal error %v, proto.Unmarshal error %v", m, err, perr)
			}
			if err == nil && !proto.Equal(got, want) {
				t.Fatalf("%T: Unmarshal gives %v, proto.Unmarshal %v", m, got, want)
			}
		}
	})
}
