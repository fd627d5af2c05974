package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetstream/fleetstream/pkg/consumer"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/topology"
)

func TestFailingMessagesAreRetriedThenDeadLetteredWhileOthersFlow(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 60*time.Second)
	if err := topology.Ensure(ctx, j.JS, 1, topology.Merge(topology.DeadLetter(), topology.Topology{
		Streams: []jetstream.StreamConfig{topology.EventStream("WORK", "work", "work.>")},
	})); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"work.ok.1", "work.transient", "work.poison", "work.panic", "work.ok.2", "work.flaky"} {
		if _, err := j.JS.Publish(ctx, s, []byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	attempts := map[string]int{}
	var handled atomic.Int32
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_ = consumer.Run(rctx, j.JS, consumer.Config{
			Stream: "WORK", Durable: "worker", MaxDeliver: 3,
			Backoff: []time.Duration{10 * time.Millisecond, 20 * time.Millisecond},
		}, testkit.Logger(t), func(_ context.Context, m jetstream.Msg) error {
			mu.Lock()
			attempts[m.Subject()]++
			n := attempts[m.Subject()]
			mu.Unlock()
			switch m.Subject() {
			case "work.transient":
				return errors.New("backend down") // never recovers: dead-lettered after 3
			case "work.poison":
				return consumer.Permanent(errors.New("malformed"))
			case "work.panic":
				panic("bug")
			case "work.flaky":
				if n < 2 {
					return errors.New("blip")
				}
			}
			handled.Add(1)
			return nil
		})
	}()
	testkit.Eventually(t, 20*time.Second, func() error {
		s, err := j.JS.Stream(ctx, topology.DeadLetterStreamName)
		if err != nil {
			return err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs != 3 || handled.Load() != 3 {
			return fmt.Errorf("%d dead letters, %d handled", info.State.Msgs, handled.Load())
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if attempts["work.transient"] != 3 || attempts["work.poison"] != 1 || attempts["work.panic"] != 1 || attempts["work.flaky"] != 2 {
		t.Fatalf("attempts %v", attempts)
	}
	// Nothing is left pending: parked messages are terminated, not redelivered forever.
	c, err := j.JS.Consumer(ctx, "WORK", "worker")
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		info, err := c.Info(ctx)
		if err != nil {
			return err
		}
		if info.NumAckPending != 0 || info.NumPending != 0 {
			return fmt.Errorf("pending %d, ack pending %d", info.NumPending, info.NumAckPending)
		}
		return nil
	})
}

// TestRunEndsOnAStreamThatDoesNotExist: a request that times out is retried, but a missing
// stream is not waited for — the services create their streams at start, so only a restart
// brings it back, and a service waiting would stay up consuming nothing.
func TestRunEndsOnAStreamThatDoesNotExist(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 30*time.Second)
	err := consumer.Run(ctx, j.JS, consumer.Config{Stream: "MISSING", Durable: "worker"}, testkit.Logger(t),
		func(context.Context, jetstream.Msg) error { return nil })
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "stream not found") {
		t.Fatalf("Run on a missing stream: %v (context: %v); want the stream's absence at once", err, ctx.Err())
	}
}
