package events_test

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	eventv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/event/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/identity"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/topology"
)

func setup(t *testing.T) (*testkit.JetStream, jetstream.Stream) {
	t.Helper()
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 10*time.Second)
	if err := topology.Ensure(ctx, j.JS, 1, topology.Topology{Streams: []jetstream.StreamConfig{
		topology.EventStream("TEST", "test events", "test.>"),
	}}); err != nil {
		t.Fatal(err)
	}
	s, err := j.JS.Stream(ctx, "TEST")
	if err != nil {
		t.Fatal(err)
	}
	return j, s
}

func TestConcurrentAppendsWithStaleExpectationExactlyOneWins(t *testing.T) {
	j, stream := setup(t)
	ctx := testkit.Context(t, 20*time.Second)
	store := events.NewStore(j.JS, "test")
	first, err := store.Append(ctx, "test.agg1", "agg1", events.Empty, &clusterv1.ClusterRegistered{Id: "1", Name: "agg1"})
	if err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 20; round++ {
		last, err := events.LastSequence(ctx, stream, "test.agg1")
		if err != nil {
			t.Fatal(err)
		}
		if round == 0 && last != first {
			t.Fatalf("last sequence %d, want %d", last, first)
		}
		const writers = 8
		var wg sync.WaitGroup
		errs := make([]error, writers)
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Each writer gets its own connection so the race is real, not serialized by one socket.
				_, js := j.Connect(t)
				_, errs[w] = events.NewStore(js, "test").Append(ctx, "test.agg1", "agg1", events.At(last), &clusterv1.ClusterUpdated{Id: "1"})
			}()
		}
		wg.Wait()
		wins := 0
		for _, err := range errs {
			switch {
			case err == nil:
				wins++
			case errors.Is(err, events.ErrConflict) && events.IsConflict(err):
			default:
				t.Fatalf("round %d: unexpected error %v", round, err)
			}
		}
		if wins != 1 {
			t.Fatalf("round %d: %d appends won, want exactly 1", round, wins)
		}
	}
}

func TestEmptyExpectationRefusesSecondCreate(t *testing.T) {
	j, _ := setup(t)
	ctx := testkit.Context(t, 10*time.Second)
	store := events.NewStore(j.JS, "test")
	if _, err := store.Append(ctx, "test.x", "x", events.Empty, &clusterv1.ClusterRegistered{Id: "1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Append(ctx, "test.x", "x", events.Empty, &clusterv1.ClusterRegistered{Id: "2"}); !errors.Is(err, events.ErrConflict) {
		t.Fatalf("second create: got %v, want conflict", err)
	}
	// Another subject is another aggregate.
	if _, err := store.Append(ctx, "test.y", "y", events.Empty, &clusterv1.ClusterRegistered{Id: "3"}); err != nil {
		t.Fatal(err)
	}
}

func TestEnvelopeRoundTripCarriesActorAndType(t *testing.T) {
	j, stream := setup(t)
	ctx := identity.WithActor(testkit.Context(t, 10*time.Second), "alice")
	seq, err := events.NewStore(j.JS, "system:test").Append(ctx, "test.z", "z-id", events.Any, &clusterv1.ClusterRegistered{Id: "z-id", Name: "z"})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := stream.GetMsg(ctx, seq)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := events.Decode(raw.Data)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Actor != "alice" || ev.AggregateId != "z-id" || ev.Type != "fleetstream.cluster.v1.ClusterRegistered" || ev.Id == "" {
		t.Fatalf("envelope %+v", ev.Envelope)
	}
	if p, ok := ev.Payload.(*clusterv1.ClusterRegistered); !ok || p.Name != "z" {
		t.Fatalf("payload %T %v", ev.Payload, ev.Payload)
	}
	if raw.Header.Get(jetstream.MsgIDHeader) != ev.Id {
		t.Fatalf("message id %q, want event id %q", raw.Header.Get(jetstream.MsgIDHeader), ev.Id)
	}
}

// Append encodes the envelope by hand (the payload marshalled once, straight into it): the bytes
// must be exactly what proto.Marshal writes for the same envelope, and decode to the payload.
func TestAppendEncodesTheEnvelopeAsProtoMarshalDoes(t *testing.T) {
	j, stream := setup(t)
	ctx := testkit.Context(t, 10*time.Second)
	store := events.NewStore(j.JS, "system:test")
	for name, payload := range map[string]proto.Message{
		"fields and a map": &clusterv1.ClusterUpdated{Id: "c1", Fields: []string{"labels"}, Labels: map[string]string{"a": "1", "b": "2"}},
		"empty payload":    &clusterv1.ClusterDeregistered{},
		"same type again":  &clusterv1.ClusterUpdated{Id: "c2"},
	} {
		seq, err := store.Append(ctx, "test.enc", "agg", events.Any, payload)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		raw, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		env := &eventv1.Envelope{}
		if err := proto.Unmarshal(raw.Data, env); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want, err := proto.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(raw.Data, want) {
			t.Errorf("%s: appended %x, proto.Marshal writes %x", name, raw.Data, want)
		}
		ev, err := events.Decode(raw.Data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !proto.Equal(ev.Payload, payload) || ev.Type != string(payload.ProtoReflect().Descriptor().FullName()) {
			t.Errorf("%s: decoded %s %v, appended %v", name, ev.Type, ev.Payload, payload)
		}
	}
}

func TestDecodeRejectsGarbage(t *testing.T) {
	for name, data := range map[string][]byte{
		"not protobuf": []byte("{not protobuf"),
		"no payload":   {},
	} {
		if _, err := events.Decode(data); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

func TestActorDefaults(t *testing.T) {
	env, err := events.NewEnvelope(context.Background(), "a", &clusterv1.ClusterDeregistered{}, "system:x")
	if err != nil {
		t.Fatal(err)
	}
	if env.Actor != "system:x" {
		t.Fatalf("actor %q", env.Actor)
	}
}

// Every event carries the CloudEvents NATS binding's headers, so subscribers route on them
// without decoding the envelope.
func TestEventsCarryCloudEventsHeaders(t *testing.T) {
	j, stream := setup(t)
	ctx := testkit.Context(t, 10*time.Second)
	seq, err := events.NewStore(j.JS, "system:cluster-import").Append(ctx, "test.c1", "c1", events.Any, &clusterv1.ClusterRegistered{Id: "id-1", Name: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := stream.GetMsg(ctx, seq)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := events.Decode(raw.Data)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"ce-specversion": "1.0",
		"ce-id":          ev.Id,
		"ce-source":      "/fleetstream/cluster-import",
		"ce-type":        "fleetstream.cluster.v1.ClusterRegistered",
		"ce-subject":     "c1",
		"ce-time":        ev.Time.AsTime().UTC().Format(time.RFC3339Nano),
		"ce-dataschema":  events.SchemaBase + "fleetstream/cluster/v1/events.proto#fleetstream.cluster.v1.ClusterRegistered",
		"content-type":   "application/protobuf",
	}
	for k, v := range want {
		if got := raw.Header.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if _, err := time.Parse(time.RFC3339Nano, raw.Header.Get("ce-time")); err != nil {
		t.Errorf("ce-time: %v", err)
	}
}

// Append sends the headers it sent when it built them per message: the CloudEvents headers, and
// what nats.go's publish options add (jetstream.WithMsgID, WithExpectLastSequencePerSubject,
// WithMsgTTL), written here by nats.go itself. A core subscription sees every message as
// published, also those JetStream refuses (a stale expectation, a TTL the stream may not allow),
// and one store's appends in a row reuse their messages.
func TestAppendSendsTheHeadersOfBefore(t *testing.T) {
	j, _ := setup(t)
	ctx := testkit.Context(t, 20*time.Second)
	nc, js := j.Connect(t)
	sub, err := nc.SubscribeSync("test.wire.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	store := events.NewStore(j.JS, "system:rbac-sync")
	// Each expectation and the options Append passed for it before.
	cases := []struct {
		expect events.Expect
		check  bool
		seq    uint64
	}{
		{events.Empty, true, 0}, {events.Any, false, 0}, {events.At(1), true, 1}, {events.At(99), true, 99},
		{events.Any.ExpiresAfter(time.Hour), false, 0}, {events.At(2).ExpiresAfter(90 * time.Second), true, 2},
		{events.Any, false, 0}, {events.Empty, true, 0}, {events.Any, false, 0},
	}
	for i, c := range cases {
		expect := c.expect
		payload := proto.Message(&clusterv1.ClusterUpdated{Id: "a", Fields: []string{"labels"}})
		if i%2 == 1 {
			payload = &rbacv1.ProjectRoleBound{Binding: &rbacv1.ProjectRoleBinding{Project: "p", RoleTemplate: "viewer"}}
		}
		if _, err := store.Append(ctx, "test.wire.a", "a", expect, payload); err != nil && !events.IsConflict(err) && !events.IsTTLDisabled(err) {
			t.Fatalf("append %d: %v", i, err)
		}
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		ev, err := events.Decode(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		d := ev.Payload.ProtoReflect().Descriptor()
		want := &nats.Msg{Subject: m.Subject, Data: m.Data, Header: nats.Header{
			"ce-specversion": {"1.0"}, "ce-id": {ev.Id}, "ce-source": {"/fleetstream/rbac-sync"}, "ce-type": {ev.Type},
			"ce-subject": {"a"}, "ce-time": {ev.Time.AsTime().UTC().Format(time.RFC3339Nano)},
			"ce-dataschema": {events.SchemaBase + d.ParentFile().Path() + "#" + string(d.FullName())},
			"content-type":  {"application/protobuf"},
		}}
		opts := []jetstream.PublishOpt{jetstream.WithMsgID(ev.Id)}
		if c.check {
			opts = append(opts, jetstream.WithExpectLastSequencePerSubject(c.seq))
		}
		if ttl := expect.TTL(); ttl > 0 {
			opts = append(opts, jetstream.WithMsgTTL(ttl))
		}
		// With its context done, PublishMsg applies the options to want's headers and sends nothing.
		done, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := js.PublishMsg(done, want, opts...); !errors.Is(err, context.Canceled) {
			t.Fatalf("publish with a done context: %v", err)
		}
		if !maps.EqualFunc(m.Header, want.Header, slices.Equal) {
			t.Errorf("append %d (%v): sent headers\n%v\nbefore\n%v", i, expect, m.Header, want.Header)
		}
	}
}
