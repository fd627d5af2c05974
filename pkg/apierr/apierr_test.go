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
	"k8s.io/apimachinery/pkg/labels"

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

func TestSelector(t *testing.T) {
	for _, tc := range []struct {
		in      string
		matches map[string]string
		want    bool
		bad     bool
	}{
		{in: "", matches: map[string]string{"env": "prod"}, want: true},
		{in: "env=prod", matches: map[string]string{"env": "prod"}, want: true},
		{in: "env in (dev,test)", matches: map[string]string{"env": "prod"}, want: false},
		{in: "!team", matches: map[string]string{"env": "prod"}, want: true},
		{in: "env in (a", bad: true},
		{in: "env in prod", bad: true},
		{in: "not a key=x", bad: true},
	} {
		var v Violations
		sel := v.Selector("label_selector", tc.in)
		err := v.Err()
		if tc.bad {
			if err == nil || sel != nil || connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "label_selector") {
				t.Errorf("Selector(%q) = %v, %v; want nil and an InvalidArgument naming label_selector", tc.in, sel, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("Selector(%q): %v", tc.in, err)
			continue
		}
		if got := sel.Matches(labels.Set(tc.matches)); got != tc.want {
			t.Errorf("Selector(%q).Matches(%v) = %v, want %v", tc.in, tc.matches, got, tc.want)
		}
	}
}
