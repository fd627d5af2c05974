package events_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	cejs "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	eventv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/event/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/identity"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// appended is what the test knows about an event it appended: the stored envelope (read back
// from the stream, the source of truth) and the service that appended it.
type appended struct {
	env     *eventv1.Envelope
	payload proto.Message
	source  string
}

// receiveCloudEvents consumes subject of stream with the CloudEvents SDK's NATS JetStream
// protocol (binary mode) until n events arrived, and returns them. Messages the SDK cannot turn
// into an event never reach the handler, so a malformed header fails the caller by timeout.
func receiveCloudEvents(t *testing.T, nc *nats.Conn, stream, subject string, n int) []cloudevents.Event {
	t.Helper()
	consumer, err := cejs.NewConsumerFromConn(nc, stream, subject, nil, []nats.SubOpt{nats.BindStream(stream), nats.DeliverAll()})
	if err != nil {
		t.Fatalf("cloudevents consumer: %v", err)
	}
	client, err := cloudevents.NewClient(consumer)
	if err != nil {
		t.Fatalf("cloudevents client: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var (
		mu  sync.Mutex
		got []cloudevents.Event
	)
	done := make(chan struct{})
	receiverErr := make(chan error, 1)
	go func() {
		receiverErr <- client.StartReceiver(ctx, func(_ context.Context, e cloudevents.Event) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, e)
			if len(got) == n {
				close(done)
			}
		})
	}()
	select {
	case <-done:
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("the CloudEvents SDK delivered %d of %d events on %s (a header it cannot parse drops the event)", len(got), n, subject)
	}
	cancel()
	if err := <-receiverErr; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("cloudevents receiver: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	return append([]cloudevents.Event(nil), got...)
}

// checkCloudEvent compares every CloudEvents attribute the SDK read from the headers with what
// the stored envelope says it must be, and decodes the data as that envelope.
func checkCloudEvent(e cloudevents.Event, want map[string]appended) error {
	env := &eventv1.Envelope{}
	if err := proto.Unmarshal(e.Data(), env); err != nil {
		return fmt.Errorf("data is not an envelope: %w", err)
	}
	w, ok := want[env.Id]
	if !ok {
		return fmt.Errorf("data holds envelope %q, which the test did not append", env.Id)
	}
	dec, err := events.Decode(e.Data())
	if err != nil {
		return fmt.Errorf("event %s: %w", env.Id, err)
	}
	if !proto.Equal(dec.Envelope, w.env) || !proto.Equal(dec.Payload, w.payload) {
		return fmt.Errorf("event %s: data decodes to %v / %v, want %v / %v", env.Id, dec.Envelope, dec.Payload, w.env, w.payload)
	}
	d := w.payload.ProtoReflect().Descriptor()
	checks := []struct{ attr, got, want string }{
		{"specversion", e.SpecVersion(), "1.0"},
		{"id", e.ID(), w.env.Id},
		{"type", e.Type(), string(d.FullName())},
		{"source", e.Source(), w.source},
		{"subject", e.Subject(), w.env.AggregateId},
		{"time", e.Time().UTC().Format(time.RFC3339Nano), w.env.Time.AsTime().UTC().Format(time.RFC3339Nano)},
		{"dataschema", e.DataSchema(), events.SchemaBase + d.ParentFile().Path() + "#" + string(d.FullName())},
		{"datacontenttype", e.DataContentType(), "application/protobuf"},
	}
	for _, c := range checks {
		if c.got != c.want {
			return fmt.Errorf("event %s: %s is %q, want %q", env.Id, c.attr, c.got, c.want)
		}
	}
	if e.Time().IsZero() || !e.Time().Equal(w.env.Time.AsTime()) {
		return fmt.Errorf("event %s: time %v, want %v", env.Id, e.Time(), w.env.Time.AsTime())
	}
	return nil
}

// appendForCloudEvents appends events of several types, aggregates and services through the
// project's own append path and returns what each stored message must say.
func appendForCloudEvents(t *testing.T, j *testkit.JetStream, stream jetstream.Stream) (map[string]appended, []uint64) {
	t.Helper()
	ctx := testkit.Context(t, 20*time.Second)
	writers := []struct {
		actor, source string
	}{
		{"system:cluster-import", "/fleetstream/cluster-import"},
		{"system:cluster-agent:edge-1", "/fleetstream/cluster-agent"},
		{"system:rbac-sync", "/fleetstream/rbac-sync"},
	}
	want := map[string]appended{}
	var seqs []uint64
	for i := range 12 {
		w := writers[i%len(writers)]
		agg := fmt.Sprintf("agg-%d", i%4)
		var payload proto.Message
		switch i % 3 {
		case 0:
			payload = &clusterv1.ClusterRegistered{Id: agg, Name: agg, Labels: map[string]string{"i": fmt.Sprint(i)}}
		case 1:
			payload = &clusterv1.ClusterUpdated{Id: agg, Fields: []string{"labels"}, Labels: map[string]string{"i": fmt.Sprint(i)}}
		default:
			payload = &rbacv1.ProjectRoleBound{Binding: &rbacv1.ProjectRoleBinding{Project: agg, Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: "alice"}, RoleTemplate: "viewer"}}
		}
		actx := ctx
		if i%2 == 0 {
			actx = identity.WithActor(ctx, "alice") // the actor is in the envelope, not the source
		}
		seq, err := events.NewStore(j.JS, w.actor).Append(actx, "test.good."+agg, agg, events.Any, payload)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		stored, err := events.Decode(raw.Data)
		if err != nil {
			t.Fatal(err)
		}
		want[stored.Id] = appended{env: stored.Envelope, payload: payload, source: w.source}
		seqs = append(seqs, seq)
	}
	return want, seqs
}

// A subscriber using the CloudEvents SDK itself (github.com/cloudevents/sdk-go and its NATS
// JetStream protocol) gets every event appended through events.Store with the attributes the
// catalogue promises, and data that decodes as the envelope.
func TestCloudEventsSDKConsumesAppendedEvents(t *testing.T) {
	j, stream := setup(t)
	want, _ := appendForCloudEvents(t, j, stream)
	nc, _ := j.Connect(t)
	got := receiveCloudEvents(t, nc, "TEST", "test.good.>", len(want))
	seen := map[string]bool{}
	for _, e := range got {
		if err := checkCloudEvent(e, want); err != nil {
			t.Error(err)
		}
		if seen[e.ID()] {
			t.Errorf("event %s delivered twice", e.ID())
		}
		seen[e.ID()] = true
	}
	if len(seen) != len(want) {
		t.Errorf("got %d distinct events, want %d", len(seen), len(want))
	}
}

// The check above can fail: a stored event republished with one header wrong (or missing) is
// read by the SDK and rejected by checkCloudEvent.
func TestCloudEventsSDKCheckRejectsAWrongHeader(t *testing.T) {
	j, stream := setup(t)
	want, seqs := appendForCloudEvents(t, j, stream)
	ctx := testkit.Context(t, 20*time.Second)
	// seqs[2] is a ProjectRoleBound appended by rbac-sync, for alice.
	raw, err := stream.GetMsg(ctx, seqs[2])
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, header, value string // value "" deletes the header
	}{
		{"id", "ce-id", "another-id"},
		{"type", "ce-type", "fleetstream.cluster.v1.ClusterRegistered"},
		{"source", "ce-source", "/fleetstream/cluster-import"},
		{"subject", "ce-subject", "agg-3"},
		{"subject-missing", "ce-subject", ""},
		{"time", "ce-time", "2020-01-01T00:00:00Z"},
		{"dataschema", "ce-dataschema", events.SchemaBase + "fleetstream/cluster/v1/events.proto#fleetstream.cluster.v1.ClusterRegistered"},
		{"datacontenttype", "content-type", "application/json"},
	}
	nc, _ := j.Connect(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := nats.Header{}
			for k, v := range raw.Header {
				if k != jetstream.MsgIDHeader {
					h[k] = append([]string(nil), v...)
				}
			}
			if tc.value == "" {
				h.Del(tc.header)
			} else {
				h.Set(tc.header, tc.value)
			}
			subject := "test.bad." + tc.name
			if _, err := j.JS.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: raw.Data}); err != nil {
				t.Fatal(err)
			}
			got := receiveCloudEvents(t, nc, "TEST", subject, 1)
			if err := checkCloudEvent(got[0], want); err == nil {
				t.Fatalf("%s=%q passed the check", tc.header, tc.value)
			} else {
				t.Logf("rejected as expected: %v", err)
			}
		})
	}
}
