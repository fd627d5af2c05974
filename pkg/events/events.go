// Package events is Fleetstream's event store: typed protobuf events in a common envelope,
// appended to JetStream subjects with optimistic concurrency and idempotent message ids.
package events

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/event/v1"
	"github.com/fleetstream/fleetstream/pkg/identity"
	"github.com/fleetstream/fleetstream/pkg/natsmetrics"
)

// ErrConflict means the subject moved on since the caller read it: another writer won.
var ErrConflict = errors.New("concurrent modification")

// JetStream error codes for a failed last-sequence expectation. A clustered stream under
// concurrent writes to one subject may answer the second one instead of the first.
const (
	errCodeWrongLastSequence    = 10071
	errCodeWrongLastSeqNotReady = 10164
	errCodeMessageTTLDisabled   = 10166
)

// Expect states what the caller believes the subject's last sequence is, and how long the
// message may live.
type Expect struct {
	check bool
	seq   uint64
	ttl   time.Duration
}

// ExpiresAfter returns e with a per-message TTL: the server removes the message d after it is
// stored (the stream must allow per-message TTLs). For a report whose only job is to say
// something is gone, where keeping it forever would keep one message per thing ever removed.
func (e Expect) ExpiresAfter(d time.Duration) Expect { e.ttl = d; return e }

// TTL is the per-message TTL of ExpiresAfter (0: none).
func (e Expect) TTL() time.Duration { return e.ttl }

var (
	// Any appends whatever the subject holds.
	Any = Expect{}
	// Empty appends only to a subject with no messages (creation of an aggregate).
	Empty = Expect{check: true}
)

// At appends only if the subject's last sequence is seq; At(0) is Empty.
func At(seq uint64) Expect { return Expect{check: true, seq: seq} }

// PayloadOf is e's payload, nil for no event (a subject with none yet, as Last answers).
func PayloadOf(e *Event) any {
	if e == nil {
		return nil
	}
	return e.Payload
}

// Event is a decoded envelope and its payload.
type Event struct {
	*eventv1.Envelope
	Payload proto.Message
	// Sequence and Subject where the event sits in its stream (zero before it is appended).
	Sequence uint64
	Subject  string
}

// Store appends events. It is safe for concurrent use.
type Store struct {
	js jetstream.JetStream
	// defaultActor is used when the context carries none, e.g. "system:cluster-import".
	defaultActor string
	// source is the ce-source header of this store's events.
	source string
	// types holds a *payloadType per payload type appended so far (by protoreflect.FullName).
	types sync.Map
	// pubs holds *publication values for appends to reuse.
	pubs sync.Pool
	ids  idSource
}

// idSource makes event ids, random (version 4) UUIDs as uuid.NewString makes them, from
// crypto/rand read a block at a time: one read per id was a tenth of Append's CPU.
type idSource struct {
	mu   sync.Mutex
	rand [64 * 16]byte
	next int // offset of the next id's bytes in rand; 0: read a block first
}

func (s *idSource) newID() string {
	var u uuid.UUID
	s.mu.Lock()
	if s.next == 0 {
		// Never fails: crypto/rand.Read crashes the program rather than return an error.
		_, _ = rand.Read(s.rand[:])
	}
	copy(u[:], s.rand[s.next:])
	s.next = (s.next + len(u)) % len(s.rand)
	s.mu.Unlock()
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // variant RFC 4122
	return u.String()
}

// payloadType is what an event's envelope and headers say about its payload's type, derived
// once per type rather than per event.
type payloadType struct {
	name, url, schema string
}

// NewStore returns a store appending through js.
func NewStore(js jetstream.JetStream, defaultActor string) *Store {
	return &Store{js: js, defaultActor: defaultActor, source: cloudEventSource(defaultActor)}
}

func (s *Store) payloadType(payload proto.Message) *payloadType {
	d := payload.ProtoReflect().Descriptor()
	if t, ok := s.types.Load(d.FullName()); ok {
		return t.(*payloadType)
	}
	name := string(d.FullName())
	t := &payloadType{name: name, url: anyURLPrefix + name, schema: SchemaBase + d.ParentFile().Path() + "#" + name}
	s.types.Store(d.FullName(), t)
	return t
}

// anyURLPrefix is what anypb.New puts before a type's full name.
const anyURLPrefix = "type.googleapis.com/"

// NewEnvelope wraps payload in an envelope with a fresh id.
func NewEnvelope(ctx context.Context, aggregateID string, payload proto.Message, defaultActor string) (*eventv1.Envelope, error) {
	anyp, err := anypb.New(payload)
	if err != nil {
		return nil, fmt.Errorf("wrap %T: %w", payload, err)
	}
	actor := identity.ActorFrom(ctx)
	if actor == "" {
		actor = defaultActor
	}
	return &eventv1.Envelope{
		Id:          uuid.NewString(),
		Type:        string(payload.ProtoReflect().Descriptor().FullName()),
		AggregateId: aggregateID,
		Time:        timestamppb.Now(),
		Actor:       actor,
		Payload:     anyp,
	}, nil
}

// Append publishes payload to subject if expect holds and returns the stream sequence it got.
// A stale expectation returns ErrConflict. Retrying a failed publish reuses the event id, so a
// publish that reached the stream but whose ack was lost is not stored twice.
func (s *Store) Append(ctx context.Context, subject, aggregateID string, expect Expect, payload proto.Message) (uint64, error) {
	t := s.payloadType(payload)
	actor := identity.ActorFrom(ctx)
	if actor == "" {
		actor = s.defaultActor
	}
	id := s.ids.newID()
	now := time.Now()
	pub := s.publication()
	defer s.release(pub)
	// The payload first, into a buffer of its own, so that its size is known before the
	// envelope's bytes that carry it are written (proto.Size would cost as much as marshalling).
	value, err := proto.MarshalOptions{}.MarshalAppend(pub.value[:0], payload)
	if err != nil {
		return 0, fmt.Errorf("append %s to %s: marshal %T: %w", t.name, subject, payload, err)
	}
	pub.value = value
	data, err := appendEnvelope(pub.msg.Data[:0], envelopeFields{id: id, typ: t.name, aggregateID: aggregateID, time: now, actor: actor}, t.url, value)
	if err != nil {
		return 0, fmt.Errorf("append %s to %s: %w", t.name, subject, err)
	}
	pub.msg.Subject, pub.msg.Data = subject, data
	pub.set(id, t, aggregateID, now, expect)
	var ack *jetstream.PubAck
	backoff := 50 * time.Millisecond
	for attempt := 0; ; attempt++ {
		// No publish options: the message already carries the headers they would add (see
		// publication), and without options nats.go neither allocates them nor sets a header.
		ack, err = s.js.PublishMsg(ctx, &pub.msg)
		if err == nil || !retryable(err) || attempt == 4 {
			break
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("append %s to %s: %w", t.name, subject, ctx.Err())
		case <-time.After(backoff):
			backoff *= 2
		}
		natsmetrics.PublishRetried()
	}
	if err != nil {
		if IsConflict(err) {
			return 0, fmt.Errorf("append %s to %s: %w", t.name, subject, ErrConflict)
		}
		return 0, fmt.Errorf("append %s to %s: %w", t.name, subject, err)
	}
	return ack.Sequence, nil
}

// SchemaBase is where the protos of the events are published; ce-dataschema points into it.
const SchemaBase = "https://github.com/fleetstream/fleetstream/blob/main/proto/"

// envelopeFields are an envelope's fields other than its payload.
type envelopeFields struct {
	id, typ, aggregateID string
	time                 time.Time
	actor                string
}

// appendEnvelope appends to buf what proto.Marshal writes for the envelope of f with a payload
// whose proto.Marshal is value wrapped in its Any (typeURL, as anypb.New names it): written field
// by field rather than through an Envelope, a Timestamp and an Any built for the purpose. Like
// proto.Marshal it refuses strings that are not UTF-8.
func appendEnvelope(buf []byte, f envelopeFields, typeURL string, value []byte) ([]byte, error) {
	for _, s := range [...]string{f.id, f.typ, f.aggregateID, f.actor} {
		if !utf8.ValidString(s) {
			return nil, fmt.Errorf("marshal envelope: string field contains invalid UTF-8: %q", s)
		}
	}
	// Fields in number order, as proto.Marshal writes them; proto3 leaves out empty strings
	// and zero numbers, but writes a set message (the time, the payload) even when empty.
	buf = appendStringField(buf, 1, f.id)
	buf = appendStringField(buf, 2, f.typ)
	buf = appendStringField(buf, 3, f.aggregateID)
	// google.protobuf.Timestamp as timestamppb.New makes it: seconds (1), nanos (2).
	secs, nanos := f.time.Unix(), int64(f.time.Nanosecond())
	tsSize := 0
	if secs != 0 {
		tsSize += protowire.SizeTag(1) + protowire.SizeVarint(uint64(secs))
	}
	if nanos != 0 {
		tsSize += protowire.SizeTag(2) + protowire.SizeVarint(uint64(nanos))
	}
	buf = protowire.AppendTag(buf, 4, protowire.BytesType)
	buf = protowire.AppendVarint(buf, uint64(tsSize))
	if secs != 0 {
		buf = protowire.AppendTag(buf, 1, protowire.VarintType)
		buf = protowire.AppendVarint(buf, uint64(secs))
	}
	if nanos != 0 {
		buf = protowire.AppendTag(buf, 2, protowire.VarintType)
		buf = protowire.AppendVarint(buf, uint64(nanos))
	}
	buf = appendStringField(buf, 5, f.actor)
	// The payload (6): an Any of type_url (1) and value (2).
	anySize := protowire.SizeTag(1) + protowire.SizeBytes(len(typeURL))
	if len(value) > 0 {
		anySize += protowire.SizeTag(2) + protowire.SizeBytes(len(value))
	}
	buf = protowire.AppendTag(buf, 6, protowire.BytesType)
	buf = protowire.AppendVarint(buf, uint64(anySize))
	buf = protowire.AppendTag(buf, 1, protowire.BytesType)
	buf = protowire.AppendString(buf, typeURL)
	if len(value) > 0 {
		buf = protowire.AppendTag(buf, 2, protowire.BytesType)
		buf = protowire.AppendBytes(buf, value)
	}
	return buf, nil
}

func appendStringField(buf []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return buf
	}
	buf = protowire.AppendTag(buf, num, protowire.BytesType)
	return protowire.AppendString(buf, s)
}

// cloudEventSource is the ce-source of the events of a store whose default actor is
// defaultActor: system:cluster-agent:<cluster> is the agent.
func cloudEventSource(defaultActor string) string {
	service := strings.TrimPrefix(defaultActor, "system:")
	service, _, _ = strings.Cut(service, ":")
	return "/fleetstream/" + service
}

// The headers of an appended message, in the order of publication.vals: the CloudEvents NATS
// protocol binding's (binary mode), so a subscriber can route on type, source and subject
// without decoding the envelope (the data is the whole envelope, whose payload the type names),
// and then those nats.go's publish options would set: the message id (the event id, so a
// retried publish is not stored twice), the expected last sequence of the subject and the
// message's TTL. The last two are present only when the append asks for them.
var headerKeys = [...]string{
	"ce-specversion", "ce-id", "ce-source", "ce-type", "ce-subject", "ce-time", "ce-dataschema", "content-type",
	jetstream.MsgIDHeader, jetstream.ExpectedLastSubjSeqHeader, jetstream.MsgTTLHeader,
}

const (
	hdrSpecVersion = iota
	hdrID
	hdrSource
	hdrType
	hdrSubject
	hdrTime
	hdrSchema
	hdrContentType
	hdrMsgID
	hdrExpectSeq
	hdrTTL
	numHeaders
)

// publication is an append's message, kept in Store.pubs for the next append once the
// publish returned: nats.go copies the subject, the headers and the data into the connection's
// buffer while publishing and keeps no reference to the message. Its header map holds every
// key from the start, each value a slice of vals, so an append only writes vals: building a
// header map of eleven keys per message cost about a tenth of Append's CPU.
type publication struct {
	msg  nats.Msg
	vals [numHeaders]string
	// value holds the marshalled payload.
	value []byte
}

// maxKeptData bounds the data buffer a publication keeps for the next append, so that one
// large event does not pin its buffer in the pool.
const maxKeptData = 64 << 10

func (s *Store) publication() *publication {
	if p, ok := s.pubs.Get().(*publication); ok {
		return p
	}
	p := &publication{msg: nats.Msg{Header: make(nats.Header, numHeaders)}}
	p.vals[hdrSpecVersion], p.vals[hdrSource], p.vals[hdrContentType] = "1.0", s.source, "application/protobuf"
	for i := range hdrExpectSeq {
		p.msg.Header[headerKeys[i]] = p.vals[i : i+1 : i+1]
	}
	return p
}

func (s *Store) release(p *publication) {
	if cap(p.msg.Data) > maxKeptData {
		p.msg.Data, p.value = nil, nil
	}
	s.pubs.Put(p)
}

// set writes the headers of the event id of type t, stamped at now, appended with expect.
func (p *publication) set(id string, t *payloadType, aggregateID string, now time.Time, expect Expect) {
	p.vals[hdrID], p.vals[hdrType], p.vals[hdrSubject], p.vals[hdrSchema], p.vals[hdrMsgID] = id, t.name, aggregateID, t.schema, id
	p.vals[hdrTime] = now.UTC().Format(time.RFC3339Nano)
	// As jetstream.WithExpectLastSequencePerSubject and WithMsgTTL write them.
	p.vals[hdrExpectSeq], p.vals[hdrTTL] = "", ""
	if expect.check {
		p.vals[hdrExpectSeq] = strconv.FormatUint(expect.seq, 10)
	}
	if expect.ttl > 0 {
		p.vals[hdrTTL] = expect.ttl.String()
	}
	for _, i := range [...]int{hdrExpectSeq, hdrTTL} {
		if p.vals[i] == "" {
			if len(p.msg.Header) > hdrExpectSeq {
				delete(p.msg.Header, headerKeys[i])
			}
		} else {
			p.msg.Header[headerKeys[i]] = p.vals[i : i+1 : i+1]
		}
	}
}

// IsConflict reports whether err is a failed last-sequence expectation.
func IsConflict(err error) bool {
	if errors.Is(err, ErrConflict) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == errCodeWrongLastSequence || apiErr.ErrorCode == errCodeWrongLastSeqNotReady
	}
	return false
}

// IsTTLDisabled reports whether an append with ExpiresAfter was refused because its stream does
// not allow per-message TTLs (a stream created by an older hub, not yet updated).
func IsTTLDisabled(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeMessageTTLDisabled
}

// Transient reports whether err is JetStream or the connection being briefly unavailable (no
// leader while one is elected, no responder, a reconnect, a request timeout) or full of
// short-lived consumers (a stream at its consumer limit while a fleet reconnects and every
// agent replays: docs/scale.md, 10,000 clusters): the same call can succeed later, so a
// long-running loop retries it instead of failing.
func Transient(err error) bool {
	for _, t := range []error{nats.ErrTimeout, nats.ErrNoResponders, nats.ErrConnectionClosed, nats.ErrConnectionDraining,
		nats.ErrConnectionReconnecting, nats.ErrDisconnected, jetstream.ErrNoStreamResponse, jetstream.ErrJetStreamNotEnabled,
		jetstream.ErrJetStreamNotEnabledForAccount, jetstream.ErrStreamNotFound, jetstream.ErrBucketNotFound} {
		if errors.Is(err, t) {
			return true
		}
	}
	var apiErr *jetstream.APIError
	// 503 is JetStream's "no leader / cluster not available" family.
	if errors.As(err, &apiErr) && (apiErr.Code == 503 || apiErr.ErrorCode == jetstream.JSErrCodeMaximumConsumersLimit) {
		return true
	}
	// A KV watch creates its consumer through nats.go's older API, whose errors are its own
	// type: rbac-sync's load of desired-rbac failed so under a 3,000-agent storm, and fleetd
	// stopped.
	var legacy *nats.APIError
	return errors.As(err, &legacy) && (legacy.Code == 503 || legacy.ErrorCode == nats.ErrorCode(jetstream.JSErrCodeMaximumConsumersLimit))
}

// retryable reports errors after which the publish may or may not have been stored, where
// a retry with the same message id is safe.
func retryable(err error) bool {
	return errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrConnectionReconnecting)
}

// Decode parses an envelope and its payload. Unknown payload types and malformed bytes are
// errors: the caller dead-letters them.
func Decode(data []byte) (*Event, error) {
	env := &eventv1.Envelope{}
	if err := proto.Unmarshal(data, env); err != nil {
		return nil, fmt.Errorf("decode envelope: %w", err)
	}
	if env.Payload == nil {
		return nil, errors.New("decode envelope: no payload")
	}
	payload, err := env.Payload.UnmarshalNew()
	if err != nil {
		return nil, fmt.Errorf("decode payload %s: %w", env.Payload.GetTypeUrl(), err)
	}
	return &Event{Envelope: env, Payload: payload}, nil
}

// DecodeMsg decodes a JetStream message and records where it sits.
func DecodeMsg(m jetstream.Msg) (*Event, error) {
	ev, err := Decode(m.Data())
	if err != nil {
		return nil, err
	}
	if md, err := m.Metadata(); err == nil {
		ev.Sequence = md.Sequence.Stream
	}
	ev.Subject = m.Subject()
	return ev, nil
}

// LastSequence returns the sequence of the last message on subject in stream, or 0 if none.
func LastSequence(ctx context.Context, s jetstream.Stream, subject string) (uint64, error) {
	m, err := s.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("last message on %s: %w", subject, err)
	}
	return m.Sequence, nil
}

// Last returns the sequence and decoded event of the last message on subject (0 and nil when
// there is none): what a command that recreates an aggregate must check, since its view may
// not yet show the event another writer just appended.
func Last(ctx context.Context, s jetstream.Stream, subject string) (uint64, *Event, error) {
	m, err := s.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil, nil
	}
	if err != nil {
		return 0, nil, fmt.Errorf("last message on %s: %w", subject, err)
	}
	ev, err := Decode(m.Data)
	if err != nil {
		return 0, nil, fmt.Errorf("last message on %s: %w", subject, err)
	}
	ev.Sequence, ev.Subject = m.Sequence, m.Subject
	return m.Sequence, ev, nil
}
