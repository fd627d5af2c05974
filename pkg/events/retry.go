package events

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"
)

// Retry calls f until it succeeds, ctx ends, or it fails with an error JetStream will not get
// over: it is tried again after a Transient error, a request's deadline (nats.go bounds a
// request without one by its default timeout) or one of also, waiting 100 ms doubling to 5 s,
// and logging msg with the error at warn. A loop that runs after start-up uses it where one
// failed request would otherwise end the service — and in fleetd, every service: a hub under a
// reconnecting fleet answers late (docs/scale.md, 10,000 clusters).
func Retry(ctx context.Context, log *zap.Logger, msg string, f func() error, also ...error) error {
	delay := 100 * time.Millisecond
	for {
		err := f()
		if err == nil || ctx.Err() != nil || !retryAgain(err, also) {
			return err
		}
		log.Warn(msg+"; trying again", zap.Error(err), zap.Duration("in", delay))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

func retryAgain(err error, also []error) bool {
	if Transient(err) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	for _, a := range also {
		if errors.Is(err, a) {
			return true
		}
	}
	return false
}
