package events_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetstream/fleetstream/pkg/events"
)

func TestTransient(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"a request timed out", fmt.Errorf("create consumer: %w", nats.ErrTimeout), true},
		{"no leader", &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream cluster not available"}, true},
		// A fleet reconnecting at once fills a stream with short-lived replay consumers.
		{"a stream at its consumer limit", fmt.Errorf("load: %w", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeMaximumConsumersLimit, Description: "maximum consumers limit reached"}), true},
		{"the client's own form of it", jetstream.ErrMaximumConsumersLimit, true},
		{"a bad request", &jetstream.APIError{Code: 400, ErrorCode: 10052, Description: "invalid config"}, false},
		{"anything else", errors.New("boom"), false},
	} {
		if got := events.Transient(tc.err); got != tc.want {
			t.Errorf("%s: Transient(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
