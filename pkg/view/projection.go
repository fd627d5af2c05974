// Package view keeps materialized views of event streams in JetStream KV buckets: a projection
// engine that applies events to entries idempotently and rebuilds the bucket from the stream
// when it is missing or its version changes, and a cache that serves reads from a bucket.
package view

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/fleetstream/fleetstream/pkg/consumer"
	"github.com/fleetstream/fleetstream/pkg/events"
)

// Change is what an event does to one view entry.
type Change struct {
	// Key is the KV key, already encoded (see package keys).
	Key string
	// Update returns the entry's next value given its current one (nil if absent); returning
	// nil deletes the entry. It may modify and return cur.
	Update func(cur proto.Message) proto.Message
}

// Projection describes a view: which events feed it and how each one changes entries.
type Projection struct {
	// Name identifies the view in logs and dead letters (fleet.dlq.<stream>.view-<Name>).
	Name string
	// Version is bumped whenever Apply changes meaning: a new version rebuilds the bucket from
	// the stream.
	Version int
	Stream  string
	// Subjects filters the stream; empty means all of it.
	Subjects []string
	Bucket   jetstream.KeyValueConfig
	// New returns an empty entry of the view's type, which must have a `uint64 revision` field.
	New func() proto.Message
	// Apply maps an event to changes. An error means the event is malformed for this view: it
	// is dead-lettered and the projection goes on. It must be a pure function of the event.
	Apply func(ev *events.Event) ([]Change, error)
}

// MetaKey is the reserved key where a view records its projection version and checkpoint (the
// stream sequence up to which every entry is written). keys.Encode never produces it.
const MetaKey = "=meta"

type meta struct {
	Version    int    `json:"version"`
	Checkpoint uint64 `json:"checkpoint"`
}

// Engine runs one projection. It must be the only engine of its view that is running: views
// have a single writer (see docs/architecture.md).
type Engine struct {
	p        Projection
	js       jetstream.JetStream
	log      *zap.Logger
	replicas int
	revField protoreflect.FieldDescriptor
	batch    int

	kv         jetstream.KeyValue
	kvPrefix   string
	cache      map[string]proto.Message // entries as last written; nil value = known absent
	rebuilding bool

	mu       sync.Mutex
	applied  uint64
	changed  chan struct{}
	ready    chan struct{}
	readyOne sync.Once
}

// Option tunes an Engine.
type Option func(*Engine)

// WithReplicas sets the bucket's replicas (default 1).
func WithReplicas(n int) Option { return func(e *Engine) { e.replicas = n } }

// WithBatch sets how many events are applied per KV write round (default 512).
func WithBatch(n int) Option { return func(e *Engine) { e.batch = n } }

// NewEngine validates p and returns an engine for it.
func NewEngine(js jetstream.JetStream, p Projection, log *zap.Logger, opts ...Option) (*Engine, error) {
	fd, err := revisionField(p.New())
	if err != nil {
		return nil, err
	}
	e := &Engine{p: p, js: js, log: log.With(zap.String("view", p.Name)), replicas: 1, revField: fd, batch: 512,
		changed: make(chan struct{}), ready: make(chan struct{})}
	for _, o := range opts {
		o(e)
	}
	return e, nil
}

// Ready is closed once the view has caught up with the stream as it was at start.
func (e *Engine) Ready() <-chan struct{} { return e.ready }

// Applied returns the stream sequence of the last event applied.
func (e *Engine) Applied() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.applied
}

// WaitApplied blocks until the event at stream sequence seq has been applied to the view, so an
// API can read its own writes.
func (e *Engine) WaitApplied(ctx context.Context, seq uint64) error {
	for {
		e.mu.Lock()
		applied, ch := e.applied, e.changed
		e.mu.Unlock()
		if applied >= seq {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for view %s to apply %d (at %d): %w", e.p.Name, seq, applied, ctx.Err())
		case <-ch:
		}
	}
}

// Run applies events until ctx is done.
//
// Events are read with an ordered consumer from the view's checkpoint: projections need strict
// stream order, which a durable consumer cannot give across a restart or reconnect (messages
// pending on a dead client come back only after AckWait, behind newer ones), while an ordered
// consumer resumes exactly after the last message it delivered.
func (e *Engine) Run(ctx context.Context) error {
	err := e.run(ctx)
	if ctx.Err() != nil {
		return nil // stopped, possibly while starting: not a failure
	}
	return err
}

func (e *Engine) run(ctx context.Context) error {
	checkpoint, err := e.open(ctx)
	if err != nil {
		return err
	}
	e.mu.Lock()
	e.applied = checkpoint
	e.mu.Unlock()
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: e.p.Subjects, DeliverPolicy: jetstream.DeliverAllPolicy}
	if checkpoint > 0 {
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = checkpoint + 1
	}
	cons, err := e.js.OrderedConsumer(ctx, e.p.Stream, cfg)
	if err != nil {
		return fmt.Errorf("view %s: consumer: %w", e.p.Name, err)
	}
	if info, err := cons.Info(ctx); err == nil && info.NumPending == 0 {
		e.markReady()
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(2 * e.batch))
	if err != nil {
		return fmt.Errorf("view %s: consume: %w", e.p.Name, err)
	}
	defer it.Stop()
	go func() {
		<-ctx.Done()
		it.Stop()
	}()
	batch := make([]jetstream.Msg, 0, e.batch)
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			e.log.Warn("view consumer", zap.Error(err))
			continue
		}
		batch = append(batch[:0], m)
		// Take whatever else is already buffered, without waiting for more.
		for len(batch) < e.batch {
			m, err := it.Next(jetstream.NextMaxWait(100 * time.Microsecond))
			if err != nil {
				break
			}
			batch = append(batch, m)
		}
		if err := e.applyBatch(ctx, batch); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// open makes sure the bucket exists and returns the checkpoint to resume after. A bucket
// without meta, or with another version's, cannot be trusted: it is emptied and rebuilt.
func (e *Engine) open(ctx context.Context) (uint64, error) {
	e.cache = make(map[string]proto.Message)
	bucket := e.p.Bucket
	bucket.Replicas = e.replicas
	kv, err := e.js.CreateOrUpdateKeyValue(ctx, bucket)
	if err != nil {
		return 0, fmt.Errorf("view %s: bucket: %w", e.p.Name, err)
	}
	var m meta
	entry, err := kv.Get(ctx, MetaKey)
	switch {
	case err == nil:
		if jerr := json.Unmarshal(entry.Value(), &m); jerr != nil {
			m = meta{}
		}
	case errors.Is(err, jetstream.ErrKeyNotFound):
	default:
		return 0, fmt.Errorf("view %s: read checkpoint: %w", e.p.Name, err)
	}
	if m.Version != e.p.Version {
		e.log.Info("rebuilding view from stream", zap.String("stream", e.p.Stream), zap.Int("from", m.Version), zap.Int("to", e.p.Version))
		if err := e.js.DeleteKeyValue(ctx, bucket.Bucket); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			return 0, fmt.Errorf("view %s: drop bucket: %w", e.p.Name, err)
		}
		if kv, err = e.js.CreateOrUpdateKeyValue(ctx, bucket); err != nil {
			return 0, fmt.Errorf("view %s: bucket: %w", e.p.Name, err)
		}
		m = meta{Version: e.p.Version}
		if err := putMeta(ctx, kv, m); err != nil {
			return 0, fmt.Errorf("view %s: %w", e.p.Name, err)
		}
		e.rebuilding = true
	}
	e.kv = kv
	e.kvPrefix = "$KV." + bucket.Bucket + "."
	return m.Checkpoint, nil
}

func putMeta(ctx context.Context, kv jetstream.KeyValue, m meta) error {
	data, _ := json.Marshal(m)
	if _, err := kv.Put(ctx, MetaKey, data); err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	return nil
}

func (e *Engine) markReady() { e.readyOne.Do(func() { close(e.ready) }) }

// applyBatch applies events in stream order, writes each touched key once, and moves the
// checkpoint only after every write is stored. A crash anywhere in between replays the batch;
// entries that already carry a message's sequence skip it.
func (e *Engine) applyBatch(ctx context.Context, batch []jetstream.Msg) error {
	dirty := make(map[string]proto.Message)
	var order []string
	var last uint64
	for _, m := range batch {
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("view %s: message metadata: %w", e.p.Name, err)
		}
		seq := md.Sequence.Stream
		last = seq
		if err := e.applyOne(ctx, m, seq, dirty, &order); err != nil {
			e.log.Error("dead-lettering event", zap.Uint64("seq", seq), zap.String("subject", m.Subject()), zap.Error(err))
			if err := e.retry(ctx, func() error { return consumer.DeadLetter(ctx, e.js, e.p.Stream, "view-"+e.p.Name, m, err) }); err != nil {
				return err
			}
		}
	}
	if err := e.retry(ctx, func() error { return e.write(ctx, dirty, order) }); err != nil {
		return err
	}
	if err := e.retry(ctx, func() error { return putMeta(ctx, e.kv, meta{Version: e.p.Version, Checkpoint: last}) }); err != nil {
		return err
	}
	lastMsg := batch[len(batch)-1]
	e.mu.Lock()
	e.applied = last
	close(e.changed)
	e.changed = make(chan struct{})
	e.mu.Unlock()
	if md, err := lastMsg.Metadata(); err == nil && md.NumPending == 0 {
		e.markReady()
	}
	return nil
}

func (e *Engine) applyOne(ctx context.Context, m jetstream.Msg, seq uint64, dirty map[string]proto.Message, order *[]string) error {
	ev, err := events.DecodeMsg(m)
	if err != nil {
		return err
	}
	changes, err := e.p.Apply(ev)
	if err != nil {
		return err
	}
	for _, ch := range changes {
		cur, ok := dirty[ch.Key]
		if !ok {
			if cur, err = e.current(ctx, ch.Key); err != nil {
				return err
			}
		}
		if cur != nil && cur.ProtoReflect().Get(e.revField).Uint() >= seq {
			continue // already applied before a redelivery
		}
		next := ch.Update(cur)
		if next != nil {
			next.ProtoReflect().Set(e.revField, protoreflect.ValueOfUint64(seq))
		}
		if _, seen := dirty[ch.Key]; !seen {
			*order = append(*order, ch.Key)
		}
		dirty[ch.Key] = next
	}
	return nil
}

// current returns the entry as stored, from the engine's cache or the bucket.
func (e *Engine) current(ctx context.Context, key string) (proto.Message, error) {
	if m, ok := e.cache[key]; ok {
		if m == nil {
			return nil, nil
		}
		return proto.Clone(m), nil
	}
	if e.rebuilding {
		return nil, nil
	}
	kve, err := e.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("view %s: get %s: %w", e.p.Name, key, err)
	}
	m := e.p.New()
	if err := proto.Unmarshal(kve.Value(), m); err != nil {
		return nil, fmt.Errorf("view %s: decode %s: %w", e.p.Name, key, err)
	}
	return m, nil
}

// write stores the dirty entries with pipelined publishes to the bucket's subjects (the KV
// protocol: a put is a message on $KV.<bucket>.<key>, a delete carries KV-Operation: DEL).
func (e *Engine) write(ctx context.Context, dirty map[string]proto.Message, order []string) error {
	futures := make([]jetstream.PubAckFuture, 0, len(order))
	for _, key := range order {
		msg := nats.NewMsg(e.kvPrefix + key)
		if v := dirty[key]; v != nil {
			data, err := proto.Marshal(v)
			if err != nil {
				return fmt.Errorf("view %s: marshal %s: %w", e.p.Name, key, err)
			}
			msg.Data = data
		} else {
			msg.Header.Set("KV-Operation", "DEL")
		}
		f, err := e.js.PublishMsgAsync(msg)
		if err != nil {
			e.dropCache()
			return fmt.Errorf("view %s: write %s: %w", e.p.Name, key, err)
		}
		futures = append(futures, f)
	}
	for i, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			e.dropCache()
			return fmt.Errorf("view %s: write %s: %w", e.p.Name, order[i], err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for _, key := range order {
		e.cache[key] = dirty[key]
	}
	if len(e.cache) > 200_000 {
		e.dropCache() // bound memory; entries are re-read from the bucket on demand
	}
	return nil
}

// dropCache forgets cached entries. During a rebuild the cache is the only record of what was
// written so far, so from then on misses must read the bucket.
func (e *Engine) dropCache() {
	e.cache = make(map[string]proto.Message)
	e.rebuilding = false
}

// retry runs f until it succeeds or ctx ends, backing off; the stream or bucket being briefly
// unavailable (a leader election) must not lose or skip events.
func (e *Engine) retry(ctx context.Context, f func() error) error {
	delay := 50 * time.Millisecond
	for {
		err := f()
		if err == nil {
			return nil
		}
		e.log.Warn("view write failed; retrying", zap.Error(err), zap.Duration("in", delay))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}
