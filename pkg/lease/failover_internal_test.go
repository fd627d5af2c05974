package lease

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/fleetstream/fleetstream/pkg/natsembed"
)

// leaderless is the lease bucket while its Raft group elects a new leader (a NATS node was
// killed): reads are answered (KV buckets allow direct gets from followers), writes are never
// answered and are not stored, and a request without a deadline gives up after nats.go's default
// API timeout of 5 s.
type leaderless struct {
	jetstream.KeyValue
	down atomic.Bool
}

func (l *leaderless) unanswered(ctx context.Context) error {
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return context.DeadlineExceeded
	}
}

func (l *leaderless) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	if l.down.Load() {
		return 0, l.unanswered(ctx)
	}
	return l.KeyValue.Create(ctx, key, value, opts...)
}

func (l *leaderless) Update(ctx context.Context, key string, value []byte, last uint64) (uint64, error) {
	if l.down.Load() {
		return 0, l.unanswered(ctx)
	}
	return l.KeyValue.Update(ctx, key, value, last)
}

func (l *leaderless) Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	if l.down.Load() {
		return l.unanswered(ctx)
	}
	return l.KeyValue.Delete(ctx, key, opts...)
}

// A holder whose lease bucket has no leader for longer than it may go without renewing stops
// its work, as it must; once the bucket has a leader again it must be back at work within a
// fraction of the TTL. A lease write sent into the leaderless bucket used to wait out nats.go's
// 5 s default, so the work came back up to 5 s + ttl/3 after the election, and with it every
// view of the service (chaos suite, NATS node killed).
func TestHolderReturnsSoonAfterTheBucketElects(t *testing.T) {
	// testkit imports this package (through pkg/view): the server is started here.
	srv, err := natsembed.Start(natsembed.Config{Name: "lease-test", StoreDir: t.TempDir(), Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancelAll := context.WithTimeout(context.Background(), time.Minute)
	defer cancelAll()
	kv, err := Open(ctx, js, 1)
	if err != nil {
		t.Fatal(err)
	}
	bucket := &leaderless{KeyValue: kv}
	const ttl = 1500 * time.Millisecond
	starts := make(chan time.Time, 10)
	stops := make(chan time.Time, 10)
	r := &runner{
		kv: bucket, key: "test.election", ttl: ttl, value: []byte("a#1"), log: zap.NewNop(), wake: make(chan struct{}, 1),
		fn: func(ctx context.Context) error {
			starts <- time.Now()
			<-ctx.Done()
			stops <- time.Now()
			return nil
		},
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.run(rctx) }()
	defer func() { cancel(); <-done }()
	next := func(ch chan time.Time, what string, within time.Duration) time.Time {
		t.Helper()
		select {
		case at := <-ch:
			return at
		case <-time.After(within):
			t.Fatalf("work not %s within %s", what, within)
			return time.Time{}
		}
	}
	next(starts, "started", 10*time.Second)

	// The bucket loses its leader for twice the TTL (elections take 4-9 s against a 5 s TTL).
	bucket.down.Store(true)
	lost := time.Now()
	stopped := next(stops, "stopped while the bucket has no leader", ttl)
	if d := stopped.Sub(lost); d > ttl*2/3+100*time.Millisecond {
		t.Errorf("work stopped %s after the bucket lost its leader; want within 2/3 ttl", d)
	}
	time.Sleep(2*ttl - time.Since(lost))
	bucket.down.Store(false)
	elected := time.Now()

	back := next(starts, "back after the bucket elected a leader", 10*time.Second).Sub(elected)
	t.Logf("work back %s after the bucket had a leader again (ttl %s)", back.Round(time.Millisecond), ttl)
	if want := r.opTimeout() + r.retryWait() + 300*time.Millisecond; back > want {
		t.Fatalf("work back %s after the bucket had a leader again; want within %s", back.Round(time.Millisecond), want)
	}
}
