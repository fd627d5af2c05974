package events

import (
	"bytes"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	eventv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/event/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
)

// appendEnvelope writes the envelope field by field: for every shape of field (empty strings,
// a zero, negative or sub-second time, non-ASCII text, an empty or nested payload) its bytes
// must be exactly what proto.Marshal writes for the Envelope the code wrote before, with
// anypb.New's Any and timestamppb.New's Timestamp.
func TestAppendEnvelopeWritesWhatProtoMarshalWrites(t *testing.T) {
	now := time.Now()
	times := map[string]time.Time{
		"now":                 now,
		"zero unix":           time.Unix(0, 0),
		"only nanos":          time.Unix(0, 1),
		"only seconds":        time.Unix(1_700_000_000, 0),
		"before 1970":         time.Unix(-86_400*365, 999_999_999),
		"the zero time.Time":  {},
		"far future":          time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.UTC),
		"another time zone":   now.In(time.FixedZone("x", -7*3600)),
		"monotonic stripped":  now.Round(0),
		"one second, one ns ": time.Unix(1, 1),
	}
	fields := map[string]envelopeFields{
		"all set":  {id: "0b8f1c1e-6a0e-4c1f-9a55-3f1b0c2d4e5f", typ: "fleetstream.cluster.v1.ClusterUpdated", aggregateID: "c1", actor: "system:test"},
		"empty":    {},
		"only id":  {id: "x"},
		"unicode":  {id: "é", typ: "t", aggregateID: "集群", actor: "ålice"},
		"long":     {id: strings.Repeat("i", 300), typ: strings.Repeat("t", 128), aggregateID: strings.Repeat("a", 200), actor: strings.Repeat("b", 129)},
		"no actor": {id: "id", typ: "t", aggregateID: "agg"},
	}
	// Map fields have at most one entry: with more, proto.Marshal itself writes them in an
	// order that changes from one call to the next.
	payloads := map[string]proto.Message{
		"fields and a map": &clusterv1.ClusterUpdated{Id: "c1", Fields: []string{"labels", "taints"}, Labels: map[string]string{"a": "1"}},
		"empty":            &clusterv1.ClusterDeregistered{},
		"nested":           &rbacv1.ProjectRoleBound{Binding: &rbacv1.ProjectRoleBinding{Project: "p", Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: "alice"}, RoleTemplate: "viewer", Revision: 1 << 40}},
		"large":            &clusterv1.ClusterRegistered{Id: "c", Name: strings.Repeat("n", 70_000)},
	}
	for tn, at := range times {
		for fn, f := range fields {
			for pn, payload := range payloads {
				f := f
				f.time = at
				anyp, err := anypb.New(payload)
				if err != nil {
					t.Fatal(err)
				}
				want, err := proto.Marshal(&eventv1.Envelope{Id: f.id, Type: f.typ, AggregateId: f.aggregateID, Time: timestamppb.New(at), Actor: f.actor, Payload: anyp})
				if err != nil {
					t.Fatal(err)
				}
				value, err := proto.Marshal(payload)
				if err != nil {
					t.Fatal(err)
				}
				d := payload.ProtoReflect().Descriptor()
				// A buffer with bytes in it: appendEnvelope appends, it does not overwrite.
				prefix := []byte("prefix")
				got, err := appendEnvelope(append(make([]byte, 0, 8), prefix...), f, anyURLPrefix+string(d.FullName()), value)
				if err != nil {
					t.Fatalf("%s, %s, %s: %v", tn, fn, pn, err)
				}
				if !bytes.HasPrefix(got, prefix) || !bytes.Equal(got[len(prefix):], want) {
					t.Errorf("%s, %s, %s: wrote\n%x\nproto.Marshal writes\n%x", tn, fn, pn, got, want)
				}
			}
		}
	}
}

// Like proto.Marshal, appendEnvelope refuses a string field that is not UTF-8.
func TestAppendEnvelopeRefusesInvalidUTF8(t *testing.T) {
	bad := string([]byte{0xff, 0xfe})
	for name, f := range map[string]envelopeFields{
		"id": {id: bad}, "type": {typ: bad}, "aggregate": {aggregateID: bad}, "actor": {actor: bad},
	} {
		if _, err := proto.Marshal(&eventv1.Envelope{Id: f.id, Type: f.typ, AggregateId: f.aggregateID, Actor: f.actor}); err == nil {
			t.Fatalf("%s: proto.Marshal accepts it, so appendEnvelope need not refuse it", name)
		}
		if _, err := appendEnvelope(nil, f, "type.googleapis.com/x", nil); err == nil {
			t.Errorf("%s: invalid UTF-8 accepted", name)
		}
	}
}

// A reused publication carries exactly the headers of a new one: whatever the appends before it
// asked for (an expected sequence, a TTL), none of their headers is left on the next.
// (TestAppendSendsTheHeadersOfBefore checks a new one's against what Append sent before.)
func TestReusedPublicationHasTheHeadersOfANewOne(t *testing.T) {
	s := NewStore(nil, "system:cluster-agent:edge-1")
	expects := []Expect{Any, Empty, At(7), At(1 << 40), Any.ExpiresAfter(time.Hour), At(3).ExpiresAfter(1500 * time.Millisecond), Any, Empty.ExpiresAfter(time.Second), Any}
	for i := len(expects) - 1; i >= 0; i-- {
		expects = append(expects, expects[i])
	}
	types := []proto.Message{&clusterv1.ClusterUpdated{}, &rbacv1.ProjectRoleBound{}}
	reused := s.publication()
	for i, expect := range expects {
		pt := s.payloadType(types[i%len(types)])
		id, agg, now := "id-"+strings.Repeat("x", i), "agg-"+strings.Repeat("y", i), time.Now().Add(time.Duration(i)*time.Second)
		reused.set(id, pt, agg, now, expect)
		fresh := (&Store{source: s.source}).publication()
		fresh.set(id, pt, agg, now, expect)
		if !maps.EqualFunc(reused.msg.Header, fresh.msg.Header, slices.Equal) {
			t.Errorf("append %d (%+v): reused headers\n%v\nnew\n%v", i, expect, reused.msg.Header, fresh.msg.Header)
		}
		if want := 9 + btoi(expect.check) + btoi(expect.ttl > 0); len(fresh.msg.Header) != want {
			t.Errorf("append %d (%+v): %d headers, want %d", i, expect, len(fresh.msg.Header), want)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Event ids are random (version 4, RFC 4122 variant) UUIDs as uuid.NewString makes them, and
// distinct, also across the blocks of randomness they are cut from.
func TestEventIDsAreRandomUUIDs(t *testing.T) {
	var ids idSource
	seen := map[string]bool{}
	for i := range 10 * len(ids.rand) / 16 {
		id := ids.newID()
		u, err := uuid.Parse(id)
		if err != nil || u.Version() != 4 || u.Variant() != uuid.RFC4122 || u.String() != id {
			t.Fatalf("id %d: %q: version %v, variant %v, %v", i, id, u.Version(), u.Variant(), err)
		}
		if seen[id] {
			t.Fatalf("id %d: %s again", i, id)
		}
		seen[id] = true
	}
}
