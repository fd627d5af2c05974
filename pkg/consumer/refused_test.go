package consumer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestRefusedIsPermanentOnly: an answer retrying cannot fix ends a reader; a stream at its
// consumer limit answers 400 too, but only while a reconnecting fleet's short-lived replay
// consumers last — a reader refused for it would end the service (and fleetd) at 10,000 clusters.
func TestRefusedIsPermanentOnly(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"not found", &jetstream.APIError{Code: 404, ErrorCode: jetstream.JSErrCodeStreamNotFound}, true},
		{"bad request", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeBadRequest}, true},
		{"consumer limit", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeMaximumConsumersLimit}, false},
		{"consumer limit, wrapped", fmt.Errorf("create: %w", jetstream.ErrMaximumConsumersLimit), false},
		{"no leader", &jetstream.APIError{Code: 503}, false},
		{"timeout", context.DeadlineExceeded, false},
	} {
		if got := refused(tc.err); got != tc.want {
			t.Errorf("%s: refused = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestRetryDelayBacksOffAtTheConsumerLimitOnly(t *testing.T) {
	limit := &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeMaximumConsumersLimit}
	if d := retryDelay(context.DeadlineExceeded, 7); d != orderedRetryDelay {
		t.Errorf("a timeout waits %v, want %v", d, orderedRetryDelay)
	}
	prev := time.Duration(0)
	for attempt := 1; attempt <= 10; attempt++ {
		d := retryDelay(limit, attempt)
		if d < prev || d > 5*time.Second {
			t.Fatalf("attempt %d at the consumer limit waits %v after %v: want growing to at most 5s", attempt, d, prev)
		}
		prev = d
	}
	if prev != 5*time.Second {
		t.Errorf("the consumer limit's delay ends at %v, want 5s", prev)
	}
}
