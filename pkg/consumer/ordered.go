package consumer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/fleetstream/fleetstream/pkg/natsmetrics"
)

// Bounds of an Ordered reader's recovery. nats.go's ordered consumer gives each attempt to
// create its replacement consumer 10 s, hard-coded: a request sent while the JetStream meta
// group has no leader is never answered, so a view resumed ~10 s after a meta leader's node was
// killed although a new leader was elected within 4-6 s (issue 14). An attempt of 1 s retried
// every 250 ms resumes within about a second of the election.
const (
	orderedCreateTimeout = time.Second
	orderedRetryDelay    = 250 * time.Millisecond
	orderedDeleteTimeout = 5 * time.Second
	// orderedInactive lets the server drop a consumer whose reader died without deleting it.
	orderedInactive = 5 * time.Minute
	// orderedLogEvery: a create failing every 1.25 s for a minute would log 48 lines.
	orderedLogEvery = 20
)

// ErrOrderedStopped is returned by Ordered.Next once Stop was called.
var ErrOrderedStopped = errors.New("ordered reader stopped")

// Ordered reads a stream (or some of its subjects) in stream order, each message exactly once,
// from a start sequence on, through an ephemeral consumer it recreates from the last sequence
// it delivered whenever that consumer is lost (its node died, it was deleted, a delivery was
// skipped). It is what nats.go's ordered consumer does, with recovery bounded by
// orderedCreateTimeout and orderedRetryDelay rather than nats.go's fixed 10 s per attempt.
//
// An Ordered is used by one goroutine; only Stop may be called from another.
type Ordered struct {
	js       jetstream.JetStream
	stream   string
	subjects []string
	log      *zap.Logger
	pull     int

	prefix string
	serial int
	// mu guards cons and it, which Stop discards from another goroutine.
	mu   sync.Mutex
	cons jetstream.Consumer
	it   jetstream.MessagesContext
	// next is the stream sequence the next message must have at least; dseq the consumer
	// delivery sequence of the last message delivered by the current consumer.
	next uint64
	dseq uint64
	// broken is why the current consumer must be replaced before reading on (an error TryNext
	// met and could not return).
	broken error
	// initial is what the first consumer had pending when it was created.
	initial uint64
	// lastPerSubject: until a message is delivered, consumers start at each subject's last
	// message (WithLastPerSubject).
	lastPerSubject bool
	// headersOnly: messages come without their payload (WithHeadersOnly).
	headersOnly bool

	stopped  chan struct{} // closed by Stop
	stopOnce sync.Once
}

// OrderedOption configures an Ordered reader.
type OrderedOption func(*Ordered)

// WithLastPerSubject starts the reader at the last message of each subject (startSeq is
// ignored), for a stream whose messages each replace the one before on their subject: reading
// those is reading the current state. Once a message is delivered the reader goes on from it
// in stream order, through every replacement consumer, as nats.go's ordered consumer does.
func WithLastPerSubject() OrderedOption { return func(o *Ordered) { o.lastPerSubject = true } }

// WithHeadersOnly delivers each message's headers without its payload; its size is in header
// nats.MsgSize (a reader that accounts for what a stream holds, not what it says).
func WithHeadersOnly() OrderedOption { return func(o *Ordered) { o.headersOnly = true } }

// NewOrdered creates the reader's first consumer, delivering from stream sequence startSeq on
// (0 or 1: from the beginning) the messages of subjects (all of the stream's if empty); pull is
// how many messages it keeps buffered. It fails if the consumer cannot be created before ctx
// ends, or at once if the server refuses it (no such stream, a bad filter).
func NewOrdered(ctx context.Context, js jetstream.JetStream, stream string, subjects []string, startSeq uint64, pull int, log *zap.Logger, opts ...OrderedOption) (*Ordered, error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("ordered reader of %s: name: %w", stream, err)
	}
	o := &Ordered{js: js, stream: stream, subjects: subjects, log: log.With(zap.String("stream", stream)),
		pull: max(pull, 1), prefix: "ord_" + hex.EncodeToString(b[:]), next: max(startSeq, 1),
		stopped: make(chan struct{})}
	for _, opt := range opts {
		opt(o)
	}
	if err := o.create(ctx); err != nil {
		return nil, err
	}
	o.initial = o.cons.CachedInfo().NumPending
	return o, nil
}

// InitialPending returns how many messages the stream held for the reader when it was created:
// none means the reader is caught up from the start; otherwise it is once a message's metadata
// reports nothing pending after it. Unlike a consumer-info request made after creation, it
// cannot count messages already buffered but not yet read as delivered.
func (o *Ordered) InitialPending() uint64 { return o.initial }

// Next returns the next message, waiting for it until ctx ends (then ctx's error) or Stop is
// called (then ErrOrderedStopped). A lost consumer is replaced meanwhile, and Next fails with
// another error only if the server refuses the replacement (the stream was deleted).
func (o *Ordered) Next(ctx context.Context) (jetstream.Msg, error) {
	m, _, err := o.read(ctx)
	return m, err
}

// Each passes every message, with its metadata, to fn in stream order until ctx ends (then it
// returns nil) or Stop is called or the server refuses a replacement consumer (then the error).
func (o *Ordered) Each(ctx context.Context, fn func(m jetstream.Msg, md *jetstream.MsgMetadata)) error {
	for {
		m, md, err := o.read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("ordered reader of %s: %w", o.stream, err)
		}
		fn(m, md)
	}
}

// read is Next with the metadata accept read.
func (o *Ordered) read(ctx context.Context) (jetstream.Msg, *jetstream.MsgMetadata, error) {
	for {
		if err := o.state(ctx); err != nil {
			return nil, nil, err
		}
		it := o.iterator()
		if o.broken != nil || it == nil {
			if err := o.reset(ctx); err != nil {
				return nil, nil, err
			}
			continue
		}
		m, err := it.Next(jetstream.NextContext(ctx))
		if err == nil {
			if md, ok := o.accept(m); ok {
				return m, md, nil
			}
			continue
		}
		if serr := o.state(ctx); serr != nil {
			return nil, nil, serr
		}
		o.broken = err
	}
}

// TryNext returns a message already buffered, or false at once. It does not replace a lost
// consumer (the next Next does), so it never blocks for long.
func (o *Ordered) TryNext() (jetstream.Msg, bool) {
	it := o.iterator()
	if o.broken != nil || it == nil {
		return nil, false
	}
	// The smallest wait nats.go allows: it returns a buffered message at once.
	m, err := it.Next(jetstream.NextMaxWait(100 * time.Microsecond))
	if err != nil {
		if !errors.Is(err, nats.ErrTimeout) {
			o.broken = err
		}
		return nil, false
	}
	if _, ok := o.accept(m); !ok {
		return nil, false
	}
	return m, true
}

// Stop ends the reader: a Next waiting returns ErrOrderedStopped, and its consumer is deleted
// in the background.
func (o *Ordered) Stop() {
	o.stopOnce.Do(func() {
		close(o.stopped)
		o.discard()
	})
}

func (o *Ordered) iterator() jetstream.MessagesContext {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.it
}

// state returns why Next must not go on: Stop was called, or ctx ended.
func (o *Ordered) state(ctx context.Context) error {
	select {
	case <-o.stopped:
		return ErrOrderedStopped
	default:
	}
	return ctx.Err()
}

// accept checks m follows the last message delivered; a gap means the consumer skipped some
// (a lost delivery): it is replaced, and m comes again from the new one.
func (o *Ordered) accept(m jetstream.Msg) (*jetstream.MsgMetadata, bool) {
	md, err := m.Metadata()
	if err != nil {
		o.broken = fmt.Errorf("message metadata: %w", err)
		return nil, false
	}
	if md.Sequence.Consumer != o.dseq+1 || md.Sequence.Stream < o.next {
		o.broken = fmt.Errorf("delivery %d (stream %d) after %d (want stream >= %d)", md.Sequence.Consumer, md.Sequence.Stream, o.dseq, o.next)
		return nil, false
	}
	o.dseq = md.Sequence.Consumer
	o.next = md.Sequence.Stream + 1
	o.lastPerSubject = false
	return md, true
}

// reset replaces the consumer, from the stream sequence after the last one delivered.
func (o *Ordered) reset(ctx context.Context) error {
	if o.broken != nil {
		o.log.Info("recreating ordered consumer", zap.Uint64("from", o.next), zap.Error(o.broken))
		natsmetrics.ConsumerRecreated(o.stream)
	}
	o.discard()
	o.broken = nil
	return o.create(ctx)
}

// deleteLater deletes consumer name in the background, bounded by orderedDeleteTimeout.
func (o *Ordered) deleteLater(name string) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), orderedDeleteTimeout)
		defer cancel()
		_ = o.js.DeleteConsumer(ctx, o.stream, name)
	}()
}

// discard stops the current iterator and deletes its consumer in the background: a consumer
// on a dead node cannot be deleted until the node is back or the server drops it
// (orderedInactive), and the reader must not wait for either.
func (o *Ordered) discard() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.it != nil {
		o.it.Stop()
	}
	if o.cons != nil {
		o.deleteLater(o.cons.CachedInfo().Name)
	}
	o.it, o.cons = nil, nil
}

// create makes a consumer from o.next and starts pulling from it, each attempt bounded to
// orderedCreateTimeout and retried every orderedRetryDelay until ctx ends or Stop is called.
func (o *Ordered) create(ctx context.Context) error {
	cfg := jetstream.ConsumerConfig{
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       o.next,
		AckPolicy:         jetstream.AckNonePolicy,
		MaxDeliver:        1,
		Replicas:          1,
		MemoryStorage:     true,
		InactiveThreshold: orderedInactive,
		HeadersOnly:       o.headersOnly,
	}
	if o.lastPerSubject {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverLastPerSubjectPolicy, 0
	}
	if len(o.subjects) == 1 {
		cfg.FilterSubject = o.subjects[0]
	} else {
		cfg.FilterSubjects = o.subjects
	}
	start := time.Now()
	for attempt := 1; ; attempt++ {
		// A new name for every attempt. An attempt that timed out may still have created its
		// consumer, possibly assigned to the very node that just died: retrying under that name
		// would be an update of a consumer nobody answers for, and in the chaos suite a view
		// waited for it until the node came back. The abandoned one is deleted in the
		// background (and the server drops it after orderedInactive anyway).
		o.serial++
		cfg.Name = o.prefix + "_" + strconv.Itoa(o.serial)
		actx, cancel := context.WithTimeout(ctx, orderedCreateTimeout)
		cons, err := o.js.CreateOrUpdateConsumer(actx, o.stream, cfg)
		cancel()
		// Only an attempt the server did not answer may have created its consumer: an answer
		// (an error code) says it did not, and a delete of it would only add to the load of a
		// stream at its consumer limit.
		var answered *jetstream.APIError
		if err != nil && !errors.As(err, &answered) {
			o.deleteLater(cfg.Name)
		}
		if err == nil {
			if o.serial > 1 {
				o.log.Info("ordered consumer recreated", zap.Uint64("from", o.next), zap.Int("attempts", attempt),
					zap.Duration("after", time.Since(start)))
			}
			return o.consume(ctx, cons)
		}
		if serr := o.state(ctx); serr != nil {
			return serr
		}
		if refused(err) {
			return fmt.Errorf("ordered reader of %s: create consumer from %d: %w", o.stream, o.next, err)
		}
		if attempt == 1 || attempt%orderedLogEvery == 0 {
			o.log.Warn("ordered consumer not created; retrying", zap.Int("attempt", attempt), zap.Uint64("from", o.next), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-o.stopped:
			return ErrOrderedStopped
		case <-time.After(retryDelay(err, attempt)):
		}
	}
}

// retryDelay is how long an ordered reader waits before its next create: orderedRetryDelay,
// except while the stream is at its consumer limit, which lasts as long as a reconnecting
// fleet's replays do — there it backs off, doubling to 5 s, rather than ask four times a second.
func retryDelay(err error, attempt int) time.Duration {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeMaximumConsumersLimit {
		return orderedRetryDelay
	}
	return min(orderedRetryDelay<<min(attempt-1, 5), 5*time.Second)
}

func (o *Ordered) consume(ctx context.Context, cons jetstream.Consumer) error {
	o.dseq = 0
	it, err := cons.Messages(jetstream.PullMaxMessages(o.pull), jetstream.PullHeartbeat(Heartbeat),
		jetstream.WithMessagesErrOnMissingHeartbeat(true))
	o.mu.Lock()
	o.cons, o.it = cons, it
	o.mu.Unlock()
	if err != nil {
		// Only a bad option fails here: the pull requests are sent asynchronously.
		o.discard()
		return fmt.Errorf("ordered reader of %s: consume: %w", o.stream, err)
	}
	// A Stop that ran meanwhile had nothing to discard yet.
	if serr := o.state(ctx); serr != nil {
		o.discard()
		return serr
	}
	return nil
}

// refused reports whether the server answered a consumer create with an error that retrying
// cannot fix (not found, bad request); a leaderless or unreachable JetStream times out or
// answers 503. A stream at its consumer limit answers 400 too, but only until the short-lived
// consumers of a reconnecting fleet's replays are gone.
func refused(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode == jetstream.JSErrCodeMaximumConsumersLimit {
		return false
	}
	return apiErr.Code == http.StatusBadRequest || apiErr.Code == http.StatusNotFound
}
