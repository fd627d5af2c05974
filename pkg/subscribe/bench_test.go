package subscribe_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/events"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/subscribe"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// BenchmarkSubscribe: events/s through pkg/subscribe (decode, type check, ordered hand-over,
// ack) reading 100,000 events, against a bare nats.go durable consumer with explicit acks
// reading the same stream in the same run (what an expert writes without the kit: Consume with
// a callback that acks). The bar: ratio ≥ 0.8.
func BenchmarkSubscribe(b *testing.B) {
	const n = 100_000
	url, js := start(b)
	ctx := context.Background()
	env, err := events.NewEnvelope(ctx, "team-a", bound("team-a", "u"), "system:bench")
	if err != nil {
		b.Fatal(err)
	}
	data, err := proto.Marshal(env)
	if err != nil {
		b.Fatal(err)
	}
	var futures []jetstream.PubAckFuture
	for i := range n {
		f, err := js.PublishAsync(fmt.Sprintf("fleet.rbac.binding.p%d", i%1000), data)
		if err != nil {
			b.Fatal(err)
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			b.Fatal(err)
		}
	}
	for i := range b.N {
		// The baseline: a durable pull consumer acking each message in its callback.
		cons, err := js.CreateConsumer(ctx, subjects.RBACStream, jetstream.ConsumerConfig{Durable: fmt.Sprintf("bare-%d", i),
			AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1024, DeliverPolicy: jetstream.DeliverAllPolicy})
		if err != nil {
			b.Fatal(err)
		}
		var bare atomic.Int64
		done := make(chan struct{})
		start := time.Now()
		cc, err := cons.Consume(func(m jetstream.Msg) {
			_ = m.Ack()
			if bare.Add(1) == n {
				close(done)
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		<-done
		bareRate := n / time.Since(start).Seconds()
		cc.Stop()

		// The kit, as a new subscriber each round (its consumer starts at the first event).
		name := fmt.Sprintf("bench%d", i)
		var got atomic.Int64
		kitDone := make(chan struct{})
		rctx, stop := context.WithCancel(ctx)
		start = time.Now()
		errc := make(chan error, 1)
		go func() {
			errc <- subscribe.Run(rctx, subscribe.Config{URL: url, Name: name, Token: "producer", Streams: []string{subjects.RBACStream}, FromSequence: 1},
				func(_ context.Context, ev *events.Event) error {
					if _, ok := ev.Payload.(*rbacv1.ProjectRoleBound); !ok {
						return fmt.Errorf("payload %T", ev.Payload)
					}
					if got.Add(1) == n {
						close(kitDone)
					}
					return nil
				}, testkit.Logger(b))
		}()
		select {
		case <-kitDone:
		case err := <-errc:
			b.Fatal(err)
		}
		kitRate := n / time.Since(start).Seconds()
		stop()
		<-errc
		b.ReportMetric(kitRate, "events/s")
		b.ReportMetric(bareRate, "bare-events/s")
		b.ReportMetric(kitRate/bareRate, "ratio")
	}
}
