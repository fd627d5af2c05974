package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/fleetstream/fleetstream/pkg/consumer"
	"github.com/fleetstream/fleetstream/pkg/natsmetrics"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// publish appends one message per subject and returns their stream sequences.
func publish(t *testing.T, ctx context.Context, js jetstream.JetStream, subjects ...string) []uint64 {
	t.Helper()
	var seqs []uint64
	for _, s := range subjects {
		ack, err := js.Publish(ctx, s, []byte(s))
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, ack.Sequence)
	}
	return seqs
}

// read takes n messages from o and returns their stream sequences.
func read(t *testing.T, ctx context.Context, o *consumer.Ordered, n int) []uint64 {
	t.Helper()
	var seqs []uint64
	for len(seqs) < n {
		m, err := o.Next(ctx)
		if err != nil {
			t.Fatalf("next after %v: %v", seqs, err)
		}
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, md.Sequence.Stream)
		// Some of them through TryNext, as the view engine takes a batch.
		for len(seqs) < n {
			m, ok := o.TryNext()
			if !ok {
				break
			}
			md, err := m.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			seqs = append(seqs, md.Sequence.Stream)
		}
	}
	return seqs
}

func equal(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func consumerNames(t *testing.T, ctx context.Context, js jetstream.JetStream, stream string) []string {
	t.Helper()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	lister := s.ConsumerNames(ctx)
	for name := range lister.Name() {
		names = append(names, name)
	}
	if err := lister.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}

// The reader delivers the messages of its subjects from its start sequence, each once and in
// stream order, across the loss of its server-side consumer.
func TestOrderedDeliversEachMessageOnceAcrossAResetOfItsConsumer(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, time.Minute)
	if _, err := j.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "ORD", Subjects: []string{"ord.>"}}); err != nil {
		t.Fatal(err)
	}
	var want []uint64
	for i := range 300 {
		seqs := publish(t, ctx, j.JS, "ord.a", "ord.other")
		if i >= 10 {
			want = append(want, seqs[0])
		}
	}
	o, err := consumer.NewOrdered(ctx, j.JS, "ORD", []string{"ord.a"}, want[0], 64, testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer o.Stop()
	if n := o.InitialPending(); n != uint64(len(want)) {
		t.Fatalf("initial pending = %d; want %d", n, len(want))
	}
	got := read(t, ctx, o, 100)
	reg := prometheus.NewRegistry()
	reg.MustRegister(natsmetrics.Collectors()...)
	const recreations = "fleetstream_nats_consumer_recreations_total"
	// Counted for the process: other tests' readers of ORD may have counted before this one.
	before := testkit.Counter(t, reg, recreations, "stream", "ORD")

	// The consumer disappears mid-stream (its node died, or the server dropped it).
	names := consumerNames(t, ctx, j.JS, "ORD")
	if len(names) != 1 {
		t.Fatalf("consumers %v, want one", names)
	}
	if err := j.JS.DeleteConsumer(ctx, "ORD", names[0]); err != nil {
		t.Fatal(err)
	}
	for range 50 {
		want = append(want, publish(t, ctx, j.JS, "ord.a", "ord.other")[0])
	}
	start := time.Now()
	got = append(got, read(t, ctx, o, len(want)-len(got))...)
	if !equal(got, want) {
		t.Fatalf("delivered %v\nwant %v", got, want)
	}
	t.Logf("read the rest of %d messages %s after the consumer was deleted", len(want), time.Since(start).Round(time.Millisecond))
	if n := testkit.Counter(t, reg, recreations, "stream", "ORD") - before; n != 1 {
		t.Fatalf("%s{stream=ORD} grew by %g after one lost consumer, want 1", recreations, n)
	}

	// Nothing more is delivered: not one message twice.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if m, err := o.Next(short); err == nil {
		md, _ := m.Metadata()
		t.Fatalf("a message more: %+v", md.Sequence)
	} else if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("next: %v, want the context's deadline", err)
	}
	// The first consumer is gone, and a reader that stops deletes its own.
	o.Stop()
	if _, err := o.Next(ctx); !errors.Is(err, consumer.ErrOrderedStopped) {
		t.Fatalf("next after stop: %v", err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if names := consumerNames(t, ctx, j.JS, "ORD"); len(names) != 0 {
			return fmt.Errorf("consumers left: %v", names)
		}
		return nil
	})
}

// WithLastPerSubject reads the current state of a stream of replacements (each subject's last
// message, in stream order), then every later message in order, also across a lost consumer;
// a consumer lost before anything was delivered is replaced by one that again starts at each
// subject's last message, not at the stream's beginning.
func TestOrderedLastPerSubject(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, time.Minute)
	if _, err := j.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "ORD", Subjects: []string{"ord.>"}}); err != nil {
		t.Fatal(err)
	}
	seqs := publish(t, ctx, j.JS, "ord.a", "ord.b", "ord.a", "ord.c", "ord.b", "ord.x")
	o, err := consumer.NewOrdered(ctx, j.JS, "ORD", []string{"ord.a", "ord.b", "ord.c"}, 0, 8, testkit.Logger(t),
		consumer.WithLastPerSubject())
	if err != nil {
		t.Fatal(err)
	}
	defer o.Stop()
	if n := o.InitialPending(); n != 3 {
		t.Fatalf("initial pending %d, want 3 (one per subject)", n)
	}
	lose := func() {
		t.Helper()
		names := consumerNames(t, ctx, j.JS, "ORD")
		if len(names) != 1 {
			t.Fatalf("consumers %v, want one", names)
		}
		if err := j.JS.DeleteConsumer(ctx, "ORD", names[0]); err != nil {
			t.Fatal(err)
		}
	}
	// Lost before the first delivery: the replacement starts at the last per subject again.
	lose()
	if got, want := read(t, ctx, o, 3), []uint64{seqs[2], seqs[3], seqs[4]}; !equal(got, want) {
		t.Fatalf("delivered %v, want the last of each subject %v", got, want)
	}
	// Lost after: every later message, superseded ones included, in stream order.
	lose()
	later := publish(t, ctx, j.JS, "ord.a", "ord.x", "ord.a", "ord.c")
	if got, want := read(t, ctx, o, 3), []uint64{later[0], later[2], later[3]}; !equal(got, want) {
		t.Fatalf("delivered %v after the consumer was lost, want %v", got, want)
	}
}

// Stop ends a Next waiting for a message; a stream that does not exist fails NewOrdered at
// once rather than being retried.
func TestOrderedStopAndRefusal(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, time.Minute)
	start := time.Now()
	if _, err := consumer.NewOrdered(ctx, j.JS, "NONE", nil, 0, 8, testkit.Logger(t)); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("new on a missing stream: %v", err)
	} else if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("new on a missing stream failed after %s", d)
	}
	if _, err := j.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "ORD", Subjects: []string{"ord.>"}}); err != nil {
		t.Fatal(err)
	}
	o, err := consumer.NewOrdered(ctx, j.JS, "ORD", nil, 0, 8, testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := o.Next(ctx)
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	o.Stop()
	select {
	case err := <-done:
		if !errors.Is(err, consumer.ErrOrderedStopped) {
			t.Fatalf("next: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Stop did not end Next")
	}
}

// A reader whose consumer is lost while the meta group has no leader resumes within about a
// second of the cluster taking writes again.
//
// An embedded server's Shutdown hands its leaderships over first, so stopping one node of three
// leaves no leaderless gap; stopping two (no quorum) and starting one again does. (The node
// left alone still answered consumer creates here, so this test does not show nats.go's 10 s
// attempts; TestOrderedBoundsEachCreateAttempt does.)
func TestOrderedResumesSoonAfterTheMetaGroupHasALeaderAgain(t *testing.T) {
	if testing.Short() {
		t.Skip("three-node cluster")
	}
	c := testkit.StartCluster(t, nil)
	ctx := testkit.Context(t, 3*time.Minute)
	const keep = 0 // the node the client is on, which stays up
	_, js := testkit.ConnectURL(t, c.Nodes[keep].ClientURL())
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORD", Subjects: []string{"ord.>"}, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	want := publish(t, ctx, js, "ord.1", "ord.2")

	// Both consumers must lose their node: start them until neither is on the node kept.
	var (
		o   *consumer.Ordered
		oc  jetstream.Consumer
		old jetstream.MessagesContext
		err error
	)
	keepName := c.Nodes[keep].Name()
	for attempt := 0; ; attempt++ {
		if o == nil {
			if o, err = consumer.NewOrdered(ctx, js, "ORD", nil, want[0], 16, zaptest.NewLogger(t)); err != nil {
				t.Fatal(err)
			}
		}
		if old == nil {
			if oc, err = js.OrderedConsumer(ctx, "ORD", jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: want[0]}); err != nil {
				t.Fatal(err)
			}
			if old, err = oc.Messages(jetstream.PullHeartbeat(consumer.Heartbeat)); err != nil {
				t.Fatal(err)
			}
		}
		// Reading makes sure both consumers exist on the server.
		if got := read(t, ctx, o, len(want)); !equal(got, want) {
			t.Fatalf("read %v, want %v", got, want)
		}
		for range want {
			if _, err := old.Next(jetstream.NextContext(ctx)); err != nil {
				t.Fatal(err)
			}
		}
		oHost, oldHost := host(t, ctx, js, consumer.OrderedConsumerName(o)), host(t, ctx, js, oc.CachedInfo().Name)
		if oHost != keepName && oldHost != keepName {
			break
		}
		if oHost == keepName {
			o.Stop()
			o = nil
		}
		if oldHost == keepName {
			old.Stop()
			old = nil
		}
		if attempt == 30 {
			t.Fatalf("a consumer was on %s in 30 starts", keepName)
		}
		want = publish(t, ctx, js, "ord.1", "ord.2")
	}
	defer o.Stop()
	defer old.Stop()

	for i := range c.Nodes {
		if i != keep {
			c.Nodes[i].Stop()
		}
	}
	stopped := time.Now()
	// Long enough for both readers to notice the missing heartbeats (2 s) and start asking
	// for a new consumer, unanswered.
	// The node kept goes on leading the meta group without a quorum for a while (and answers
	// a consumer create meanwhile); wait until it gives up.
	// It took 20 s in a run: 45 s leaves room for a loaded machine.
	testkit.Eventually(t, 45*time.Second, func() error {
		if c.Nodes[keep].JetStreamIsLeader() {
			return errors.New("still leads the meta group")
		}
		return nil
	})
	leaderless := time.Now()
	t.Logf("no meta leader %s after the nodes stopped", leaderless.Sub(stopped).Round(time.Millisecond))
	// The reader's consumer is lost now, with nobody to answer the create of the next one.
	consumer.BreakOrdered(o)
	time.Sleep(3 * time.Second)
	if err := c.Restart(1); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	var metaLeader time.Time
	for metaLeader.IsZero() {
		for _, n := range c.Nodes {
			if n.Running() && n.JetStreamIsLeader() {
				metaLeader = time.Now()
			}
		}
		if ctx.Err() != nil {
			t.Fatal("no meta leader")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Published as soon as the stream takes writes again.
	var published time.Time
	var seq uint64
	testkit.Eventually(t, 30*time.Second, func() error {
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		// A publish whose ack was lost may be stored: its ID makes the retry a duplicate.
		ack, err := js.Publish(pctx, "ord.new", nil, jetstream.WithMsgID("new"))
		if err != nil {
			return err
		}
		published, seq = time.Now(), ack.Sequence
		return nil
	})

	type delivery struct {
		at  time.Time
		err error
	}
	oldDone := make(chan delivery, 1)
	go func() {
		for {
			m, err := old.Next(jetstream.NextContext(ctx))
			if err != nil {
				oldDone <- delivery{err: err}
				return
			}
			if md, _ := m.Metadata(); md != nil && md.Sequence.Stream == seq {
				oldDone <- delivery{at: time.Now()}
				return
			}
		}
	}()
	m, err := o.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	delivered := time.Now()
	if md, _ := m.Metadata(); md == nil || md.Sequence.Stream != seq {
		t.Fatalf("delivered %v, want stream sequence %d (exactly once, in order)", md, seq)
	}
	rel := func(at time.Time) string {
		return fmt.Sprintf("%s after the meta leader, %s after the publish ack (%s after the nodes stopped)",
			at.Sub(metaLeader).Round(time.Millisecond), at.Sub(published).Round(time.Millisecond), at.Sub(stopped).Round(time.Millisecond))
	}
	t.Logf("meta leader %s after the restart; publish acked %s after the meta leader",
		metaLeader.Sub(restarted).Round(time.Millisecond), published.Sub(metaLeader).Round(time.Millisecond))
	t.Logf("consumer.Ordered delivered the new message %s", rel(delivered))
	// Comparison only, not asserted: nats.go's attempt in flight runs out its 10 s.
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	select {
	case d := <-oldDone:
		if d.err != nil {
			t.Logf("nats.go's ordered consumer: %v", d.err)
		} else {
			t.Logf("nats.go's ordered consumer delivered it %s", rel(d.at))
		}
	case <-wctx.Done():
		t.Logf("nats.go's ordered consumer did not deliver it within 30 s of the meta leader")
	}
	// The stream's own election may end after the meta group's: what is timed is from when
	// both have a leader (the message was stored).
	if d := delivered.Sub(published); d > 2*time.Second {
		t.Fatalf("consumer.Ordered delivered the new message %s after it was stored; want within 2 s", d.Round(time.Millisecond))
	}
}

// host returns the node of the stream's consumer name.
func host(t *testing.T, ctx context.Context, js jetstream.JetStream, name string) string {
	t.Helper()
	ci, err := js.Consumer(ctx, "ORD", name)
	if err != nil {
		t.Fatalf("consumer %q: %v", name, err)
	}
	info := ci.CachedInfo()
	if info.Cluster == nil || info.Cluster.Leader == "" {
		t.Fatalf("consumer %s has no leader", name)
	}
	return info.Cluster.Leader
}

// When the meta group has no leader, a consumer create is never answered: nats.go's ordered
// consumer, whose attempts last 10 s each, resumed ~10 s after the kill of a meta leader's node
// although a new leader was there within 4-6 s (issue 14). Here both readers use JetStream
// through a relay that drops every API request while "leaderless", which is what a client sees
// then; the reader must resume within about a second of the relay answering again.
func TestOrderedBoundsEachCreateAttempt(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, time.Minute)
	if _, err := j.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "ORD", Subjects: []string{"ord.>"}}); err != nil {
		t.Fatal(err)
	}
	var drop atomic.Bool
	sub, err := j.Conn.Subscribe("RELAY.API.>", func(m *nats.Msg) {
		if drop.Load() {
			return
		}
		out := &nats.Msg{Subject: "$JS.API." + m.Subject[len("RELAY.API."):], Reply: m.Reply, Header: m.Header, Data: m.Data}
		_ = j.Conn.PublishMsg(out)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	nc, _ := j.Connect(t)
	relayed, err := jetstream.NewWithAPIPrefix(nc, "RELAY.API")
	if err != nil {
		t.Fatal(err)
	}
	want := publish(t, ctx, j.JS, "ord.1", "ord.2")
	o, err := consumer.NewOrdered(ctx, relayed, "ORD", nil, 0, 16, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer o.Stop()
	oc, err := relayed.OrderedConsumer(ctx, "ORD", jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	old, err := oc.Messages(jetstream.PullHeartbeat(consumer.Heartbeat))
	if err != nil {
		t.Fatal(err)
	}
	defer old.Stop()
	if got := read(t, ctx, o, len(want)); !equal(got, want) {
		t.Fatalf("read %v, want %v", got, want)
	}
	for range want {
		if _, err := old.Next(jetstream.NextContext(ctx)); err != nil {
			t.Fatal(err)
		}
	}

	// Both wait in Next for the message to come, which is where they notice the loss of their
	// consumers and replace them.
	type delivery struct {
		at  time.Time
		seq uint64
		err error
	}
	ours, theirs := make(chan delivery, 1), make(chan delivery, 1)
	wait := func(next func() (jetstream.Msg, error), out chan<- delivery) {
		m, err := next()
		if err != nil {
			out <- delivery{err: err}
			return
		}
		md, err := m.Metadata()
		if err != nil {
			out <- delivery{err: err}
			return
		}
		out <- delivery{at: time.Now(), seq: md.Sequence.Stream}
	}
	go wait(func() (jetstream.Msg, error) { return o.Next(ctx) }, ours)
	go wait(func() (jetstream.Msg, error) { return old.Next(jetstream.NextContext(ctx)) }, theirs)

	// JetStream stops answering and both consumers are lost.
	drop.Store(true)
	for _, name := range consumerNames(t, ctx, j.JS, "ORD") {
		if err := j.JS.DeleteConsumer(ctx, "ORD", name); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(4 * time.Second)
	seq := publish(t, ctx, j.JS, "ord.new")[0]
	drop.Store(false)
	answering := time.Now()

	d := <-ours
	if d.err != nil {
		t.Fatal(d.err)
	}
	if d.seq != seq {
		t.Fatalf("delivered stream sequence %d, want %d (exactly once, in order)", d.seq, seq)
	}
	took := d.at.Sub(answering)
	t.Logf("consumer.Ordered delivered the new message %s after JetStream answered again", took.Round(time.Millisecond))
	select {
	case d := <-theirs:
		if d.err != nil {
			t.Logf("nats.go's ordered consumer: %v", d.err)
		} else {
			t.Logf("nats.go's ordered consumer delivered stream sequence %d %s after JetStream answered again", d.seq, d.at.Sub(answering).Round(time.Millisecond))
		}
	case <-time.After(20 * time.Second):
		t.Logf("nats.go's ordered consumer did not deliver it within 20 s of JetStream answering again")
	}
	// At most an attempt lost to the dropped answers (1 s) and a retry delay (250 ms), with room
	// for a loaded machine; nats.go's takes ~7 s here.
	if took > 2*time.Second {
		t.Fatalf("consumer.Ordered delivered the new message %s after JetStream answered again; want within 2 s", took.Round(time.Millisecond))
	}
}
