package events_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/fleetstream/fleetstream/pkg/events"
)

func TestRetry(t *testing.T) {
	errStalled := errors.New("stalled")
	for _, tc := range []struct {
		name      string
		fails     []error // what f returns before it succeeds
		also      []error
		wantCalls int
		wantErr   error
	}{
		{"succeeds at once", nil, nil, 1, nil},
		{"request timeouts are retried", []error{context.DeadlineExceeded, fmt.Errorf("lookup: %w", nats.ErrTimeout)}, nil, 3, nil},
		{"no responders is retried", []error{nats.ErrNoResponders}, nil, 2, nil},
		{"an error the caller names is retried", []error{errStalled}, []error{errStalled}, 2, nil},
		{"any other error is returned at once", []error{errors.New("bad request")}, nil, 1, errors.New("bad request")},
		{"an error the caller does not name is returned", []error{errStalled}, nil, 1, errStalled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			err := events.Retry(context.Background(), zap.NewNop(), "test", func() error {
				calls++
				if calls <= len(tc.fails) {
					return tc.fails[calls-1]
				}
				return nil
			}, tc.also...)
			if calls != tc.wantCalls {
				t.Errorf("calls = %d, want %d", calls, tc.wantCalls)
			}
			if (err == nil) != (tc.wantErr == nil) || err != nil && err.Error() != tc.wantErr.Error() {
				t.Errorf("err = %v, want %v", err, tc.wantErr)
			}
		})
	}
}

// TestRetryEndsWithItsContext: a call that keeps timing out is retried until ctx ends, and
// Retry returns then.
func TestRetryEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	calls := 0
	err := events.Retry(ctx, zap.NewNop(), "test", func() error { calls++; return nats.ErrTimeout })
	if !errors.Is(err, context.DeadlineExceeded) || calls < 2 {
		t.Fatalf("err %v after %d calls: want the context's end after several", err, calls)
	}
}
