// Package protofast marshals and unmarshals messages through the methods vtprotobuf generates
// into pkg/gen (MarshalToSizedBufferVT, SizeVT, UnmarshalVT) when a message has them, and
// through proto.Marshal and proto.Unmarshal otherwise. It is what the event store and the view
// engine use on their hot paths (docs/benchmarks.md).
//
// The results are those of the proto package: what Unmarshal accepts, proto.Unmarshal accepts
// and decodes to an equal message, and what it refuses proto.Unmarshal refuses with the same
// error; what MarshalAppend writes proto.Unmarshal decodes to a message equal to the one given,
// and what proto.Marshal refuses it refuses with proto's error. vtprotobuf's generated code does
// not check that proto3 strings are UTF-8 (proto does, on both sides) and refuses a known field
// sent with an unexpected wire type (proto keeps it as an unknown field), so every string is
// checked here, and whenever the generated code fails or a string is not UTF-8 the proto
// package does the work again and its answer is the one returned. The bytes may differ from
// proto.Marshal's where proto's own are not fixed: the order of map entries.
package protofast

import (
	"slices"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// vtMarshaler is what vtprotobuf's marshal and size features generate.
type vtMarshaler interface {
	SizeVT() int
	MarshalToSizedBufferVT(dAtA []byte) (int, error)
}

// vtUnmarshaler is what vtprotobuf's unmarshal feature generates.
type vtUnmarshaler interface {
	UnmarshalVT(dAtA []byte) error
}

// MarshalAppend appends the wire encoding of m to b, as proto.MarshalOptions{}.MarshalAppend.
func MarshalAppend(b []byte, m proto.Message) ([]byte, error) {
	vm, ok := m.(vtMarshaler)
	if !ok || !validUTF8(m.ProtoReflect()) {
		return proto.MarshalOptions{}.MarshalAppend(b, m)
	}
	n := vm.SizeVT()
	b = slices.Grow(b, n)
	out := b[len(b) : len(b)+n]
	if w, err := vm.MarshalToSizedBufferVT(out); err != nil || w != n {
		return proto.MarshalOptions{}.MarshalAppend(b, m)
	}
	return b[:len(b)+n], nil
}

// Unmarshal parses data into m, as proto.Unmarshal (m is reset first).
func Unmarshal(data []byte, m proto.Message) error {
	vm, ok := m.(vtUnmarshaler)
	if !ok {
		return proto.Unmarshal(data, m)
	}
	proto.Reset(m)
	if err := vm.UnmarshalVT(data); err != nil || !validUTF8(m.ProtoReflect()) {
		return proto.Unmarshal(data, m) // proto's verdict, and its message when it accepts
	}
	return nil
}

// validUTF8 reports whether every string of m that proto validates (proto3 and editions
// fields; proto2 ones are not checked by proto either) is valid UTF-8, in nested messages,
// lists and maps too. Unknown fields and the bytes of an Any are not looked into, as proto
// does not.
func validUTF8(m protoreflect.Message) bool {
	ok := true
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList():
			l := v.List()
			for i := 0; ok && i < l.Len(); i++ {
				ok = validValue(fd, l.Get(i))
			}
		case fd.IsMap():
			kd, vd := fd.MapKey(), fd.MapValue()
			v.Map().Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
				ok = validValue(kd, k.Value()) && validValue(vd, v)
				return ok
			})
		default:
			ok = validValue(fd, v)
		}
		return ok
	})
	return ok
}

func validValue(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return fd.Syntax() == protoreflect.Proto2 || utf8.ValidString(v.String())
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return validUTF8(v.Message())
	}
	return true
}
