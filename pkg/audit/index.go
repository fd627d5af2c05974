package audit

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/consumer"
	auditv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/audit/v1"
	eventv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/event/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// Sources are the domain event streams the index follows.
var Sources = []string{subjects.ClusterStream, subjects.NamespaceStream, subjects.PlacementStream,
	subjects.RBACStream, subjects.EndpointStream}

// Row classes, the first token after fleet.audit.
const (
	ClassEvent  = "event"
	ClassDenied = "denied"
)

// msgIDKeyName is the key, in the checkpoints bucket, of the secret the indexer's message ids
// are keyed with. Only the indexer's identity may read that bucket (pkg/natsauth), so no other
// service can compute the id of an event's row before the indexer writes it.
const msgIDKeyName = "msg-id-key"

// indexBatch bounds the records of one write round (one checkpoint move).
const indexBatch = 256

// indexer copies each event of the domain streams into FLEET_AUDIT as an Activity on a subject
// naming its project, cluster, object and actor, so a query is a filtered read of that stream
// rather than a scan of every domain stream. One writer at a time (the lease); a record's
// Nats-Msg-Id is a MAC of its event's stream and sequence, so the batch a crash replays (the
// checkpoint moves only after every record of a batch is stored) is dropped by the duplicate
// window. The id is a MAC, not "<stream>:<seq>", because every service may publish denied rows
// into the same stream: with a guessable id one could publish first under the next event's id
// and have the real row dropped as a duplicate.
type indexer struct {
	js  jetstream.JetStream
	log *zap.Logger
	kv  jetstream.KeyValue
	// key is the message ids' secret (msgIDKey), set by run before any write.
	key []byte
	// indexed counts the records written, for tests and metrics.
	indexed func(stream string)
}

func (ix *indexer) run(ctx context.Context) error {
	for delay := 100 * time.Millisecond; ix.key == nil; delay = min(2*delay, 10*time.Second) {
		key, err := ix.msgIDKey(ctx)
		if err == nil {
			ix.key = key
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		ix.log.Warn("audit index: starting again", zap.Error(err), zap.Duration("after", delay))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
	}
	g, ctx := errgroup.WithContext(ctx)
	for _, s := range Sources {
		g.Go(func() error { return ix.followRetrying(ctx, s) })
	}
	return g.Wait()
}

// followRetrying follows stream until ctx ends, starting again from the checkpoint after an
// error (a store that failed a write, a checkpoint another writer moved) with backoff, so a
// failing index never stops the process that serves the API.
func (ix *indexer) followRetrying(ctx context.Context, stream string) error {
	for delay := 100 * time.Millisecond; ; delay = min(2*delay, 10*time.Second) {
		err := ix.follow(ctx, stream)
		if ctx.Err() != nil {
			return nil
		}
		ix.log.Warn("audit index: starting again", zap.String("stream", stream), zap.Error(err), zap.Duration("after", delay))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
	}
}

// follow indexes stream from its checkpoint on until ctx ends. A stream that does not exist yet
// (its owner has not started) is waited for.
func (ix *indexer) follow(ctx context.Context, stream string) error {
	log := ix.log.With(zap.String("stream", stream))
	var s jetstream.Stream
	for delay := 100 * time.Millisecond; ; delay = min(2*delay, 5*time.Second) {
		var err error
		if s, err = ix.js.Stream(ctx, stream); err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
			return fmt.Errorf("audit index: stream %s: %w", stream, err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
	}
	checkpoint, rev, err := ix.checkpoint(ctx, stream)
	if err != nil {
		return err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("audit index: stream %s: %w", stream, err)
	}
	// Events removed by the stream's retention are gone from the trail too: the index follows
	// what the stream keeps (its own retention is FLEET_AUDIT's).
	if first := info.State.FirstSeq; first > checkpoint+1 && info.State.Msgs > 0 {
		log.Warn("events the audit index has not recorded were removed from the stream by its retention",
			zap.Uint64("checkpoint", checkpoint), zap.Uint64("first_seq", first))
	}
	r, err := consumer.NewOrdered(ctx, ix.js, stream, nil, checkpoint+1, 2*indexBatch, log)
	if err != nil {
		return fmt.Errorf("audit index: %w", err)
	}
	defer r.Stop()
	batch := make([]jetstream.Msg, 0, indexBatch)
	for {
		m, err := r.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("audit index of %s: %w", stream, err)
		}
		batch = append(batch[:0], m)
		for len(batch) < indexBatch {
			m, ok := r.TryNext()
			if !ok {
				break
			}
			batch = append(batch, m)
		}
		last, err := ix.write(ctx, stream, batch)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if rev, err = ix.kv.Update(ctx, stream, []byte(strconv.FormatUint(last, 10)), rev); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			// Another writer moved it: this one lost its lease without noticing yet.
			return fmt.Errorf("audit index of %s: move checkpoint: %w", stream, err)
		}
	}
}

// msgIDKey returns the secret of the message ids, creating it the first time: every indexer
// (each replica, each restart) must use the same one for a replayed batch to be dropped.
func (ix *indexer) msgIDKey(ctx context.Context) ([]byte, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("audit index: message id key: %w", err)
	}
	if _, err := ix.kv.Create(ctx, msgIDKeyName, key); err == nil {
		return key, nil
	} else if !errors.Is(err, jetstream.ErrKeyExists) {
		return nil, fmt.Errorf("audit index: create message id key: %w", err)
	}
	e, err := ix.kv.Get(ctx, msgIDKeyName)
	if err != nil {
		return nil, fmt.Errorf("audit index: message id key: %w", err)
	}
	if len(e.Value()) < 16 {
		return nil, fmt.Errorf("audit index: message id key of %d bytes in %s: delete it to make a new one", len(e.Value()), subjects.AuditCheckpointsBucket)
	}
	return e.Value(), nil
}

// msgID is the Nats-Msg-Id of the row of event seq of stream.
func msgID(key []byte, stream string, seq uint64) string {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(stream + ":" + strconv.FormatUint(seq, 10)))
	return "audit:" + hex.EncodeToString(h.Sum(nil))
}

// checkpoint returns the last sequence of stream the index holds and the key's revision.
func (ix *indexer) checkpoint(ctx context.Context, stream string) (uint64, uint64, error) {
	e, err := ix.kv.Get(ctx, stream)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		rev, err := ix.kv.Create(ctx, stream, []byte("0"))
		if err != nil {
			return 0, 0, fmt.Errorf("audit index: create checkpoint of %s: %w", stream, err)
		}
		return 0, rev, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("audit index: checkpoint of %s: %w", stream, err)
	}
	seq, err := strconv.ParseUint(string(e.Value()), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("audit index: checkpoint of %s: %q: %w", stream, e.Value(), err)
	}
	return seq, e.Revision(), nil
}

// write publishes the batch's records pipelined and waits for every acknowledgement; it
// returns the stream sequence of the batch's last message.
func (ix *indexer) write(ctx context.Context, stream string, batch []jetstream.Msg) (uint64, error) {
	var last uint64
	futures := make([]jetstream.PubAckFuture, 0, len(batch))
	for _, m := range batch {
		md, err := m.Metadata()
		if err != nil {
			return 0, fmt.Errorf("audit index of %s: metadata: %w", stream, err)
		}
		last = md.Sequence.Stream
		a := recordOf(stream, m.Subject(), md, m.Data())
		data, err := proto.Marshal(a)
		if err != nil {
			return 0, fmt.Errorf("audit index of %s: %w", stream, err)
		}
		msg := &nats.Msg{Subject: activitySubject(ClassEvent, a),
			Data: data, Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, msgID(ix.key, stream, last))
		f, err := ix.js.PublishMsgAsync(msg, jetstream.WithExpectStream(subjects.AuditStream))
		if err != nil {
			return 0, fmt.Errorf("audit index of %s: publish: %w", stream, err)
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return 0, fmt.Errorf("audit index of %s: publish: %w", stream, err)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	if ix.indexed != nil {
		for range batch {
			ix.indexed(stream)
		}
	}
	return last, nil
}

// recordOf makes the activity row of one stored event. An event whose payload this build cannot
// decode (a newer type) is still recorded with what its envelope and subject say.
func recordOf(stream, subject string, md *jetstream.MsgMetadata, data []byte) *auditv1.Activity {
	a := &auditv1.Activity{Stream: stream, Sequence: md.Sequence.Stream}
	var payload proto.Message
	env := &eventv1.Envelope{}
	if err := proto.Unmarshal(data, env); err == nil {
		a.Time, a.Actor, a.Type, a.EventId = env.Time, env.Actor, env.Type, env.Id
		if env.Payload != nil {
			if p, err := env.Payload.UnmarshalNew(); err == nil {
				payload = p
			}
		}
	} else {
		a.Type = "Undecodable"
	}
	if a.Time == nil {
		a.Time = timestamppb.New(md.Timestamp)
	}
	o := describe(stream, subject, payload)
	a.Kind, a.Name, a.Project, a.Cluster = o.Kind, o.Name, o.Project, o.Cluster
	return a
}
