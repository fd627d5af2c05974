package apierr

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetstream/fleetstream/pkg/events"
)

func TestInternalMapsEveryKindOfFailure(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want connect.Code
	}{
		{"already a connect error", NotFound("project", "p"), connect.CodeNotFound},
		{"lost a race", fmt.Errorf("append: %w", events.ErrConflict), connect.CodeAborted},
		{"deadline", fmt.Errorf("wait: %w", context.DeadlineExceeded), connect.CodeDeadlineExceeded},
		{"cancelled", context.Canceled, connect.CodeCanceled},
		{"bus timeout", fmt.Errorf("publish: %w", nats.ErrTimeout), connect.CodeUnavailable},
		{"no responders", nats.ErrNoResponders, connect.CodeUnavailable},
		{"no stream response", jetstream.ErrNoStreamResponse, connect.CodeUnavailable},
		{"no leader", &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, connect.CodeUnavailable},
		{"a bug", errors.New("decode view entry: proto: cannot parse invalid wire-format data"), connect.CodeInternal},
		{"bad request to the store", &jetstream.APIError{Code: 400, ErrorCode: 10999, Description: "bad"}, connect.CodeInternal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := connect.CodeOf(Internal(tc.err)); got != tc.want {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
	if Internal(nil) != nil {
		t.Fatal("nil is not an error")
	}
}

func TestErrorsStayShort(t *testing.T) {
	var v Violations
	v.DNSLabel("name", strings.Repeat("X", 1<<20))
	for i := range 1000 {
		v.Add(fmt.Sprintf("labels[%d]", i), "bad")
	}
	msg := v.Err().Error()
	if len(msg) > 4096 || !strings.Contains(msg, "and 982 more problems") || !strings.Contains(msg, "(1048576 bytes)") {
		t.Fatalf("%d bytes: %.300s", len(msg), msg)
	}
	if got := Short("héllo"); got != `"héllo"` {
		t.Fatalf("Short of a short value: %s", got)
	}
}
