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
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/fleetstream/fleetstream/pkg/consumer"
	"github.com/fleetstream/fleetstream/pkg/events"
	"github.com/fleetstream/fleetstream/pkg/lease"
	"github.com/fleetstream/fleetstream/pkg/topology"
)

// Change is what an event does to one view entry.
type Change struct {
	// Key is the KV key, already encoded (see package keys).
	Key string
	// Update returns the entry's next value given its current one (nil if absent); returning
	// nil deletes the entry. It may modify and return cur.
	Update func(cur proto.Message) proto.Message
}

// ChangeOf returns the Change of key by f, typed as the view's entries: f gets the current entry
// (nil when absent) and returns the next one, nil to delete it. Every projection of one entry
// type would otherwise write the same assertion and nil check around its own function.
func ChangeOf[T proto.Message](key string, f func(cur T) T) Change {
	return Change{Key: key, Update: func(cur proto.Message) proto.Message {
		var c T
		if cur != nil {
			c, _ = cur.(T)
		}
		next := f(c)
		// A nil pointer of T is a non-nil proto.Message: the deletion is told by validity.
		if any(next) == nil || !next.ProtoReflect().IsValid() {
			return nil
		}
		return next
	}}
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

// Engine runs one projection. Views have a single writer (see docs/architecture.md): every
// replica of a service runs the engines of its views, and each engine writes only while it holds
// the lease view.<Name> (pkg/lease). The others follow the leader's checkpoint, so Ready, Applied
// and WaitApplied mean the same in every replica.
type Engine struct {
	p        Projection
	js       jetstream.JetStream
	log      *zap.Logger
	replicas int
	revField protoreflect.FieldDescriptor
	batch    int
	leaseTTL time.Duration
	holder   string
	// cacheLimit bounds cache; see WithCacheLimit.
	cacheLimit int

	kv         jetstream.KeyValue
	kvPrefix   string
	cache      map[string]proto.Message // entries as last written; nil value = known absent
	rebuilding bool
	metaRev    uint64 // KV revision of the checkpoint this engine last read or wrote
	// target is the last stream sequence the view reads as it was when the engine started; a
	// follower is ready once the leader's checkpoint reaches it.
	target             uint64
	targetKnown        bool
	otherVersionLogged bool
	scratch            batchScratch

	// pending is the leader's lag: events in the stream after the last one it applied, as of
	// its delivery; the metrics' fallback when the stream does not answer a scrape (metrics.go).
	pending atomic.Uint64
	// streamLastSeq is the stream's last event of the view's subjects as a scrape last read it,
	// at streamLastAt (metrics.go).
	streamLastMu  sync.Mutex
	streamLastSeq uint64
	streamLastAt  time.Time
	// nextAfter and nextTime are the first event of the view's subjects after sequence
	// nextAfter and its time, as a scrape last read them (metrics.go): unchanged while the
	// view applies nothing, so a stalled view costs one read, not one per scrape.
	nextAfter uint64
	nextTime  time.Time
	nextKnown bool

	// started is when Run was first called, and readyAfter how long after it the view became
	// ready (0: not yet): fleetstream_view_time_to_ready_seconds.
	started    time.Time
	readyAfter atomic.Int64

	mu       sync.Mutex
	leading  bool
	applied  uint64
	changed  chan struct{}
	ready    chan struct{}
	readyOne sync.Once
}

// errSuperseded says the checkpoint was moved by another writer: this engine's picture of the
// bucket is stale, and it must reopen the view (or step down) before writing again.
var errSuperseded = errors.New("checkpoint written by another engine")

// Option tunes an Engine.
type Option func(*Engine)

// WithReplicas sets the bucket's replicas (default 1).
func WithReplicas(n int) Option { return func(e *Engine) { e.replicas = n } }

// DefaultBatch is how many events an engine applies per KV write round unless WithBatch says
// otherwise; no service overrides it, so benchmarks' baselines use it too.
const DefaultBatch = 512

// WithBatch sets how many events are applied per KV write round (default DefaultBatch).
func WithBatch(n int) Option { return func(e *Engine) { e.batch = n } }

// WithCacheLimit sets how many entries the engine keeps in memory (default 200,000). Above it
// the engine forgets half of them; a forgotten entry is read from the bucket again when an
// event touches it, prefetched concurrently for the whole batch.
func WithCacheLimit(n int) Option { return func(e *Engine) { e.cacheLimit = max(n, 2) } }

// WithLeaseTTL sets the TTL of the engine's lease (default lease.DefaultTTL, which is also the
// most the lease bucket allows): how soon another replica takes over when the leader dies.
func WithLeaseTTL(d time.Duration) Option { return func(e *Engine) { e.leaseTTL = d } }

// NewEngine validates p and returns an engine for it.
func NewEngine(js jetstream.JetStream, p Projection, log *zap.Logger, opts ...Option) (*Engine, error) {
	fd, err := revisionField(p.New())
	if err != nil {
		return nil, err
	}
	e := &Engine{p: p, js: js, log: log.With(zap.String("view", p.Name)), replicas: 1, revField: fd, batch: DefaultBatch,
		leaseTTL: lease.DefaultTTL, holder: lease.DefaultHolder(), cacheLimit: 200_000,
		changed: make(chan struct{}), ready: make(chan struct{})}
	for _, o := range opts {
		o(e)
	}
	return e, nil
}

// Ready is closed once the view has caught up with the stream as it was at start: in the
// leader when its engine has applied it, in a follower when the leader's checkpoint has reached
// it. Either way the bucket exists and holds the view (in a follower during a rolling upgrade,
// possibly the leader's older version of it, which is what every replica serves until a leader
// of the new version has rebuilt it).
func (e *Engine) Ready() <-chan struct{} { return e.ready }

// Leading reports whether this engine holds the view's lease and writes the view.
func (e *Engine) Leading() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leading
}

// Applied returns the stream sequence of the last event applied to the view: by this engine
// when it leads, by the leader (its checkpoint) when it follows.
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

// Run applies events until ctx is done, while it holds the view's lease; while another replica
// holds it, Run follows that replica's checkpoint and takes over when it stops or dies. The
// lease bucket is created if missing (lease.Open), so a service need not declare it.
//
// Events are read with an ordered reader (consumer.Ordered) from the view's checkpoint:
// projections need strict stream order, which a durable consumer cannot give across a restart
// or reconnect (messages pending on a dead client come back only after AckWait, behind newer
// ones), while an ordered reader resumes exactly after the last message it delivered.
func (e *Engine) Run(ctx context.Context) error {
	e.mu.Lock()
	if e.started.IsZero() {
		e.started = time.Now()
	}
	e.mu.Unlock()
	err := lease.Run(ctx, e.js, "view."+e.p.Name, e.holder, e.leaseTTL, e.lead,
		lease.WithStandby(e.follow), lease.WithLogger(e.log), lease.WithReplicas(e.replicas))
	if ctx.Err() != nil {
		return nil // stopped, possibly while starting: not a failure
	}
	return err
}

// lead runs the projection while this engine holds the lease; ctx ends when it is lost.
func (e *Engine) lead(ctx context.Context) error {
	e.mu.Lock()
	e.leading = true
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.leading = false
		e.mu.Unlock()
	}()
	delay := 50 * time.Millisecond
	for {
		err := e.run(ctx)
		if ctx.Err() != nil {
			return nil // stopped, or the lease is lost
		}
		switch {
		case errors.Is(err, errSuperseded):
			// Another engine wrote the checkpoint although this one holds the lease (an old
			// leader's last write, or our own write whose answer was lost): read the view again.
			e.log.Warn("view checkpoint moved under this engine; reopening", zap.Duration("in", delay))
		case !errors.Is(err, ErrHistoryGone) && (events.Transient(err) || errors.Is(err, context.DeadlineExceeded)):
			// Opening the bucket or the consumer while a NATS node is lost and its streams
			// elect new leaders (a JetStream request times out; ctx itself is alive): the
			// service must ride it out, not exit.
			e.log.Warn("view unavailable; reopening", zap.Error(err), zap.Duration("in", delay))
		default:
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Second)
	}
}

// follow tracks the leader's checkpoint while another replica holds the lease: Applied and
// WaitApplied follow it, and Ready closes when it reaches the stream as it was at start.
func (e *Engine) follow(ctx context.Context) error {
	var lastRev uint64
	for ctx.Err() == nil {
		if err := e.followOnce(ctx, &lastRev); err != nil && ctx.Err() == nil {
			if errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, errRecreated) {
				e.log.Debug("following view checkpoint", zap.Error(err))
			} else {
				e.log.Warn("following view checkpoint; retrying", zap.Error(err))
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
	return nil
}

func (e *Engine) followOnce(ctx context.Context, lastRev *uint64) error {
	kv, err := e.js.KeyValue(ctx, e.p.Bucket.Bucket)
	if err != nil {
		return err // the leader creates it
	}
	if !e.targetKnown {
		if e.target, err = e.streamLast(ctx); err != nil {
			return err
		}
		e.targetKnown = true
	}
	w, err := kv.Watch(ctx, MetaKey)
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	// The watch may not notice the bucket being dropped and recreated (a rebuild); reading the
	// checkpoint now and then does.
	check := time.NewTicker(time.Second)
	defer check.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case entry, ok := <-w.Updates():
			if !ok {
				return errors.New("checkpoint watch closed")
			}
			if entry != nil && entry.Operation() == jetstream.KeyValuePut {
				*lastRev = entry.Revision()
				e.observe(entry.Value())
			}
		case <-check.C:
			entry, err := kv.Get(ctx, MetaKey)
			if err != nil {
				if errors.Is(err, jetstream.ErrKeyNotFound) {
					continue
				}
				return err
			}
			if entry.Revision() < *lastRev {
				*lastRev = 0
				return errRecreated
			}
			if entry.Revision() > *lastRev {
				*lastRev = entry.Revision()
				e.observe(entry.Value())
			}
		}
	}
}

var errRecreated = errors.New("view bucket recreated")

// observe takes a checkpoint the leader wrote. The leader may run another version of the
// projection (a rolling upgrade): its view is still the one every replica serves until a leader
// of the new version rebuilds it, so a follower reports it rather than never becoming ready.
func (e *Engine) observe(data []byte) {
	var m meta
	if err := json.Unmarshal(data, &m); err != nil || m.Version == 0 {
		return
	}
	if m.Version != e.p.Version && !e.otherVersionLogged {
		e.otherVersionLogged = true
		e.log.Info("the leading engine runs another version of this view", zap.Int("leader", m.Version), zap.Int("ours", e.p.Version))
	}
	e.mu.Lock()
	if e.leading {
		e.mu.Unlock()
		return
	}
	if m.Checkpoint != e.applied {
		e.applied = m.Checkpoint
		close(e.changed)
		e.changed = make(chan struct{})
	}
	e.mu.Unlock()
	if m.Checkpoint >= e.target {
		e.markReady()
	}
}

// streamLast returns the sequence of the stream's last message the projection reads (0 if
// none).
func (e *Engine) streamLast(ctx context.Context) (uint64, error) {
	return LastRead(ctx, e.js, e.p)
}

// LastRead returns the sequence of the last message of p's stream that p reads (0 if none): a
// view whose checkpoint reaches it has applied everything appended so far.
func LastRead(ctx context.Context, js jetstream.JetStream, p Projection) (uint64, error) {
	s, err := js.Stream(ctx, p.Stream)
	if err != nil {
		return 0, err
	}
	if len(p.Subjects) == 0 {
		info, err := s.Info(ctx)
		if err != nil {
			return 0, err
		}
		return info.State.LastSeq, nil
	}
	var last uint64
	for _, subj := range p.Subjects {
		m, err := s.GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return 0, err
		}
		last = max(last, m.Sequence)
	}
	return last, nil
}

func (e *Engine) run(ctx context.Context) error {
	checkpoint, err := e.open(ctx)
	if err != nil {
		return err
	}
	if err := e.checkHistory(ctx, checkpoint); err != nil {
		return err
	}
	e.mu.Lock()
	e.applied = checkpoint
	e.mu.Unlock()
	// Not nats.go's ordered consumer: it gives each attempt to replace a lost consumer 10 s,
	// and one made while the meta group has no leader is never answered, so the view (and every
	// API write waiting for it) stalled ~10 s after a meta leader's node died (issue 14).
	r, err := consumer.NewOrdered(ctx, e.js, e.p.Stream, e.p.Subjects, checkpoint+1, 2*e.batch, e.log)
	if err != nil {
		return fmt.Errorf("view %s: consumer: %w", e.p.Name, err)
	}
	defer r.Stop()
	e.pending.Store(r.InitialPending())
	if r.InitialPending() == 0 {
		e.markReady()
	}
	batch := make([]jetstream.Msg, 0, e.batch)
	for {
		m, err := r.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			// The stream is gone or refuses the consumer: lead decides whether to reopen.
			return fmt.Errorf("view %s: consume: %w", e.p.Name, err)
		}
		batch = append(batch[:0], m)
		// Take whatever else is already buffered, without waiting for more.
		for len(batch) < e.batch {
			m, ok := r.TryNext()
			if !ok {
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
		// What the stream held past the batch when its last event was delivered: the view's
		// lag, for fleetstream_view_pending_events.
		if md, err := batch[len(batch)-1].Metadata(); err == nil {
			e.pending.Store(md.NumPending)
		}
	}
}

// ErrHistoryGone means the events a view must apply next were removed from its stream (by the
// stream's retention limits or a purge): building on would give a silently partial view, so the
// engine refuses and Run returns the error. See docs/events.md, Retention.
var ErrHistoryGone = errors.New("events the view needs are no longer in the stream")

// checkHistory fails with ErrHistoryGone when the stream no longer holds the event after
// checkpoint: a rebuild (checkpoint 0) of a stream whose first events are gone, or a view that
// fell behind the stream's retention. Streams with a per-subject limit are exempt. A view reading only some of the stream's subjects cannot
// tell whether the removed events were its own when it resumes, so it warns then; when it
// rebuilds, it refuses as the others do.
func (e *Engine) checkHistory(ctx context.Context, checkpoint uint64) error {
	s, err := e.js.Stream(ctx, e.p.Stream)
	if err != nil {
		return fmt.Errorf("view %s: stream %s: %w", e.p.Name, e.p.Stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("view %s: stream %s: %w", e.p.Name, e.p.Stream, err)
	}
	first := info.State.FirstSeq
	if first <= checkpoint+1 {
		return nil
	}
	// A stream keeping the latest messages per subject (FLEET_AGENT's reports) removes a message
	// only when a newer one of its subject supersedes it: what remains is complete by design.
	if info.Config.MaxMsgsPerSubject > 0 {
		return nil
	}
	whole := len(e.p.Subjects) == 0 || sameSet(e.p.Subjects, info.Config.Subjects)
	if checkpoint > 0 && !whole {
		e.log.Warn("the stream no longer holds every event after the view's checkpoint; those removed may be of other subjects",
			zap.String("stream", e.p.Stream), zap.Uint64("checkpoint", checkpoint), zap.Uint64("first_seq", first))
		return nil
	}
	return fmt.Errorf("view %s (version %d) must apply stream %s from sequence %d, but the stream's first sequence is %d: "+
		"events %d to %d were removed by its retention limits or a purge, and a view built without them would be silently "+
		"partial; restore the stream's events or the view's bucket: %w",
		e.p.Name, e.p.Version, e.p.Stream, checkpoint+1, first, checkpoint+1, first-1, ErrHistoryGone)
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	seen := make(map[string]bool, len(a))
	for _, x := range a {
		seen[x] = true
	}
	for _, x := range b {
		if !seen[x] {
			return false
		}
	}
	return true
}

// open makes sure the bucket exists and returns the checkpoint to resume after. A bucket
// without meta, or with another version's, cannot be trusted: it is emptied and rebuilt.
func (e *Engine) open(ctx context.Context) (uint64, error) {
	e.cache = make(map[string]proto.Message)
	e.rebuilding = false
	e.metaRev = 0
	bucket := e.p.Bucket
	bucket.Replicas = e.replicas
	kv, fresh, err := topology.OpenBucket(ctx, e.js, bucket)
	if err != nil {
		return 0, fmt.Errorf("view %s: bucket: %w", e.p.Name, err)
	}
	var m meta
	entry, err := kv.Get(ctx, MetaKey)
	switch {
	case err == nil:
		e.metaRev = entry.Revision()
		if jerr := json.Unmarshal(entry.Value(), &m); jerr != nil {
			m = meta{}
		}
	case errors.Is(err, jetstream.ErrKeyNotFound):
	default:
		return 0, fmt.Errorf("view %s: read checkpoint: %w", e.p.Name, err)
	}
	if m.Version != e.p.Version {
		e.log.Info("rebuilding view from stream", zap.String("stream", e.p.Stream), zap.Int("from", m.Version), zap.Int("to", e.p.Version))
		// A bucket this engine has just created is empty: dropping it again would only pull it
		// from under the caches of replicas (and other services) that opened it meanwhile.
		if !fresh {
			if err := e.js.DeleteKeyValue(ctx, bucket.Bucket); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
				return 0, fmt.Errorf("view %s: drop bucket: %w", e.p.Name, err)
			}
			if kv, err = e.js.CreateOrUpdateKeyValue(ctx, bucket); err != nil {
				return 0, fmt.Errorf("view %s: bucket: %w", e.p.Name, err)
			}
		}
		m = meta{Version: e.p.Version}
		e.metaRev = 0
		if err := e.putMeta(ctx, kv, m); err != nil {
			return 0, fmt.Errorf("view %s: %w", e.p.Name, err)
		}
		e.rebuilding = true
	}
	e.kv = kv
	e.kvPrefix = "$KV." + bucket.Bucket + "."
	return m.Checkpoint, nil
}

// putMeta writes the checkpoint if it is still the one this engine last read or wrote: a
// compare-and-set, so an engine that lost the lease without noticing yet cannot move the
// checkpoint of its successor (it gets errSuperseded and stops).
func (e *Engine) putMeta(ctx context.Context, kv jetstream.KeyValue, m meta) error {
	data, _ := json.Marshal(m)
	rev, err := kv.Update(ctx, MetaKey, data, e.metaRev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		return errSuperseded
	}
	if err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	e.metaRev = rev
	return nil
}

func (e *Engine) markReady() {
	e.readyOne.Do(func() {
		e.mu.Lock()
		started := e.started
		e.mu.Unlock()
		if !started.IsZero() {
			e.readyAfter.Store(max(int64(time.Since(started)), 1))
		}
		close(e.ready)
	})
}

// applyBatch applies events in stream order, writes each touched key once, and moves the
// checkpoint only after every write is stored. A crash anywhere in between replays the batch;
// entries that already carry a message's sequence skip it.
//
// Projections update the cached entries in place (no copy per event): a batch that fails
// leaves entries in the cache that may not be in the bucket, so the cache is dropped whenever
// applyBatch fails, before anything reads it again.
func (e *Engine) applyBatch(ctx context.Context, batch []jetstream.Msg) (err error) {
	defer func() {
		if err != nil {
			e.dropCache()
		}
	}()
	// Decode and map every event first, so the entries the batch touches can be read from the
	// bucket concurrently rather than one synchronous read per event (what a view larger than
	// the cache would otherwise pay).
	s := &e.scratch
	s.reset()
	var last *jetstream.MsgMetadata
	for _, m := range batch {
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("view %s: message metadata: %w", e.p.Name, err)
		}
		last = md
		p := preparedEvent{msg: m, seq: md.Sequence.Stream}
		// events.DecodeMsg would parse the metadata a second time.
		ev, err := events.Decode(m.Data())
		if err == nil {
			ev.Sequence, ev.Subject = md.Sequence.Stream, m.Subject()
			p.changes, err = e.p.Apply(ev)
		}
		p.err = err
		s.prepared = append(s.prepared, p)
	}
	if err := e.retry(ctx, func() error { return e.prefetch(ctx, s.prepared) }); err != nil {
		return err
	}
	for _, p := range s.prepared {
		err := p.err
		if err == nil {
			err = e.applyChanges(ctx, p.changes, p.seq, s.dirty, &s.order)
		}
		if err != nil {
			e.log.Error("dead-lettering event", zap.Uint64("seq", p.seq), zap.String("subject", p.msg.Subject()), zap.Error(err))
			if err := e.retry(ctx, func() error { return consumer.DeadLetter(ctx, e.js, e.p.Stream, "view-"+e.p.Name, p.msg, err) }); err != nil {
				return err
			}
		}
	}
	if err := e.retry(ctx, func() error { return e.write(ctx, s.dirty, s.order) }); err != nil {
		return err
	}
	superseded := false
	if err := e.retry(ctx, func() error {
		err := e.putMeta(ctx, e.kv, meta{Version: e.p.Version, Checkpoint: last.Sequence.Stream})
		if errors.Is(err, errSuperseded) {
			superseded = true
			return nil
		}
		return err
	}); err != nil {
		return err
	}
	if superseded {
		return fmt.Errorf("view %s: %w", e.p.Name, errSuperseded)
	}
	e.mu.Lock()
	e.applied = last.Sequence.Stream
	close(e.changed)
	e.changed = make(chan struct{})
	e.mu.Unlock()
	if last.NumPending == 0 {
		e.markReady()
	}
	return nil
}

// batchScratch is what applying a batch needs besides the cache, kept from one batch to the
// next so that a batch allocates only its events and entries.
type batchScratch struct {
	prepared []preparedEvent
	dirty    map[string]proto.Message
	order    []string
	futures  []jetstream.PubAckFuture
	missing  []string
	seen     map[string]struct{}
	// buf holds the encoded entries of a batch's writes. It is reused only after every write
	// of the batch is acknowledged: an unacknowledged publish may still be resent from it.
	buf []byte
}

func (s *batchScratch) reset() {
	clear(s.prepared) // let the previous batch's messages go
	s.prepared = s.prepared[:0]
	if s.dirty == nil {
		s.dirty = make(map[string]proto.Message)
		s.seen = make(map[string]struct{})
	}
	clear(s.dirty)
	clear(s.seen)
	s.order = s.order[:0]
	s.missing = s.missing[:0]
}

// preparedEvent is one message of a batch, decoded and mapped to its changes (or the error
// that dead-letters it).
type preparedEvent struct {
	msg     jetstream.Msg
	seq     uint64
	changes []Change
	err     error
}

// prefetchConcurrency bounds the bucket reads a batch has in flight.
const prefetchConcurrency = 32

// prefetch reads into the cache, concurrently, every entry the batch touches that the cache
// lacks. During a rebuild the cache is complete (a miss is an absent entry), so nothing is read.
func (e *Engine) prefetch(ctx context.Context, batch []preparedEvent) error {
	if e.rebuilding {
		return nil
	}
	missing, seen := e.scratch.missing[:0], e.scratch.seen
	defer func() { e.scratch.missing = missing }()
	for _, p := range batch {
		for _, ch := range p.changes {
			if _, ok := e.cache[ch.Key]; ok {
				continue
			}
			if _, ok := seen[ch.Key]; ok {
				continue
			}
			seen[ch.Key] = struct{}{}
			missing = append(missing, ch.Key)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	got := make([]proto.Message, len(missing))
	errs := make([]error, len(missing))
	sem := make(chan struct{}, prefetchConcurrency)
	var wg sync.WaitGroup
	for i, key := range missing {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			kve, err := e.kv.Get(ctx, key)
			switch {
			case errors.Is(err, jetstream.ErrKeyNotFound):
			case err != nil:
				errs[i] = fmt.Errorf("view %s: get %s: %w", e.p.Name, key, err)
			default:
				m := e.p.New()
				if err := proto.Unmarshal(kve.Value(), m); err != nil {
					errs[i] = fmt.Errorf("view %s: decode %s: %w", e.p.Name, key, err)
					return
				}
				got[i] = m
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for i, key := range missing {
		e.cache[key] = got[i] // nil: known absent
	}
	return nil
}

func (e *Engine) applyChanges(ctx context.Context, changes []Change, seq uint64, dirty map[string]proto.Message, order *[]string) error {
	for _, ch := range changes {
		cur, ok := dirty[ch.Key]
		if !ok {
			var err error
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

// current returns the entry as stored, from the engine's cache or the bucket. A cached entry is
// returned itself, not a copy, for the projection to update in place (see applyBatch).
func (e *Engine) current(ctx context.Context, key string) (proto.Message, error) {
	if m, ok := e.cache[key]; ok {
		return m, nil // nil: known absent
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
	if err := ctx.Err(); err != nil {
		return err // the lease is lost: not one more write
	}
	s := &e.scratch
	buf, futures := s.buf[:0], s.futures[:0]
	// Until every write is acknowledged, buf must not be written again (see batchScratch.buf).
	s.buf = nil
	defer func() {
		clear(futures)
		s.futures = futures[:0]
	}()
	for _, key := range order {
		msg := &nats.Msg{Subject: e.kvPrefix + key}
		if v := dirty[key]; v != nil {
			start := len(buf)
			var err error
			if buf, err = (proto.MarshalOptions{}).MarshalAppend(buf, v); err != nil {
				return fmt.Errorf("view %s: marshal %s: %w", e.p.Name, key, err)
			}
			// A full slice expression: a later append must not write into this one's bytes (it
			// may not move buf, reallocating only when it has to).
			msg.Data = buf[start:len(buf):len(buf)]
		} else {
			msg.Header = nats.Header{"KV-Operation": []string{"DEL"}}
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
	s.buf = buf
	for _, key := range order {
		e.cache[key] = dirty[key]
	}
	if len(e.cache) > e.cacheLimit {
		e.evict()
	}
	return nil
}

// evict forgets entries until the cache is at half its limit (which ones is left to map order:
// the engine cannot tell hot entries from cold without paying for it on every event). Forgotten
// entries are in the bucket, so from then on misses read it, as after dropCache.
func (e *Engine) evict() {
	n := len(e.cache) - e.cacheLimit/2
	for k := range e.cache {
		if n <= 0 {
			break
		}
		delete(e.cache, k)
		n--
	}
	e.rebuilding = false
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
		if ctx.Err() != nil {
			return ctx.Err()
		}
		e.log.Warn("view write failed; retrying", zap.Error(err), zap.Duration("in", delay))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		// At most a second: the usual cause is a stream or bucket electing a new leader, and
		// API writes wait for this view once the leader is back.
		delay = min(2*delay, time.Second)
	}
}
