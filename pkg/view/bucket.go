package view

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
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
		timedOut := ctx.Err() == nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout))
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
