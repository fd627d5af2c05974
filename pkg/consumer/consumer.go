// Package consumer runs durable JetStream pull consumers with explicit acks, bounded in-flight
// messages, backoff on redelivery and a dead-letter path, so one poison message is parked
// instead of looping forever.
package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/fleetstream/fleetstream/pkg/events"
	"github.com/fleetstream/fleetstream/pkg/topology"
)

// Handler processes one message. A nil error acks it; an error marked Permanent dead-letters it
// at once; any other error redelivers it after a backoff until MaxDeliver, then dead-letters it.
type Handler func(ctx context.Context, m jetstream.Msg) error

type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }

// Permanent marks err as one a retry cannot fix (a malformed message).
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanent{err}
}

// IsPermanent reports whether err was marked Permanent.
func IsPermanent(err error) bool {
	var p permanent
	return errors.As(err, &p)
}

// Heartbeat is the idle heartbeat every long-running pull of Fleetstream asks the server for.
// A pull whose consumer lived on a NATS node that crashed hears nothing more: nats.go notices
// only after two missed heartbeats and then re-creates the pull (an ordered consumer re-creates
// its consumer on a live node). With nats.go's defaults (5 s for ordered consumers, 15 s for
// durable ones) that took 10-30 s, longer than the 4-9 s nats-server needs to elect new leaders
// for the crashed node's streams, and a view waiting for it stalled every read-your-writes API
// write behind it (docs/reliability.md). At 1 s the pull is back within 2 s, before the
// election; an idle pull costs one small message a second.
const Heartbeat = time.Second

// Config describes a durable consumer.
type Config struct {
	Stream         string
	Durable        string
	FilterSubjects []string
	// DeliverPolicy defaults to all messages.
	DeliverPolicy jetstream.DeliverPolicy
	// MaxAckPending bounds messages in flight; default 256.
	MaxAckPending int
	// MaxDeliver is the number of attempts before dead-lettering; default 8.
	MaxDeliver int
	// Backoff between redeliveries, indexed by attempt; default 250ms, 1s, 5s, 15s, 30s.
	Backoff []time.Duration
	// AckWait before an unacked message is redelivered; default 30s.
	AckWait time.Duration
	// Workers is the number of concurrent handler goroutines; default 1 (ordered).
	Workers int
}

func (c *Config) defaults() {
	if c.MaxAckPending == 0 {
		c.MaxAckPending = 256
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = 8
	}
	if len(c.Backoff) == 0 {
		c.Backoff = []time.Duration{250 * time.Millisecond, time.Second, 5 * time.Second, 15 * time.Second, 30 * time.Second}
	}
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	if c.Workers == 0 {
		c.Workers = 1
	}
}

// Ensure creates or updates the durable consumer described by cfg.
func Ensure(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.Consumer, error) {
	cfg.defaults()
	cc := jetstream.ConsumerConfig{
		Durable:        cfg.Durable,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        cfg.AckWait,
		MaxAckPending:  cfg.MaxAckPending,
		DeliverPolicy:  cfg.DeliverPolicy,
		FilterSubjects: cfg.FilterSubjects,
		// The handler dead-letters on the last attempt itself; the server limit is one above
		// so that the last attempt is still delivered to it.
		MaxDeliver: cfg.MaxDeliver + 1,
	}
	c, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, cc)
	if err != nil {
		return nil, fmt.Errorf("ensure consumer %s on %s: %w", cfg.Durable, cfg.Stream, err)
	}
	return c, nil
}

// errStreamGone hides a missing stream from events.Retry, which would wait for it.
type errStreamGone struct{ err error }

func (e errStreamGone) Error() string { return e.err.Error() }

// Run consumes until ctx is done.
func Run(ctx context.Context, js jetstream.JetStream, cfg Config, log *zap.Logger, h Handler) error {
	cfg.defaults()
	// Created while the hub may be at its busiest (a fleet reconnecting): a request that
	// times out is made again rather than ending the service. A stream that does not exist is
	// not waited for: the services create their streams at start, so a restart is what brings
	// it back, and waiting would leave the service up consuming nothing.
	var c jetstream.Consumer
	err := events.Retry(ctx, log.With(zap.String("consumer", cfg.Durable)), "creating a consumer", func() (err error) {
		c, err = Ensure(ctx, js, cfg)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return errStreamGone{err}
		}
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting
		}
		return err
	}
	it, err := c.Messages(jetstream.PullMaxMessages(cfg.MaxAckPending), jetstream.PullHeartbeat(Heartbeat))
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("consume %s: %w", cfg.Durable, err)
	}
	defer it.Stop()
	msgs := make(chan jetstream.Msg)
	done := make(chan struct{})
	for range cfg.Workers {
		go func() {
			defer func() { done <- struct{}{} }()
			for m := range msgs {
				handle(ctx, js, cfg, log, h, m)
			}
		}()
	}
	defer func() {
		close(msgs)
		for range cfg.Workers {
			<-done
		}
	}()
	return Each(ctx, it, func(err error) error {
		log.Warn("consumer next", zap.String("consumer", cfg.Durable), zap.Error(err))
		return nil
	}, func(m jetstream.Msg) error {
		select {
		case msgs <- m:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}

// Each calls handle with every message of it until ctx ends or it is stopped, and then returns
// nil: how every long-running consumer of Fleetstream reads its messages. Next blocks with no
// context of its own, so Each stops it when ctx ends. Another error of Next goes to failed,
// which returns nil to go on (nats.go recovers from missed heartbeats and leader changes by
// itself) or an error to end Each with; so does an error of handle, unless ctx has ended (a
// handler interrupted by the stop has not failed).
func Each(ctx context.Context, it jetstream.MessagesContext, failed func(error) error, handle func(jetstream.Msg) error) error {
	go func() {
		<-ctx.Done()
		it.Stop()
	}()
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			if err := failed(err); err != nil {
				return err
			}
			continue
		}
		if err := handle(m); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

func handle(ctx context.Context, js jetstream.JetStream, cfg Config, log *zap.Logger, h Handler, m jetstream.Msg) {
	err := safeCall(ctx, h, m)
	if err == nil {
		_ = m.Ack()
		return
	}
	md, _ := m.Metadata()
	attempt := 1
	if md != nil {
		attempt = int(md.NumDelivered)
	}
	if IsPermanent(err) || attempt >= cfg.MaxDeliver {
		log.Error("dead-lettering message", zap.String("consumer", cfg.Durable), zap.String("subject", m.Subject()),
			zap.Int("attempt", attempt), zap.Error(err))
		if dlErr := DeadLetter(ctx, js, cfg.Stream, cfg.Durable, m, err); dlErr != nil {
			// Not parked: leave it for redelivery rather than lose it.
			log.Error("dead-letter failed", zap.Error(dlErr))
			_ = m.NakWithDelay(cfg.Backoff[len(cfg.Backoff)-1])
			return
		}
		_ = m.Term()
		return
	}
	delay := cfg.Backoff[min(attempt-1, len(cfg.Backoff)-1)]
	log.Warn("handler failed; will retry", zap.String("consumer", cfg.Durable), zap.String("subject", m.Subject()),
		zap.Int("attempt", attempt), zap.Duration("retryIn", delay), zap.Error(err))
	_ = m.NakWithDelay(delay)
}

// safeCall turns a handler panic into a permanent error so that one bad message cannot crash
// the service into a restart loop.
func safeCall(ctx context.Context, h Handler, m jetstream.Msg) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = Permanent(fmt.Errorf("handler panic: %v", r))
		}
	}()
	return h(ctx, m)
}

// Dead-letter headers describe where a parked message came from.
const (
	HeaderStream  = "Fleet-Dlq-Stream"
	HeaderSeq     = "Fleet-Dlq-Sequence"
	HeaderSubject = "Fleet-Dlq-Subject"
	HeaderError   = "Fleet-Dlq-Error"
)

// DeadLetter copies m to fleet.dlq.<stream>.<consumer> with headers naming its origin and the
// error. The message id makes a repeated dead-lettering of the same message a no-op.
func DeadLetter(ctx context.Context, js jetstream.JetStream, stream, consumerName string, m jetstream.Msg, cause error) error {
	var seq uint64
	if md, err := m.Metadata(); err == nil {
		seq = md.Sequence.Stream
	}
	out := nats.NewMsg(topology.DeadLetterSubjectPrefix + "." + stream + "." + consumerName)
	out.Data = m.Data()
	out.Header.Set(HeaderStream, stream)
	out.Header.Set(HeaderSeq, strconv.FormatUint(seq, 10))
	out.Header.Set(HeaderSubject, m.Subject())
	out.Header.Set(HeaderError, cause.Error())
	_, err := js.PublishMsg(ctx, out, jetstream.WithMsgID(fmt.Sprintf("dlq:%s:%s:%d", stream, consumerName, seq)))
	if err != nil {
		return fmt.Errorf("dead-letter %s seq %d: %w", m.Subject(), seq, err)
	}
	return nil
}
