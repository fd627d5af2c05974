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
		// What a KV watch returns (nats.go's older API): fleetd stopped on it in a storm.
		{"a KV watch at the consumer limit", fmt.Errorf("load desired-rbac: %w", &nats.APIError{Code: 400, ErrorCode: 10026, Description: "maximum consumers limit reached"}), true},
		{"a KV watch without a leader", &nats.APIError{Code: 503, ErrorCode: 10008}, true},
		{"a KV watch's bad request", &nats.APIError{Code: 400, ErrorCode: 10052}, false},
		{"a bad request", &jetstream.APIError{Code: 400, ErrorCode: 10052, Description: "invalid config"}, false},
		{"anything else", errors.New("boom"), false},
	} {
		if got := events.Transient(tc.err); got != tc.want {
			t.Errorf("%s: Transient(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
