package view

import (
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// revisionField finds the `uint64 revision` field every view entry type carries: the stream
// sequence of the last event applied to the entry. It is what makes applying an event twice a
// no-op, and what API callers pass back for optimistic concurrency.
func revisionField(m proto.Message) (protoreflect.FieldDescriptor, error) {
	fd := m.ProtoReflect().Descriptor().Fields().ByName("revision")
	if fd == nil || fd.Kind() != protoreflect.Uint64Kind || fd.Cardinality() == protoreflect.Repeated {
		return nil, fmt.Errorf("view entry %s needs a `uint64 revision` field", m.ProtoReflect().Descriptor().FullName())
	}
	return fd, nil
}

// Revision returns m's revision field (0 when m is nil or has none).
func Revision(m proto.Message) uint64 {
	if m == nil || !m.ProtoReflect().IsValid() {
		return 0
	}
	fd := m.ProtoReflect().Descriptor().Fields().ByName("revision")
	if fd == nil {
		return 0
	}
	return m.ProtoReflect().Get(fd).Uint()
}
