package view

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// bucketPoll is how often WaitBucket looks for a bucket that does not exist yet.
const bucketPoll = 250 * time.Millisecond

// WaitBucket opens a bucket another service owns, waiting until that service has created it
// (services start in any order). It logs once if the wait lasts, and returns ctx's error when
// ctx ends first.
func WaitBucket(ctx context.Context, js jetstream.JetStream, bucket string, log *zap.Logger) (jetstream.KeyValue, error) {
	start := time.Now()
	logged := false
	for {
		kv, err := js.KeyValue(ctx, bucket)
		if err == nil {
			return kv, nil
		}
		if !errors.Is(err, jetstream.ErrBucketNotFound) {
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
