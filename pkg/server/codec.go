package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/fleetstream/fleetstream/pkg/apierr"
)

// Request decoding is strict where a client can only have made a mistake, and lenient where
// protobuf promises forward compatibility:
//
//   - JSON (Connect's "json" codec, which serves POST bodies, GET ?message= and streams): an
//     unknown field or an unknown enum name is an error naming its path. Connect's own JSON
//     codec discards both, so a placement sent with OCM's celSelector was stored without it
//     and then matched every cluster.
//   - Binary protobuf (Connect, gRPC, gRPC-Web): unknown fields are kept, as protobuf intends
//     for a newer client talking to an older server.
//   - Both: an enum field holding a number the enum does not declare is an error naming its
//     path. Such a value can only be stored as-is and then read as nothing in particular.
//
// Connect reports a codec error as InvalidArgument ("unmarshal message: <our message>").

// codecOptions replace Connect's JSON and binary codecs on every handler of the server.
func codecOptions() []connect.HandlerOption {
	return []connect.HandlerOption{
		connect.WithCodec(jsonCodec{name: "json"}),
		// Connect registers the charset form separately; without this one a client saying
		// "application/json; charset=utf-8" would reach Connect's lenient codec.
		connect.WithCodec(jsonCodec{name: "json; charset=utf-8"}),
		connect.WithCodec(binaryCodec{}),
	}
}

var errNotProto = errors.New("not a protobuf message")

type jsonCodec struct{ name string }

func (c jsonCodec) Name() string { return c.name }

func (c jsonCodec) Marshal(m any) ([]byte, error) { return c.MarshalAppend(nil, m) }

func (jsonCodec) MarshalAppend(dst []byte, m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, errNotProto
	}
	return protojson.MarshalOptions{}.MarshalAppend(dst, pm)
}

func (jsonCodec) Unmarshal(data []byte, m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return errNotProto
	}
	return UnmarshalJSON(data, pm)
}

func (jsonCodec) IsBinary() bool { return false }

type binaryCodec struct{}

func (binaryCodec) Name() string { return "proto" }

func (c binaryCodec) Marshal(m any) ([]byte, error) { return c.MarshalAppend(nil, m) }

func (binaryCodec) MarshalAppend(dst []byte, m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, errNotProto
	}
	return proto.MarshalOptions{}.MarshalAppend(dst, pm)
}

func (binaryCodec) Unmarshal(data []byte, m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return errNotProto
	}
	return UnmarshalBinary(data, pm)
}

func (binaryCodec) IsBinary() bool { return true }

// UnmarshalJSON decodes a request in protobuf's JSON form strictly: an unknown field, an
// unknown enum name or an undeclared enum number is an error naming the field path. Codecs
// that replace the server's own (a service caching its responses) decode requests with it.
func UnmarshalJSON(data []byte, m proto.Message) error {
	if len(data) == 0 {
		return errors.New("zero-length payload is not a valid JSON object")
	}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(data, m); err != nil {
		if msg, ok := locateJSON(data, m.ProtoReflect().Descriptor()); ok {
			return errors.New(msg)
		}
		// Not one of the problems located above (malformed JSON, a string for a number...):
		// protojson's message says where by line and column. It may quote the input, so
		// it is cut short.
		return errors.New(shorten(err.Error()))
	}
	return undeclaredEnum(m)
}

// UnmarshalBinary decodes a request in protobuf's binary form. Unknown fields are kept; an
// undeclared enum number is an error naming the field path.
func UnmarshalBinary(data []byte, m proto.Message) error {
	if err := proto.Unmarshal(data, m); err != nil {
		return err
	}
	return undeclaredEnum(m)
}

// shorten cuts s to its first 256 bytes (at a rune boundary).
func shorten(s string) string {
	const maxLen = 256
	if len(s) <= maxLen {
		return s
	}
	cut := maxLen
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// undeclaredEnum returns an error naming the first enum field of m (at any depth) that holds a
// number its enum does not declare. Messages whose types can hold no enum are not walked.
func undeclaredEnum(m proto.Message) error {
	if err := checkEnums(m.ProtoReflect()); err != nil {
		return err
	}
	return nil // not the nil *enumError
}

// enumError is an undeclared enum number; path is built from the leaf up as the walk unwinds,
// so a message without one costs no path building.
type enumError struct {
	path []string // innermost first
	enum protoreflect.EnumDescriptor
	n    protoreflect.EnumNumber
}

func (e *enumError) Error() string {
	var b strings.Builder
	for i := len(e.path) - 1; i >= 0; i-- {
		s := e.path[i]
		if i < len(e.path)-1 && !strings.HasPrefix(s, "[") {
			b.WriteByte('.')
		}
		b.WriteString(s)
	}
	b.WriteString(": ")
	b.WriteString(unknownEnumValue(e.enum, strconv.Itoa(int(e.n))))
	return b.String()
}

func (e *enumError) at(seg string) *enumError {
	e.path = append(e.path, seg)
	return e
}

func checkEnum(fd protoreflect.FieldDescriptor, n protoreflect.EnumNumber) *enumError {
	if fd.Enum().Values().ByNumber(n) != nil {
		return nil
	}
	return &enumError{enum: fd.Enum(), n: n}
}

func checkEnums(m protoreflect.Message) *enumError {
	md := m.Descriptor()
	if !mayHoldEnums(md) {
		return nil
	}
	// A loop over the fields rather than m.Range: Range's closure is an allocation per message,
	// and requests are small.
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if !m.Has(fd) {
			continue
		}
		if err := checkField(fd, m.Get(fd)); err != nil {
			return err.at(string(fd.Name()))
		}
	}
	return nil
}

func checkField(fd protoreflect.FieldDescriptor, v protoreflect.Value) *enumError {
	switch {
	case fd.IsMap():
		vd := fd.MapValue()
		if vd.Kind() != protoreflect.EnumKind && (vd.Message() == nil || !mayHoldEnums(vd.Message())) {
			return nil
		}
		var err *enumError
		v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
			if err = checkField(vd, mv); err != nil {
				err = err.at("[" + apierr.Short(k.String()) + "]")
			}
			return err == nil
		})
		return err
	case fd.IsList():
		if fd.Kind() != protoreflect.EnumKind && (fd.Message() == nil || !mayHoldEnums(fd.Message())) {
			return nil
		}
		l := v.List()
		for i := range l.Len() {
			var err *enumError
			if fd.Kind() == protoreflect.EnumKind {
				err = checkEnum(fd, l.Get(i).Enum())
			} else {
				err = checkEnums(l.Get(i).Message())
			}
			if err != nil {
				return err.at("[" + strconv.Itoa(i) + "]")
			}
		}
	case fd.Kind() == protoreflect.EnumKind:
		return checkEnum(fd, v.Enum())
	case fd.Message() != nil:
		return checkEnums(v.Message())
	}
	return nil
}

// holdsEnums caches, per message type, whether it or any message type it reaches has an enum
// field: most requests have none, and their walk is then one map lookup.
var holdsEnums sync.Map // protoreflect.MessageDescriptor -> bool

func mayHoldEnums(md protoreflect.MessageDescriptor) bool {
	if v, ok := holdsEnums.Load(md); ok {
		return v.(bool)
	}
	found := false
	seen := map[protoreflect.FullName]bool{md.FullName(): true}
	queue := []protoreflect.MessageDescriptor{md}
	for len(queue) > 0 && !found {
		cur := queue[0]
		queue = queue[1:]
		fields := cur.Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			if fd.IsMap() {
				fd = fd.MapValue()
			}
			if fd.Kind() == protoreflect.EnumKind {
				found = true
				break
			}
			if sub := fd.Message(); sub != nil && !seen[sub.FullName()] {
				seen[sub.FullName()] = true
				queue = append(queue, sub)
			}
		}
	}
	holdsEnums.Store(md, found)
	return found
}

// unknownEnumValue describes value (a name or number as the client sent it) that enum does
// not declare, listing the declared names when they are few.
func unknownEnumValue(enum protoreflect.EnumDescriptor, value string) string {
	msg := fmt.Sprintf("unknown value %s of enum %s", value, enum.FullName())
	vals := enum.Values()
	if vals.Len() > 12 {
		return msg
	}
	names := make([]string, 0, vals.Len())
	for i := range vals.Len() {
		names = append(names, string(vals.Get(i).Name()))
	}
	return msg + " (one of " + strings.Join(names, ", ") + ")"
}

// locateJSON finds the first unknown field or unknown enum name in data, a JSON object for a
// message of type md, and describes it with its field path. protojson refuses both but names
// only the field (and a line and column), which in a placement with several predicates does not
// say which one. It runs only once protojson has refused data, so it decodes data generically
// and walks it along the descriptors, in key order for a stable answer. Well-known types
// (Timestamp, Struct, ...) have JSON forms of their own and are skipped.
func locateJSON(data []byte, md protoreflect.MessageDescriptor) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", false
	}
	return locateMessage(v, md, "")
}

// identifier is what may follow a dot in a path without quoting, up to maxPlainKey bytes.
var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

const maxPlainKey = 64

func located(path, msg string) (string, bool) {
	if path == "" {
		return msg, true
	}
	return strings.TrimPrefix(path, ".") + ": " + msg, true
}

func locateMessage(v any, md protoreflect.MessageDescriptor, path string) (string, bool) {
	if strings.HasPrefix(string(md.FullName()), "google.protobuf.") {
		return "", false
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return "", false // null, or not shaped like the message: protojson's message says
	}
	fields := md.Fields()
	for _, key := range slices.Sorted(maps.Keys(obj)) {
		fd := fields.ByJSONName(key)
		if fd == nil {
			fd = fields.ByTextName(key)
		}
		if fd == nil {
			if identifier.MatchString(key) && len(key) <= maxPlainKey {
				return located(path+"."+key, "unknown field")
			}
			return located(path+"["+apierr.Short(key)+"]", "unknown field")
		}
		if msg, ok := locateField(obj[key], fd, path+"."+string(fd.Name())); ok {
			return msg, true
		}
	}
	return "", false
}

func locateField(v any, fd protoreflect.FieldDescriptor, path string) (string, bool) {
	switch {
	case fd.IsList():
		list, _ := v.([]any)
		for i, e := range list {
			if msg, ok := locateSingle(e, fd, path+"["+strconv.Itoa(i)+"]"); ok {
				return msg, true
			}
		}
	case fd.IsMap():
		obj, _ := v.(map[string]any)
		for _, key := range slices.Sorted(maps.Keys(obj)) {
			if msg, ok := locateSingle(obj[key], fd.MapValue(), path+"["+apierr.Short(key)+"]"); ok {
				return msg, true
			}
		}
	default:
		return locateSingle(v, fd, path)
	}
	return "", false
}

func locateSingle(v any, fd protoreflect.FieldDescriptor, path string) (string, bool) {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return locateMessage(v, fd.Message(), path)
	case protoreflect.EnumKind:
		if s, ok := v.(string); ok && fd.Enum().Values().ByName(protoreflect.Name(s)) == nil {
			return located(path, unknownEnumValue(fd.Enum(), apierr.Short(s)))
		}
	}
	return "", false
}
