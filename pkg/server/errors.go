package server

import (
	"context"

	"connectrpc.com/connect"

	"github.com/fleetstream/fleetstream/pkg/apierr"
)

// errorInterceptor is the innermost interceptor: an error a handler returns that is not already a
// Connect error goes through apierr.Internal, so a store or bus failure reaches the caller as
// Aborted, Unavailable, DeadlineExceeded or Internal by one set of rules, never as Connect's
// default Unknown.
type errorInterceptor struct{}

func (errorInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		res, err := next(ctx, req)
		return res, apierr.Internal(err)
	}
}

func (errorInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (errorInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return apierr.Internal(next(ctx, conn))
	}
}
