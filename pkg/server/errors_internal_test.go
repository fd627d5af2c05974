package server

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/events"
)

// A handler's plain error leaves by apierr's rules, not as Connect's Unknown; a Connect error
// passes unchanged; unary and streaming alike.
func TestHandlerErrorsAreMapped(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want connect.Code
	}{
		{"a bug", errors.New("decode: unexpected EOF"), connect.CodeInternal},
		{"a lost race", fmt.Errorf("append: %w", events.ErrConflict), connect.CodeAborted},
		{"the bus is down", fmt.Errorf("publish: %w", nats.ErrTimeout), connect.CodeUnavailable},
		{"already mapped", apierr.NotFound("project", "p"), connect.CodeNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			unary := errorInterceptor{}.WrapUnary(func(context.Context, connect.AnyRequest) (connect.AnyResponse, error) {
				return nil, tc.err
			})
			if _, err := unary(context.Background(), nil); connect.CodeOf(err) != tc.want {
				t.Errorf("unary: %v, want %v", connect.CodeOf(err), tc.want)
			}
			stream := errorInterceptor{}.WrapStreamingHandler(func(context.Context, connect.StreamingHandlerConn) error { return tc.err })
			if err := stream(context.Background(), nil); connect.CodeOf(err) != tc.want {
				t.Errorf("streaming: %v, want %v", connect.CodeOf(err), tc.want)
			}
		})
	}
	ok := errorInterceptor{}.WrapUnary(func(context.Context, connect.AnyRequest) (connect.AnyResponse, error) { return nil, nil })
	if _, err := ok(context.Background(), nil); err != nil {
		t.Errorf("success became %v", err)
	}
}
