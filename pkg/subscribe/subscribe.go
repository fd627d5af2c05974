// Package subscribe is the kit for downstream systems that read Fleetstream's events: give it
// a subscriber credential (from SubscriberService.CreateSubscriber) and a handler, and it
// creates or resumes the subscriber's durable consumer on each of its streams, decodes every
// envelope into its typed payload, keeps the types asked for and hands them over one at a time,
// acknowledging only what the handler accepted (at-least-once; a handler must be idempotent —
// the envelope id is stable across redeliveries).
//
// Order: each stream's events reach the handler one at a time in stream order, which is in
// particular the order of each aggregate's events. A failed event is retried in place (with
// backoff, the message kept in progress) before anything after it is handed over, so a failure
// never reorders; messages are fetched ahead and acknowledged asynchronously, so order costs
// no throughput.
package subscribe

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/fleetstream/fleetstream/pkg/consumer"
	"github.com/fleetstream/fleetstream/pkg/events"
	// The event types every stream carries, so that any envelope decodes into its payload.
	_ "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	_ "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	_ "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	_ "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	_ "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/natsauth"
)

// apiTimeout bounds one JetStream API call.
const apiTimeout = 5 * time.Second

// ackWait is how long a handed-over event stays the kit's without word; retries renew it.
const ackWait = time.Minute

// maxRetryDelay caps the backoff between retries of a failing event.
const maxRetryDelay = 30 * time.Second

// Config says who subscribes to what.
type Config struct {
	// URL of the NATS servers, comma-separated.
	URL string
	// Name and Token of the subscriber, as CreateSubscriber made them.
	Name, Token string
	// Streams to read; each must have been granted to the subscriber.
	Streams []string
	// Types are the payload types (full protobuf names, e.g. fleetstream.rbac.v1.ProjectRoleBound)
	// to hand over; empty hands over every event. Others are acknowledged and skipped.
	Types []string
	// Where a consumer that does not exist yet starts: at FromSequence if set, else at Since if
	// set, else with new events only. An existing consumer resumes where it left off.
	FromSequence uint64
	Since        time.Time
}

// Handler processes one event. An error makes the kit retry it after a backoff, and nothing
// later on its stream is handed over before it succeeds.
type Handler func(ctx context.Context, ev *events.Event) error

// Run reads until ctx ends or a consumer cannot be created.
func Run(ctx context.Context, cfg Config, h Handler, log *zap.Logger) error {
	if cfg.Name == "" || cfg.Token == "" || len(cfg.Streams) == 0 {
		return errors.New("subscribe: a subscriber name, its token and at least one stream are required")
	}
	nc, err := nats.Connect(cfg.URL, nats.Name("fleetstream-subscriber:"+cfg.Name), nats.Token(cfg.Token),
		nats.CustomInboxPrefix(natsauth.SubscriberInboxPrefix(cfg.Name)), nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("subscribe: connect to %s: %w", cfg.URL, err)
	}
	defer func() {
		// Acks are sent without waiting: make sure the last ones leave before the connection
		// goes, or a resumed subscriber gets them again.
		_ = nc.FlushTimeout(2 * time.Second)
		nc.Close()
	}()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	g, ctx := errgroup.WithContext(ctx)
	for _, stream := range cfg.Streams {
		cons, err := ensureConsumer(ctx, js, cfg, stream)
		if err != nil {
			return err
		}
		g.Go(func() error { return consume(ctx, cons, cfg, h, log.With(zap.String("stream", stream))) })
	}
	return g.Wait()
}

// ensureConsumer resumes the subscriber's durable consumer on stream, or creates it.
func ensureConsumer(ctx context.Context, js jetstream.JetStream, cfg Config, stream string) (jetstream.Consumer, error) {
	// A stream the subscriber was not granted answers nothing (a permission violation): bound
	// the wait instead of hanging until ctx ends.
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	name := natsauth.SubscriberConsumer(cfg.Name, stream)
	cons, err := js.Consumer(ctx, stream, name)
	if err == nil {
		return cons, nil
	}
	if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("subscribe: consumer %s on %s: %w", name, stream, err)
	}
	cc := jetstream.ConsumerConfig{
		Durable: name, AckPolicy: jetstream.AckExplicitPolicy,
		MaxAckPending: 1024, AckWait: ackWait, DeliverPolicy: jetstream.DeliverNewPolicy,
	}
	switch {
	case cfg.FromSequence > 0:
		cc.DeliverPolicy, cc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, cfg.FromSequence
	case !cfg.Since.IsZero():
		since := cfg.Since
		cc.DeliverPolicy, cc.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	cons, err = js.CreateConsumer(ctx, stream, cc)
	if err != nil {
		return nil, fmt.Errorf("subscribe: create consumer %s on %s: %w", name, stream, err)
	}
	return cons, nil
}

func consume(ctx context.Context, cons jetstream.Consumer, cfg Config, h Handler, log *zap.Logger) error {
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	return consumer.Each(ctx, it, func(err error) error {
		log.Warn("subscription", zap.Error(err))
		return nil
	}, func(m jetstream.Msg) error {
		handle(ctx, m, cfg, h, log)
		return nil
	})
}

func handle(ctx context.Context, m jetstream.Msg, cfg Config, h Handler, log *zap.Logger) {
	ev, err := events.Decode(m.Data())
	if err != nil {
		// Redelivering cannot fix it: terminate it (a subscriber may not publish to the
		// dead-letter stream; the producer's own consumers dead-letter it there).
		log.Error("undecodable event skipped", zap.String("subject", m.Subject()), zap.Error(err))
		_ = m.Term()
		return
	}
	if md, err := m.Metadata(); err == nil {
		ev.Sequence = md.Sequence.Stream
	}
	ev.Subject = m.Subject()
	if len(cfg.Types) > 0 && !slices.Contains(cfg.Types, ev.Type) {
		_ = m.Ack()
		return
	}
	for attempt := 1; ; attempt++ {
		err := h(ctx, ev)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return // left unacknowledged: redelivered to whoever reads next
		}
		delay := min(time.Duration(attempt)*time.Second, maxRetryDelay)
		log.Warn("handler failed; retrying", zap.String("type", ev.Type), zap.Uint64("seq", ev.Sequence), zap.Duration("in", delay), zap.Error(err))
		_ = m.InProgress()
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
	if err := m.Ack(); err != nil && ctx.Err() == nil {
		log.Warn("ack", zap.Error(err))
	}
}
