package view

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/events"
)

// bucketPoll is how often WaitBucket looks for a bucket that does not exist yet;
// bucketLookupTimeout bounds each look.
const (
	bucketPoll          = 250 * time.Millisecond
	bucketLookupTimeout = 10 * time.Second
)

// WaitBucket opens a bucket another service owns, waiting until that service has created it
// (services start in any order). It logs once if the wait lasts, and returns ctx's error when
// ctx ends first.
func WaitBucket(ctx context.Context, js jetstream.JetStream, bucket string, log *zap.Logger) (jetstream.KeyValue, error) {
	start := time.Now()
	logged := false
	for {
		// Each lookup is bounded and a timed-out one retried: ctx may live as long as the
		// process, and a request that gets no answer while JetStream starts is not waited for
		// for good.
		lctx, cancel := context.WithTimeout(ctx, bucketLookupTimeout)
		kv, err := js.KeyValue(lctx, bucket)
		cancel()
		if err == nil {
			return kv, nil
		}
		// Not there yet, or JetStream briefly unable to answer (a timeout under load, no
		// leader, a reconnect): at 10,000 clusters a lookup that gave up on the first timeout
		// stopped fleetd.
		timedOut := ctx.Err() == nil && (errors.Is(err, context.DeadlineExceeded) || events.Transient(err))
		if !errors.Is(err, jetstream.ErrBucketNotFound) && !timedOut {
			return nil, fmt.Errorf("bucket %s: %w", bucket, err)
		}
		if !logged && time.Since(start) > 5*time.Second && log != nil {
			log.Warn("waiting for a bucket another service creates", zap.String("bucket", bucket))
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(bucketPoll):
		}
	}
}

// ErrBucketReplaced ends Follow: the bucket was dropped, or dropped and created again (a view
// rebuilt).
var ErrBucketReplaced = errors.New("bucket dropped or created again")

// bucketReplacedCheck is how often Follow checks that its bucket is still the one it reads.
const bucketReplacedCheck = 2 * time.Second

// Follow runs c, a cache of kv owned by another service, until c's reader ends, ctx ends, or kv
// is found dropped or created again. A reader of a bucket dropped and created again at once may
// go on at the old stream's next sequence and never see the new stream's first entries, so the
// bucket's identity (its stream's creation time) is checked every few seconds; a check that
// fails otherwise (the stream's leader died and its election is under way) keeps the reader,
// which picks up where it was once a leader is back. started, if not nil, runs once the
// identity is known, before c runs; ready runs once c is ready. Follow returns nil when ctx
// ended, ErrBucketReplaced, the error that ended c's reader, or that of the first identity
// lookup; callers attach again.
func Follow[T proto.Message](ctx context.Context, kv jetstream.KeyValue, c *Cache[T], started, ready func()) error {
	bctx, bcancel := context.WithTimeout(ctx, bucketLookupTimeout)
	born, err := bucketCreated(bctx, kv)
	bcancel()
	if err != nil {
		return fmt.Errorf("bucket %s: %w", kv.Bucket(), err)
	}
	if started != nil {
		started()
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.Run(cctx) }()
	tick := time.NewTicker(bucketReplacedCheck)
	defer tick.Stop()
	readyc := c.Ready()
	for {
		select {
		case <-readyc:
			ready()
			readyc = nil
		case err := <-errc:
			if ctx.Err() != nil {
				return nil
			}
			if err == nil {
				err = errors.New("reader ended")
			}
			return fmt.Errorf("bucket %s: %w", kv.Bucket(), err)
		case <-tick.C:
			lctx, lcancel := context.WithTimeout(ctx, bucketReplacedCheck)
			now, err := bucketCreated(lctx, kv)
			lcancel()
			gone := errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)
			if gone || (err == nil && !now.Equal(born)) {
				cancel()
				<-errc
				return ErrBucketReplaced
			}
		case <-ctx.Done():
			<-errc
			return nil
		}
	}
}

// bucketCreated returns when kv's stream was created: a bucket dropped and created again differs.
func bucketCreated(ctx context.Context, kv jetstream.KeyValue) (time.Time, error) {
	st, err := kv.Status(ctx)
	if err != nil {
		return time.Time{}, err
	}
	si, ok := st.(interface{ StreamInfo() *jetstream.StreamInfo })
	if !ok {
		return time.Time{}, nil
	}
	return si.StreamInfo().Created, nil
}
